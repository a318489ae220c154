"""Whole-plan choices the cost model makes beyond one instruction (issue 11): an embedding
lookup whose table and ids are sharded over the same devices along different dims is planned
both ways and the cheaper program kept (plan_trials), and a small value wanted whole is
recomputed from values every device holds rather than all-gathered (recompute).  Each case
checks the plan the hand-derived costs call for and verifies the result against XLA's run of
the unpartitioned module on 8 devices."""

from __future__ import annotations

from hlo_passes import parse_module
from hlo_passes.passes.spmd import plan_trials
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from tests.spmd.partitioning import collectives, partition, partition_verified


def _lookup_then_matmul(tokens: int, seq: int, d: int, vocab: int = 64) -> str:
    """An embedding lookup (table sharded along its features, ids along the batch, FSDP-style:
    the same 8 devices) feeding a matmul with a weight sharded along its contracting dim; the
    result is wanted batch-sharded."""
    return f"""HloModule lookup, num_partitions=8
ENTRY main {{
  table = f32[{vocab},{d}] parameter(0), sharding={{devices=[1,8]<=[8]}}
  ids = s32[{tokens},{seq}] parameter(1), sharding={{devices=[8,1]<=[8]}}
  w = f32[{d},{d}] parameter(2), sharding={{devices=[8,1]<=[8]}}
  lo = s32[] constant(0)
  hi = s32[] constant({vocab - 1})
  clamped = s32[{tokens},{seq}] clamp(lo, ids, hi)
  idx = s32[{tokens},{seq},1] reshape(clamped)
  emb = f32[{tokens},{seq},{d}] gather(table, idx), offset_dims={{2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=2, slice_sizes={{1,{d}}}
  h = f32[{tokens},{seq},{d}] dot(emb, w), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  ROOT t = f32[{tokens},{seq},{d}] tanh(h), sharding={{devices=[8,1,1]<=[8]}}
}}
"""


def _gathered_weight(module, d: int) -> bool:
    return any(i.opcode.value == "all-gather" and list(i.shape.dims) == [d, d] for i in module.all_instructions())


def test_lookup_follows_the_table_when_the_weights_outweigh_the_activations():
    """8 x 2 tokens, d=512: gathering the [512,512] weight (the ids' plan) moves 7/8 MB a
    device; contracting the feature-sharded activation and reduce-scattering the 8x2x512
    partial sums to the batch moves 28 KB.  The table's plan is kept, said so, and the weight never moves."""
    text = _lookup_then_matmul(8, 2, 512)
    module, _ = partition_verified(text)
    _, _, remarks = partition(text)
    assert any("follows its table's sharding" in r.message for r in remarks), remarks
    assert not _gathered_weight(module, 512)
    assert collectives(module)["reduce-scatter"] == 1, collectives(module)


def test_lookup_follows_the_ids_when_the_activations_outweigh_the_weights():
    """512 x 16 tokens, d=64: the activation (2 MB) outweighs the [64,64] weight (16 KB):
    the ids' plan (gather the weight, multiply each device's tokens) stays, and the trial of
    the table's plan is reported as kept out."""
    text = _lookup_then_matmul(512, 16, 64)
    module, _ = partition_verified(text)
    _, _, remarks = partition(text)
    assert any("was tried and kept out" in r.message for r in remarks), remarks
    assert not any("follows its table's sharding" in r.message for r in remarks)
    assert _gathered_weight(module, 64)


def test_a_lookup_the_user_annotated_is_not_tried_the_other_way():
    """An annotation on the lookup is the user's plan: no trial, no remark about one."""
    text = _lookup_then_matmul(8, 2, 512).replace("slice_sizes={1,512}", "slice_sizes={1,512}, "
                                                  "sharding={devices=[8,1,1]<=[8]}")
    module = parse_module(text)
    assert plan_trials.lookups_worth_a_trial(module) is False
    _, _, remarks = partition(text)
    assert not any("table's sharding" in r.message for r in remarks)


def test_a_lookup_whose_result_already_keeps_the_tables_tiling_is_no_conflict():
    """Ids sharded over `data` and the table over `model` (a 2 x 4 mesh, Megatron style): the
    result takes both, nothing to try."""
    text = """HloModule megatron_lookup, num_partitions=8
ENTRY main {
  table = f32[64,32] parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  ids = s32[4,3,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT emb = f32[4,3,32] gather(table, ids), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,32}
}
"""
    module = parse_module(text)
    SpmdPartitioner(num_partitions=8).run(parse_module(text))
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation

    ShardingPropagation().run(module)
    assert plan_trials.alternatives(module, set()) == []
    partition_verified(text)


def test_a_snapshot_is_kept_only_where_a_table_is_tiled_along_what_the_lookup_slices_whole():
    """The snapshot before propagation costs memory: it is taken for a table tiled along its
    features, also when JAX looks it up inside a called `_take` computation, and not for a
    table sharded along the vocabulary (each id reads one row: nothing to follow) or
    replicated."""
    def module(table_sharding: str) -> str:
        return f"""HloModule m, num_partitions=8
_take {{
  t = f32[64,32] parameter(0)
  i = s32[4,1] parameter(1)
  ROOT g = f32[4,32] gather(t, i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,32}}
}}

ENTRY main {{
  table = f32[64,32] parameter(0), sharding={table_sharding}
  ids = s32[4,1] parameter(1), sharding={{devices=[8,1]<=[8]}}
  ROOT r = f32[4,32] call(table, ids), to_apply=_take
}}
"""
    assert plan_trials.lookups_worth_a_trial(parse_module(module("{devices=[1,8]<=[8]}")))
    assert not plan_trials.lookups_worth_a_trial(parse_module(module("{devices=[8,1]<=[8]}")))
    assert not plan_trials.lookups_worth_a_trial(parse_module(module("{replicated}")))


# ------------------------------------------------------------- recompute --
def test_statistics_wanted_whole_are_recomputed_from_the_all_reduced_sum_not_gathered():
    """A layer norm's mean over features sharded 8 ways: the reduce all-reduces the partial
    sums (every device then holds all 8 means), the mean's small arithmetic is pinned to the
    batch sharding, and its broadcast back over the feature-sharded input wants it whole.
    Gathering it back would pay a collective's latency for 8 floats; the chain is recomputed
    from the all-reduced sums instead: one all-reduce, no all-gather."""
    text = """HloModule stats, num_partitions=8
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,256] parameter(0), sharding={devices=[1,8]<=[8]}
  zero = f32[] constant(0)
  sum = f32[8] reduce(x, zero), dimensions={1}, to_apply=add
  n = f32[8] constant({256, 256, 256, 256, 256, 256, 256, 256})
  mean = f32[8] divide(sum, n), sharding={devices=[8]<=[8]}
  bmean = f32[8,256] broadcast(mean), dimensions={0}
  ROOT centred = f32[8,256] subtract(x, bmean), sharding={devices=[1,8]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-reduce": 1}, collectives(module)


def test_a_value_not_held_whole_anywhere_is_still_gathered():
    """The same chain starting from a batch-sharded parameter: nothing upstream is whole, so
    recomputing would need a collective as well: the all-gather stays."""
    text = """HloModule stats_sharded, num_partitions=8
ENTRY main {
  x = f32[8,256] parameter(0), sharding={devices=[1,8]<=[8]}
  m = f32[8] parameter(1), sharding={devices=[8]<=[8]}
  n = f32[8] constant({256, 256, 256, 256, 256, 256, 256, 256})
  mean = f32[8] divide(m, n), sharding={devices=[8]<=[8]}
  bmean = f32[8,256] broadcast(mean), dimensions={0}
  ROOT centred = f32[8,256] subtract(x, bmean), sharding={devices=[1,8]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}, collectives(module)


def test_a_large_chain_is_gathered_rather_than_recomputed():
    """Forty exponentials of a [1024,1024] value whole on every device cost far more than
    all-gathering the result once: the cost model gathers."""
    ops = ["  e0 = f32[1024,1024] divide(sum, n), sharding={devices=[8,1]<=[8]}"]
    for k in range(1, 40):
        ops.append(f"  e{k} = f32[1024,1024] exponential(e{k - 1}), sharding={{devices=[8,1]<=[8]}}")
    body = "\n".join(ops)
    text = f"""HloModule big_chain, num_partitions=8
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[1024,1024,8] parameter(0), sharding={{devices=[1,1,8]<=[8]}}
  zero = f32[] constant(0)
  sum = f32[1024,1024] reduce(x, zero), dimensions={{2}}, to_apply=add
  c = f32[] constant(1e6)
  n = f32[1024,1024] broadcast(c), dimensions={{}}
{body}
  ROOT r = f32[1024,1024] copy(e39), sharding={{replicated}}
}}
"""
    module, _, _ = partition(text)
    assert collectives(module)["all-gather"] == 1, collectives(module)


# ------------------------------------------------------ random lookups --
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _random_lookup(draw):
    """A lookup, a layer norm over the features and a matmul, at random sizes (uneven ones
    included) with the table, ids, weight and result sharded over 2, 4 or 8 devices in
    random ways: both plans of every trial, and every recompute, must compute the same."""
    n = draw(st.sampled_from([2, 4, 8]))
    tokens, seq = draw(st.integers(1, 12)), draw(st.integers(1, 5))
    d, vocab = draw(st.integers(2, 40)), draw(st.integers(2, 20))
    tiled = f"{{devices=[{n},1]<=[{n}]}}"
    table = draw(st.sampled_from([f"{{devices=[1,{n}]<=[{n}]}}", tiled, "{replicated}"]))
    ids = draw(st.sampled_from([f"{{devices=[{n},1]<=[{n}]}}", f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}"]))
    weight = draw(st.sampled_from([tiled, f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}"]))
    out = draw(st.sampled_from([f"{{devices=[{n},1,1]<=[{n}]}}", f"{{devices=[1,1,{n}]<=[{n}]}}", "{replicated}"]))
    return f"""HloModule random_lookup, num_partitions={n}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  table = f32[{vocab},{d}] parameter(0), sharding={table}
  ids = s32[{tokens},{seq}] parameter(1), sharding={ids}
  w = f32[{d},{d}] parameter(2), sharding={weight}
  lo = s32[] constant(0)
  hi = s32[] constant({vocab - 1})
  clamped = s32[{tokens},{seq}] clamp(lo, ids, hi)
  idx = s32[{tokens},{seq},1] reshape(clamped)
  emb = f32[{tokens},{seq},{d}] gather(table, idx), offset_dims={{2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=2, slice_sizes={{1,{d}}}
  zero = f32[] constant(0)
  sum = f32[{tokens},{seq}] reduce(emb, zero), dimensions={{2}}, to_apply=add
  count = f32[] constant({d})
  counts = f32[{tokens},{seq}] broadcast(count), dimensions={{}}
  mean = f32[{tokens},{seq}] divide(sum, counts)
  means = f32[{tokens},{seq},{d}] broadcast(mean), dimensions={{0,1}}
  centred = f32[{tokens},{seq},{d}] subtract(emb, means)
  h = f32[{tokens},{seq},{d}] dot(centred, w), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  ROOT t = f32[{tokens},{seq},{d}] tanh(h), sharding={out}
}}
"""


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(text=_random_lookup())
def test_random_lookups_partition_to_what_the_original_computes(text):
    """Correctness only: a size-1 or uneven dim may leave an op to the replicating fallback."""
    from hlo_passes.runtime import verify_equivalent

    n = int(text.split("num_partitions=")[1].split("\n")[0])
    _, out, _ = partition(text, n)
    report = verify_equivalent(text, out, num_devices=n)
    assert report.ok, report.format() + "\n" + out
