"""Gathers and scatters whose operand is tiled on what XLA calls trivially sliced dims (indexed,
slice size 1) together with passthrough dims, or only on explicit batching dims
(handlers/gather.py).  Each case states the collectives and local shapes it expects and is
verified on 8 devices against the unpartitioned module."""


import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent
from tests.spmd.partitioning import collectives as _collectives
from tests.spmd.partitioning import partition_verified as _partition

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
"""


def _only(module, opcode: Opcode):
    (op,) = [i for i in module.entry.instructions if i.opcode is opcode]
    return op


@pytest.mark.parametrize("v,out", [
    (512, "{devices=[1,1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"),   # result split like the columns
    (500, "{devices=[1,1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"),   # uneven vocabulary tiles
])
def test_table_tiled_by_vocabulary_and_embedding_keeps_both(v, out):
    """A [vocab, embed] table tiled [4,2]: each device gathers its 32 columns of its 128 rows
    with shifted, masked ids, and the four vocabulary tiles' partial rows are summed — one
    all-reduce over groups of 4, the table never moves (it was all-gathered over embed)."""
    text = f"""HloModule emb2d, num_partitions=8
ENTRY e {{
  table = f32[{v},64] parameter(0), sharding={{devices=[4,2]<=[8]}}
  ids = s32[4,16] parameter(1), sharding={{replicated}}
  ROOT g = f32[4,16,64] gather(table, ids), offset_dims={{2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=2, slice_sizes={{1,64}}, sharding={out}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {"all-reduce": 1}
    g = _only(module, Opcode.GATHER)
    assert g.shape.to_hlo(False) == "f32[4,16,32]" and g.attr("slice_sizes") == (1, 32)
    assert [list(x) for x in _only(module, Opcode.ALL_REDUCE).replica_groups.groups] == [
        [0, 2, 4, 6], [1, 3, 5, 7]]


def test_gradient_scattered_into_a_table_tiled_both_ways_stays_local():
    """The matching scatter-add: every device adds the updates' columns it holds into its rows
    (indices shifted; updates of other rows fall outside and are skipped): no collective."""
    text = f"""HloModule emb2d_grad, num_partitions=8
{ADD}
ENTRY e {{
  table = f32[512,64] parameter(0), sharding={{devices=[4,2]<=[8]}}
  ids = s32[4,16] parameter(1), sharding={{replicated}}
  u = f32[4,16,64] parameter(2), sharding={{replicated}}
  ROOT s = f32[512,64] scatter(table, ids, u), update_window_dims={{2}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=add, sharding={{devices=[4,2]<=[8]}}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {}
    assert _only(module, Opcode.SCATTER).shape.to_hlo(False) == "f32[128,32]"


def test_take_along_axis_of_batch_tiled_logits_with_whole_labels():
    """Logits tiled by batch, labels whole: each device takes its batch rows of the labels (a
    local slice) and gathers from its own logits; only the small result is gathered (XLA does
    the same; this was replicated, the logits all-gathered)."""
    text = """HloModule tal, num_partitions=8
ENTRY e {
  logits = f32[8,6,40] parameter(0), sharding={devices=[8,1,1]<=[8]}
  labels = s32[8,6,1] parameter(1), sharding={replicated}
  ROOT g = f32[8,6,1] gather(logits, labels), offset_dims={}, collapsed_slice_dims={2}, start_index_map={2}, operand_batching_dims={0,1}, start_indices_batching_dims={0,1}, index_vector_dim=3, slice_sizes={1,1,1}, sharding={replicated}
}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {"all-gather": 1}
    assert _only(module, Opcode.GATHER).shape.to_hlo(False) == "f32[1,6,1]"
    assert _only(module, Opcode.ALL_GATHER).shape.to_hlo(False) == "f32[8,6,1]"


def test_scatter_with_batching_dims_into_batch_tiled_operand_stays_local():
    text = f"""HloModule sbatch, num_partitions=8
{ADD}
ENTRY e {{
  x = f32[8,6,40] parameter(0), sharding={{devices=[8,1,1]<=[8]}}
  labels = s32[8,6,1] parameter(1), sharding={{replicated}}
  u = f32[8,6] parameter(2), sharding={{replicated}}
  ROOT s = f32[8,6,40] scatter(x, labels, u), update_window_dims={{}}, inserted_window_dims={{2}}, scatter_dims_to_operand_dims={{2}}, input_batching_dims={{0,1}}, scatter_indices_batching_dims={{0,1}}, index_vector_dim=2, to_apply=add, sharding={{devices=[8,1,1]<=[8]}}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {}
    assert _only(module, Opcode.SCATTER).shape.to_hlo(False) == "f32[1,6,40]"


@pytest.mark.parametrize("v", [64, 60])
def test_out_of_range_ids_clamp_like_the_unpartitioned_gather(v):
    """A gather clamps a start index into the operand: id 70 of 60 rows reads row 59, -3 reads
    row 0.  Shifted into each device's rows without that clamp, id 70 was found on no device
    (zeros; XLA's own partitioner does the same) or, with uneven tiles, in the last device's
    padding."""
    text = f"""HloModule oob, num_partitions=8
ENTRY e {{
  table = f32[{v},16] parameter(0), sharding={{devices=[8,1]<=[8]}}
  ids = s32[6,1] constant({{{{70}}, {{-3}}, {{{v - 1}}}, {{{v}}}, {{63}}, {{7}}}})
  ROOT g = f32[6,16] gather(table, ids), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,16}}, sharding={{replicated}}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {"all-reduce": 1}


def test_pred_and_complex_tables_gather_by_rows():
    """Row-sharded pred and c64 tables take the same masked local gather (false / zero
    elsewhere) with an OR / add all-reduce, instead of being gathered whole."""
    text = """HloModule kinds, num_partitions=8
ENTRY e {
  t0 = f32[64,6] parameter(0), sharding={devices=[8,1]<=[8]}
  z = f32[64,6] broadcast(f32[] constant(0)), dimensions={}, sharding={devices=[8,1]<=[8]}
  table = pred[64,6] compare(t0, z), direction=GT, sharding={devices=[8,1]<=[8]}
  c = c64[64,6] complex(t0, t0), sharding={devices=[8,1]<=[8]}
  ids = s32[5,1] parameter(1), sharding={replicated}
  g = pred[5,6] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}
  h = c64[5,6] gather(c, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}
  ROOT t = (pred[5,6], c64[5,6]) tuple(g, h), sharding={{replicated}, {replicated}}
}
"""
    module, out = _partition(text)
    assert _collectives(module) == {"all-reduce": 2}
    assert "to_apply=or.pred.reduction" in out and "to_apply=add.c64.reduction" in out


SUM_MAX = """sum_max {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s = f32[] add(a0, b0)
  m = s32[] maximum(a1, b1)
  ROOT t = (f32[], s32[]) tuple(s, m)
}
"""

ARGMAX = """argmax {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  ge = pred[] compare(av, bv), direction=GE
  v = f32[] select(ge, av, bv)
  i = s32[] select(ge, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
"""


def _variadic_segments(updates: int, rows: int = 16, idx_sharding: str = "{devices=[8,1]<=[8]}",
                       reducer: str = "sum_max") -> str:
    ids = ", ".join(f"{{{(7 * k + 3) % (rows + 2) - 1}}}" for k in range(updates))  # -1 and `rows`: skipped
    return f"""HloModule segments, num_partitions=8
{SUM_MAX}
{ARGMAX}
ENTRY e {{
  x = f32[{rows},4] parameter(0), sharding={{replicated}}
  y = s32[{rows},4] parameter(1), sharding={{replicated}}
  idx = s32[{updates},1] constant({{{ids}}}), sharding={idx_sharding}
  u = f32[{updates},4] parameter(2), sharding={{devices=[8,1]<=[8]}}
  v = s32[{updates},4] parameter(3), sharding={{devices=[8,1]<=[8]}}
  ROOT s = (f32[{rows},4], s32[{rows},4]) scatter(x, y, idx, u, v), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply={reducer}, sharding={{{{replicated}}, {{replicated}}}}
}}
"""


@pytest.mark.parametrize("updates", [256, 250])
def test_variadic_scatter_over_tiled_indices_sums_each_output(updates):
    """A segment sum and max at once, the updates (many more than the rows) tiled by index
    batch: each device scatters its 32 updates into (0, INT_MIN), each output's partials are
    all-reduced with its own reducer (add, max) and combined with its operand once.  250
    updates: the last tile's padded updates are set to the identities.  XLA replicates
    variadic scatters (gathers the updates)."""
    module, out = _partition(_variadic_segments(updates))
    assert _collectives(module) == {"all-reduce": 2}
    assert "to_apply=add.f32.reduction" in out and "to_apply=maximum.s32.reduction" in out
    assert _only(module, Opcode.SCATTER).shape.to_hlo(False) == "(f32[16,4], s32[16,4])"


def test_variadic_scatter_with_few_updates_gathers_them():
    """Eight updates into 64 rows: all-reducing both outputs would move more than gathering
    the updates and indices, so those are gathered and every device scatters them all (no
    all-reduce); a note, not a fallback."""
    module, _ = _partition(_variadic_segments(8, rows=64))
    counts = _collectives(module)
    assert "all-reduce" not in counts and counts.get("all-gather", 0) >= 2


def test_variadic_scatter_with_a_pairing_reducer_still_replicates():
    """An argmax pairs its outputs (the index follows the value's comparison): no output has a
    reduction of its own, and no identity, so partial results cannot be combined — replicated
    with its remark, and still right."""
    text = _variadic_segments(256, reducer="argmax")
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=8)
    p.run(module)
    out = print_module(module)
    assert [r for r in p.remarks if r.kind == "missed" and "scatter" in r.message], p.remarks
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format()


def test_variadic_gradient_into_vocabulary_rows_sums_over_the_data_axis():
    """Rows tiled over model=4, token ids and updates tiled by batch over data=2 (a variadic
    embedding gradient with counts): each device scatters its batch into its rows with shifted
    indices, and the two data halves' partials are all-reduced per output (groups of 2)."""
    text = f"""HloModule vgrad, num_partitions=8
{SUM_MAX}
ENTRY e {{
  x = f32[64,16] parameter(0), sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  y = s32[64,16] parameter(1), sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  ids = s32[8,32] parameter(2), sharding={{devices=[2,1,4]<=[8] last_tile_dim_replicate}}
  u = f32[8,32,16] parameter(3), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  v = s32[8,32,16] parameter(4), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  ROOT s = (f32[64,16], s32[64,16]) scatter(x, y, ids, u, v), update_window_dims={{2}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=sum_max, sharding={{{{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}, {{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}}}
}}
"""
    module, _ = _partition(text)
    assert _collectives(module) == {"all-reduce": 2}
    assert _only(module, Opcode.SCATTER).shape.to_hlo(False) == "(f32[16,16], s32[16,16])"
    for ar in [i for i in module.entry.instructions if i.opcode is Opcode.ALL_REDUCE]:
        assert all(len(g) == 2 for g in ar.replica_groups.groups)


def _lookup(rows: int, ids: int, id_sharding: str, out_sharding: str) -> str:
    return f"""HloModule lookup, num_partitions=8
ENTRY e {{
  table = f32[{rows},8,16] parameter(0), sharding={{devices=[8,1,1]<=[8]}}
  idx = s32[{ids},1] parameter(1), sharding={id_sharding}
  ROOT g = f32[{ids},8,16] gather(table, idx), offset_dims={{1,2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,8,16}}, sharding={out_sharding}
}}
"""


def test_a_table_smaller_than_its_lookup_is_gathered_rather_than_summed():
    """An [8,8,16] table tiled by rows, looked up 16 times into a batch-tiled result: gathering
    the table (4 KB) costs less than summing partial results of the whole lookup (8 KB), and is
    XLA's plan; it summed them with an all-reduce and sliced the sum (8,200 bytes against 512)."""
    module, _ = _partition(_lookup(8, 16, "{devices=[8,1]<=[8]}", "{devices=[8,1,1]<=[8]}"))
    assert _collectives(module) == {"all-gather": 1}
    assert _only(module, Opcode.ALL_GATHER).array_shape.dims == (8, 8, 16)
    assert _only(module, Opcode.GATHER).array_shape.dims == (2, 8, 16)


def test_a_large_table_sums_its_partial_lookups_straight_into_the_result_tiles():
    """A [1024,8,16] table tiled by rows, looked up 16 times by ids held whole, into a
    batch-tiled result: the table stays, each device looks up the rows it holds, and the
    partial lookups are summed by one reduce-scatter into the result's tiles (an all-reduce and
    a slice moved twice the wire bytes)."""
    module, _ = _partition(_lookup(1024, 16, "{replicated}", "{devices=[8,1,1]<=[8]}"))
    assert _collectives(module) == {"reduce-scatter": 1}
    assert _only(module, Opcode.REDUCE_SCATTER).array_shape.dims == (2, 8, 16)


_BIAS_GRADIENT = """HloModule bias_gradient, num_partitions=8
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  table = f32[32,4] parameter(0), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  updates = f32[32,64,4] parameter(1), sharding={devices=[4,1,2]<=[8]}
  q = s32[32,64] iota(), iota_dimension=0
  k = s32[32,64] iota(), iota_dimension=1
  d = s32[32,64] subtract(k, q)
  lo = s32[32,64] broadcast(s32[] constant(0)), dimensions={}
  hi = s32[32,64] broadcast(s32[] constant(31)), dimensions={}
  bucket = s32[32,64] clamp(lo, d, hi)
  ids = s32[32,64,1] reshape(bucket)
  ROOT g = f32[32,4] scatter(table, ids, updates), update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, to_apply=add, sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
}
"""


def test_a_scatter_add_over_the_heads_sums_the_sequence_tiles_partial_tables():
    """A relative-position bias gradient: updates tiled over the sequence (4) and the heads (2),
    the bucket ids computed from iotas, the table tiled over the heads.  Each device scatters
    its own rows (its slice of the ids is computed in place) into its heads' columns, and one
    all-reduce over the sequence tiles adds the [32,2] partial tables, where the passthrough plan
    gathered all 64x32 updates and ids over the sequence (6,144 bytes; XLA's plan sums too)."""
    module, out = _partition(_BIAS_GRADIENT)
    assert _collectives(module) == {"all-reduce": 1}, out
    ar, = [i for i in module.all_instructions() if i.opcode.value == "all-reduce"]
    assert tuple(ar.array_shape.dims) == (32, 2), out
