"""`hlo_passes.stats` counts FLOPs and transcendentals as XLA's HloCostAnalysis does.

The oracle is XLA itself: `cost_analysis(text)` runs jaxlib's HloCostAnalysis on the module as
written, the figure every benchmark compares our `--stats` with.  One hand-written module per
opcode family guards each rule of `stats._OWN_WORK` / `stats._CALLED_WORK`; the whole corpus and
seeded random modules guard the rules together.

One difference is deliberate: XLA charges a custom-call -1 FLOPs ("unknown"); we charge it
nothing, so the oracle's count is compared with one FLOP added back per custom-call it ran."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from hlo_passes import parse_module
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.runtime.xla_backend import cost_analysis
from hlo_passes.stats import Work, computation_work, module_stats
from tests.spmd.random_hlo import module_from_seed

ROOT = Path(__file__).resolve().parent.parent

# Computations the hand-written modules apply: scalar reducers, comparators and a mapped function.
HELPERS = """
add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] maximum(a, b)
}

ge_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=GE
}

lt_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}

lt_f32_s32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT
}

argmax_f32_s32 {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  ge = pred[] compare(a, b), direction=GE
  v = f32[] select(ge, a, b)
  k = s32[] select(ge, i, j)
  ROOT r = (f32[], s32[]) tuple(v, k)
}

exp_add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  e = f32[] exponential(a)
  ROOT r = f32[] add(e, b)
}
"""


def module(entry: str, extra: str = "") -> str:
    """A module of the helper computations, `extra` computations and an entry of `entry`'s lines."""
    body = "\n".join("  " + line.strip() for line in entry.strip().splitlines())
    return f"HloModule m\n{HELPERS}\n{extra}\nENTRY main {{\n{body}\n}}\n"


def custom_calls_run(parsed: Module) -> int:
    """Custom-calls in the computations the entry runs (XLA charges each -1 FLOPs)."""
    return sum(1 for comp in parsed.computations for instr in comp.instructions
               if instr.opcode is Opcode.CUSTOM_CALL)


def ours_and_xla(text: str) -> tuple[Work, Work]:
    """(our count, XLA's count with custom-calls' -1 FLOPs added back)."""
    parsed = parse_module(text)
    ours = computation_work(parsed.entry)
    xla = cost_analysis(text)
    return ours, Work(int(xla.get("flops", 0)) + custom_calls_run(parsed), int(xla.get("transcendentals", 0)))


def assert_matches_xla(text: str) -> Work:
    ours, xla = ours_and_xla(text)
    assert ours == xla, f"ours {ours}, XLA {xla}\n{text}"
    stats = module_stats(parse_module(text))
    assert (stats.flops, stats.transcendentals) == (ours.flops, ours.transcendentals)
    return ours


# ------------------------------------------------------------- per opcode --
CASES: dict[str, tuple[str, str]] = {
    # element-wise: one FLOP per output element, a transcendental instead for exp, log, ...
    "add": ("p = f32[8,16] parameter(0)\n ROOT r = f32[8,16] add(p, p)", ""),
    "negate_abs_floor": ("p = f32[8,16] parameter(0)\n n = f32[8,16] negate(p)\n a = f32[8,16] abs(n)\n"
                         "ROOT r = f32[8,16] floor(a)", ""),
    "compare_select_clamp": ("p = f32[8,16] parameter(0)\n q = f32[8,16] parameter(1)\n"
                             "c = pred[8,16] compare(p, q), direction=LT\n s = f32[8,16] select(c, p, q)\n"
                             "ROOT r = f32[8,16] clamp(p, s, q)", ""),
    "convert_bitcast_convert_reduce_precision": (
        "p = f32[8,16] parameter(0)\n c = bf16[8,16] convert(p)\n b = s32[8,16] bitcast-convert(p)\n"
        "rp = f32[8,16] reduce-precision(p), exponent_bits=5, mantissa_bits=10\n"
        "ROOT t = (bf16[8,16], s32[8,16], f32[8,16]) tuple(c, b, rp)", ""),
    "integer_bitwise": ("p = s32[8,16] parameter(0)\n a = s32[8,16] and(p, p)\n x = s32[8,16] xor(a, p)\n"
                        "s = s32[8,16] shift-left(x, p)\n ROOT r = s32[8,16] popcnt(s)", ""),
    "transcendentals": (
        "p = f32[8,16] parameter(0)\n e = f32[8,16] exponential(p)\n l = f32[8,16] log(e)\n"
        "t = f32[8,16] tanh(l)\n g = f32[8,16] logistic(t)\n s = f32[8,16] sqrt(g)\n"
        "rs = f32[8,16] rsqrt(s)\n cb = f32[8,16] cbrt(rs)\n pw = f32[8,16] power(cb, p)\n"
        "sn = f32[8,16] sine(pw)\n cs = f32[8,16] cosine(sn)\n tn = f32[8,16] tan(cs)\n"
        "at = f32[8,16] atan2(tn, p)\n er = f32[8,16] erf(at)\n em = f32[8,16] exponential-minus-one(er)\n"
        "ROOT lp = f32[8,16] log-plus-one(em)", ""),
    "inverse_and_hyperbolic_trig": (
        "p = f32[8,16] parameter(0)\n a = f32[8,16] acos(p)\n b = f32[8,16] asin(a)\n c = f32[8,16] sinh(b)\n"
        "d = f32[8,16] cosh(c)\n e = f32[8,16] atanh(d)\n f = f32[8,16] asinh(e)\n ROOT g = f32[8,16] acosh(f)", ""),
    "mixed_elementwise": ("p = f32[8,16] parameter(0)\n e = f32[8,16] exponential(p)\n"
                          "ROOT r = f32[8,16] multiply(e, p)", ""),
    # data movement and the like: nothing
    "copy_transpose_reshape_slice": (
        "p = f32[8,16] parameter(0)\n c = f32[8,16] copy(p)\n t = f32[16,8] transpose(c), dimensions={1,0}\n"
        "r = f32[128] reshape(t)\n s = f32[64] slice(r), slice={[0:64]}\n"
        "b = f32[4,64] broadcast(s), dimensions={1}\n ROOT x = f32[4,64] reverse(b), dimensions={0}", ""),
    "iota_concatenate_pad": (
        "i = f32[8,16] iota(), iota_dimension=1\n c = f32[16,16] concatenate(i, i), dimensions={0}\n"
        "z = f32[] constant(0)\n ROOT p = f32[18,16] pad(c, z), padding=1_1x0_0", ""),
    "dynamic_slice_update": (
        "p = f32[8,16] parameter(0)\n u = f32[2,16] parameter(1)\n i = s32[] parameter(2)\n"
        "z = s32[] constant(0)\n d = f32[2,16] dynamic-slice(p, i, z), dynamic_slice_sizes={2,16}\n"
        "a = f32[2,16] add(d, u)\n ROOT r = f32[8,16] dynamic-update-slice(p, a, i, z)", ""),
    "gather": (
        "p = f32[16,8] parameter(0)\n i = s32[5,1] parameter(1)\n"
        "ROOT g = f32[5,8] gather(p, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},"
        " index_vector_dim=1, slice_sizes={1,8}", ""),
    "rng": ("a = f32[] constant(0)\n b = f32[] constant(1)\n"
            "ROOT r = f32[8,16] rng(a, b), distribution=rng_uniform", ""),
    "rng_bit_generator": ("s = u64[2] parameter(0)\n"
                          "ROOT r = (u64[2], u32[8,16]) rng-bit-generator(s), algorithm=rng_default", ""),
    "custom_call": ("p = f32[8,16] parameter(0)\n c = f32[8,16] custom-call(p), custom_call_target=\"foo\"\n"
                    "ROOT r = f32[8,16] add(c, p)", ""),
    # contractions
    "dot": ("a = f32[4,8,16] parameter(0)\n b = f32[4,16,32] parameter(1)\n"
            "ROOT d = f32[4,8,32] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},"
            " lhs_contracting_dims={2}, rhs_contracting_dims={1}", ""),
    "dot_outer_product": ("a = f32[8] parameter(0)\n b = f32[16] parameter(1)\n"
                          "ROOT d = f32[8,16] dot(a, b), lhs_contracting_dims={}, rhs_contracting_dims={}", ""),
    "convolution_same_padding": (
        "x = f32[2,10,10,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n"
        "ROOT c = f32[2,10,10,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f", ""),
    "convolution_stride": (
        "x = f32[2,11,11,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n"
        "ROOT c = f32[2,5,5,8] convolution(x, k), window={size=3x3 stride=2x2}, dim_labels=b01f_01io->b01f", ""),
    "convolution_stride_padding": (
        "x = f32[2,10,10,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n"
        "ROOT c = f32[2,5,5,8] convolution(x, k), window={size=3x3 stride=2x2 pad=1_1x1_1},"
        " dim_labels=b01f_01io->b01f", ""),
    "convolution_rhs_dilation": (
        "x = f32[2,10,10,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n"
        "ROOT c = f32[2,8,8,8] convolution(x, k), window={size=3x3 pad=1_1x1_1 rhs_dilate=2x2},"
        " dim_labels=b01f_01io->b01f", ""),
    "convolution_lhs_dilation": (
        "x = f32[2,5,5,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n"
        "ROOT c = f32[2,11,11,8] convolution(x, k), window={size=3x3 pad=2_2x2_2 lhs_dilate=2x2},"
        " dim_labels=b01f_01io->b01f", ""),
    "convolution_feature_groups": (
        "x = f32[2,8,8,6] parameter(0)\n k = f32[3,3,2,12] parameter(1)\n"
        "ROOT c = f32[2,8,8,12] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f,"
        " feature_group_count=3", ""),
    "convolution_batch_groups": (
        "x = f32[4,8,8,3] parameter(0)\n k = f32[3,3,3,4] parameter(1)\n"
        "ROOT c = f32[1,6,6,4] convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f,"
        " batch_group_count=4", ""),
    "convolution_weight_gradient": (  # a backward-filter convolution: the kernel is the big operand
        "x = f32[8,9,9,3] parameter(0)\n g = f32[8,9,9,4] parameter(1)\n"
        "ROOT c = f32[3,3,3,4] convolution(x, g), window={size=9x9 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf", ""),
    "convolution_1d_no_window": (
        "x = f32[4,16] parameter(0)\n k = f32[16,32] parameter(1)\n"
        "ROOT c = f32[4,32] convolution(x, k), dim_labels=bf_io->bf", ""),
    # reductions: the reducer once per element folded away
    "reduce": ("p = f32[8,16] parameter(0)\n z = f32[] constant(0)\n"
               "ROOT r = f32[8] reduce(p, z), dimensions={1}, to_apply=add_f32", ""),
    "reduce_all_dims_transcendental_reducer": (
        "p = f32[8,16] parameter(0)\n z = f32[] constant(0)\n"
        "ROOT r = f32[] reduce(p, z), dimensions={0,1}, to_apply=exp_add_f32", ""),
    "reduce_variadic_argmax": (
        "p = f32[8,16] parameter(0)\n i = s32[8,16] iota(), iota_dimension=1\n"
        "z = f32[] constant(-inf)\n zi = s32[] constant(0)\n"
        "ROOT r = (f32[8], s32[8]) reduce(p, i, z, zi), dimensions={1}, to_apply=argmax_f32_s32", ""),
    "reduce_window_pool": (
        "p = f32[2,8,8,3] parameter(0)\n z = f32[] constant(-inf)\n"
        "ROOT r = f32[2,4,4,3] reduce-window(p, z), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=max_f32", ""),
    "reduce_window_padding": (
        "p = f32[2,8,8,3] parameter(0)\n z = f32[] constant(0)\n"
        "ROOT r = f32[2,4,4,3] reduce-window(p, z), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0},"
        " to_apply=add_f32", ""),
    "reduce_window_cumsum": (  # JAX's cumsum: a window over the whole dimension, padded low
        "p = f32[64,256] parameter(0)\n z = f32[] constant(0)\n"
        "ROOT r = f32[64,256] reduce-window(p, z), window={size=64x1 pad=63_0x0_0}, to_apply=add_f32", ""),
    "reduce_window_reduce_then_broadcast": (  # a centred whole-dimension window: XLA's reduce + broadcast
        "p = f32[8,16] parameter(0)\n z = f32[] constant(0)\n"
        "ROOT r = f32[8,16] reduce-window(p, z), window={size=1x31 pad=0_0x15_15}, to_apply=add_f32", ""),
    "reduce_window_base_dilation": (
        "p = f32[8,8] parameter(0)\n z = f32[] constant(0)\n"
        "ROOT r = f32[14,14] reduce-window(p, z), window={size=2x2 lhs_dilate=2x2}, to_apply=add_f32", ""),
    "reduce_window_variadic": (
        "p = f32[8,16] parameter(0)\n i = s32[8,16] iota(), iota_dimension=1\n"
        "z = f32[] constant(-inf)\n zi = s32[] constant(0)\n"
        "ROOT r = (f32[8,8], s32[8,8]) reduce-window(p, i, z, zi), window={size=1x2 stride=1x2},"
        " to_apply=argmax_f32_s32", ""),
    "select_and_scatter": (
        "p = f32[2,8,8,3] parameter(0)\n s = f32[2,4,4,3] parameter(1)\n z = f32[] constant(0)\n"
        "ROOT r = f32[2,8,8,3] select-and-scatter(p, s, z), window={size=1x2x2x1 stride=1x2x2x1},"
        " select=ge_f32, scatter=add_f32", ""),
    "scatter": (
        "p = f32[16,8] parameter(0)\n i = s32[5,1] parameter(1)\n u = f32[5,8] parameter(2)\n"
        "ROOT s = f32[16,8] scatter(p, i, u), update_window_dims={1}, inserted_window_dims={0},"
        " scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add_f32", ""),
    "scatter_variadic": (
        "p = f32[16,8] parameter(0)\n q = s32[16,8] parameter(1)\n i = s32[5,1] parameter(2)\n"
        "u = f32[5,8] parameter(3)\n v = s32[5,8] parameter(4)\n"
        "ROOT s = (f32[16,8], s32[16,8]) scatter(p, q, i, u, v), update_window_dims={1},"
        " inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1,"
        " to_apply=argmax_f32_s32", ""),
    "sort": ("p = f32[8,100] parameter(0)\n"
             "ROOT s = f32[8,100] sort(p), dimensions={1}, to_apply=lt_f32", ""),
    "sort_two_operands": ("p = f32[8,100] parameter(0)\n i = s32[8,100] iota(), iota_dimension=1\n"
                          "ROOT s = (f32[8,100], s32[8,100]) sort(p, i), dimensions={1}, to_apply=lt_f32_s32", ""),
    "map": ("p = f32[8,16] parameter(0)\n q = f32[8,16] parameter(1)\n"
            "ROOT m = f32[8,16] map(p, q), dimensions={0,1}, to_apply=exp_add_f32", ""),
    "fft": ("p = c64[4,16,8] parameter(0)\n ROOT f = c64[4,16,8] fft(p), fft_type=FFT, fft_length={16,8}", ""),
    "triangular_solve": ("a = f32[3,8,8] parameter(0)\n b = f32[3,8,5] parameter(1)\n"
                         "ROOT x = f32[3,8,5] triangular-solve(a, b), left_side=true, lower=true,"
                         " transpose_a=NO_TRANSPOSE", ""),
    "cholesky": ("a = f32[3,8,8] parameter(0)\n ROOT c = f32[3,8,8] cholesky(a), lower=true", ""),
    "all_reduce": ("p = f32[8,16] parameter(0)\n q = f32[4] parameter(1)\n"
                   "ROOT a = (f32[8,16], f32[4]) all-reduce(p, q), replica_groups={}, to_apply=add_f32", ""),
    # called computations
    "call": ("p = f32[8,16] parameter(0)\n c = f32[8,16] call(p), to_apply=body\n"
             "ROOT r = f32[8,16] multiply(c, c)",
             "body {\n  x = f32[8,16] parameter(0)\n  e = f32[8,16] exponential(x)\n"
             "  ROOT y = f32[8,16] add(e, x)\n}\n"),
    "fusion": ("p = f32[8,16] parameter(0)\n z = f32[] constant(0)\n"
               "ROOT f = f32[8] fusion(p, z), kind=kInput, calls=fused",
               "fused {\n  x = f32[8,16] parameter(0)\n  z = f32[] parameter(1)\n  e = f32[8,16] tanh(x)\n"
               "  ROOT r = f32[8] reduce(e, z), dimensions={1}, to_apply=add_f32\n}\n"),
    "while_body_and_condition_once": (
        "z = s32[] constant(0)\n p = f32[8,16] parameter(0)\n t = (s32[], f32[8,16]) tuple(z, p)\n"
        "ROOT w = (s32[], f32[8,16]) while(t), condition=cond, body=body",
        "cond {\n  s = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
        "  n = s32[] constant(10)\n  ROOT c = pred[] compare(i, n), direction=LT\n}\n"
        "body {\n  s = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n"
        "  x = f32[8,16] get-tuple-element(s), index=1\n  one = s32[] constant(1)\n  j = s32[] add(i, one)\n"
        "  e = f32[8,16] exponential(x)\n  y = f32[8,16] multiply(e, x)\n"
        "  ROOT t = (s32[], f32[8,16]) tuple(j, y)\n}\n"),
    "conditional_costliest_branch_each_count": (  # FLOPs of one branch, transcendentals of the other
        "b = s32[] parameter(0)\n p = f32[8,16] parameter(1)\n"
        "ROOT c = f32[8,16] conditional(b, p, p, p), branch_computations={flops3, exp1, nothing}",
        "flops3 {\n  x = f32[8,16] parameter(0)\n  a = f32[8,16] add(x, x)\n  m = f32[8,16] multiply(a, x)\n"
        "  ROOT s = f32[8,16] subtract(m, x)\n}\n"
        "exp1 {\n  x = f32[8,16] parameter(0)\n  e = f32[8,16] exponential(x)\n  ROOT l = f32[8,16] log(e)\n}\n"
        "nothing {\n  ROOT x = f32[8,16] parameter(0)\n}\n"),
    "conditional_predicated": (
        "b = pred[] parameter(0)\n p = f32[8,16] parameter(1)\n"
        "ROOT c = f32[8,16] conditional(b, p, p), true_computation=t, false_computation=f",
        "t {\n  x = f32[8,16] parameter(0)\n  ROOT y = f32[8,16] negate(x)\n}\n"
        "f {\n  x = f32[8,16] parameter(0)\n  ROOT y = f32[8,16] sqrt(x)\n}\n"),
    "body_called_twice": (
        "p = f32[8,16] parameter(0)\n a = f32[8,16] call(p), to_apply=body\n b = f32[8,16] call(a), to_apply=body\n"
        "ROOT r = f32[8,16] add(a, b)",
        "body {\n  x = f32[8,16] parameter(0)\n  ROOT y = f32[8,16] tanh(x)\n}\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcode_rule_matches_xla(name: str) -> None:
    entry, extra = CASES[name]
    assert_matches_xla(module(entry, extra))


def test_transcendentals_are_not_flops() -> None:
    """exp(x) * x on 128 elements: 128 FLOPs and 128 transcendentals, not 256 FLOPs."""
    entry, extra = CASES["mixed_elementwise"]
    assert assert_matches_xla(module(entry, extra)) == Work(flops=128, transcendentals=128)


def test_cumsum_reduce_window_charges_every_window_element() -> None:
    """A cumulative sum over 64 rows adds 63 pairs per output element (padding included)."""
    entry, extra = CASES["reduce_window_cumsum"]
    assert assert_matches_xla(module(entry, extra)).flops == 63 * 64 * 256


def test_stats_print_transcendentals_beside_flops() -> None:
    entry, extra = CASES["mixed_elementwise"]
    text = module_stats(parse_module(module(entry, extra))).format()
    assert "flops: 128" in text and "transcendentals: 128" in text


# ---------------------------------------------------------------- corpus --
CORPUS = sorted(str(Path(p).relative_to(ROOT)) for p in glob.glob(str(ROOT / "golden/corpus/**/*.hlo"),
                                                                     recursive=True))


def test_corpus_is_found() -> None:
    assert len(CORPUS) > 100


@pytest.mark.parametrize("path", CORPUS)
def test_corpus_module_matches_xla_within_one_percent(path: str) -> None:
    """Every corpus module (JAX's lowered, partitioned and compiled programs): FLOPs and
    transcendentals within 1% of XLA's (float32 sums on XLA's side round big counts)."""
    ours, xla = ours_and_xla((ROOT / path).read_text())
    assert ours.flops == pytest.approx(xla.flops, rel=0.01, abs=0.5), f"FLOPs: ours {ours}, XLA {xla}"
    assert ours.transcendentals == pytest.approx(xla.transcendentals, rel=0.01, abs=0.5), \
        f"transcendentals: ours {ours}, XLA {xla}"


# ---------------------------------------------------------------- random --
@pytest.mark.parametrize("block", range(4))
def test_random_modules_match_xla(block: int) -> None:
    """Random programs over every op family the partitioner handles (tests/spmd/random_hlo.py),
    50 seeds per block: counts equal to XLA's exactly."""
    for seed in range(block * 50, block * 50 + 50):
        text = module_from_seed(seed)
        ours, xla = ours_and_xla(text)
        assert ours == xla, f"seed {seed}: ours {ours}, XLA {xla}"
