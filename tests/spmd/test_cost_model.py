"""The cost model's choice rule (`cost_model.cheapest`), on estimates derived by hand, and the
decision it changes, on a small Megatron layer partitioned end to end."""

import pytest

from hlo_passes import parse_module
from hlo_passes.passes.spmd.cost_model import DEFAULT, CostModel, Estimate, HardwareProfile, cheapest, module_estimate
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent
from tests.spmd.partitioning import collectives

LATENCY = DEFAULT.profile.collective_latency * (1 - DEFAULT.profile.overlap)  # 5 µs exposed


def est(seconds: float, flops: int, collectives: int) -> Estimate:
    return Estimate(seconds=seconds, flops=flops, collectives=collectives, latency_seconds=collectives * LATENCY)


def test_transfer_carries_each_collectives_exposed_latency():
    one = DEFAULT.collective("all-reduce", 1 << 20, group=8)
    two = one + DEFAULT.collective("all-gather", 1 << 20, group=8)
    assert one.latency_seconds == pytest.approx(LATENCY)
    assert two.latency_seconds == pytest.approx(2 * LATENCY)
    assert two.shared_by(2).latency_seconds == pytest.approx(LATENCY)


def test_replicated_work_that_wins_by_nanoseconds_loses_to_a_saved_collective():
    partial_and_all_reduce = est(0.133e-6, flops=500_000, collectives=1)
    gather_both_and_multiply_whole = est(0.110e-6, flops=2_000_000, collectives=2)
    assert gather_both_and_multiply_whole < partial_and_all_reduce  # by transfer time alone
    chosen = cheapest([("gather", gather_both_and_multiply_whole), ("partial", partial_and_all_reduce)])
    assert chosen is not None and chosen[0] == "partial"


def test_replicated_work_that_wins_with_latency_counted_is_kept():
    partial = est(40e-6, flops=500_000, collectives=1)
    replicated = est(10e-6, flops=2_000_000, collectives=2)  # 30 µs cheaper, 5 µs more latency
    assert cheapest([("partial", partial), ("replicated", replicated)])[0] == "replicated"


def test_latency_never_decides_between_candidates_of_equal_flops():
    """Among candidates doing the same work latency only breaks ties: two small collectives that
    move less beat one that moves more, even though their latency would not."""
    one_big = est(2.0e-6, flops=1000, collectives=1)
    two_small = est(1.0e-6, flops=1000, collectives=2)
    assert cheapest([("one", one_big), ("two", two_small)])[0] == "two"


def test_latency_never_buys_replicated_work():
    """A candidate that replicates work and saves a collective does not win by that collective's
    latency: here keeping the op sharded costs 1 µs more and one more collective."""
    sharded = est(2.0e-6, flops=1000, collectives=2)
    replicated = est(1.5e-6 + 0.5e-6 + 1e-9, flops=8000, collectives=1)
    assert cheapest([("sharded", sharded), ("replicated", replicated)])[0] == "sharded"
    assert cheapest([]) is None


ROW_PARALLEL = """HloModule row_parallel, num_partitions=8

ENTRY main {
  heads = f32[8,63,8,8] parameter(0), sharding={devices=[2,1,4,1]<=[8]}
  w = f32[8,8,64] parameter(1), sharding={devices=[4,1,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  ROOT out = f32[8,63,64] dot(heads, w), lhs_contracting_dims={2,3}, rhs_contracting_dims={0,1}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
}
"""


def test_small_row_parallel_matmul_sums_partials_rather_than_gathering_both_operands():
    """A Megatron output projection at d_model 64 (data=2 x model=4): the activation's and the
    weight's contracting dims (heads) are split over the same 4 devices.  Gathering both (two
    all-gathers, 48 KB + 12 KB on each device's wire) moves less than all-reducing the partial
    product (97 KB), but multiplies the whole matrix on every device and launches one more collective; XLA, and
    the cost model with latency counted against replicated work, do the local partial matmul and
    one all-reduce over the model devices."""
    module = parse_module(ROW_PARALLEL)
    SpmdPartitioner(num_partitions=8).run(module)
    assert collectives(module) == {"all-reduce": 1}
    assert verify_equivalent(ROW_PARALLEL, module).ok


# ------------------------------------------------------------------ fusion --
# A profile whose FLOPs cost nothing, so a kernel's time is the bytes it touches over the
# memory bandwidth and each case's bytes can be read off the estimate.

MEMORY_BOUND = CostModel(HardwareProfile("memory-bound", flops={"f32": 1e30}, memory_bandwidth=1.0,
                                         link_bandwidth=1.0, collective_latency=0.0))


def _bytes_touched(text: str, fused: bool) -> float:
    return module_estimate(parse_module(text), MEMORY_BOUND, fused=fused).seconds


def test_an_elementwise_chain_into_a_reduce_reads_its_input_once():
    """exp, multiply, reduce over f32[1024]: one fused kernel reads the 4 KiB input and the
    init, and writes the scalar; op by op, exp writes 4 KiB, multiply reads it twice and
    writes 4 KiB, and the reduce reads that back."""
    text = """HloModule chain
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY main {
  p = f32[1024] parameter(0)
  e = f32[1024] exponential(p)
  m = f32[1024] multiply(e, e)
  zero = f32[] constant(0)
  ROOT r = f32[] reduce(m, zero), dimensions={0}, to_apply=add
}
"""
    n = 4096
    assert _bytes_touched(text, fused=True) == pytest.approx(n + 4 + 4)
    assert _bytes_touched(text, fused=False) == pytest.approx((n + n) + (n + n + n) + (n + 4 + 4))


def test_a_value_a_dot_reads_is_written_and_a_broadcast_into_elementwise_is_not():
    """The dot cannot fuse its producer: the add's result is written (and read by the dot);
    the broadcast feeding the add is read as its 4-byte operand; the root tanh writes its
    result."""
    text = """HloModule dot
ENTRY main {
  x = f32[16,16] parameter(0)
  w = f32[16,16] parameter(1)
  s = f32[] parameter(2)
  b = f32[16,16] broadcast(s), dimensions={}
  a = f32[16,16] add(x, b)
  d = f32[16,16] dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = f32[16,16] tanh(d)
}
"""
    m = 16 * 16 * 4
    broadcast = 4            # reads its scalar; result fused into the add
    add = m + m              # reads x (a parameter), writes for the dot; b is fused
    dot = m + m + m          # reads a and w, writes d
    tanh = m + m             # reads d, writes the root
    assert _bytes_touched(text, fused=True) == pytest.approx(broadcast + add + dot + tanh)


CALLED_CHAIN = """HloModule called
body {
  b0 = f32[1024] parameter(0)
  t = f32[1024] tanh(b0)
  ROOT pair = (f32[1024], f32[1024]) tuple(t, b0)
}
ENTRY main {
  p = f32[1024] parameter(0)
  e = f32[1024] exponential(p)
  c = (f32[1024], f32[1024]) call(e), to_apply=body
  g0 = f32[1024] get-tuple-element(c), index=0
  g1 = f32[1024] get-tuple-element(c), index=1
  ROOT n = f32[1024] add(g0, g1)
}
"""
INLINED_CHAIN = """HloModule inlined
ENTRY main {
  p = f32[1024] parameter(0)
  e = f32[1024] exponential(p)
  t = f32[1024] tanh(e)
  ROOT n = f32[1024] add(t, e)
}
"""


def test_calls_cost_what_their_inlined_bodies_cost():
    """XLA inlines calls before it fuses: exp, the called tanh (through a root tuple and
    get-tuple-elements) and the add are one kernel that reads p and writes the root, 8 KiB,
    exactly as the module with the call inlined by hand; the call itself moves nothing."""
    n = 4096
    assert _bytes_touched(INLINED_CHAIN, fused=True) == pytest.approx(n + n)
    assert _bytes_touched(CALLED_CHAIN, fused=True) == pytest.approx(n + n)


def test_a_body_called_from_two_places_keeps_its_boundaries():
    """With two call sites there is no one call to see through: the body's parameter is read
    from memory and its results are written, at each site."""
    twice = CALLED_CHAIN.replace("  g0 = f32[1024] get-tuple-element(c), index=0",
                                 "  c2 = (f32[1024], f32[1024]) call(e), to_apply=body\n"
                                 "  g0 = f32[1024] get-tuple-element(c2), index=0")
    assert _bytes_touched(twice, fused=True) > _bytes_touched(CALLED_CHAIN, fused=True) + 4096


def test_the_fused_charge_never_exceeds_the_op_by_op_charge_on_random_modules():
    """Fusion only removes memory traffic: on random modules of every op family, partitioned,
    the fused estimate's compute is at most the op-by-op one (and below it on modules with
    element-wise chains), its communication and FLOPs the same."""
    from tests.spmd.random_hlo import module_from_seed

    lower = 0
    for seed in range(12):
        module = parse_module(module_from_seed(seed))
        SpmdPartitioner(num_partitions=module.num_partitions).run(module)
        fused = module_estimate(module, DEFAULT, fused=True)
        unfused = module_estimate(module, DEFAULT, fused=False)
        assert fused.seconds <= unfused.seconds * (1 + 1e-12), seed
        assert (fused.bytes, fused.flops, fused.collectives) == (unfused.bytes, unfused.flops, unfused.collectives)
        lower += fused.seconds < unfused.seconds
    assert lower >= 6, lower
