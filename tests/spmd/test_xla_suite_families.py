"""Families of behaviour that XLA's partitioner tests exercise, checked on modules of our own
(shapes, names and structure written from the semantics, not taken from XLA's tests): each
partitioned module is verified against XLA's run of the original on 8 devices, and the
collectives it may use are counted by hand."""

from __future__ import annotations

import pytest

from hlo_passes.stats import module_stats
from tests.spmd.partitioning import collectives, partition_verified


def _bytes(module) -> int:
    return sum(module_stats(module).collective_bytes.values())


_ARGMAX = """HloModule argmax, num_partitions=8
amax {{
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  g = pred[] compare(a, b), direction=GT
  v = f32[] select(g, a, b)
  i = s32[] select(g, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}}
ENTRY e {{
  x = f32[20,{c}] parameter(0), sharding={{devices=[2,4]<=[8]}}
  i = s32[20,{c}] iota(), iota_dimension=1, sharding={{devices=[2,4]<=[8]}}
  ROOT r = (f32[20], s32[20]) reduce(x, i, f32[] constant(-inf), s32[] constant(0)), dimensions={{1}}, to_apply=amax, sharding={{{{devices=[2,4]<=[8] last_tile_dim_replicate}}, {{devices=[2,4]<=[8] last_tile_dim_replicate}}}}
}}
"""


@pytest.mark.parametrize("cols", [36, 37])
def test_variadic_reduce_over_a_tiled_dim_gathers_partial_results_not_the_operands(cols):
    """An argmax over a dim tiled 4 ways: each device reduces its tile (uneven tiles padded
    with the init values), then all-gathers its 10 partial maxima and their 10 indices over
    its row group and reduces those 4 again.  Sent per device: 10 f32 + 10 s32 = 80 bytes
    (gathering the operands would send 10 x ceil(cols/4) of each)."""
    module, _ = partition_verified(_ARGMAX.format(c=cols))
    assert collectives(module) == {"all-gather": 2}
    assert _bytes(module) == 80


def test_reduce_with_a_select_reducer_over_an_uneven_tiled_dim():
    """A max written as compare+select (no single-op reducer, so no all-reduce): dim 1 of 21
    rows tiled 8 ways (tiles of 3; the last holds only padding, which takes the init -inf);
    the 3x5 partial maxima are all-gathered (60 bytes) and reduced again."""
    text = """HloModule smax, num_partitions=8
smax {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  g = pred[] compare(a, b), direction=GE
  ROOT s = f32[] select(g, a, b)
}
ENTRY e {
  x = f32[3,21,5] parameter(0), sharding={devices=[1,8,1]<=[8]}
  ROOT r = f32[3,5] reduce(x, f32[] constant(-inf)), dimensions={1}, to_apply=smax, sharding={replicated}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 3 * 5 * 4


@pytest.mark.parametrize("sharding,dims", [
    ("{devices=[8,1,1]<=[8]}", "{0}"),
    ("{devices=[4,1,2]<=[2,4]T(1,0)}", "{0,2}"),
])
def test_reverse_of_evenly_tiled_dims_is_one_collective_permute(sharding, dims):
    """Reversing dims tiled evenly: the device holding result tile c reverses operand tile
    t-1-c, so the tile moves once (a collective-permute of the local tile, 48 floats either
    way), no all-gather."""
    text = f"""HloModule rev, num_partitions=8
ENTRY e {{
  x = f32[16,6,4] parameter(0), sharding={sharding}
  ROOT r = f32[16,6,4] reverse(x), dimensions={dims}, sharding={sharding}
}}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 16 * 6 * 4 * 4 // 8


def test_reverse_of_an_uneven_tiled_dim_still_verifies():
    text = """HloModule rev, num_partitions=8
ENTRY e {
  x = f32[27,5] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT r = f32[27,5] reverse(x), dimensions={0}, sharding={devices=[8,1]<=[8]}
}
"""
    partition_verified(text)


@pytest.mark.parametrize("pad,slice_,cps,nbytes", [
    # shift right by 2 rows: each device sends its last 2 rows of 5 floats to its right neighbour
    ("2_0", "[0:32]", 1, 2 * 5 * 4),
    # shift left by 3 rows (padding on the high side, slice from row 3)
    ("0_3", "[3:35]", 1, 3 * 5 * 4),
])
def test_slice_of_pad_is_one_shift(pad, slice_, cps, nbytes):
    """slice(pad(x)) on the tiled dim is one pad of x with negative padding: a single halo
    shift, not an exchange for the pad and another for the slice."""
    text = f"""HloModule shift, num_partitions=8
ENTRY e {{
  x = f32[32,5] parameter(0), sharding={{devices=[8,1]<=[8]}}
  p = f32[34,5] pad(x, f32[] constant(7)), padding={pad}x0_0, sharding={{devices=[8,1]<=[8]}}
  ROOT s = f32[32,5] slice(p), slice={{{slice_}, [0:5]}}, sharding={{devices=[8,1]<=[8]}}
}}
"""
    text = text.replace("f32[34,5]", "f32[35,5]") if pad == "0_3" else text
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": cps}
    assert _bytes(module) == nbytes


def test_slice_of_a_pad_with_another_user_is_not_merged():
    text = """HloModule shift2, num_partitions=8
ENTRY e {
  x = f32[32,5] parameter(0), sharding={devices=[8,1]<=[8]}
  p = f32[34,5] pad(x, f32[] constant(7)), padding=2_0x0_0, sharding={devices=[8,1]<=[8]}
  s = f32[32,5] slice(p), slice={[0:32], [0:5]}, sharding={devices=[8,1]<=[8]}
  q = f32[32,5] slice(p), slice={[2:34], [0:5]}, sharding={devices=[8,1]<=[8]}
  ROOT a = f32[32,5] add(s, q), sharding={devices=[8,1]<=[8]}
}
"""
    partition_verified(text)


@pytest.mark.parametrize("shape,sharding,dim,k,cps,nbytes", [
    # 40 rows in tiles of 5, rotated by 3: each device takes 3 rows of its left neighbour
    ((40, 6), "{devices=[8,1]<=[8]}", 0, 3, 1, 3 * 6 * 4),
    # 32 columns in tiles of 8, rotated by 11 = 8 + 3: 3 columns from two tiles left, 5 from one
    ((6, 32), "{devices=[2,4]<=[8]}", 1, 11, 2, 3 * 3 * 4 + 3 * 5 * 4),
    # partially replicated, rotated by two whole tiles: one permute of the 4x3 tile
    ((16, 3), "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", 0, 8, 1, 4 * 3 * 4),
])
def test_slices_concatenated_into_a_rotation_move_only_the_rows_that_change_device(
        shape, sharding, dim, k, cps, nbytes):
    n = shape[dim]

    def spec(lo, hi):
        return ", ".join(f"[{lo}:{hi}]" if d == dim else f"[0:{s}]" for d, s in enumerate(shape))

    def dims(m):
        return ",".join(str(m if d == dim else s) for d, s in enumerate(shape))
    full = ",".join(map(str, shape))
    text = f"""HloModule rot, num_partitions=8
ENTRY e {{
  x = f32[{full}] parameter(0), sharding={sharding}
  a = f32[{dims(k)}] slice(x), slice={{{spec(n - k, n)}}}, sharding={sharding}
  b = f32[{dims(n - k)}] slice(x), slice={{{spec(0, n - k)}}}, sharding={sharding}
  ROOT r = f32[{full}] concatenate(a, b), dimensions={{{dim}}}, sharding={sharding}
}}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": cps}
    assert _bytes(module) == nbytes


_SCATTER_IOTA = """HloModule scatter_iota, num_partitions=8
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
ENTRY e {{
  x = f32[{rows},6,3] parameter(0), sharding={{devices=[8,1,1]<=[8]}}
  i0 = s32[1,{rows},5] iota(), iota_dimension=1, sharding={{devices=[1,8,1]<=[8]}}
  j = s32[1,{rows},5] parameter(1), sharding={{devices=[1,8,1]<=[8]}}
  idx = s32[2,{rows},5] concatenate(i0, j), dimensions={{0}}, sharding={{devices=[1,8,1]<=[8]}}
  u = f32[{rows},5,3] parameter(2), sharding={{devices=[8,1,1]<=[8]}}
  ROOT s = f32[{rows},6,3] scatter(x, idx, u), update_window_dims={{2}}, inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=0, to_apply=add, sharding={{devices=[8,1,1]<=[8]}}
}}
"""


@pytest.mark.parametrize("rows", [16, 19])
def test_scatter_whose_index_component_is_an_iota_runs_locally(rows):
    """Index component 0 is an iota along the indices dim tiled like operand dim 0: row r of
    the indices only writes operand row r, a batching pair, so every device scatters its own
    rows with no collective (even or uneven tiles)."""
    module, _ = partition_verified(_SCATTER_IOTA.format(rows=rows))
    assert collectives(module) == {}


def test_gather_whose_index_component_is_an_iota_gathers_only_the_passthrough_dim():
    """Index component 0 is an iota along indices dim 1 (16 long), the operand's dim 0 (16
    long, tiled 4 ways like the result): a batching pair.  The operand's 2-way tiling of its
    passthrough dim 2 stays (the result is tiled alike: each device gathers its rows of
    indices from its own columns), so nothing moves (it gathered that dim before: each device
    sent its 4x6x2 tile, 192 bytes; XLA's partition moves 576)."""
    text = """HloModule gather_iota, num_partitions=8
ENTRY e {
  x = f32[16,6,3] parameter(0), sharding={devices=[4,1,2]<=[8]}
  i0 = s32[1,16,6] iota(), iota_dimension=1, sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}
  j = s32[1,16,6] parameter(1), sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}
  jc = s32[1,16,6] clamp(s32[] constant(0), j, s32[] constant(5)), sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}
  idx = s32[2,16,6] concatenate(i0, jc), dimensions={0}, sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}
  ROOT g = f32[16,6,3] gather(x, idx), offset_dims={2}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,1,3}, sharding={devices=[4,1,2]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {}


def test_iota_components_that_are_not_batching_pairs_are_left_alone():
    """An iota over a dim shorter than the operand dim it indexes, and an index vector made
    only of iotas: no rewrite, the gathers still partition correctly."""
    text = """HloModule not_pairs, num_partitions=8
ENTRY e {
  x = f32[16,6] parameter(0), sharding={devices=[8,1]<=[8]}
  i0 = s32[8,1] iota(), iota_dimension=0, sharding={devices=[8,1]<=[8]}
  g = f32[8,6] gather(x, i0), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}, sharding={devices=[8,1]<=[8]}
  i1 = s32[16,1] iota(), iota_dimension=0, sharding={devices=[8,1]<=[8]}
  h = f32[16,6] gather(x, i1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}, sharding={devices=[8,1]<=[8]}
  ROOT t = (f32[8,6], f32[16,6]) tuple(g, h), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}
}
"""
    partition_verified(text)


def test_xla_partition_over_a_permuted_device_order_parses_and_verifies():
    """XLA's partitioner writes mesh-form replica groups with `device_ids=(1,0)` for a module
    whose shardings list the devices out of order; its partition must parse and compute what
    the module computes (our partition too)."""
    from hlo_passes.runtime import verify_equivalent
    from hlo_passes.runtime.xla_backend import pass_dump

    text = """HloModule permuted, num_partitions=2
ENTRY e {
  a = f32[5,7] parameter(0), sharding={devices=[2,1]0,1}
  b = f32[7,3] parameter(1), sharding={devices=[2,1]1,0}
  d = f32[5,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,2]0,1}
  ROOT t = f32[3,5] transpose(d), dimensions={1,0}, sharding={devices=[2,1]0,1}
}
"""
    xla = pass_dump(text, "spmd-partitioning", num_partitions=2, propagate_to_output=(True,))
    assert "device_ids=" in xla  # the form under test (XLA prints it for this module)
    assert verify_equivalent(text, xla, num_devices=2).ok
    partition_verified(text, 2)


@pytest.mark.parametrize("sharding", ["{devices=[4,2]<=[8]}", "{devices=[2,4]<=[8]}"])
def test_gathering_two_tiled_dims_gathers_the_smaller_group_first(sharding):
    """f32[16,8] tiled 4x2 (or 2x4) made replicated: each device sends its 16-float tile into
    the gather over 2 devices, then the 32 floats that made into the gather over 4: 64 + 128
    bytes (the other order would send 64 + 256)."""
    text = f"""HloModule gather_order, num_partitions=8
ENTRY e {{
  x = f32[16,8] parameter(0), sharding={sharding}
  ROOT c = f32[16,8] copy(x), sharding={{replicated}}
}}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 2}
    assert _bytes(module) == 64 + 128


def test_uneven_target_that_an_all_to_all_cannot_reach_gathers_once_and_slices():
    """20 rows whole, 6 columns tiled 2 ways (replicated over 4) made 8 tiles of 3 rows: an
    all-to-all onto the rows would leave 2 tiles of 10 that tiles of 3 do not nest in, so a
    gather would follow it.  Gathering the columns (each device sends its 20x3 tile, 240
    bytes) and slicing the rows is one collective."""
    text = """HloModule uneven_target, num_partitions=8
ENTRY e {
  b = f32[20,6] parameter(0), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  ROOT c = f32[20,6] copy(b), sharding={devices=[8,1]<=[8]}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"all-gather": 1}
    assert _bytes(module) == 20 * 3 * 4


def test_halo_skips_tiles_whose_results_are_all_padding():
    """One row (23) sliced from 40 rows tiled 4 ways (replicated over 2): the result's tiles of
    one row are padding except tile 0, so only row 23 moves, from the holders of tile 2 to
    those of tile 0: one collective-permute of 6 floats (24 bytes)."""
    text = """HloModule slice_one, num_partitions=8
ENTRY e {
  x = f32[40,6] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  ROOT s = f32[1,6] slice(x), slice={[23:24], [0:6]}, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module, _ = partition_verified(text)
    assert collectives(module) == {"collective-permute": 1}
    assert _bytes(module) == 6 * 4


def test_pad_whose_only_result_tile_reads_padding():
    """A pad whose result is mostly padding: tiles past the first hold only padding, the first
    reads rows of the array; verified (no exchange may read past what exists)."""
    text = """HloModule pad_far, num_partitions=8
ENTRY e {
  x = f32[3,2] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT p = f32[5,2] pad(x, f32[] constant(2)), padding=2_0x0_0, sharding={devices=[8,1]<=[8]}
}
"""
    partition_verified(text)


_BRANCHES_WANT_OTHER_SHARDINGS = """HloModule branches, num_partitions=8
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}
tiled_branch {
  x = f32[16,6] parameter(0), sharding={devices=[4,2]<=[8]}
  ROOT n = f32[16,6] negate(x), sharding={devices=[4,2]<=[8]}
}
whole_branch {
  x = f32[16,6] parameter(0), sharding={replicated}
  r = f32[16] reduce(x, f32[] constant(0)), dimensions={1}, to_apply=add, sharding={replicated}
  ROOT b = f32[16,6] broadcast(r), dimensions={0}, sharding={devices=[4,2]<=[8]}
}
ENTRY e {
  i = s32[] parameter(0), sharding={replicated}
  a = f32[16,6] parameter(1), sharding={devices=[8,1]<=[8]}
  ROOT c = f32[16,6] conditional(i, a, a), branch_computations={tiled_branch, whole_branch}, sharding={devices=[4,2]<=[8]}
}
"""


def test_conditional_branches_reshard_their_operand_inside_the_branch_that_wants_it():
    """Both branches read `a` (rows over 8), one wanting it (4,2), the other whole.  Resharded
    before the conditional, each device paid both moves (an all-to-all and an all-gather) for
    the one branch that runs; the branches take `a` as it lies and reshard it inside, so the
    entry has no collective and each branch holds only its own move."""
    module, out = partition_verified(_BRANCHES_WANT_OTHER_SHARDINGS)
    def kinds(comp):
        return {i.opcode.value for i in comp.instructions if i.opcode.is_collective}

    comps = {c.name: c for c in module.computations}
    assert not kinds(module.entry), out
    assert kinds(comps["tiled_branch"]) == {"all-to-all"}, out
    assert kinds(comps["whole_branch"]) == {"all-gather"}, out


@pytest.mark.parametrize("rows,window,start", [(64, 1, 37), (64, 3, 14), (50, 5, 44), (50, 2, 0)])
def test_a_window_of_a_tiled_dim_is_cut_where_it_lies_and_summed(rows, window, start):
    """x[start:start+window] of rows tiled 8 ways (50 rows: uneven tiles of 7), wanted whole on
    every device: each device cuts the part of the window its tile holds, zeros elsewhere, and
    one all-reduce of the window adds the parts.  Making the rows whole first moved the whole
    operand (an all-to-all of x, then an all-gather of the window)."""
    text = f"""HloModule window, num_partitions=8
ENTRY e {{
  x = f32[{rows},128] parameter(0), sharding={{devices=[8,1]<=[8]}}
  ROOT s = f32[{window},128] slice(x), slice={{[{start}:{start + window}], [0:128]}}, sharding={{replicated}}
}}
"""
    module, out = partition_verified(text)
    assert collectives(module) == {"all-reduce": 1}, out
    assert _bytes(module) == window * 128 * 4, out


@pytest.mark.parametrize("index", [-3, 0, 21, 47, 60])
def test_a_dynamic_window_of_a_tiled_dim_is_cut_where_it_lies_and_summed(index):
    """The same with the start a value, clamped as dynamic-slice clamps it (into [0, 50 - 4]),
    on a 2-D mesh: the rows tiled 4 ways, the columns 2 ways and kept tiled in the result."""
    text = f"""HloModule dynamic_window, num_partitions=8
ENTRY e {{
  x = f32[50,64] parameter(0), sharding={{devices=[4,2]<=[8]}}
  i = s32[] constant({index})
  z = s32[] constant(0)
  ROOT s = f32[4,64] dynamic-slice(x, i, z), dynamic_slice_sizes={{4,64}}, sharding={{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}}
}}
"""
    module, out = partition_verified(text)
    assert collectives(module) == {"all-reduce": 1}, out
    assert _bytes(module) == 4 * 32 * 4, out


def test_a_reshard_several_branches_ask_for_is_made_once_before_the_conditional():
    """Two branches want `a` (rows over 8) as (4,2), a third whole: the (4,2) reshard is shared
    before the conditional (one all-to-all, as XLA's partition shares it), the gather happens
    only inside the branch that asks for it."""
    text = _BRANCHES_WANT_OTHER_SHARDINGS.replace("tiled_branch {", "tiled_branch_2 {\n  x = f32[16,6] parameter(0), "
                                                  "sharding={devices=[4,2]<=[8]}\n  ROOT e = f32[16,6] exponential(x), "
                                                  "sharding={devices=[4,2]<=[8]}\n}\ntiled_branch {", 1)
    text = text.replace("conditional(i, a, a), branch_computations={tiled_branch, whole_branch}",
                        "conditional(i, a, a, a), branch_computations={tiled_branch, whole_branch, tiled_branch_2}")
    module, out = partition_verified(text)

    def kinds(comp):
        return sorted(i.opcode.value for i in comp.instructions if i.opcode.is_collective)

    comps = {c.name: c for c in module.computations}
    assert kinds(module.entry) == ["all-to-all"], out
    assert kinds(comps["tiled_branch"]) == kinds(comps["tiled_branch_2"]) == [], out
    assert kinds(comps["whole_branch"]) == ["all-gather"], out


@pytest.mark.parametrize("sharding", ["{devices=[2,4,1]<=[8]}", "{mesh['d'=2,'m'=4], [{'d'}, {'m'}, {}]}"])
def test_an_fft_keeps_the_tiling_of_its_leading_dims(sharding):
    """An rfft over the last dim of activations tiled over batch and features, then an irfft:
    the transforms run on each device's rows and the result keeps their tiling, as the result
    is wanted (in the GSPMD and the named-mesh forms).  Without an FFT rule propagation left the transform's result
    unsharded: it was gathered whole after the local transform, and the inverse ran on every
    row on every device."""
    text = f"""HloModule fft, num_partitions=8
ENTRY e {{
  x = f32[4,16,64] parameter(0), sharding={sharding}
  f = c64[4,16,33] fft(x), fft_type=RFFT, fft_length={{64}}
  g = c64[4,16,33] multiply(f, f)
  y = f32[4,16,64] fft(g), fft_type=IRFFT, fft_length={{64}}
  ROOT r = f32[4,16,64] copy(y), sharding={sharding}
}}
"""
    module, out = partition_verified(text)
    assert not collectives(module), out
    assert module.entry.root.array_shape.dims == (2, 4, 64), out


def test_a_depthwise_convolution_keeps_its_feature_tiles_in_the_gspmd_form():
    """A depthwise convolution (one group per feature) of activations and a kernel tiled over
    the features, squared, then the kernel-gradient convolution (one batch group per feature)
    wanted tiled the same way: each device convolves its own features.  XLA's GSPMD
    propagation gives the first convolution's output no sharding (its rule passes no tiled
    input feature dim): it was gathered whole and sliced back for the second (16,384 bytes,
    XLA's GSPMD plan)."""
    text = """HloModule depthwise, num_partitions=8
ENTRY e {
  x = f32[2,16,16,64] parameter(0), sharding={devices=[1,1,1,8]<=[8]}
  k = f32[3,3,1,64] parameter(1), sharding={devices=[1,1,1,8]<=[8]}
  c = f32[2,16,16,64] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=64
  s = f32[2,16,16,64] multiply(c, c)
  ROOT g = f32[3,3,1,64] convolution(x, s), window={size=16x16 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf, batch_group_count=64, sharding={devices=[1,1,1,8]<=[8]}
}
"""
    module, out = partition_verified(text)
    assert not collectives(module), out


def test_a_conditional_whose_branches_agree_on_their_result_is_resharded_once_after_it():
    """Both branches of `cond(p, a @ b, b.T @ a.T + sum(a))` end with the same tiling of their
    result, which is wanted replicated: the conditional returns it tiled and one all-gather
    follows it, as XLA's partition does; each branch gathered its own root before (the same
    bytes when one runs, a copy of the move in every branch)."""
    text = """HloModule cond_agree, num_partitions=8
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
mm {
  t = (f32[64,32], f32[32,64]) parameter(0)
  a = f32[64,32] get-tuple-element(t), index=0
  b = f32[32,64] get-tuple-element(t), index=1
  ROOT d = f32[64,64] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
neg {
  t = (f32[64,32], f32[32,64]) parameter(0)
  a = f32[64,32] get-tuple-element(t), index=0
  ROOT n = f32[64,64] concatenate(a, a), dimensions={1}
}
ENTRY e {
  a = f32[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  b = f32[32,64] parameter(1), sharding={replicated}
  p = pred[] parameter(2), sharding={replicated}
  t = (f32[64,32], f32[32,64]) tuple(a, b)
  ROOT c = f32[64,64] conditional(p, t, t), true_computation=mm, false_computation=neg, sharding={replicated}
}
"""
    module, out = partition_verified(text)
    gathers = [i for i in module.all_instructions() if i.opcode.value == "all-gather"]
    assert len(gathers) == 1 and gathers[0].parent is module.entry, out
