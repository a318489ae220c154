"""Numerical verification: equal modules verify, deliberate corruptions are
caught, partitioned modules are judged against their unpartitioned originals
(XLA's execution of the original is the oracle)."""

from pathlib import Path

import numpy as np
import pytest

from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.verify import compare_arrays, default_tolerance

ROOT = Path(__file__).resolve().parents[1]

ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"

ORIGINAL = """HloModule m
ENTRY e {
  x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[16,4] parameter(1), sharding={devices=[4,1]<=[4]}
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  c = f32[] constant(2)
  b = f32[8,4] broadcast(c), dimensions={}
  ROOT r = f32[8,4] multiply(d, b), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""

# Contracting dim split 4 ways: partial dots, all-reduce, then each device keeps its row half.
PARTITIONED = """HloModule m, num_partitions=4
""" + ADD + """
ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[4,4] parameter(1), sharding={devices=[4,1]<=[4]}
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ar = f32[8,4] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  table = s32[4] constant({0, 0, 4, 4})
  pid = u32[] partition-id()
  i = s32[1] dynamic-slice(table, pid), dynamic_slice_sizes={1}
  off = s32[] reshape(i)
  zero = s32[] constant(0)
  rows = f32[4,4] dynamic-slice(ar, off, zero), dynamic_slice_sizes={4,4}
  c = f32[] constant(2)
  b = f32[4,4] broadcast(c), dimensions={}
  ROOT r = f32[4,4] multiply(rows, b), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


def test_identical_modules_verify():
    assert verify_equivalent(ORIGINAL, ORIGINAL).ok


def test_partitioned_module_verifies_against_original():
    report = verify_equivalent(ORIGINAL, PARTITIONED)
    assert report.ok, report.format()
    assert "partitioned on 4 devices" in report.format()


@pytest.mark.parametrize("corruption", [
    ("constant(2)\n  b = f32[4,4]", "constant(3)\n  b = f32[4,4]"),                   # a changed constant
    ("ar = f32[8,4] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add",
     "ar = f32[8,4] copy(d)"),                                                         # a dropped all-reduce
    ("constant({0, 0, 4, 4})", "constant({0, 0, 4, 3})"),                              # a wrong dynamic-slice offset
    ("constant({0, 0, 4, 4})", "constant({4, 4, 0, 0})"),                              # swapped output shards
])
def test_corruptions_are_caught(corruption):
    old, new = corruption
    assert old in PARTITIONED
    report = verify_equivalent(ORIGINAL, PARTITIONED.replace(old, new))
    assert not report.ok, report.format()


UNEVEN_ORIGINAL = """HloModule m
ENTRY e {
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[10,6] negate(x), sharding={devices=[4,1]<=[4]}
}
"""
UNEVEN_PARTITIONED = """HloModule m, num_partitions=4
ENTRY e {
  x = f32[3,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[3,6] negate(x), sharding={devices=[4,1]<=[4]}
}
"""


def test_uneven_shards_are_padded_and_cropped():
    assert verify_equivalent(UNEVEN_ORIGINAL, UNEVEN_PARTITIONED).ok
    wrong = UNEVEN_PARTITIONED.replace("negate(x)", "abs(x)").replace("ROOT n", "ROOT n")
    assert not verify_equivalent(UNEVEN_ORIGINAL, wrong).ok


REPLICA = """HloModule m, replica_count=4
""" + ADD + """
ENTRY e {
  x = f32[8] parameter(0)
  ROOT r = f32[8] all-reduce(x), replica_groups={{0,1},{2,3}}, to_apply=add
}
"""


def test_replica_programs_compare_per_replica():
    assert verify_equivalent(REPLICA, REPLICA).ok
    regrouped = REPLICA.replace("{{0,1},{2,3}}", "{{0,2},{1,3}}")
    assert not verify_equivalent(REPLICA, regrouped).ok


@pytest.mark.parametrize("etype", ["pred", "s8", "s32", "u8", "u32", "s64", "f16", "bf16", "f32", "f64",
                                   "c64", "f8e4m3fn"])
def test_every_element_type_runs(etype):
    op = "not" if etype == "pred" else ("negate" if etype[0] in "fcb" or etype.startswith("s") else "copy")
    text = f"HloModule m\nENTRY e {{\n  x = {etype}[4] parameter(0)\n  ROOT y = {etype}[4] {op}(x)\n}}\n"
    assert verify_equivalent(text, text).ok
    if etype not in ("pred",) and op != "copy":
        other = text.replace(f"{op}(x)", "copy(x)")
        assert not verify_equivalent(text, other).ok


def test_nan_positions_must_match():
    want = np.array([1.0, np.nan, 3.0], np.float32)
    assert compare_arrays("0", want, want.copy()).ok
    assert not compare_arrays("0", want, np.array([1.0, 2.0, 3.0], np.float32)).ok
    assert not compare_arrays("0", np.array([np.inf], np.float32), np.array([-np.inf], np.float32)).ok
    assert default_tolerance(np.dtype("int32")) == (0.0, 0.0)


# ------------------------------------------------------------ inputs / compare --
import ml_dtypes  # noqa: E402

from hlo_passes import parse_module  # noqa: E402
from hlo_passes.ir.sharding import Sharding  # noqa: E402
from hlo_passes.runtime import execute_module, load_npz, random_inputs, save_npz  # noqa: E402
from hlo_passes.runtime.partitioned import assemble_array, manual_program, shard_array  # noqa: E402
from hlo_passes.runtime.verify import VerificationError  # noqa: E402
from hlo_passes.runtime import xla_backend  # noqa: E402

CORPUS = ROOT / "golden" / "corpus"


def tiled(text):
    return parse_module(f"HloModule m\nENTRY e {{\n  ROOT x = f32[1] parameter(0), sharding={text}\n}}\n"
                        ).entry.root.sharding


def test_uneven_shards_match_xla_padding():
    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    s = tiled("{devices=[4,1]<=[4]}")
    tiles = [shard_array(x, s, d) for d in range(4)]
    assert [t.shape for t in tiles] == [(3, 3)] * 4          # ceil(10 / 4) rows each
    np.testing.assert_array_equal(tiles[3][0], x[9])          # one real row ...
    np.testing.assert_array_equal(tiles[3][1:], 0)            # ... then zero padding
    back, problem = assemble_array(tiles, s, (10, 3))
    assert problem is None and np.array_equal(back, x)


def test_transposed_device_order_and_replica_disagreement():
    x = np.arange(8, dtype=np.int32)
    s = tiled("{devices=[2,2]<=[2,2]T(1,0) last_tile_dim_replicate}")   # devices 0,2 hold tile 0
    tiles = [shard_array(x, s, d) for d in range(4)]
    assert [list(t) for t in tiles] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    tiles[2] = tiles[2] + 1
    _, problem = assemble_array(tiles, s, (8,))
    assert "devices 0 and 2 hold tile [0]" in problem


def test_inputs_deterministic_and_positive_where_needed():
    text = ("HloModule m\nENTRY e {\n  p = (f32[3], s32[2]) parameter(0)\n  q = f32[3] parameter(1)\n"
            "  a = f32[3] get-tuple-element(p), index=0\n  r = f32[3] reshape(q)\n  l = f32[3] log(r)\n"
            "  ROOT s = f32[3] add(a, l)\n}\n")
    m = parse_module(text)
    first, again, other = random_inputs(m, 0), random_inputs(m, 0), random_inputs(m, 1)
    assert [x.shape for x in first] == [(3,), (2,), (3,)]     # the tuple parameter flattened
    assert [x.dtype for x in first] == [np.float32, np.int32, np.float32]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])
    assert first[2].min() >= 0.5                               # feeds log through a reshape
    np.testing.assert_allclose(execute_module(text, first)[0], first[0] + np.log(first[2]), rtol=1e-6)


def test_signed_inputs_are_negative_too_except_where_they_may_count_a_loop():
    """Signed integers come from [-4, 5), so that a rewrite that mishandles a sign shows; a
    parameter that reaches a loop's state stays in [0, 5) (a loop counting up to a negative
    bound with `!=` would run 2^31 steps); unsigned ones stay in [0, 5)."""
    text = """HloModule m
cond { s = (s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=1
  ROOT ne = pred[] compare(i, n), direction=NE }
body { s = (s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], s32[]) tuple(j, n) }
ENTRY e {
  x = s32[64] parameter(0)
  u = u32[64] parameter(1)
  n = s32[] parameter(2)
  zero = s32[] constant(0)
  t = (s32[], s32[]) tuple(zero, n)
  w = (s32[], s32[]) while(t), condition=cond, body=body
  c = s32[] get-tuple-element(w), index=0
  ROOT r = (s32[64], u32[64], s32[]) tuple(x, u, c)
}
"""
    x, u, n = random_inputs(parse_module(text), 0)
    assert x.min() == -4 and x.max() == 4
    assert u.min() >= 0 and u.max() <= 4
    assert 0 <= int(n) <= 4
    assert int(execute_module(text, [x, u, n])[2]) == int(n)


def test_npz_round_trip_restores_narrow_float_types(tmp_path):
    text = "HloModule m\nENTRY e {\n  x = bf16[4] parameter(0)\n  ROOT y = bf16[4] negate(x)\n}\n"
    m = parse_module(text)
    saved = random_inputs(m, 3)
    save_npz(tmp_path / "in.npz", saved)
    loaded = load_npz(tmp_path / "in.npz", m)
    assert loaded[0].dtype == ml_dtypes.bfloat16 and np.array_equal(loaded[0], saved[0])
    assert np.array_equal(execute_module(text, loaded)[0], -saved[0])
    with pytest.raises(ValueError, match="1 input arrays for 2 parameter leaves"):
        load_npz(tmp_path / "in.npz", parse_module(text.replace("ROOT y = bf16[4] negate(x)",
                                                                 "y = bf16[4] parameter(1)\n  ROOT z = bf16[4] add(x, y)")))


def test_compare_exact_integers_and_message():
    big = np.array([2**60, 5], np.int64)
    stats = compare_arrays("3", big, big + np.array([1, 0]))
    assert not stats.ok and "first mismatch at [0]" in stats.detail
    assert f"expected {2**60}, got {2**60 + 1}" in stats.detail
    assert default_tolerance(ml_dtypes.bfloat16) == (2e-2, 2e-2)
    assert default_tolerance(ml_dtypes.float8_e4m3fn) == (0.25, 0.25)
    assert compare_arrays("0", np.float32([1.0]), np.float32([1.00005])).ok
    assert not compare_arrays("0", np.float32([1.0]), np.float32([1.001])).ok
    assert compare_arrays("0", np.float32([1.0]), np.float32([1.001]), rtol=1e-2).ok


ALL_TYPES = ["pred", "s2", "s4", "s8", "s16", "s32", "s64", "u2", "u4", "u8", "u16", "u32", "u64",
             "f16", "bf16", "f32", "f64", "c64", "c128", "f8e5m2", "f8e4m3", "f8e4m3fn", "f8e3m4",
             "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e8m0fnu", "f4e2m1fn"]


def test_every_element_type_matches_numpy():
    """x + x (or, for pred) through XLA equals numpy's (ml_dtypes') x + x, one module for all types."""
    params = "\n".join(f"  p{i} = {t}[4] parameter({i})" for i, t in enumerate(ALL_TYPES))
    sums = "\n".join(f"  a{i} = {t}[4] {'or' if t == 'pred' else 'add'}(p{i}, p{i})" for i, t in enumerate(ALL_TYPES))
    root = ", ".join(f"a{i}" for i in range(len(ALL_TYPES)))
    shape = ", ".join(f"{t}[4]" for t in ALL_TYPES)
    text = f"HloModule m\nENTRY e {{\n{params}\n{sums}\n  ROOT t = ({shape}) tuple({root})\n}}\n"
    inputs = random_inputs(parse_module(text), 0)
    outputs = execute_module(text, inputs)
    for t, x, y in zip(ALL_TYPES, inputs, outputs):
        assert y.dtype == x.dtype, t
        want = (x | x) if t == "pred" else (x + x)
        assert compare_arrays(t, want, y).ok, (t, x, y)
    assert verify_equivalent(text, text).ok
    corrupted = text.replace("a4 = s16[4] add(p4, p4)", "a4 = s16[4] subtract(p4, p4)")
    report = verify_equivalent(text, corrupted)
    assert not report.ok and report.first_mismatch.index == "4"


# ------------------------------------------------------------------ modes --
def test_partitioned_module_runs_as_manual_program():
    text = manual_program(parse_module(PARTITIONED), 4)
    assert "sharding={manual}" in text and "devices=" not in text
    report = verify_equivalent(ORIGINAL, PARTITIONED)
    assert report.ok and not report.notes, report.format()  # no fallback to a replica program


def test_global_outputs_of_a_partitioned_module_equal_the_original():
    x = np.random.default_rng(5).uniform(-1, 1, (8, 16)).astype(np.float32)
    w = np.random.default_rng(6).uniform(-1, 1, (16, 4)).astype(np.float32)
    np.testing.assert_allclose(execute_module(PARTITIONED, [x, w])[0], 2 * x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(execute_module(ORIGINAL, [x, w], num_devices=4)[0], 2 * x @ w, rtol=1e-5,
                               atol=1e-5)  # mode (b): XLA's SPMD partitioner


TWO_PARTS = """HloModule m, num_partitions=2
""" + ADD + """
ENTRY e {
  x = f32[4,3] parameter(0)
  y = s32[2] parameter(1)
  fy = f32[2] convert(y)
  ar = (f32[4,3], f32[2]) all-reduce(x, fy), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  a = f32[4,3] get-tuple-element(ar), index=0
  b = f32[2] get-tuple-element(ar), index=1
  ROOT t = (f32[4,3], f32[2]) tuple(a, b)
}
"""


def test_variadic_all_reduce_runs_per_device():
    split = TWO_PARTS.replace(
        "ar = (f32[4,3], f32[2]) all-reduce(x, fy), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add\n"
        "  a = f32[4,3] get-tuple-element(ar), index=0\n  b = f32[2] get-tuple-element(ar), index=1",
        "a = f32[4,3] all-reduce(x), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add\n"
        "  b = f32[2] all-reduce(fy), channel_id=2, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add")
    report = verify_equivalent(TWO_PARTS, split)
    assert report.ok and not report.notes, report.format()
    unreduced = split.replace("b = f32[2] all-reduce(fy), channel_id=2, replica_groups={{0,1}}, "
                              "use_global_device_ids=true, to_apply=add", "b = f32[2] copy(fy)")
    report = verify_equivalent(TWO_PARTS, unreduced)
    assert not report.ok and "device" in report.first_mismatch.index


REPLICATED_ROOT = """HloModule m, num_partitions=2
ENTRY e {
  x = f32[4] parameter(0), sharding={replicated}
  pid = u32[] partition-id()
  f = f32[] convert(pid)
  b = f32[4] broadcast(f), dimensions={}
  ROOT r = f32[4] add(x, b), sharding={replicated}
}
"""


def test_replicated_result_must_agree_on_every_device():
    original = "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT r = f32[4] copy(x)\n}\n"
    report = verify_equivalent(original, REPLICATED_ROOT)
    assert not report.ok
    assert "output 0 should be replicated but device 1 differs from device 0" in report.format()


MANUAL_REGION = """HloModule m
""" + ADD + """
ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  s = f32[8,4] custom-call(x), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
  l = f32[2,4] custom-call(s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  ar = f32[2,4] all-reduce(l), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, sharding={manual}
  t = f32[2,4] copy(ar), sharding={manual}
  ROOT g = f32[8,4] custom-call(t), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
}
"""
SUM_OF_BLOCKS = """HloModule m
""" + ADD + """
ENTRY e {
  x = f32[8,4] parameter(0)
  r = f32[4,2,4] reshape(x)
  z = f32[] constant(0)
  s = f32[2,4] reduce(r, z), dimensions={0}, to_apply=add
  b = f32[4,2,4] broadcast(s), dimensions={1,2}
  ROOT g = f32[8,4] reshape(b)
}
"""


def test_manual_region_runs_through_xla_spmd_partitioner():
    report = verify_equivalent(SUM_OF_BLOCKS, MANUAL_REGION, num_devices=4)
    assert report.ok, report.format()
    assert "XLA-partitioned" in report.mode
    wrong = MANUAL_REGION.replace("replica_groups={{0,1,2,3}}", "replica_groups={{0,1},{2,3}}")
    assert not verify_equivalent(SUM_OF_BLOCKS, wrong, num_devices=4).ok


@pytest.mark.parametrize("program", ["sharded_megatron_mlp", "sharded_uneven"])
def test_xla_own_partitioned_output_verifies(program):
    """XLA's SPMD output (no parameter shardings in the text) against its input program."""
    original = (CORPUS / program / f"{program}.lowered.gspmd.hlo").read_text()
    xla = (CORPUS / program / f"{program}.xla_spmd.hlo").read_text()
    report = verify_equivalent(original, xla)
    assert report.ok, report.format()


def test_explicit_shardings_are_used_for_xla_output():
    program = "sharded_megatron_mlp"
    original = (CORPUS / program / f"{program}.lowered.gspmd.hlo").read_text()
    xla = (CORPUS / program / f"{program}.xla_spmd.hlo").read_text()
    params = [p.sharding for p in parse_module(original).entry.parameters]
    root = parse_module(original).entry.root.sharding
    assert verify_equivalent(original, xla, param_shardings=params, root_sharding=root).ok
    with pytest.raises(VerificationError, match=r"cuts the global \[16, 32\] into \[16, 32\] tiles"):
        verify_equivalent(original, xla, param_shardings=[Sharding.replicated()] * len(params),
                          root_sharding=root)
    # The same tiles on the devices in reverse order: every device computes on the wrong shard.
    first = params[0]
    reordered = Sharding.tiled(first.tile_assignment.reshape(-1)[::-1].reshape(first.tile_dims), first.subgroups)
    report = verify_equivalent(original, xla, param_shardings=[reordered] + params[1:], root_sharding=root)
    assert not report.ok


def test_per_device_module_without_shardings_has_no_global_result():
    with pytest.raises(VerificationError, match="no global result"):
        execute_module(REPLICA)


def test_backend_cache_and_device_errors():
    text = "HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] sine(x)\n}\n"
    assert xla_backend.compile_hlo(text) is xla_backend.compile_hlo(text)
    assert xla_backend.compile_hlo(text) is not xla_backend.compile_hlo(text, num_partitions=2, spmd=True)
    with pytest.raises(xla_backend.BackendUnavailable, match="XLA_FLAGS=--xla_force_host_platform_device_count=64"):
        xla_backend.ensure_devices(64)


def test_changed_private_api_names_the_pinned_version(monkeypatch):
    from jax._src.lib import xla_client

    monkeypatch.setattr(xla_backend, "_api_cache", [])
    monkeypatch.delattr(xla_client._xla.mlir, "hlo_to_stablehlo")
    with pytest.raises(xla_backend.BackendUnavailable,
                       match=r"lacks xla_client._xla.mlir.hlo_to_stablehlo.*tested with jax/jaxlib 0.12.0.1"):
        xla_backend.compile_hlo("HloModule m\nENTRY e {\n  ROOT x = f32[] parameter(0)\n}\n")


def test_global_module_is_the_oracle_on_either_side():
    report = verify_equivalent(PARTITIONED, ORIGINAL)
    assert report.ok and report.mode == "partitioned on 4 devices", report.format()


def test_float_outputs_are_judged_against_the_array_scale():
    """A gradient summed in another order (partitioned) moves an element whose terms cancel by
    many of its own ulps, but not by more than the array's scale allows (rtol × max|want|); a
    wrong sign is still wrong, and so is an f32 error far beyond f32's tolerance."""
    want = np.array([292.0, 5.34375, 0.0], ml_dtypes.bfloat16)
    reordered = np.array([291.0, 4.90625, 0.5], ml_dtypes.bfloat16)
    assert compare_arrays("0", want, reordered).ok
    assert not compare_arrays("0", want, np.array([292.0, 5.34375, 9.0], ml_dtypes.bfloat16)).ok
    small = np.array([1.0, 0.5], ml_dtypes.bfloat16)
    assert not compare_arrays("0", small, np.array([1.0, -0.5], ml_dtypes.bfloat16)).ok
    assert not compare_arrays("0", np.float32([292.0, 5.34375]), np.float32([292.0, 4.90625])).ok
    assert not compare_arrays("0", want, reordered, rtol=1e-3).ok  # an explicit rtol is elementwise


_BF16_SUM = """HloModule m

add {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT s = bf16[] add(a, b)
}

addf {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p = bf16[4096] parameter(0)
  q = f32[64] parameter(1)
  zero = bf16[] constant(0)
  %BODY%
  loss = f32[] convert(total)
  zf = f32[] constant(0)
  qs = f32[] reduce(q, zf), dimensions={0}, to_apply=addf
  ROOT t = (f32[], f32[]) tuple(loss, qs)
}
"""
_WHOLE = "total = bf16[] reduce(p, zero), dimensions={0}, to_apply=add"
_HALVES = """lo = bf16[2048] slice(p), slice={[0:2048]}
  hi = bf16[2048] slice(p), slice={[2048:4096]}
  rlo = bf16[] reduce(lo, zero), dimensions={0}, to_apply=add
  rhi = bf16[] reduce(hi, zero), dimensions={0}, to_apply=add
  total = bf16[] add(rlo, rhi)"""


def test_an_f32_output_of_bf16_work_is_judged_at_bf16_precision():
    # The f32 loss of a bf16 model: the same sum rounded at other places (as XLA:GPU's optimized
    # module does next to XLA:CPU's, or a partitioned reduction) moves it by bf16 ulps, far more
    # than f32's 1e-4; the f32 output computed in f32 alone keeps f32's tolerance.
    from hlo_passes.runtime.verify import computed_in

    whole, halves = (parse_module(_BF16_SUM.replace("%BODY%", body)) for body in (_WHOLE, _HALVES))
    assert [str(t) for t in computed_in(whole)] == ["bfloat16", "float32"]
    report = verify_equivalent(whole, halves, seed=3)
    assert report.ok, report.format()
    assert report.outputs[0].rtol == default_tolerance(ml_dtypes.bfloat16)[0]
    assert report.outputs[1].rtol == default_tolerance(np.float32)[0]
    # judged at f32 precision the same pair differs: the looser tolerance is what lets it pass
    want = execute_module(whole, random_inputs(whole, 3))[0]
    got = execute_module(halves, random_inputs(whole, 3))[0]
    assert not compare_arrays("0", want, got).ok
    # a wrong rewrite still fails
    wrong = parse_module(_BF16_SUM.replace("%BODY%", _WHOLE).replace("loss = f32[] convert(total)",
                                                                      "c = f32[] convert(total)\n  two = f32[] constant(2)\n  loss = f32[] multiply(c, two)"))
    assert not verify_equivalent(whole, wrong, seed=3).ok


# A per-device program whose (replicated, unannotated) topk feeds an all-gather nothing reads (a
# collective outlives DCE): XLA's sharding propagation CHECK-failed inferring the manual topk's
# sharding (hlo_sharding.cc "!IsManualLeaf()") and killed the process, so manual_program gives
# every topk a manual sharding.
TOPK_ORIGINAL = """HloModule topk, num_partitions=4
ENTRY main {
  x = f32[5,16] parameter(0)
  y = f32[2] parameter(1)
  t = (f32[1], s32[1]) topk(y), k=1, largest=false, sharding={{devices=[4]0,1,2,3}, {devices=[4]0,1,2,3}}
  i = s32[1] get-tuple-element(t), index=1
  dead = f32[1] convert(i)
  u = (f32[5,2], s32[5,2]) topk(x), k=2, largest=false
  v = f32[5,2] get-tuple-element(u), index=0
  ROOT out = f32[5,2] copy(v), sharding={replicated}
}
"""
TOPK_PARTITIONED = """HloModule topk, num_partitions=4
ENTRY main_spmd {
  x = f32[5,16] parameter(0), sharding={replicated}
  y = f32[2] parameter(1), sharding={replicated}
  t = (f32[1], s32[1]) topk(y), k=1, largest=false
  i = s32[1] get-tuple-element(t), index=1
  g = s32[4] all-gather(i), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  u = (f32[5,2], s32[5,2]) topk(x), k=2, largest=false
  v = f32[5,2] get-tuple-element(u), index=0
  ROOT out = f32[5,2] copy(v), sharding={replicated}
}
"""


def test_a_manual_topk_feeding_a_collective_runs():
    assert "largest=false, sharding={{manual}, {manual}}" in manual_program(parse_module(TOPK_PARTITIONED), 4)
    assert verify_equivalent(TOPK_ORIGINAL, TOPK_PARTITIONED, num_devices=4).ok


def test_a_program_without_outputs_verifies_and_runs():
    """JAX dumps a jit whose function returns nothing as `() -> ()`: it runs on every device and
    gives nothing, so it equals itself (the runner once read outputs of the first output that
    was not there)."""
    from hlo_passes.runtime.xla_backend import run_single

    text = "HloModule empty\n\nENTRY main {\n  ROOT t = () tuple()\n}\n"
    assert run_single(text, []) == []
    assert verify_equivalent(text, text).ok


RNG_PROGRAM = """HloModule m

ENTRY e {
  p = f32[64] parameter(0)
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  r = f32[64] rng(lo, hi), distribution=rng_uniform
  s = f32[64] add(p, r)
  d = f32[64] multiply(p, p)
  ROOT t = (f32[64], f32[64]) tuple(s, d)
}
"""


def test_outputs_drawn_by_the_rng_instruction_are_not_compared():
    """XLA's `rng` draws new numbers on every run (the corpus's `rng` program verified as a
    MISMATCH against itself): what depends on it is compared by type and shape only, every other
    output as before, so a wrong rewrite of those is still caught."""
    first, second = execute_module(RNG_PROGRAM), execute_module(RNG_PROGRAM)
    assert not np.array_equal(first[0], second[0])  # the premise: two runs differ
    report = verify_equivalent(RNG_PROGRAM, RNG_PROGRAM)
    assert report.ok, report.format()
    assert not report.outputs[0].compared and "rng" in report.outputs[0].detail
    assert report.outputs[1].compared
    wrong = RNG_PROGRAM.replace("d = f32[64] multiply(p, p)", "d = f32[64] add(p, p)")
    assert not verify_equivalent(RNG_PROGRAM, wrong).ok
    other_use = RNG_PROGRAM.replace("s = f32[64] add(p, r)", "s = f32[64] subtract(p, r)")
    assert verify_equivalent(RNG_PROGRAM, other_use).ok  # the limit: not comparable: the values are random either way


STEERED_PROGRAM = """HloModule m, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

summed {
  p = (f32[2]) parameter(0)
  x = f32[2] get-tuple-element(p), index=0
  s = f32[2] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[2]) tuple(s)
}

negated {
  p = (f32[2]) parameter(0)
  x = f32[2] get-tuple-element(p), index=0
  n = f32[2] negate(x)
  ROOT t = (f32[2]) tuple(n)
}

ENTRY main_spmd {
  k = s32[] parameter(0)
  x = f32[2] parameter(1)
  y = f32[2] parameter(2)
  i = s32[] clamp(s32[] constant(0), k, s32[] constant(1))
  t = (f32[2]) tuple(x)
  c = (f32[2]) conditional(i, t, t), branch_computations={summed, negated}
  r = f32[2] get-tuple-element(c), index=0
  ROOT o = f32[2] add(r, y)
}
"""


def test_a_parameter_steering_a_branch_with_a_collective_is_the_same_on_every_device():
    """XLA's after_optimizations drops the parameters' shardings, so a per-device program does not
    say its branch index is replicated; with a different index per device the devices wait in
    different collectives and XLA hangs (JAX-program fuzz seed 2020).  Such a parameter gets one
    value on every device; the others stay per device."""
    from hlo_passes.runtime.inputs import per_device_inputs, steering_parameters
    module = parse_module(STEERED_PROGRAM)
    assert steering_parameters(module) == {0}
    args = per_device_inputs(module, 4, seed=1)
    assert all(np.array_equal(a, args[0][0]) for a in args[0])
    assert not all(np.array_equal(a, args[1][0]) for a in args[1])
    report = verify_equivalent(STEERED_PROGRAM, STEERED_PROGRAM)
    assert report.ok and report.mode.startswith("per-device"), report.format()
