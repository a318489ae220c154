"""Data-movement family modules where our partition moved more than XLA's (issue 11, the `dm_*`
probes in benchmarks/spmd_families): a gather or scatter with explicit batching dims whose
operand is also tiled along a passthrough dim (the batch and the columns partition together:
no collective), and a reshape whose tiles do not line up across a merge-then-split of a
sharded dim (a halo exchange of sub-rows instead of gathering the operand).  Each checks the
plan by hand-derived counts and verifies the result against XLA's run of the unpartitioned
module on 8 devices."""

from __future__ import annotations

from collections import Counter

from hlo_passes.ir.opcode import Opcode
from hlo_passes.runtime import verify_equivalent
from hlo_passes.stats import module_stats
from tests.spmd.partitioning import collectives, partition, partition_verified


def _bytes(module) -> int:
    return sum(module_stats(module).collective_bytes.values())


def _ops(module) -> Counter[str]:
    return Counter(i.opcode.value for i in module.all_instructions())


def _only(module, opcode: Opcode):
    found = [i for i in module.all_instructions() if i.opcode is opcode]
    assert len(found) == 1, found
    return found[0]


def test_gather_with_batching_dims_keeps_the_operands_passthrough_tiling():
    """Batch dim 0 (4) tiled 2 ways, passthrough dim 2 (32 columns) 4 ways, indices tiled by
    batch only: each device gathers its 2 batch rows' 16 indices from its 8 columns — the
    result tile f32[2,16,8] with slice_sizes {1,1,8}, nothing moved (it gathered the columns
    before: 8192 bytes)."""
    text = """HloModule gb, num_partitions=8
ENTRY e {
  x = f32[4,128,32] parameter(0), sharding={devices=[2,1,4]<=[8]}
  idx = s32[4,16,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[4,16,32] gather(x, idx), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,32}, sharding={devices=[2,1,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert not collectives(module)
    g = _only(module, Opcode.GATHER)
    assert tuple(g.array_shape.dims) == (2, 16, 8)
    assert tuple(g.attr("slice_sizes")) == (1, 1, 8)


def test_gather_with_batching_dims_takes_the_result_passthrough_tiling_for_a_replicated_operand():
    """The operand whole on every device, the result tiled by batch and columns: each device
    gathers straight into its tile from its local slice of the operand (no result-sized
    dynamic-slice afterwards, no collective)."""
    text = """HloModule gr, num_partitions=8
ENTRY e {
  x = f32[4,64,32] parameter(0), sharding={replicated}
  idx = s32[4,8,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[4,8,32] gather(x, idx), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,32}, sharding={devices=[2,1,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert not collectives(module)
    assert tuple(_only(module, Opcode.GATHER).array_shape.dims) == (2, 8, 8)


def test_scatter_with_batching_dims_keeps_the_batch_tiling_beside_the_passthrough_tiling():
    """The scatter twin: operand and updates tiled [2,1,4] (batch, -, columns), indices by
    batch: each device scatters its batch rows' updates into its columns — the local scatter
    is f32[2,128,8] with updates f32[2,16,8] and indices s32[2,16,1]; nothing moves (the
    passthrough path alone gathered the batch: 9344 bytes)."""
    text = """HloModule sb, num_partitions=8
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[4,128,32] parameter(0), sharding={devices=[2,1,4]<=[8]}
  idx = s32[4,16,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  u = f32[4,16,32] parameter(2), sharding={devices=[2,1,4]<=[8]}
  ROOT s = f32[4,128,32] scatter(x, idx, u), update_window_dims={2}, inserted_window_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, scatter_dims_to_operand_dims={1}, index_vector_dim=2, to_apply=add, sharding={devices=[2,1,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert not collectives(module)
    s = _only(module, Opcode.SCATTER)
    assert tuple(s.array_shape.dims) == (2, 128, 8)
    assert [tuple(o.array_shape.dims) for o in s.operands[1:]] == [(2, 16, 1), (2, 16, 8)]


def test_reshape_whose_tiles_do_not_line_up_exchanges_sub_rows():
    """[2,3,7,10] tiled 2 ways on the 7 (tiles of 4 and 3 rows) -> [3,2,1,14,5] tiled 2 ways on
    the 14 (7 rows each).  Output tile 1 is elements 35..69 of the 70-element group; input tile
    1 holds 40..69 (and 10 padding elements).  In sub-rows of gcd(10, 35) = 5 elements: tile 1
    needs sub-rows 7..13 and holds 8..15, so it takes sub-row 7 from tile 0 — 5 elements for
    each of the 2*3 outer positions, 120 bytes in one collective-permute (it gathered the
    operand before: 960 bytes)."""
    text = """HloModule rh, num_partitions=8
ENTRY e {
  x = f32[2,3,7,10] parameter(0), sharding={devices=[1,1,2,1,4]<=[8] last_tile_dim_replicate}
  ROOT r = f32[3,2,1,14,5] reshape(x), sharding={devices=[1,1,1,2,1,4]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 2 * 3 * 5 * 4


def test_reshape_split_with_a_halo_from_the_left_neighbour_only():
    """f32[6,20] tiled 4 ways (2 rows, the last tile all padding) -> f32[24,5] tiled 4 ways (6
    rows = 30 elements).  Sub-rows of gcd(20, 30) = 10: input tile t holds sub-rows 4t..4t+3,
    output tile t needs 3t..3t+2, so tile t takes t sub-rows from tile t-1 (3 at most: within
    the neighbour), by collective-permute, and nothing is gathered."""
    text = """HloModule rs, num_partitions=8
ENTRY e {
  x = f32[6,20] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  ROOT r = f32[24,5] reshape(x), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    found = collectives(module)
    assert set(found) == {"collective-permute"}, found
    assert _bytes(module) < 6 * 20 * 4 // 4 * 3  # less than what an all-gather sends in


def test_reshape_whose_output_tiles_drift_past_the_neighbours_permutes_per_distance():
    """f32[12,8,64] tiled 8 ways (2 rows) -> f32[96,64] tiled 8 ways (12 rows): output tile 7
    reads input tile 5, two tiles away; the exchange takes one permute per distance and the
    price prefers it to gathering the operand (each device receives 6 KiB, not 28 KiB; the
    `reshape_merge` family row, where XLA's partition permutes 7 KiB)."""
    text = """HloModule rm, num_partitions=8
ENTRY e {
  x = f32[12,8,64] parameter(0), sharding={devices=[8,1,1]<=[8]}
  ROOT r = f32[96,64] reshape(x), sharding={devices=[8,1]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert set(collectives(module)) == {"collective-permute"}
    assert _bytes(module) == 6144


def test_tile_to_partial_on_a_2d_mesh_permutes_before_the_gathers():
    """[2,4] -> [1,2,4] last_tile_dim_replicate over f32[64,64]: the plan gathered rows (2 KiB
    sent), permuted the gathered 4 KiB, then gathered columns (4 KiB): 10 KiB.  With the
    permute moved before the first gather each device first takes the 32x16 piece its pair
    then completes: 2 + 2 + 4 KiB, XLA's 8 KiB and order."""
    text = """HloModule tp, num_partitions=8
ENTRY e {
  x = f32[64,64] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT c = f32[64,64] copy(x), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1, "all-gather": 2}
    assert _bytes(module) == 32 * 16 * 4 + 32 * 16 * 4 + 32 * 32 * 4
    order = [i.opcode.value for i in module.entry.post_order() if i.opcode.is_collective]
    assert order[0] == "collective-permute"


_DUS = """HloModule dus_const, num_partitions=8
ENTRY e {{
  x = f32[{n},32] parameter(0), sharding={{devices=[8,1]<=[8]}}
  u = f32[{u},32] parameter(1), sharding={{devices=[8,1]<=[8]}}
  ROOT d = f32[{n},32] dynamic-update-slice(x, u, s32[] constant({at}), s32[] constant(0)), sharding={{devices=[8,1]<=[8]}}
}}
"""


def test_update_at_a_constant_start_fetches_only_the_rows_that_change_device():
    """f32[128,32] tiled 8 ways (16 rows), a 64-row update tiled 8 ways (8 rows) written at row
    32: result tile t (t = 2..5) takes update rows 16(t-2)..+16, two update tiles.  Each device
    receives at most those 16 rows (2 KiB), by collective-permutes of 8-row pieces; nothing is
    gathered (it all-to-all'ed operand and update to columns and back before: 5 KiB; XLA
    gathers both: 3 KiB sent)."""
    module, _ = partition_verified(_DUS.format(n=128, u=64, at=32))
    found = collectives(module)
    assert set(found) == {"collective-permute"}, found
    assert _bytes(module) == 2 * 8 * 32 * 4


def test_update_at_a_constant_start_that_cuts_tiles_and_is_clamped():
    """The same with tiles the update starts and ends inside of (20 rows at row 5 over tiles of
    8, update tiles of 3 rows, the last one short), and with a start past the end that XLA
    clamps to 128 - 20 = 108: both verify, no all-gather."""
    for at in (5, 200):
        module, _ = partition_verified(_DUS.format(n=128, u=20, at=at))
        assert "all-gather" not in collectives(module)


def test_slice_of_a_sort_along_its_sharded_dim_reads_the_replicated_sort_result():
    """A sort along its 8-way tiled dim runs on the gathered rows (every device sorts all
    4096) and its result is sliced to its own tiling; the slice of the first 8 columns wants
    them replicated.  It takes the sort's replicated result (through the get-tuple-element)
    instead of gathering the tiles back: one all-gather of the 4x512 input (8 KiB sent), XLA's
    plan (it gathered twice before: 16 KiB)."""
    text = """HloModule st, num_partitions=8
gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ia = s32[] parameter(2)
  ib = s32[] parameter(3)
  ROOT c = pred[] compare(a, b), direction=GT
}
ENTRY e {
  x = f32[4,4096] parameter(0), sharding={devices=[1,8]<=[8]}
  i = s32[4,4096] iota(), iota_dimension=1, sharding={devices=[1,8]<=[8]}
  s = (f32[4,4096], s32[4,4096]) sort(x, i), dimensions={1}, is_stable=true, to_apply=gt, sharding={{devices=[1,8]<=[8]}, {devices=[1,8]<=[8]}}
  v = f32[4,4096] get-tuple-element(s), index=0, sharding={devices=[1,8]<=[8]}
  ROOT k = f32[4,8] slice(v), slice={[0:4], [0:8]}, sharding={replicated}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 4 * 512 * 4


def test_sliced_result_still_serves_users_of_its_own_tiling():
    """The wider form is taken only where it costs less: a user of the sort's own tiling
    (negate, [1,8]) reads the sliced tiles, nothing more is moved for it."""
    text = """HloModule sw, num_partitions=8
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[4,1024] parameter(0), sharding={devices=[1,8]<=[8]}
  s = f32[4,1024] sort(x), dimensions={1}, to_apply=lt, sharding={devices=[1,8]<=[8]}
  n = f32[4,1024] negate(s), sharding={devices=[1,8]<=[8]}
  k = f32[4,8] slice(s), slice={[0:4], [0:8]}, sharding={replicated}
  ROOT t = (f32[4,1024], f32[4,8]) tuple(n, k), sharding={{devices=[1,8]<=[8]}, {replicated}}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    neg = _only(module, Opcode.NEGATE)
    assert tuple(neg.array_shape.dims) == (4, 128)


def test_gather_without_batching_dims_runs_index_parallel_beside_the_passthrough_tiling():
    """Indices tiled 2 ways by rows, the operand's 64 columns 4 ways over the other mesh axis,
    the result [2,4] over both: each device gathers its 16 rows of indices from its 16 columns
    — nothing moves (the passthrough plan alone gathered the indices: 64 bytes)."""
    text = """HloModule gip, num_partitions=8
ENTRY e {
  x = f32[128,64] parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  idx = s32[32,1] parameter(1), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[32,64] gather(x, idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}, sharding={devices=[2,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert not collectives(module)
    g = _only(module, Opcode.GATHER)
    assert tuple(g.array_shape.dims) == (16, 16)
    assert tuple(g.attr("slice_sizes")) == (1, 16)


def test_reshape_of_size_one_dims_tiled_has_no_halo_to_plan():
    """A group of size-1 dims only, the result tiling its size-1 dim (fuzz seed 9096): no
    sub-rows to exchange, the reshape is planned as before (it raised IndexError)."""
    text = """HloModule r1, num_partitions=2
ENTRY e {
  x = f32[1,1] parameter(0), sharding={replicated}
  ROOT r = f32[1] reshape(x), sharding={devices=[2]0,1}
}
"""
    _, out, _ = partition(text, n=2)
    assert verify_equivalent(text, out, num_devices=2).ok


def test_reshape_exchanges_sub_rows_only_from_an_operand_already_tiled_for_it():
    """A fused qkv projection's heads merged back ([b,s,3,h,e] tiled over the heads ->
    [b,s,3*h*e] tiled 4 ways, as gpt_dense in benchmarks/spmd_models.py): the sub-row exchange
    would need the operand retiled over the 3 first (an all-to-all into an uneven tiling) and
    then a permute, which wins per instruction by transfer time and lost 3.6% of the model's
    estimated step; the heads are gathered and the result sliced, XLA's plan."""
    text = """HloModule qkv_merge, num_partitions=8
ENTRY e {
  x = f32[4,16,3,8,8] parameter(0), sharding={devices=[2,1,1,4,1]<=[8]}
  ROOT r = f32[4,16,192] reshape(x), sharding={devices=[2,1,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
