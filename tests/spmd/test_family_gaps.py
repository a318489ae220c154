"""Family modules where our partition did more than XLA's (issue 11): a needless mask over the
rows a slice or a zero pad reads outside its operand, a select where a permute can send a
kept tile to itself, and a permute of gathered tiles that XLA makes before the gather.  Each
checks the plan (which collectives, how many bytes, no masking ops) and verifies the result
against XLA's run of the unpartitioned module on 8 devices."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hlo_passes import parse_module
from hlo_passes.ir import ArrayShape, PrimitiveType
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.passes.spmd.partition_context import tile_map
from hlo_passes.passes.spmd.reshard import plan
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.stats import module_stats
from hlo_passes.runtime import verify_equivalent
from tests.spmd.partitioning import collectives, partition, partition_verified


def _bytes(module) -> int:
    return sum(module_stats(module).collective_bytes.values())


def _ops(module) -> Counter[str]:
    return Counter(i.opcode.value for i in module.all_instructions())


def test_strided_slice_of_uneven_tiles_reads_their_padding_without_a_mask():
    """Dim 2 (130 columns, 4 tiles of 33, the last with 2 padding columns) sliced [7:129:2]:
    the last tile's window reaches past column 130, but a slice's result column j reads one
    input column, inside the input whenever j is inside the result, so what it reads from the
    padding lands in the result's own padding: one collective-permute of 5 columns, no
    iota/compare/select mask."""
    text = """HloModule ssp, num_partitions=8
ENTRY e {
  x = f32[64,20,130] parameter(0), sharding={devices=[1,1,4,2]<=[8] last_tile_dim_replicate}
  ROOT s = f32[31,20,61] slice(x), slice={[2:64:2], [0:20], [7:129:2]}, sharding={devices=[1,1,4,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 64 * 20 * 5 * 4
    ops = _ops(module)
    assert ops["select"] == 0 and ops["compare"] == 0 and ops["iota"] == 0


def test_slice_of_uneven_tiles_at_the_end_is_unmasked():
    """The same on one dim of 21 rows in 4 tiles of 6 (3 padding rows), sliced [3:21]: the last
    tile reads rows 21..23, all padding, into its result's padding."""
    text = """HloModule su, num_partitions=8
ENTRY e {
  x = f32[21,6] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  ROOT s = f32[18,6] slice(x), slice={[3:21], [0:6]}, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    ops = _ops(module)
    assert ops["select"] == 0 and ops["compare"] == 0


def test_zero_pad_of_partially_replicated_tiles_needs_no_mask():
    """pad 4_4 with the constant 0 on rows tiled 4 ways (2 replicas each): the rows before the
    first tile and past the last are the pad's edge padding, and the collective-permutes
    deliver zeros there (no neighbour sends), so no row is masked: two collective-permutes of
    2 rows each way, no iota/compare/select."""
    text = """HloModule pp, num_partitions=8
ENTRY e {
  x = f32[1024,64] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  z = f32[] constant(0)
  ROOT p = f32[1032,64] pad(x, z), padding=4_4x0_0, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 2}
    assert _bytes(module) == 2 * 2 * 64 * 4
    ops = _ops(module)
    assert ops["select"] == 0 and ops["compare"] == 0 and ops["iota"] == 0


def test_nonzero_pad_still_masks_its_edge_rows():
    """The same pad with the value 1: the permutes deliver zeros, not ones, so the edge rows are
    still set to the pad value (a select) — and the result verifies."""
    text = """HloModule pp1, num_partitions=8
ENTRY e {
  x = f32[1024,64] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  z = f32[] constant(1)
  ROOT p = f32[1032,64] pad(x, z), padding=4_4x0_0, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert _ops(module)["select"] >= 1


def test_zero_pad_of_uneven_tiles_masks_their_padding():
    """A zero pad of 21 rows in 4 tiles of 6: the last tile's 3 padding rows are don't-care
    values the pad's high edge would read, so they are masked even though the value is 0."""
    text = """HloModule ppu, num_partitions=8
ENTRY e {
  x = f32[21,6] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  z = f32[] constant(0)
  ROOT p = f32[25,6] pad(x, z), padding=2_2x0_0, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert _ops(module)["select"] >= 1


def test_permute_keeping_tiles_sends_them_to_themselves_instead_of_selecting():
    """[8,1] -> [2,4,1] through a reshape: after the all-to-all, devices 0, 3, 4, 7 already hold
    their tiles and the others swap pairwise.  One collective-permute with the self pairs
    {0,0},{3,3},... does both, as XLA's does: no per-device select between the kept and the
    received tile."""
    text = """HloModule rs, num_partitions=8
ENTRY e {
  x = f32[48,10] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT r = f32[4,12,10] reshape(x), sharding={devices=[2,4,1]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-to-all": 1, "collective-permute": 1}
    (cp,) = [i for i in module.all_instructions() if i.opcode.value == "collective-permute"]
    pairs = cp.attr("source_target_pairs")
    assert sorted(s for s, _ in pairs) == list(range(8)) and any(s == t for s, t in pairs)
    ops = _ops(module)
    assert ops["select"] == 0 and ops["compare"] == 0


def test_partial_tiles_are_permuted_before_the_gather_not_after():
    """[2,2,2] last_tile_dim_replicate -> [1,2,4] last_tile_dim_replicate of f32[12,10]:
    gathering dim 0 over pairs leaves the column tiles on the wrong devices, so a permute
    follows — of the gathered 12x5 tile (240 bytes).  Permuting the 6x5 halves first, so that
    each gather pair holds both halves of its target tile, moves 120: 120 + 120 for the first
    reshard (as in XLA's partition).  The second, to [4,1,2], slices each device's 3x5 piece,
    permutes it and gathers the columns (60 + 60): an all-to-all (240) also transposes its
    result locally, a copy the cost model prices, so 360 in all where XLA's partition moves 480."""
    text = """HloModule prp, num_partitions=8
ENTRY e {
  p = f32[12,10] parameter(0), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}
  c = f32[12,10] copy(p), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  ROOT d = f32[12,10] copy(c), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    order = [i.opcode.value for i in module.entry.instructions if i.opcode.is_collective]
    assert order[:2] == ["collective-permute", "all-gather"]
    assert _bytes(module) == 360
    ops = _ops(module)
    assert ops["select"] == 0


def test_dot_gathers_the_small_operand_where_a_partial_sum_ties_on_time():
    """x f32[32,16] [4,2] times a replicated 16x16 weight, result [4,2]: summing partial products
    over the 2-way contracting dim (a reduce-scatter of the 8x16 partials, 512 bytes in) and
    gathering x's 8x8 tiles over that pair (256 bytes in) then multiplying by the weight's
    column tile receive the same bytes and take the same time; the gather adds nothing, so the
    tie goes to it, as in XLA's partition (inside a while body: one all-gather per step)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families" / "while_sharded_carry.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 8 * 8 * 4


def test_dot_keeps_the_partial_sum_where_it_moves_less():
    """The same kind of dot with a 64-wide contracting dim and an 8-wide result: each device's
    8x8 partial reduce-scattered to 8x4 (128 bytes received) beats gathering the other 8x32
    half of its lhs rows (1 KiB): the summing FLOPs only break ties."""
    text = """HloModule dps, num_partitions=8
ENTRY e {
  x = f32[32,64] parameter(0), sharding={devices=[4,2]<=[8]}
  w = f32[64,8] parameter(1), sharding={replicated}
  ROOT d = f32[32,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,2]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"reduce-scatter": 1}


def test_uneven_refinement_permutes_only_the_missing_piece():
    """f32[6,5] computed [2,1,4] last_tile_dim_replicate (rows 0-2 on devices 0-3, 3-5 on 4-7)
    and needed [8,1] (row d on device d, devices 6 and 7 padding): the 3-row tiles do not nest
    in 8 tiles of 1 evenly, so the gather-free plans got stuck and an all-gather of the 3x5
    tiles (60 bytes) ran.  Every target row lies inside one source tile: device 3's row 3 comes
    from device 6 (which keeps nothing), every other device slices its own — one
    collective-permute of one row (20 bytes), no select."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families" / "partial_to_tiled_halo.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 5 * 4
    assert _ops(module)["select"] == 0


def test_piece_permute_where_receivers_also_send():
    """f32[12,4] from [2,1,4] last_tile_dim_replicate (rows 0-5 on devices 0-3, 6-11 on 4-7)
    to [4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate (3-row tiles on pairs {0,4},{1,5},{2,6},
    {3,7}): devices 0, 1, 6, 7 keep a slice of their own tile and send it to themselves, and
    2, 3, 4, 5, which each lack theirs, receive it from one another — each sends the piece
    another needs while receiving its own: one collective-permute of 3x4 rows."""
    text = """HloModule pp2, num_partitions=8
ENTRY e {
  x = f32[12,4] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  c = f32[12,4] copy(x), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT d = f32[12,4] copy(c), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 3 * 4 * 4
    src, dst = (tile_map(reader_for("sharding")(s), 2, 8) for s in (
        "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"))
    # one step, not a local slice to 3-row tiles followed by a permute of them
    assert [s.kind for s in plan(src, dst, ArrayShape(PrimitiveType.F32, (12, 4)))] == ["piece-permute"]


def test_in_place_update_offset_is_one_subtraction_per_dim():
    """A dynamic-update-slice into rows tiled 8 ways, updated in place: the (clamped) offset
    goes to U + o - s in the tile padded by U rows; the per-device table holds s - U, so each
    sliced dim costs a clamp and one subtract (no add of the constant U)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families" / "dus_dyn2d.hlo").read_text()
    module, _ = partition_verified(text)
    ops = _ops(module)
    assert ops["add"] == 0
    assert ops["subtract"] == ops["clamp"] == 2


def test_zero_pad_test_reads_the_bits_of_any_element_type():
    """The zero test is on the constant's bits: a complex (0, 0) pad value is zero padding too
    (no mask), and -0.0, whose bits are not the permutes' zeros, keeps its mask."""
    text = """HloModule cz, num_partitions=8
ENTRY e {{
  x = {t}[16,4] parameter(0), sharding={{devices=[4,1,2]<=[8] last_tile_dim_replicate}}
  z = {t}[] constant({z})
  ROOT p = {t}[20,4] pad(x, z), padding=2_2x0_0, sharding={{devices=[4,1,2]<=[8] last_tile_dim_replicate}}
}}
"""
    module, _ = partition_verified(text.format(t="c64", z="(0, 0)"))
    assert _ops(module)["select"] == 0
    module, _ = partition_verified(text.format(t="f32", z="-0"))
    assert _ops(module)["select"] >= 1


def test_sort_along_one_axis_of_a_2d_mesh_folds_that_axis_into_the_rows():
    """A sort along dim 1 tiled 4 ways, dim 0 tiled 2 ways: the sort needs dim 1 whole, and the
    rows are tiled already.  Dim 1's 4 tiles become the minor part of dim 0's (8 row tiles of
    2 rows): an all-to-all within each group of 4 there and back, each device sorting 2 rows
    of 512 — not an all-gather after which every device sorts 8 rows (4× the work)."""
    text = """HloModule sort2d, num_partitions=8
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[16,512] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT s = f32[16,512] sort(x), dimensions={1}, to_apply=lt, sharding={devices=[2,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-to-all": 2}
    (sort,) = [i for i in module.all_instructions() if i.opcode.value == "sort"]
    assert sort.array_shape.dims == (2, 512)


def test_sort_whose_rows_cannot_take_the_folded_tiles_gathers():
    """The same with 6 rows (3 per row tile, not divisible by 4 more): the fold would make
    uneven tiles, so the sorted dim is gathered (each device sorts its 3 rows whole)."""
    text = """HloModule sort2d_uneven, num_partitions=8
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GT
}
ENTRY e {
  x = f32[6,64] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT s = f32[6,64] sort(x), dimensions={1}, to_apply=lt, sharding={devices=[2,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    (sort,) = [i for i in module.all_instructions() if i.opcode.value == "sort"]
    assert sort.array_shape.dims == (3, 64)


def test_cholesky_with_rows_tiled_on_a_2d_mesh_folds_them_into_the_batch_tiles():
    """Matrices [8,64,64] tiled 2 ways on the batch, 4 ways on the rows: the rows' tiles become
    the batch dim's minor tiles (one matrix per device, an all-to-all within each group of 4
    there and back), not gathered (4 matrices factored per device)."""
    text = """HloModule c2, num_partitions=8
ENTRY e {
  a = f32[8,64,64] parameter(0), sharding={devices=[2,4,1]<=[8]}
  ROOT c = f32[8,64,64] cholesky(a), lower=true, sharding={devices=[2,4,1]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-to-all": 2}
    (chol,) = [i for i in module.all_instructions() if i.opcode.value == "cholesky"]
    assert chol.array_shape.dims == (1, 64, 64)


def test_fft_along_a_tiled_dim_of_a_2d_mesh_runs_on_folded_row_tiles():
    """An FFT over dim 1 tiled 4 ways, rows tiled 2 ways: each device transforms 2 whole rows."""
    text = """HloModule f2, num_partitions=8
ENTRY e {
  x = c64[16,256] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT f = c64[16,256] fft(x), fft_type=FFT, fft_length={256}, sharding={devices=[2,4]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-to-all": 2}
    (fft,) = [i for i in module.all_instructions() if i.opcode.value == "fft"]
    assert fft.array_shape.dims == (2, 256)


def test_get_dimension_size_of_a_static_dim_is_the_global_size_without_reading_the_operand():
    """Rows tiled 8 ways: each device's operand has 8 rows, but the op asks for the global
    size, 64, a constant; the operand is not gathered (it was: 1,024 bytes)."""
    text = """HloModule gds, num_partitions=8
ENTRY e {
  x = f32[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  n = s32[] get-dimension-size(x), dimensions={0}
  c = f32[] convert(n)
  b = f32[64,32] broadcast(c), dimensions={}
  ROOT a = f32[64,32] add(x, b), sharding={devices=[8,1]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {}
    assert _ops(module)["get-dimension-size"] == 0


def test_get_dimension_size_of_a_dynamic_dim_reads_the_whole_operand():
    """A bounded dynamic dim's size is known only at run time: the operand is gathered and
    asked (XLA:CPU cannot run dynamic shapes, so this checks the plan only)."""
    text = """HloModule gds_dyn, num_partitions=8
ENTRY e {
  x = f32[<=64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  n = s32[] get-dimension-size(x), dimensions={0}
  c = f32[] convert(n)
  ROOT b = f32[8] broadcast(c), dimensions={}, sharding={replicated}
}
"""
    module = parse_module(text)
    SpmdPartitioner(num_partitions=8).run(module)
    (gds,) = [i for i in module.all_instructions() if i.opcode.value == "get-dimension-size"]
    assert gds.operands[0].array_shape.dims == (64, 32)


def test_dot_tiles_the_result_columns_on_the_devices_its_operands_replicate_over():
    """a f32[128,256] and b f32[256,128] both tiled 4 ways on the contracting dim (device d
    holds slice d//2) and replicated over the device pairs (d%2); the result [4,2] tiles rows
    by d//2, columns by d%2.  The operands' tiling and the result's merge in no way as wholes
    (the result's rows sit on the contracting dim's devices), but its columns do: slicing b's
    columns by d%2 is free, the local 128x64 partial product is reduce-scattered over the four
    devices of each column half into 32x64 rows (a 32 KiB operand, 24 KiB received), where
    XLA's partition all-reduces the 128x64 partials (48 KiB received) and slices."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_dot_contract_partial_repl.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"reduce-scatter": 1}
    assert _bytes(module) == 128 * 64 * 4


def test_convolution_tiles_the_output_feature_on_the_devices_its_operands_replicate_over():
    """The convolution form of the same: input and kernel tiled 4 ways on the input feature
    (slice d//2) and replicated over d%2, the result [4,1,1,2] (batch by d//2, output feature by
    d%2).  Slicing the kernel's output features by d%2 is free and the 16x32x32x16 partial
    result is reduce-scattered along the batch over the four devices of each feature half (a
    1 MiB operand): one reduce-scatter, no all-reduce."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_in_feature_partial.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"reduce-scatter": 1}
    assert _bytes(module) == 16 * 32 * 32 * 16 * 4


def test_convolution_cuts_windows_from_a_replicated_input_in_place():
    """x f32[8,64,64,16] replicated, a 3x3 pad-1 convolution whose result is tiled 8 ways along
    dim 1: every device holds all 64 rows, so its window (its 8 output rows plus one halo row
    each side, zero rows past the edges) is a pad and a slice of its own copy.  Slicing x into
    tiles and exchanging their edge rows (XLA's partition: two collective-permutes of 64 KiB
    in all) would send each device rows it held: no collective at all."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_out_spatial_only.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {}
    conv = [i for i in module.all_instructions() if i.opcode.value == "convolution"]
    assert [tuple(c.operands[0].shape.dims) for c in conv] == [(8, 10, 64, 16)]


def test_convolution_in_place_window_beside_a_gathered_kernel():
    """The input replicated, the kernel tiled 2 ways on its output feature (4 replicas each),
    the result tiled 2 ways on the spatial dim 1 over those same device pairs: each device
    cuts its 8 rows and their halo from its copy of x and gathers the kernel's other output
    features (one all-gather of a 4.5 KiB half), instead of convolving its feature half over
    all rows and all-to-all'ing the result (16 KiB), or slicing x and exchanging halos as
    XLA's partition does (8 KiB of permutes beside the same gather)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_replicated_input_tiled_kernel.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 3 * 3 * 16 * 8 * 4


def test_permute_between_two_gathers_moves_before_the_first():
    """x f32[8,32,32,16] tiled [1,4,1,2] on one device order, read by a 1x1 convolution tiled
    [1,2,1,4] on another: the input's target is [1,2,1,1] with 4 replicas.  The plan gathers
    dim 1 over pairs, permutes the gathered 16-row tiles to the devices that need them, then
    gathers dim 3; the permute moves half as much before the first gather, as XLA's
    partition does: permute, all-gather, all-gather (64 KiB permuted, not 128 KiB)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_reshard_gather_permute_gather.hlo").read_text()
    module, _ = partition_verified(text)
    x_steps = [i for i in module.entry.instructions if i.opcode.is_collective
               and tuple(i.shape.dims)[0] == 8]
    assert [i.opcode.value for i in x_steps] == ["collective-permute", "all-gather", "all-gather"]
    assert module_stats(module).collective_bytes["collective-permute"] < 8 * 16 * 32 * 8 * 4 + 1024


def test_partial_sums_reduce_scatter_into_a_result_tiled_on_two_dims():
    """a f32[16,64,512] [2,1,4] times b f32[512,2,33,16] (contracting dim tiled 4 ways on the
    same devices as a's, 2 replicas), the result [2,1,2,2,1]: each batch half's four devices
    sum partials whose target tiles dims 2 and 3 (2 x 2, dim 3 of 33 rows uneven) over exactly
    those four.  One reduce-scatter of the 8x64x2x34x16 padded partials, its tile dims merged
    into one scattered dim, where an all-reduce and a slice move twice the bytes on the wire."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_dot_rs_two_out_dims.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"reduce-scatter": 1}
    assert _bytes(module) == 8 * 64 * 2 * 34 * 16 * 4


def test_dot_slices_a_replicated_operand_and_gathers_the_small_one_over_an_all_to_all():
    """a f32[32,512,128] replicated, b f32[32,128,96] tiled 2 ways on its columns (4 replicas),
    the result tiled 2 ways on its rows over other device pairs.  Multiplying by b's column tile
    and all-to-all'ing the 32x512x48 result to row tiles moved 1.5 MiB on the wire; slicing a's
    rows (a local copy) and gathering b's other column half moves 768 KiB, as XLA's partition
    does.  The all-to-all looked cheaper only because its local transpose went unpriced while
    the slice's copy was priced: both are now."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_dot_replicated_lhs_gather_rhs.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 32 * 128 * 48 * 4


def test_kernel_gradient_tiled_along_its_window_is_not_refused_for_halo_recompute():
    """A 5x5 kernel gradient of x f32[16,32,32,16] (batch 4 ways, width 2 ways) and an output
    gradient tiled 2 ways on its width: tiling the iteration space by the batch (4) and the
    window's width (2) needs a 2-column halo of x and a permute of the gradient, and recomputes
    0.02% more FLOPs (the halo columns) than gathering everything and tiling the result 8 ways.
    That sliver counted as replicated work, so latency chose the gather: 10x the wire bytes and
    1.6x XLA's FLOPs.  Now: three permutes and the all-reduce of the 5x5x16x8 partial kernels,
    as XLA's partition (less its gather)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_filter_grad_window_tiled.hlo").read_text()
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 3, "all-reduce": 1}
    conv = [i for i in module.all_instructions() if i.opcode.value == "convolution"]
    assert [tuple(c.operands[0].shape.dims) for c in conv] == [(4, 32, 20, 16)]


def test_convolution_prices_a_dim_tiled_past_its_rows_on_the_busiest_device():
    """A 1x1 convolution whose kernel f32[1,1,32,16] is tiled 8 ways along its one-row window
    dim: tiling the iteration space that way leaves one device all the work and seven none.
    Its FLOPs were priced as the total over 8, the fewest of all tilings, so the frugal-FLOPs
    rule picked it: gathering x, 4x the FLOPs and 7x the wire bytes of XLA's partition.  Priced
    on the busiest device (ceil(rows / tiles) per dim) it is no longer frugal: the result is
    computed on x's width tiles (a quarter of the FLOPs) and moved by an all-to-all and a
    permute, with the 2 KiB kernel made whole (its one real row summed into place: the
    reshard's sum-gather; no partial convolution results are all-reduced)."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "dc_conv_1x1_kernel_tiled_past_its_rows.hlo").read_text()
    module, _ = partition_verified(text)
    conv = [i for i in module.all_instructions() if i.opcode.value == "convolution"]
    assert [tuple(c.shape.dims) for c in conv] == [(16, 64, 4, 16)]
    reduced = [tuple(i.shape.dims) for i in module.all_instructions() if i.opcode.value == "all-reduce"]
    assert reduced in ([], [(1, 1, 32, 16)]), reduced  # the kernel's buffer, never the result


import pytest  # noqa: E402


@pytest.mark.parametrize("src, dst, rows, cols", [
    ("{devices=[1,2,3]<=[6] last_tile_dim_replicate}", "{devices=[2,3]<=[6]}", 10, 9),
    ("{devices=[1,3,2]<=[6] last_tile_dim_replicate}", "{devices=[3,2]<=[6]}", 9, 12),
    ("{devices=[1,2,3]<=[6] last_tile_dim_replicate}", "{devices=[2,3]<=[6]}", 7, 8),
])
def test_a_tiling_the_target_does_not_refine_moves_into_the_other_dim_by_all_to_all(src, dst, rows, cols):
    """Columns tiled 2 ways (3 replicas) wanted 3 ways, rows whole wanted 2 ways: the column
    tiling cannot be refined to the target's, so it must be undone; moving its factor into the
    rows (an all-to-all within the pairs that will share a row block) sends half of what
    gathering the columns does, and each replica then slices its own columns.  Uneven sizes
    included (9 columns in 2 tiles, 7 rows)."""
    text = f"""HloModule a2a_not_refined, num_partitions=6
ENTRY e {{
  p = f32[{rows},{cols}] parameter(0), sharding={src}
  ROOT c = f32[{rows},{cols}] copy(p), sharding={dst}
}}
"""
    module, _ = partition_verified(text, 6)
    assert collectives(module) == {"all-to-all": 1}, collectives(module)


REDUCE_INTO_ANOTHER_DEVICE_ORDER = """HloModule reduce_order, num_partitions=3

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  p = f32[390,70] parameter(0), sharding={devices=[3,1]<=[3]}
  z = f32[] constant(0)
  r = f32[390] reduce(p, z), dimensions={1}, to_apply=add
  ROOT n = f32[390] negate(r), sharding={devices=[3]1,2,0}
}
"""


def test_a_reduce_wanted_in_another_device_order_moves_its_result_not_its_input():
    """The rows lie on devices 0,1,2 and the result is wanted on 1,2,0: reducing where the
    rows lie and permuting the 130-element result moves 520 bytes a device (as XLA's
    partition); permuting the 130x70 input first moved 36,400."""
    from tests.spmd.partitioning import partition_verified

    module, _ = partition_verified(REDUCE_INTO_ANOTHER_DEVICE_ORDER, 3)[:2]
    permutes = [i for i in module.all_instructions() if i.opcode.value == "collective-permute"]
    assert permutes and all(tuple(i.shape.dims) == (130,) for i in permutes)


BATCHED_GATHER_BY_INDEX = """HloModule batched_gather, num_partitions=5

ENTRY main {
  p = f32[10,30,5] parameter(0), sharding={devices=[5,1,1]4,0,3,1,2}
  idx = s32[10,4,1] parameter(1), sharding={replicated}
  ROOT g = f32[10,4,5] gather(p, idx), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,5}, sharding={devices=[1,5,1]<=[5]}
}
"""


def test_a_batched_gather_runs_where_its_operand_lies_when_moving_the_result_is_cheaper():
    """The operand lies by batch, the result is wanted by index: each device gathers its
    batch rows from its own operand tile and the (smaller) result moves, instead of the
    operand being gathered whole on every device (XLA's plan too)."""
    from tests.spmd.partitioning import partition_verified

    module, _ = partition_verified(BATCHED_GATHER_BY_INDEX, 5)
    gathers = [i for i in module.all_instructions() if i.opcode.value == "all-gather"]
    assert not any(tuple(i.shape.dims) == (10, 30, 5) for i in gathers), [i.shape for i in gathers]
    local = [i for i in module.all_instructions() if i.opcode.value == "gather"]
    assert local and tuple(local[0].operands[0].shape.dims) == (2, 30, 5)


def test_a_batched_gather_keeps_its_operands_offset_tiling():
    """The operand is tiled on a dim the slices take whole (an offset dim): the passthrough
    plan (indices whole, each device gathers its columns) is priced for gathers with batching
    dims too; it was offered only without them, and the operand was resharded by batch
    (5,280 bytes a device where this moves 704; XLA 1,024)."""
    from pathlib import Path

    from tests.spmd.partitioning import partition_verified

    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "spmd_families"
            / "gather_batched_offset_tiled.hlo").read_text()
    module, _ = partition_verified(text, 6)
    local = [i for i in module.all_instructions() if i.opcode.value == "gather"]
    assert local and tuple(local[0].operands[0].shape.dims) == (10, 30, 2)  # its own columns (5 over 3)


SCAN_WRITING_STACKED_OUTPUT = """HloModule scan_ys, num_partitions=8

body {
  p = (s32[], f32[8,4,6], f32[8,4,6]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  ys = f32[8,4,6] get-tuple-element(p), index=1
  xs = f32[8,4,6] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  row = f32[1,4,6] dynamic-slice(xs, i, zero, zero), dynamic_slice_sizes={1,4,6}
  y = f32[1,4,6] tanh(row)
  ys2 = f32[8,4,6] dynamic-update-slice(ys, y, i, zero, zero)
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT t = (s32[], f32[8,4,6], f32[8,4,6]) tuple(i2, ys2, xs)
}

cond {
  p = (s32[], f32[8,4,6], f32[8,4,6]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(8)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  xs = f32[8,4,6] parameter(0), sharding={devices=[4,2,1]<=[8]}
  zero = s32[] constant(0)
  z = f32[] constant(0)
  ys0 = f32[8,4,6] broadcast(z), dimensions={}, sharding={devices=[4,1,2]<=[8]}
  init = (s32[], f32[8,4,6], f32[8,4,6]) tuple(zero, ys0, xs)
  loop = (s32[], f32[8,4,6], f32[8,4,6]) while(init), condition=cond, body=body
  ROOT ys = f32[8,4,6] get-tuple-element(loop), index=1, sharding={devices=[4,1,2]<=[8]}
}
"""


def test_scan_writes_its_stacked_output_where_the_buffer_lies():
    """A scan writing row i of a stacked output that lies tiled along the rows [4,1,2], from an
    update whose sharding ([1,2,1,4]-like, from the input's columns) conflicts with it.  XLA's
    propagation gives the dynamic-update-slice its update's sharding first, so the whole
    buffer is regathered and resharded every iteration (XLA's GSPMD plan of the probe's Shardy
    scan: 5,952 bytes a device).  Ours prices both and takes the base's: the buffer never moves,
    the small update does (the probe's scan 5,664 -> 1,344 bytes; XLA's Shardy plan 1,356)."""
    module, _ = partition_verified(SCAN_WRITING_STACKED_OUTPUT)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    body = loop.called_computation("body")
    (write,) = [i for i in body.instructions if i.opcode.value == "dynamic-update-slice"]
    base = write.operands[0]
    while base.opcode.value in ("pad", "slice", "copy", "reshape"):
        base = base.operands[0]
    assert base.opcode.value == "get-tuple-element" and base.attr("index") == 1  # the buffer itself
    moved = [i for i in body.instructions if i.opcode.value in _COLLECTIVES]
    assert all(i.array_shape.element_count <= 8 * 2 * 6 for i in moved), [str(i.shape) for i in moved]
    assert _bytes(module) <= 8 * 2 * 6 * 4 + 4 * 6 * 4, _bytes(module)


_COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")


def test_dynamic_update_slice_keeps_the_base_sharding_on_purpose():
    """Deliberate difference from XLA (propagation_rules._base_is_cheaper): when a
    dynamic-update-slice's base and update offer conflicting shardings, the one that moves less
    wins, with a remark; XLA takes the update's (here: regather a [8,4,6] buffer to place a
    [1,4,6] row)."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    text = """HloModule m, num_partitions=8
ENTRY e {
  a = f32[8,4,6] parameter(0), sharding={devices=[4,1,2]<=[8]}
  u = f32[4,6] parameter(1), sharding={devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  r = f32[1,4,6] reshape(u)
  i = s32[] parameter(2), sharding={replicated}
  c = s32[] constant(0)
  d = f32[8,4,6] dynamic-update-slice(a, r, i, c, c)
  ROOT n = f32[8,4,6] negate(d)
}
"""
    module = parse_module(text)
    p = ShardingPropagation()
    p.run(module)
    d = next(i for i in module.entry.instructions if i.name == "d")
    assert d.sharding == reader_for("sharding")("{devices=[4,1,2]<=[8]}")
    assert any("base operand's sharding" in r.message for r in p.remarks)
    partition_verified(text)


LOOP_WITH_CONSTRAINED_CARRY = """HloModule carry, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

body {
  p = (f32[16,32], f32[6,10], s32[]) parameter(0)
  x = f32[16,32] get-tuple-element(p), index=0
  y = f32[6,10] get-tuple-element(p), index=1
  zero = f32[] constant(0)
  total = f32[] reduce(y, zero), dimensions={0,1}, to_apply=add
  bt = f32[16,32] broadcast(total), dimensions={}
  x1 = f32[16,32] add(x, bt)
  x2 = f32[16,32] custom-call(x1), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  i = s32[] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT t = (f32[16,32], f32[6,10], s32[]) tuple(x2, y, i2)
}

cond {
  p = (f32[16,32], f32[6,10], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=2
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  x = f32[16,32] parameter(0), sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}
  y0 = f32[6,10] parameter(1), sharding={replicated}
  y = f32[6,10] custom-call(y0), custom_call_target="Sharding", sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  zero = s32[] constant(0)
  init = (f32[16,32], f32[6,10], s32[]) tuple(x, y, zero)
  loop = (f32[16,32], f32[6,10], s32[]) while(init), condition=cond, body=body
  ROOT r = f32[16,32] get-tuple-element(loop), index=0
}
"""


def test_loop_carry_takes_the_bodys_constraint_and_reshards_once():
    """A fori body constrains its carry to rows ([4,1,2]) while the carry enters tiled by
    columns ([1,4,2]).  XLA's GSPMD propagation keeps the loop state in the initial value's
    sharding (the first to reach it): every iteration all-to-alls the carry to rows for the
    constraint and back for the next state (the probe's JAX loop: 872 bytes a device, XLA's
    GSPMD plan the same, its Shardy plan 272).  Ours carries the constraint's sharding: one
    all-to-all before the loop, none in the body (a remark says so; a deliberate difference
    from XLA's GSPMD propagation, Shardy's behaviour)."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    module = parse_module(LOOP_WITH_CONSTRAINED_CARRY)
    p = ShardingPropagation()
    p.run(module)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    assert loop.sharding.leaves()[0] == reader_for("sharding")("{devices=[4,1,2]<=[8] last_tile_dim_replicate}")
    assert any("the body's constraint" in r.message for r in p.remarks)

    module, _ = partition_verified(LOOP_WITH_CONSTRAINED_CARRY)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    body = loop.called_computation("body")
    moved = [i for i in body.instructions if i.opcode.value in _COLLECTIVES and i.array_shape.rank > 0]
    assert moved == [], [i.to_hlo() if hasattr(i, "to_hlo") else i.name for i in moved]
    entry_moves = sorted(i.opcode.value for i in module.entry.instructions if i.opcode.value in _COLLECTIVES)
    assert entry_moves == ["all-gather", "all-to-all"], entry_moves  # in once; out whole (unannotated root)


def test_a_single_trip_loop_keeps_its_initial_sharding():
    """With one iteration the constraint's reshard happens once either way: XLA's rule (the
    initial value's sharding) stands."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    module = parse_module(LOOP_WITH_CONSTRAINED_CARRY.replace("constant(6)", "constant(1)"))
    ShardingPropagation().run(module)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    assert loop.sharding.leaves()[0] == reader_for("sharding")("{devices=[1,4,2]<=[8] last_tile_dim_replicate}")


def test_loop_carry_constrained_where_the_body_reads_it_reshards_once():
    """The same loop with the constraint on the carried value as the body reads it from its
    parameter (a `with_sharding_constraint` at the top of a fori body), the root passing on a
    value computed from it: the state takes the constraint's sharding too."""
    text = LOOP_WITH_CONSTRAINED_CARRY.replace(
        """  x1 = f32[16,32] add(x, bt)
  x2 = f32[16,32] custom-call(x1), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}""",
        """  xc = f32[16,32] custom-call(x), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  x2 = f32[16,32] add(xc, bt)""")
    assert "xc = " in text
    module, _ = partition_verified(text)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    body = loop.called_computation("body")
    moved = [i for i in body.instructions if i.opcode.value in _COLLECTIVES and i.array_shape.rank > 0]
    assert moved == [], [i.name for i in moved]


def test_loop_carry_keeps_a_constraint_with_fewer_tiles_than_the_initial_value():
    """The carry enters tiled 8 ways ([4,2]) and the body constrains it to a 4-way tiling
    replicated in pairs: a tuple with more tiles wins leaf by leaf in XLA's improvement rule,
    which would take the state back to the initial sharding and reshard at every iteration.
    The state keeps the constraint's (a remark says so)."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    text = LOOP_WITH_CONSTRAINED_CARRY.replace(
        "  x = f32[16,32] parameter(0), sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}",
        "  x = f32[16,32] parameter(0), sharding={devices=[4,2]<=[8]}")
    assert "sharding={devices=[4,2]<=[8]}" in text
    module = parse_module(text)
    p = ShardingPropagation()
    p.run(module)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    assert loop.sharding.leaves()[0] == reader_for("sharding")("{devices=[4,1,2]<=[8] last_tile_dim_replicate}")
    module, _ = partition_verified(text)
    (loop,) = [i for i in module.entry.instructions if i.opcode.value == "while"]
    body = loop.called_computation("body")
    assert [i.name for i in body.instructions if i.opcode.value in _COLLECTIVES and i.array_shape.rank > 0] == []


def test_elementwise_ops_feeding_a_replicated_result_run_on_shards():
    """`x * 2 + 1` returned replicated from x tiled [8,1] (a with_sharding_constraint: GSPMD
    propagation makes the add replicated): the add ran on the whole array on every device after
    gathering `x * 2` (131,072 FLOPs).  Computed where its operand lies and gathered once, as
    XLA's partition does: 16,384 FLOPs, the same one all-gather."""
    text = """HloModule r1g, num_partitions=8
ENTRY main {
  x = f32[1024,64] parameter(0), sharding={devices=[8,1]<=[8]}
  two = f32[] constant(2)
  b2 = f32[1024,64] broadcast(two), dimensions={}
  m = f32[1024,64] multiply(x, b2)
  one = f32[] constant(1)
  b1 = f32[1024,64] broadcast(one), dimensions={}
  a = f32[1024,64] add(m, b1)
  ROOT r = f32[1024,64] custom-call(a), custom_call_target="Sharding", sharding={replicated}
}
"""
    module, _ = partition_verified(text)
    assert module_stats(module).flops == 2 * 1024 * 64 // 8
    assert collectives(module) == {"all-gather": 1}


def test_a_select_feeding_a_replicated_result_gathers_the_result_not_its_operands():
    """where(x > 0, x, y) wanted replicated from operands tiled [4,2]: the result is gathered
    (along each mesh axis) instead of the predicate and the two values each."""
    text = """HloModule where_out, num_partitions=8
ENTRY main {
  x = f32[256,128] parameter(0), sharding={devices=[4,2]<=[8]}
  y = f32[256,128] parameter(1), sharding={devices=[4,2]<=[8]}
  z = f32[] constant(0)
  zb = f32[256,128] broadcast(z), dimensions={}
  c = pred[256,128] compare(x, zb), direction=GT
  ROOT s = f32[256,128] select(c, x, y), sharding={replicated}
}
"""
    module, _ = partition_verified(text)
    moved = [i for i in module.all_instructions() if i.opcode.is_collective]
    assert moved and all(i.operands[0].opcode.value in ("select", "all-gather") for i in moved), moved
    assert module_stats(module).flops <= 2 * 256 * 128 // 8


def test_a_widening_convert_is_gathered_narrow():
    """A convert to a wider type wanted replicated stays computed after the gather: computing it
    on shards would move the wider elements (the byte guard of `_where_to_compute`)."""
    text = """HloModule widen, num_partitions=8
ENTRY main {
  a = bf16[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT d = f32[64,32] convert(a), sharding={replicated}
}
"""
    module, _ = partition_verified(text)
    (gather,) = [i for i in module.all_instructions() if i.opcode.value == "all-gather"]
    assert gather.array_shape.element_type.name.lower() == "bf16"


SHARDY_REPLICATED_RESULT = """HloModule jit_lambda, entry_computation_layout={(f32[1024,64]{1,0})->f32[1024,64]{1,0}}, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=8]>}}

ENTRY main {
  x = f32[1024,64]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}, {}]>"}
  two = f32[] constant(2)
  b2 = f32[1024,64]{1,0} broadcast(two), dimensions={}
  m = f32[1024,64]{1,0} multiply(x, b2)
  r = f32[1024,64]{1,0} custom-call(m), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"}
  t = (f32[1024,64]{1,0}) tuple(r)
  ROOT g = f32[1024,64]{1,0} get-tuple-element(t), index=0, sharding={replicated}
}
"""


def test_a_shardy_function_result_is_a_boundary_not_a_constraint():
    """JAX's `out_shardings=P()` in the Shardy form is the function result's sharding: the value
    computed inside keeps the sharding its operands give it and is gathered at the boundary
    (XLA's Shardy plan).  Imported as a `Sharding` custom-call, GSPMD propagation handed the
    replicated sharding to the multiply, which then ran whole on every device."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    module = parse_module(SHARDY_REPLICATED_RESULT)
    ShardingPropagation(num_partitions=8).run(module)
    m = next(i for i in module.entry.instructions if i.opcode.value == "multiply")
    assert m.sharding == reader_for("sharding")("{devices=[8,1]<=[8]}")
    module, _ = partition_verified(SHARDY_REPLICATED_RESULT)
    assert module_stats(module).flops == 1024 * 64 // 8
    assert collectives(module) == {"all-gather": 1}
    # the boundary's reshard is the result: no copy of the gathered value after it
    assert not [i.name for i in module.all_instructions() if i.opcode.value == "copy"]


SHARDY_UNEVEN_OUTPUT = """HloModule jit_f4, entry_computation_layout={(f32[256,128]{1,0})->f32[250,120]{1,0}}, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=4, "y"=2]>}}, allow_spmd_sharding_propagation_to_parameters={false}, allow_spmd_sharding_propagation_to_output={true}

ENTRY main {
  x = f32[256,128]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}, {\\"y\\"}]>"}
  s = f32[250,120]{1,0} slice(x), slice={[0:250], [0:120]}
  ROOT t = f32[250,120]{1,0} tanh(s)
}
"""


def test_a_shardy_output_left_to_the_compiler_keeps_its_even_dims():
    """JAX's Shardy form with the output sharding left to the compiler: [250, 120] tiled 4x2
    does not divide 250 by 4.  XLA's GSPMD rule replicates such an output whole; XLA's Shardy
    pipeline, which compiles this form, drops only the uneven dim's tiling and keeps the
    columns' two tiles.  The GSPMD form keeps XLA's GSPMD rule."""
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation
    module = parse_module(SHARDY_UNEVEN_OUTPUT)
    ShardingPropagation(num_partitions=8).run(module)
    assert module.entry.root.sharding == reader_for("sharding")("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}")
    partition_verified(SHARDY_UNEVEN_OUTPUT)


def test_start_index_along_a_dim_a_dynamic_slice_spans_whole_is_zero():
    """XLA clamps a start into [0, dim - size]: where the slice or update spans the whole dim its
    start is 0, so the value computing it (here a max over a tiled array, which would need a
    gather or an all-reduce) is dead and costs nothing."""
    roots = {
        "dynamic-slice": "f32[4,16] dynamic-slice(x, j, s), dynamic_slice_sizes={4,16}",
        "dynamic-update-slice": "f32[16,16] dynamic-update-slice(x, u, j, s)",
    }
    for op, root in roots.items():
        text = f"""HloModule m, num_partitions=8
max {{
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT m = s32[] maximum(a, b)
}}
ENTRY e {{
  x = f32[16,16] parameter(0), sharding={{devices=[1,8]<=[8]}}
  u = f32[4,16] parameter(1), sharding={{devices=[1,8]<=[8]}}
  i = s32[64] parameter(2), sharding={{devices=[8]<=[8]}}
  z = s32[] constant(0)
  j = s32[] constant(3)
  s = s32[] reduce(i, z), dimensions={{0}}, to_apply=max
  ROOT r = {root}, sharding={{devices=[1,8]<=[8]}}
}}"""
        module, _ = partition_verified(text)
        assert not collectives(module), (op, collectives(module))


def test_update_as_large_as_the_operand_is_the_result():
    """A dynamic-update-slice whose update spans every dim of its operand returns the update
    (every start clamps to 0): only the update moves, to the result's sharding, and the operand
    is not read (a random JAX program's `dynamic_update_index_in_dim` into a stack of one, in a
    loop: the operand and the update were both cut to a third tiling, gathered and cut again,
    every iteration).  Here the update already lies as the result wants it and the operand is
    tiled another way: nothing moves."""
    text = """HloModule m, num_partitions=8
ENTRY e {
  x = f32[1,16,8] parameter(0), sharding={devices=[1,1,8]<=[8]}
  u = f32[16,8] parameter(1), sharding={devices=[8,1]<=[8]}
  i = s32[] parameter(2), sharding={replicated}
  r = f32[1,16,8] reshape(u), sharding={devices=[1,8,1]<=[8]}
  z = s32[] constant(0)
  ROOT d = f32[1,16,8] dynamic-update-slice(x, r, i, z, z), sharding={devices=[1,8,1]<=[8]}
}"""
    module, _ = partition_verified(text)
    assert not collectives(module), collectives(module)


def test_select_and_scatter_windows_inside_tiles_run_locally():
    """Windows no larger than their stride, unpadded, on tiles a whole number of strides long:
    every window lies inside one tile, so each device runs the op on its own rows and source
    rows (a stride-2 pool's gradient with 1-row windows fell back to gathering both, with a
    remark that windows crossed tiles).  Rows no window covers get the init value on a tile as
    in the whole.  Checked against the unpartitioned module for gaps and touching windows; a
    tile of 5 rows with stride 2 still needs more than its own rows (not local)."""
    def module(rows, out, size, stride):
        return f"""HloModule m, num_partitions=8
ge {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}
ENTRY e {{
  x = f32[2,{rows},6] parameter(0), sharding={{devices=[1,8,1]<=[8]}}
  g = f32[2,{out},6] parameter(1), sharding={{devices=[1,8,1]<=[8]}}
  ROOT s = f32[2,{rows},6] select-and-scatter(x, g, f32[] constant(0)), window={{size=1x{size}x1 stride=1x{stride}x1}}, select=ge, scatter=add, sharding={{devices=[1,8,1]<=[8]}}
}}"""
    for rows, out, size, stride in [(32, 16, 1, 2), (48, 16, 2, 3), (48, 16, 1, 3), (32, 16, 2, 2)]:
        m, _ = partition_verified(module(rows, out, size, stride))  # (and no fallback remark)
        assert not collectives(m), ((rows, size, stride), collectives(m))
    text = module(40, 20, 1, 2)  # 5 rows a tile: windows start at odd rows on some
    m, out, _ = partition(text, 8)
    assert verify_equivalent(text, out, num_devices=8).ok
    assert collectives(m)


def test_gather_and_scatter_whose_index_components_are_all_iotas_run_locally():
    """Indices that are a concatenate of iotas, one per collapsed operand dim (XLA's "parallel"
    gathers and scatters: row r, column c of the indices reads operand element [r, c]): every
    component becomes a batching dim, none is left (an index vector of no components, which
    XLA parses and runs), and the operand, indices and result are tiled alike.  Each device
    then works on its own tile: no operand gathered whole (the form fell back to that, 4-8x
    XLA's wire bytes, when no other component remained).  Swapped component order too."""
    for index_map, first, second in [("0,1", 1, 2), ("1,0", 2, 1)]:
        for op in ("gather", "scatter"):
            root = (f"ROOT g = f32[8,4,3] gather(x, c), offset_dims={{2}}, collapsed_slice_dims={{0,1}}, "
                    f"start_index_map={{{index_map}}}, index_vector_dim=0, slice_sizes={{1,1,3}}, "
                    "sharding={devices=[8,1,1]<=[8]}"
                    if op == "gather" else
                    f"ROOT s = f32[8,4,3] scatter(x, c, u), to_apply=add, update_window_dims={{2}}, "
                    f"inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{{index_map}}}, "
                    "index_vector_dim=0, sharding={devices=[8,1,1]<=[8]}")
            text = f"""HloModule m, num_partitions=8
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}
ENTRY e {{
  x = f32[8,4,3] parameter(0), sharding={{devices=[8,1,1]<=[8]}}
  u = f32[8,4,3] parameter(1), sharding={{devices=[8,1,1]<=[8]}}
  i1 = s32[1,8,4] iota(), iota_dimension={first}, sharding={{devices=[1,8,1]<=[8]}}
  i2 = s32[1,8,4] iota(), iota_dimension={second}, sharding={{devices=[1,8,1]<=[8]}}
  c = s32[2,8,4] concatenate(i1, i2), dimensions={{0}}, sharding={{devices=[1,8,1]<=[8]}}
  {root}
}}"""
            module, _ = partition_verified(text)
            assert not collectives(module), (index_map, op, collectives(module))


def test_reshard_slices_replicas_before_the_all_to_all_that_fills_another_dim():
    """A partial sum all-reduced over one mesh axis, wanted tiled over that axis on a new dim and
    with its batch tiling moved to another dim: the replicas slice the new dim first (free),
    then the all-to-all moves half as much.  The replicas' budget went to the dim the all-to-all
    fills, so the all-to-all moved whole tiles and a permute followed (a probe of XLA's grouped
    batch-and-contracting dot: 1.2x its wire bytes, now its plan)."""
    src, dst = (tile_map(reader_for("sharding")(s), 4, 4) for s in (
        "{devices=[2,1,1,1,2]<=[4] last_tile_dim_replicate}", "{devices=[1,2,1,2]<=[4]}"))
    steps = plan(src, dst, ArrayShape(PrimitiveType.F32, (8, 16, 6, 32)))
    assert [(s.kind, s.bytes) for s in steps] == [("slice", 0), ("all-to-all", 4 * 16 * 6 * 16 * 4 // 2)]
    text = """HloModule m, num_partitions=4
ENTRY e {
  a = f32[8,16,6,64] parameter(0), sharding={devices=[2,1,1,2]<=[4]}
  b = f32[8,64,32] parameter(1), sharding={devices=[2,2,1]<=[4]}
  ROOT d = f32[8,16,6,32] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={3}, rhs_contracting_dims={1}, sharding={devices=[1,2,1,2]<=[4]}
}"""
    module, _ = partition_verified(text, 4)
    assert "collective-permute" not in collectives(module), collectives(module)


def test_a_value_gathered_to_its_sharding_is_read_tiled_where_it_was_computed():
    """An add annotated replicated between tiled operands and a tiled user: computed where its
    operands lie and gathered to its own sharding, the user read slices of the gathered value
    (an all-gather and a dynamic-slice for nothing).  The value it was gathered from is
    remembered, so the user reads the computed tiles and the gather, unread, is gone (XLA's
    plan: no collective).  Also across a reduce on a 2-D mesh: the all-reduce stays, the
    gather after it goes."""
    text = """HloModule m, num_partitions=8
ENTRY e {
  x = f32[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  y = f32[64,32] parameter(1), sharding={devices=[8,1]<=[8]}
  a = f32[64,32] add(x, y), sharding={replicated}
  ROOT n = f32[64,32] negate(a), sharding={devices=[8,1]<=[8]}
}"""
    module, _ = partition_verified(text)
    assert not collectives(module), collectives(module)
    text = """HloModule m, num_partitions=8
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[16,8,32] parameter(0), sharding={devices=[4,1,2]<=[8]}
  r = f32[16,8] reduce(x, f32[] constant(0)), dimensions={2}, to_apply=add, sharding={replicated}
  ROOT n = f32[16,8] negate(r), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-reduce": 1}, collectives(module)


def test_top_k_whose_positions_nobody_reads_gathers_only_values():
    """`top_k(x)[0]` along a tiled dim: the positions are neither offset, gathered nor sorted
    along (they were: two all-gathers and a sort of pairs, twice XLA's bytes); with the positions
    read, both are gathered as before."""
    for op in ('custom-call(x), custom_call_target="TopK"', "topk(x), k=8, largest=true"):
        text = f"""HloModule m, num_partitions=8
ENTRY e {{
  x = f32[4,1024] parameter(0), sharding={{devices=[1,8]<=[8]}}
  t = (f32[4,8], s32[4,8]) {op}, sharding={{{{replicated}}, {{replicated}}}}
  ROOT v = f32[4,8] get-tuple-element(t), index=0, sharding={{replicated}}
}}"""
        module, _ = partition_verified(text)
        assert collectives(module) == {"all-gather": 1}, (op, collectives(module))
        both = text.replace("ROOT v = f32[4,8] get-tuple-element(t), index=0, sharding={replicated}",
                            "v = f32[4,8] get-tuple-element(t), index=0\n"
                            "  i = s32[4,8] get-tuple-element(t), index=1\n"
                            "  ROOT r = (f32[4,8], s32[4,8]) tuple(v, i), sharding={{replicated}, {replicated}}")
        module, _ = partition_verified(both)
        assert collectives(module) == {"all-gather": 2}, (op, collectives(module))


def test_reshape_split_misaligned_with_the_tiles_gathers_over_the_fewest_devices():
    """f32[4,96] tiled 8 ways on the 96 (tiles of 12) to f32[4,12,8] tiled on the 8: no tile is
    whole rows of 8, so the operand was gathered whole (with a fallback remark).  Gathered over
    pairs (tiles of 24: 3 rows each) it reshapes locally and an all-to-all and permute reach
    the target: XLA's plan, 40% of the bytes."""
    text = """HloModule m, num_partitions=8
ENTRY e {
  x = f32[4,96] parameter(0), sharding={devices=[1,8]<=[8]}
  ROOT r = f32[4,12,8] reshape(x), sharding={devices=[1,1,8]<=[8]}
}"""
    module, _ = partition_verified(text)  # (and no fallback remark)
    gathers = [i for i in module.all_instructions() if i.opcode.value == "all-gather"]
    assert gathers and all(len(g.replica_groups.groups[0]) == 2 for g in gathers), [g.replica_groups for g in gathers]


def test_update_into_a_zero_buffer_untiles_the_buffer_instead_of_moving_it():
    """A dynamic-update-slice into a zero broadcast tiled on the batch and a sliced dim: the
    zeros are made again untiled along the sliced dims (nothing moves), the small update is
    gathered along them, and the result is sliced to its tiling, as XLA does.  Priced as moved
    (and the in-place update as touching the whole buffer), the plan all-to-alled the update
    and the whole result instead: 8.5x XLA's bytes."""
    text = """HloModule m, num_partitions=4
ENTRY e {
  p = f32[4,16,16,8] parameter(0), sharding={devices=[2,2,1,1]<=[4]}
  z = f32[4,64,64,8] broadcast(f32[] constant(0)), dimensions={}, sharding={devices=[2,2,1,1]<=[4]}
  ROOT d = f32[4,64,64,8] dynamic-update-slice(z, p, s32[] constant(0), s32[] constant(24), s32[] constant(24), s32[] constant(0)), sharding={devices=[2,2,1,1]<=[4]}
}"""
    module, _ = partition_verified(text, 4)
    assert collectives(module) == {"all-gather": 1}, collectives(module)
    assert _bytes(module) == 2 * 8 * 16 * 8 * 4


def test_a_dim_smaller_than_its_tiles_is_made_whole_by_a_sum_not_a_gather():
    """f32[1,100,3] tiled 8 ways on its size-1 dim: one device holds the row, seven hold padding.
    Gathering moved all eight tiles to every device (7 rows received); each device instead writes
    its row, or zeros, into a zero buffer and an all-reduce adds them (2 * 7/8 of a row on the
    wire, XLA's plan).  Checked for ints and preds too (a pred is or-ed)."""
    for etype in ("f32", "s32", "pred"):
        text = f"""HloModule m, num_partitions=8
ENTRY e {{
  u = {etype}[1,100,3] parameter(0), sharding={{devices=[8,1,1]<=[8]}}
  ROOT c = {etype}[1,100,3] copy(u), sharding={{replicated}}
}}"""
        module, _ = partition_verified(text)
        assert collectives(module) == {"all-reduce": 1}, (etype, collectives(module))
