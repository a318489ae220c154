"""weight-update-sharding on real JAX data-parallel training steps (golden/corpus), each
rewritten and compared with the original on 8 devices.

Inputs are positive (floats in [0.1, 1)) so Adam's second moment has a real square root
and every output is finite: a NaN would hide a wrong value.  Weights and optimizer state
get the same input on every device (data parallelism); batches differ per device.

These tests check the rewrite itself, so they shard every update the analysis allows
(`only_when_it_pays=False`) with one collective per tensor (`pack_threshold_bytes=0`);
pricing and packing have their own tests (test_optax_programs.py).
"""

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.manager import structural_problems
from hlo_passes.passes.registry import lookup
from hlo_passes.passes.spmd.cost_model import CostModel, module_estimate
from hlo_passes.passes.weight_update_sharding.weight_update_sharding import WeightUpdateSharding
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.per_device import as_replica_program, execute
from hlo_passes.runtime.verify import _declared_replicated, run_single_device

CORPUS = Path(__file__).resolve().parents[2] / "golden" / "corpus"
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "weight-update-sharding"
N = 8

# MLP 16-32-10-6-5: per weight, elements per device = ceil(size / 8) (flattened, padded).
MLP_CHUNKS = sorted(math.ceil(s / N) for s in (32, 10, 6, 5, 16 * 32, 32 * 10, 10 * 6, 6 * 5))


def corpus(program: str, form: str) -> str:
    return (CORPUS / program / f"{program}.{form}.hlo").read_text()


def positive(shape, rng) -> np.ndarray:
    dtype = shape.element_type.numpy_dtype()
    if shape.element_type.is_float:
        return rng.uniform(0.1, 1.0, shape.dims).astype(dtype)
    return rng.integers(0, 5, shape.dims).astype(dtype)


FORCED = {"only_when_it_pays": False, "pack_threshold_bytes": 0}


def rewrite(text: str, *, pipeline=(), **options):
    options = {**FORCED, **options}
    module = parse_module(text)
    for name in pipeline:
        cls = lookup(name)
        (cls(num_partitions=N) if name == "spmd-partition" else cls()).run(module)
    wus = WeightUpdateSharding(**options)
    changed = wus.run(module)
    out = print_module(module)
    assert not structural_problems(parse_module(out))
    return out, changed, wus.remarks


def collectives(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for instr in parse_module(text).all_instructions():
        if instr.opcode in (Opcode.ALL_REDUCE, Opcode.REDUCE_SCATTER, Opcode.ALL_GATHER):
            found.setdefault(instr.opcode.value, []).append(instr.shape.dims if instr.shape.is_array else None)
    return found


def assert_same_per_device(original: str, rewritten: str) -> None:
    """Both per-device programs on 8 devices; parameters declared replicated on either side get
    one input for all devices."""
    a, b = parse_module(original), parse_module(rewritten)
    rng = np.random.default_rng(0)
    inputs = []
    for pa, pb in zip(a.entry.parameters, b.entry.parameters):
        same = _declared_replicated(pa) or _declared_replicated(pb)
        arrays = [positive(pa.shape, rng) for _ in range(1 if same else N)]
        inputs.append(arrays * N if same else arrays)
    want, got = execute(original, inputs, N), execute(rewritten, inputs, N)
    for device, (w_outs, g_outs) in enumerate(zip(want, got)):
        assert len(w_outs) == len(g_outs)
        for i, (w, g) in enumerate(zip(w_outs, g_outs)):
            assert np.isfinite(w.astype(np.float64)).all(), f"output {i}: the test inputs give non-finite values"
            np.testing.assert_allclose(g, w, rtol=3e-5, atol=1e-6, err_msg=f"device {device} output {i}")


def assert_same_as_logical(original: str, rewritten: str) -> None:
    """A logical (unpartitioned) original against a partitioned rewrite, on positive inputs."""
    rng = np.random.default_rng(1)
    inputs = [positive(p.shape, rng) for p in parse_module(original).entry.parameters]
    want = run_single_device(parse_module(original), inputs)
    assert all(np.isfinite(w.astype(np.float64)).all() for w in want)
    report = verify_equivalent(original, rewritten, inputs=inputs, rtol=3e-5, atol=1e-6)
    assert report.ok, report.format()


# ----------------------------------------------- jit DP, XLA's partitioner --
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw_clip", "lamb"])
def test_jit_data_parallel_xla_partitioned(optimizer):
    original = corpus(f"train_dp_jit_{optimizer}_mlp", "xla_spmd")
    out, changed, remarks = rewrite(original, assume_replicated_parameters=True)
    assert changed and not [r for r in remarks if r.kind == "missed"]
    found = collectives(out)
    # every gradient is reduce-scattered (flattened, padded) and every new weight all-gathered
    assert sorted(d[0] for d in found["reduce-scatter"]) == MLP_CHUNKS
    outputs_per_weight = {"sgd": 1, "momentum": 2, "adam": 3, "adamw_clip": 3, "lamb": 3}[optimizer]
    assert sorted(d[0] for d in found["all-gather"]) == sorted(c * N for c in MLP_CHUNKS * outputs_per_weight)
    # all-reduces left are scalars: the loss, and norm partials (global for clipping, per weight
    # for LAMB: ‖u‖ and ‖w‖, the weight's norm reduced on its shard too)
    scalars = {"sgd": 1, "momentum": 1, "adam": 1, "adamw_clip": 1 + 8, "lamb": 1 + 8 + 8}[optimizer]
    assert [d for d in found["all-reduce"] if d] == [] and len(found["all-reduce"]) == scalars
    assert_same_per_device(original, out)


def test_jit_transformer_xla_partitioned():
    original = corpus("train_dp_jit_adamw_clip_transformer", "xla_spmd")
    before = collectives(original)
    out, changed, remarks = rewrite(original, assume_replicated_parameters=True)
    assert changed and not [r for r in remarks if r.kind == "missed"]
    gradients = [d for d in before["all-reduce"] if d]
    assert len(collectives(out)["reduce-scatter"]) == len(gradients) == 12
    assert_same_per_device(original, out)


# ------------------------------------------------ jit DP, our partitioner --
@pytest.mark.parametrize("program,keep_state", [
    ("train_dp_jit_sgd_mlp", False), ("train_dp_jit_adam_mlp", False), ("train_dp_jit_adam_mlp", True),
    ("train_dp_jit_lamb_mlp", True), ("train_dp_jit_adamw_clip_transformer", True)])
def test_jit_data_parallel_ours(program, keep_state):
    """spmd-partition's output carries logical shardings (params replicated: provably so);
    with keep-state-sharded the state signature becomes tiles and still verifies against
    the unpartitioned program."""
    lowered = corpus(program, "lowered.gspmd")
    pipeline = ("spmd-partition", "call-inliner")  # LAMB computes its norms in calls
    out, changed, remarks = rewrite(lowered, pipeline=pipeline, keep_state_sharded=keep_state)
    assert changed and not [r for r in remarks if r.kind == "missed"], [r.format() for r in remarks]
    if keep_state:  # some state comes in and goes out as tiles; more tiled inputs than the batch
        before = parse_module(corpus(program, "lowered.gspmd")).entry.parameters
        entry = parse_module(out).entry
        tiled_before = sum(1 for p in before if p.sharding is not None and p.sharding.is_tiled)
        tiled_after = sum(1 for p in entry.parameters if p.sharding is not None and p.sharding.is_tiled)
        assert tiled_after > tiled_before
        assert sum(e.is_tiled for e in entry.root.sharding.elements) == tiled_after - tiled_before
    assert_same_as_logical(lowered, out)


def test_keep_state_sharded_signature():
    """Adam on the MLP: mu and nu (16 tensors) come in and go out as tiles over 8 devices,
    each on the dimension that pads least (10x6: 6 columns to 8, not 10 rows to 16)."""
    out, _, _ = rewrite(corpus("train_dp_jit_adam_mlp", "lowered.gspmd"), pipeline=("spmd-partition",),
                        keep_state_sharded=True)
    entry = parse_module(out).entry
    state = [p for p in entry.parameters if "mu" in p.name or "nu" in p.name]
    assert len(state) == 16
    for p in state:
        assert p.sharding.is_tiled and math.prod(p.sharding.tile_dims) == N
    shapes = sorted(p.shape.dims for p in state if "mu" in p.name)
    assert shapes == sorted([(4,), (2,), (1,), (1,), (2, 32), (4, 10), (10, 1), (1, 5)])
    weights = [p for p in entry.parameters if p.name.startswith("p")]
    assert all(p.sharding.is_replicated for p in weights)


# ------------------------------------------------- pmap: manual-region body --
@pytest.mark.parametrize("program", ["train_dp_pmap_sgd_mlp", "train_dp_pmap_momentum_mlp",
                                     "train_dp_pmap_adam_mlp", "train_dp_pmap_adamw_clip_mlp",
                                     "train_dp_pmap_lamb_mlp", "train_dp_pmap_adam_transformer"])
def test_pmap_data_parallel(program):
    """XLA's per-device module of a pmap step: the update lives in the shard_map body (a call);
    weights reach it through copies and the call's parameters."""
    original = corpus(program, "xla_spmd")
    out, changed, remarks = rewrite(original, assume_replicated_parameters=True)
    assert changed and not [r for r in remarks if r.kind == "missed"]
    assert all(r.computation != parse_module(original).entry.name for r in remarks)  # in the body
    assert "parameter_replication={true}" in out
    assert_same_per_device(original, out)


def test_replica_style_program():
    """The same pmap step as a `replica_count=8` program: shards are indexed by replica-id."""
    original = as_replica_program(corpus("train_dp_pmap_adam_mlp", "xla_spmd"), N)
    assert parse_module(original).replica_count == N
    out, changed, _ = rewrite(original, assume_replicated_parameters=True)
    assert changed and "replica-id()" in out and "partition-id()" not in out
    assert sorted(d[0] for d in collectives(out)["reduce-scatter"]) == MLP_CHUNKS
    assert_same_per_device(original, out)


# ------------------------------------------------------------ declines --
def test_unproven_replication_is_declined():
    """XLA's partitioned module does not say the weights are replicated: without the
    assumption nothing changes and every gradient gets a missed remark."""
    original = corpus("train_dp_jit_sgd_mlp", "xla_spmd")
    out, changed, remarks = rewrite(original)
    assert not changed and out == print_module(parse_module(original))
    missed = [r for r in remarks if r.kind == "missed"]
    assert len(missed) == 8 and all("not provably identical" in r.message for r in missed)
    assert all(r.source.startswith("golden/corpus/make_corpus.py:") for r in missed)


def test_verification_needs_replicated_weights():
    """The check can fail: the same rewrite compared with weights that differ per device
    (parameter_replication dropped) mixes shards of different weights."""
    original = corpus("train_dp_pmap_sgd_mlp", "xla_spmd")
    out, _, _ = rewrite(original, assume_replicated_parameters=True)
    stripped = out.replace(", parameter_replication={true}", "")
    assert not verify_equivalent(original, stripped).ok
    assert verify_equivalent(original, out).ok


@pytest.mark.parametrize("case,words", [
    ("decline_other_user", "another user %probe: dot"),
    ("decline_not_replicated", "%w is not provably identical"),
    ("decline_non_sum", "non-sum reduction (maximum)"),
    ("decline_nonuniform_groups", "non-uniform replica groups"),
    ("decline_factor_transposed", "%rn: a broadcast of a row or column reduction over other dimensions"),
])
def test_decline_remarks(case, words):
    text = (GOLDEN / f"{case}.hlo").read_text()
    _, _, remarks = rewrite(text)
    missed = [r for r in remarks if r.kind == "missed"]
    assert len(missed) == 1 and words in missed[0].message, [r.format() for r in remarks]
    assert missed[0].instruction in ("g",)
    applied = Counter(r.kind for r in remarks)["applied"]
    assert applied == 0


# ------------------------------------------------ default options: priced --
MOMENTUM_STEP = """HloModule momentum_step, replica_count=8

add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }

ENTRY step {
  w = f32[1024,1024] parameter(0), parameter_replication={true}
  v = f32[1024,1024] parameter(1), parameter_replication={true}
  x = f32[1024,1024] parameter(2)
  dw = f32[1024,1024] multiply(w, x)
  g = f32[1024,1024] all-reduce(dw), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  mu = f32[] constant(0.9)
  mub = f32[1024,1024] broadcast(mu), dimensions={}
  decayed = f32[1024,1024] multiply(v, mub)
  new_v = f32[1024,1024] add(decayed, g)
  lr = f32[] constant(0.05)
  lrb = f32[1024,1024] broadcast(lr), dimensions={}
  step = f32[1024,1024] multiply(new_v, lrb)
  new_w = f32[1024,1024] subtract(w, step)
  ROOT out = (f32[1024,1024], f32[1024,1024]) tuple(new_w, new_v)
}
"""


def _wire_bytes(text: str) -> int:
    return module_estimate(parse_module(text)).bytes


def test_priced_decline_when_gathering_state_costs_more():
    """SGD-momentum returning its velocity whole (the local gradient w·x stands for the backward
    pass, which reads the weight: so w' is the weight, v' the state): sharded, it would all-gather the velocity too
    (one more all-gather, 7/8 of 4 MiB on the wire), to save 7/8 of an update that XLA runs as
    one kernel reading 3 and writing 2 tensors.  On the accelerator profile that does not pay, with
    or without overlap: declined, the module untouched, the remark giving both estimates."""
    out, changed, remarks = rewrite(MOMENTUM_STEP, only_when_it_pays=True)
    assert not changed and out == print_module(parse_module(MOMENTUM_STEP))
    (r,) = remarks
    assert r.kind == "missed" and r.instruction == "g"
    assert "costs more than it saves (1 optimizer-state output(s) all-gathered" in r.message, r.format()
    assert "with the rewrite" in r.message and "without" in r.message and "accelerator profile" in r.message
    forced, _, _ = rewrite(MOMENTUM_STEP)  # what it declined: more bytes on the wire
    assert _wire_bytes(forced) > _wire_bytes(out)
    assert_same_per_device(MOMENTUM_STEP, out)


def test_priced_rewrite_where_it_pays():
    """The same step where it pays: on the cpu profile memory is slow beside the links (2:1, not
    7.4:1), so the sharded update saves more than the velocity's all-gather costs."""
    out, changed, remarks = rewrite(MOMENTUM_STEP, only_when_it_pays=True, cost_profile="cpu")
    assert changed and [r.kind for r in remarks] == ["applied"], [r.format() for r in remarks]
    assert collectives(out)["reduce-scatter"] == [(131072,)]
    assert_same_per_device(MOMENTUM_STEP, out)


SGD_STEP = """HloModule sgd_step, replica_count=8

add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }

ENTRY step {
  b = f32[SIZE] parameter(0), parameter_replication={true}
  c = f32[SIZE] parameter(1), parameter_replication={true}
  x = f32[SIZE] parameter(2)
  db = f32[SIZE] multiply(b, x)
  dc = f32[SIZE] multiply(c, x)
  gb = f32[SIZE] all-reduce(db), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  gc = f32[SIZE] all-reduce(dc), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  lr = f32[] constant(0.05)
  lrb = f32[SIZE] broadcast(lr), dimensions={}
  new_b = f32[SIZE] subtract(b, f32[SIZE] multiply(gb, lrb))
  new_c = f32[SIZE] subtract(c, f32[SIZE] multiply(gc, lrb))
  ROOT out = (f32[SIZE], f32[SIZE]) tuple(new_b, new_c)
}
"""


def test_priced_sgd_formatting_and_latency():
    """Plain SGD (no state), two weights.  Padded from 1001 to 1008, the pad before the
    reduce-scatter and the slice after the all-gather are two copies of each gradient, more than
    the 7/8 of a three-pass update they save: both declined by price.  At 1008 (no padding) the
    rewrite moves the same wire bytes and saves compute, and the two are packed into one
    reduce-scatter and one all-gather: applied.  A single weight's collectives have nothing to
    pack with: one more collective's latency (10 µs) is more than 7/8 of its update saves."""
    padded = SGD_STEP.replace("SIZE", "1001")
    out, changed, remarks = rewrite(padded, only_when_it_pays=True, pack_threshold_bytes=4 << 20)
    assert not changed and [r.kind for r in remarks] == ["missed", "missed"]
    assert all("costs more than it saves (the gradient padded from 1001 to 1008 elements)" in r.message
               for r in remarks), [r.format() for r in remarks]
    assert_same_per_device(padded, out)

    even = SGD_STEP.replace("SIZE", "1008")
    out, changed, remarks = rewrite(even, only_when_it_pays=True, pack_threshold_bytes=4 << 20)
    assert changed and [r.kind for r in remarks] == ["applied", "applied"], [r.format() for r in remarks]
    assert len(collectives(out)["reduce-scatter"]) == 1 and "all-reduce" not in collectives(out)
    assert _wire_bytes(out) == _wire_bytes(even)
    assert_same_per_device(even, out)

    single = (even.replace("gc = f32[1008] all-reduce(dc), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add",
                           "gc = f32[1008] multiply(dc, dc)"))
    out, changed, remarks = rewrite(single, only_when_it_pays=True, pack_threshold_bytes=4 << 20)
    assert not changed and [r.kind for r in remarks] == ["missed"], [r.format() for r in remarks]
    assert "cannot be packed with others, and one more collective's latency" in remarks[0].message
    assert_same_per_device(single, out)


def test_an_activation_all_reduce_is_not_called_a_gradient():
    """A row-parallel layer's partial sums all-reduced over the model axis feed the next matmul:
    no output of the step is computed elementwise from them, so the remark says what it is not
    (a weight's gradient) and names the reader, instead of "the reduced gradient has another user"."""
    text = """HloModule row_parallel, replica_count=8

add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }

ENTRY step {
  x = f32[4,16] parameter(0)
  w1 = f32[16,32] parameter(1), parameter_replication={true}
  w2 = f32[32,8] parameter(2), parameter_replication={true}
  partial = f32[4,32] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  h = f32[4,32] all-reduce(partial), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  zero = f32[] constant(0)
  zeros = f32[4,32] broadcast(zero), dimensions={}
  relu = f32[4,32] maximum(h, zeros)
  ROOT y = f32[4,8] dot(relu, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    out, changed, remarks = rewrite(text)
    assert not changed
    (r,) = remarks
    assert r.kind == "missed" and r.instruction == "h"
    assert "not a weight's gradient: no output of the step is computed elementwise from it" in r.message, r.format()
    assert "%y reads it: dot" in r.message and "the reduced gradient" not in r.message
    assert_same_per_device(text, out)


# ---------------------------------------- whole-tensor reductions of the weight --
def _whole_reductions(text: str) -> list[str]:
    """The reduces over every dimension of a rank-2 value (a full-weight or full-gradient norm)."""
    return [i.name for i in parse_module(text).all_instructions()
            if i.opcode is Opcode.REDUCE and i.shape.is_array and i.shape.rank == 0 and i.operands[0].shape.rank == 2]


def test_weight_norm_reduced_on_the_shard():
    """LAMB's ‖w‖ (golden lamb_trust_ratio): the weight is sliced for the update anyway, so its
    norm is a partial sum of the shard (padding masked: 60 of 64) and a scalar all-reduce, like
    the update's norm; no device reads the whole weight for it any more."""
    text = (GOLDEN / "lamb_trust_ratio.hlo").read_text()
    assert _whole_reductions(text) == ["wn2", "un2"]
    out, changed, remarks = rewrite(text)
    assert changed and [r.kind for r in remarks] == ["applied"]
    assert _whole_reductions(out) == [] and collectives(out)["all-reduce"] == [(), ()]
    assert_same_per_device(text, out)


LAMB_STEP = """HloModule lamb_step, replica_count=8

add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }
max { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] maximum(a, b) }

ENTRY step {
  w = f32[DIMS] parameter(0), parameter_replication={true}
  v = f32[DIMS] parameter(1), parameter_replication={true}
  m = f32[DIMS] parameter(2), parameter_replication={true}
  x = f32[DIMS] parameter(3)
  dw = f32[DIMS] multiply(w, x)
  g = f32[DIMS] all-reduce(dw), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  zero = f32[] constant(0)
  ww = f32[DIMS] multiply(NORMED, NORMED)
  wn2 = f32[] reduce(ww, zero), dimensions={0,1}, to_apply=add
  wn = f32[] sqrt(wn2)
  beta = f32[] constant(0.9)
  betab = f32[DIMS] broadcast(beta), dimensions={}
  new_m = f32[DIMS] add(f32[DIMS] multiply(m, betab), g)
  wd = f32[] constant(0.01)
  wdb = f32[DIMS] broadcast(wd), dimensions={}
  u = f32[DIMS] add(new_m, f32[DIMS] multiply(w, wdb))
  uu = f32[DIMS] multiply(u, u)
  un2 = f32[] reduce(uu, zero), dimensions={0,1}, to_apply=add
  un = f32[] sqrt(un2)
  ratio = f32[] divide(wn, un)
  sb = f32[DIMS] broadcast(ratio), dimensions={}
  new_w = f32[DIMS] subtract(w, f32[DIMS] multiply(u, sb))
  ROOT out = (f32[DIMS], f32[DIMS]) tuple(new_w, new_m)
}
"""


def _price(text: str, **options):
    """The trial price of the one component of `text` (what the pass compares before it rewrites)."""
    wus = WeightUpdateSharding(only_when_it_pays=False, **options)
    ((price, _, _),) = wus._shard(parse_module(text), chosen=None).values()
    return price


def test_weight_norm_is_priced():
    """The weight's norm moves into the price: without the rewrite it is one more kernel reading
    the whole 512 KiB weight; with it, it reads the chunk the update reads anyway (no more bytes)
    and adds one scalar all-reduce, which is packed with the update's norm (both are of the same
    level: no launch more), or is one launch more unpacked.  A norm of `v`, which the update does
    not read, stays whole and out of both prices."""
    text = LAMB_STEP.replace("DIMS", "512,256")
    ours, other = _price(text.replace("NORMED", "w")), _price(text.replace("NORMED", "v"))
    model = CostModel.for_profile("accelerator")
    weight_read = 512 * 256 * 4 / model.profile.memory_bandwidth
    assert ours.without.seconds - other.without.seconds == pytest.approx(weight_read, rel=0.01)
    assert ours.without.collectives == other.without.collectives == 1
    assert ours.with_rewrite.collectives == other.with_rewrite.collectives
    unpacked = [_price(text.replace("NORMED", x), pack_threshold_bytes=0) for x in "wv"]
    assert unpacked[0].with_rewrite.collectives == unpacked[1].with_rewrite.collectives + 1
    assert ours.with_rewrite.seconds - other.with_rewrite.seconds < 0.01 * weight_read
    # w·w, and its sum: 512·256 - 1 additions (a reduce of n elements to one adds n - 1, as XLA counts)
    assert ours.without.flops - other.without.flops == 2 * 512 * 256 - 1
    assert ours.with_rewrite.flops - other.with_rewrite.flops == 2 * 512 * 256 // N - 1  # of the chunk


def test_weight_reductions_masked_and_left_whole():
    """A maximum of |w| over a padded weight (10x6 to 64: the padding filled with -inf) and a norm
    of the old state ‖m‖ are reduced on the shard; a norm whose square something else returns
    stays whole (`ww` is computed whole anyway)."""
    text = (LAMB_STEP.replace("DIMS", "10,6").replace("NORMED", "w")
            .replace("zero = f32[] constant(0)", "zero = f32[] constant(0)\n  ninf = f32[] constant(-inf)\n"
                     "  wmax = f32[] reduce(f32[10,6] abs(w), ninf), dimensions={0,1}, to_apply=max\n"
                     "  mn2 = f32[] reduce(f32[10,6] multiply(m, m), zero), dimensions={0,1}, to_apply=add")
            .replace("ratio = f32[] divide(wn, un)", "ratio = f32[] divide(f32[] add(wn, wmax), f32[] add(un, mn2))"))
    out, changed, _ = rewrite(text)
    assert changed and _whole_reductions(out) == [] and len(collectives(out)["all-reduce"]) == 4
    assert_same_per_device(text, out)
    shared = text.replace("ROOT out = (f32[10,6], f32[10,6]) tuple(new_w, new_m)",
                          "ROOT out = (f32[10,6], f32[10,6], f32[10,6]) tuple(new_w, new_m, ww)")
    out, changed, _ = rewrite(shared)
    assert changed and _whole_reductions(out) == ["wn2"]
    assert_same_per_device(shared, out)


KEPT_LAMB = """HloModule kept_lamb

add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }

ENTRY step {
  w = f32[10,6] parameter(0), sharding={replicated}
  m = f32[10,6] parameter(1), sharding={replicated}
  x = f32[16,10] parameter(2), sharding={devices=[8,1]<=[8]}
  dy = f32[16,6] parameter(3), sharding={devices=[8,1]<=[8]}
  y = f32[16,6] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  err = f32[16,6] subtract(y, dy)
  g = f32[10,6] dot(x, err), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={replicated}
  zero = f32[] constant(0)
  one = f32[] constant(1)
  wn2 = f32[] reduce(f32[10,6] multiply(w, w), zero), dimensions={0,1}, to_apply=add
  mn2 = f32[] reduce(f32[10,6] multiply(m, m), zero), dimensions={0,1}, to_apply=add
  beta = f32[] constant(0.9)
  betab = f32[10,6] broadcast(beta), dimensions={}
  new_m = f32[10,6] add(f32[10,6] multiply(m, betab), g)
  ratio = f32[] divide(f32[] sqrt(wn2), f32[] add(f32[] sqrt(mn2), one))
  ratiob = f32[10,6] broadcast(ratio), dimensions={}
  step = f32[10,6] multiply(new_m, ratiob)
  new_w = f32[10,6] subtract(w, step)
  ROOT out = (f32[10,6], f32[10,6]) tuple(new_w, new_m), sharding={{replicated}, {replicated}}
}
"""


def test_state_norm_kept_sharded():
    """With the state kept sharded, a norm of the state itself (‖m‖) is reduced on its tile (as is
    ‖w‖ on the weight's chunk), so nothing else reads the whole state: its parameter and output
    still become 10x1 tiles."""
    out, changed, remarks = rewrite(KEPT_LAMB, pipeline=("spmd-partition",), keep_state_sharded=True)
    assert changed and [r.kind for r in remarks] == ["applied"], [r.format() for r in remarks]
    (m,) = [p for p in parse_module(out).entry.parameters if p.name == "m"]
    assert m.shape.dims == (10, 1) and m.sharding.is_tiled and _whole_reductions(out) == []
    assert_same_as_logical(KEPT_LAMB, out)


# ------------------------------------ reductions over some of the gradient's dims --
@pytest.mark.parametrize("case", ["row_norms", "factored_moments_padded"])
def test_row_and_column_reductions(case):
    """Goldens: per-row norms (8x4, one whole row per device: reduced on the device) and an
    Adafactor-style factored moment on a padded 10x6 gradient (tiled on its 6 columns: the column
    factor keeps a tile of its own, masked where it is summed; the row factor is a masked partial
    sum all-reduced as a [10] vector and held whole).  Per device they compute what the original
    computes, and no device reduces a whole gradient."""
    text = (GOLDEN / f"{case}.hlo").read_text()
    out, changed, remarks = rewrite(text)
    assert changed and all(r.kind == "applied" for r in remarks), [r.format() for r in remarks]
    assert "tiled on dimension" in remarks[0].message
    assert not any(i.opcode is Opcode.REDUCE and i.operands[0].shape.rank == 2 and i.operands[0].shape.element_count > 10
                   for i in parse_module(out).all_instructions())
    assert_same_per_device(text, out)


CONTROL_ORDERED = """HloModule ordered, replica_count=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  w = f32[16] parameter(0), parameter_replication={true}
  g = f32[16] parameter(1)
  v = f32[16] parameter(2), parameter_replication={true}
  h = f32[16] parameter(3)
  ga = f32[16] all-reduce(g), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
  ha = f32[16] all-reduce(h), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add, control-predecessors={ga}
  w2 = f32[16] subtract(w, ga)
  v2 = f32[16] subtract(v, ha)
  ROOT t = (f32[16], f32[16]) tuple(w2, v2)
}
"""


def test_an_all_reduce_ordered_by_control_edges_is_left_whole():
    """`ha` waits on `ga` through a control edge: rewriting either would replace it and drop
    the order (the pass raised an IRError erasing `ga`).  Both are declined with a remark,
    and the module is unchanged and valid."""
    module = parse_module(CONTROL_ORDERED)
    wus = WeightUpdateSharding(**FORCED)
    assert not wus.run(module)
    assert structural_problems(module) == ""
    declined = [r.message for r in wus.remarks if "control edges" in r.message]
    assert len(declined) == 2, [r.message for r in wus.remarks]
    free = parse_module(CONTROL_ORDERED.replace(", control-predecessors={ga}", ""))
    assert WeightUpdateSharding(**FORCED).run(free)  # the same program without the edge is sharded
