"""Halo exchange for windowed ops over tiled dims (halo.py, handlers/convolution.py,
handlers/reduce_window.py): the row algebra against brute force, and convolutions
(forward, kernel-gradient, input-gradient) and reduce-windows over spatially tiled inputs
verified on 8 devices against the unpartitioned module."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hlo_passes import parse_module, print_module
from hlo_passes.ir.attributes import WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd import halo
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent


def _out_size(n, w: WindowDimension) -> int:
    padded = (n - 1) * w.lhs_dilation + 1 + w.padding_low + w.padding_high
    return (padded - ((w.size - 1) * w.rhs_dilation + 1)) // w.stride + 1


def _rows_read(w: WindowDimension, outs, wins) -> set[int]:
    """Input rows (possibly outside [0, n)) that outputs `outs` read through window positions `wins`."""
    rows = set()
    for o in outs:
        for k in wins:
            p = o * w.stride + k * w.rhs_dilation - w.padding_low
            if p % w.lhs_dilation == 0:
                rows.add(p // w.lhs_dilation)
    return rows


windows = st.builds(WindowDimension, size=st.integers(1, 5), stride=st.integers(1, 3),
                    padding_low=st.integers(-1, 3), padding_high=st.integers(-1, 3),
                    lhs_dilation=st.integers(1, 3), rhs_dilation=st.integers(1, 2))


@settings(max_examples=300, deadline=None)
@given(w=windows, n=st.integers(1, 40), tiles=st.integers(2, 8))
def test_window_rows_cover_exactly_what_each_tile_reads(w, n, tiles):
    o = _out_size(n, w)
    if o < 1:
        return
    lo = -(-o // tiles)
    rows = halo.window_rows(w, tiles, [t * lo for t in range(tiles)], lo, [0] * tiles, w.size)
    if rows is None:  # tiles start at different phases of the base dilation, or read only holes
        assert (lo * w.stride) % w.lhs_dilation or any(
            not _rows_read(w, range(t * lo, t * lo + lo), range(w.size)) for t in range(tiles))
        return
    for t in range(tiles):
        start = rows.starts[t]
        read = _rows_read(w, range(t * lo, t * lo + lo), range(w.size))
        assert read <= set(range(start, start + rows.width))
        # the local window over those rows reads the same rows, in the same places
        local = rows.local
        local_read = _rows_read(local, range(lo), range(local.size))
        assert {start + r for r in local_read} == read
        assert all(0 <= r < rows.width for r in local_read)
    active = [t * lo < o for t in range(tiles)]
    plan = halo.plan(1, n, tiles, rows, zero_padding=True, active=active)
    size = plan.left + plan.local + plan.right
    for t, start in enumerate(rows.starts):  # an active tile's window lies in its buffer unclamped
        assert 0 <= plan.offsets[t] and plan.offsets[t] + rows.width <= size
        if active[t]:
            assert plan.offsets[t] == plan.left - (t * plan.local - start)


def _check(text: str, *, expect: dict[str, int], no_missed: bool = True):
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=8)
    p.run(module)
    out = print_module(module)
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format() + "\n" + out
    for op, count in expect.items():
        assert out.count(f" {op}(") == count, f"expected {count} × {op}:\n{out}"
    if no_missed:
        assert not [r for r in p.remarks if r.kind == "missed"], p.remarks
    return out


CONV = """HloModule conv
ENTRY main {{
  x = f32[2,{n},6,3] parameter(0), sharding={s}
  k = f32[{k},3,3,4] parameter(1), sharding={{replicated}}
  ROOT c = f32[2,{o},6,4] convolution(x, k), window={{size={k}x3 {win} pad={pad}x1_1}}, dim_labels=b01f_01io->b01f, sharding={s}
}}
"""


@pytest.mark.parametrize("n,k,win,pad,o,s,cps", [
    (16, 3, "", "1_1", 16, "{devices=[1,8,1,1]<=[8]}", 2),
    (16, 5, "", "2_2", 16, "{devices=[2,4,1,1]<=[8]}", 2),            # two rows each way
    (16, 3, "stride=2x1", "0_1", 8, "{devices=[2,4,1,1]<=[8]}", 1),   # the corpus net's strided form
    (16, 3, "stride=2x1", "1_1", 8, "{devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}", 1),
    (13, 3, "", "1_1", 13, "{devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}", 2),  # uneven
    # uneven, strided: each window needs two rows of its right neighbour only -> one permute
    (10, 3, "stride=2x1", "1_1", 5, "{devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}", 1),
    (16, 3, "rhs_dilate=3x1", "3_3", 16, "{devices=[1,8,1,1]<=[8]}", 4),  # halo wider than a tile
    (16, 2, "", "0_0", 15, "{devices=[1,4,2,1]<=[8]}", 3),            # one-sided halo; dim 2 tiled too
])
def test_forward_convolution_exchanges_halos(n, k, win, pad, o, s, cps):
    text = CONV.format(n=n, k=k, win=win, pad=pad, o=o, s=s)
    _check(text, expect={"collective-permute": cps, "all-gather": 0})


def test_kernel_gradient_is_local_convolution_then_all_reduce():
    text = """HloModule kgrad
ENTRY main {
  x = f32[2,16,6,3] parameter(0), sharding={devices=[2,4,1,1]<=[8]}
  dy = f32[2,8,6,4] parameter(1), sharding={devices=[2,4,1,1]<=[8]}
  ROOT dw = f32[3,3,3,4] convolution(x, dy), window={size=8x6 pad=0_1x1_1 rhs_dilate=2x1}, dim_labels=f01b_i01o->01bf, sharding={replicated}
}
"""
    _check(text, expect={"collective-permute": 1, "all-reduce": 1, "all-gather": 0})


def test_input_gradient_of_strided_convolution_keeps_base_dilation():
    text = """HloModule dgrad
ENTRY main {
  dy = f32[2,8,6,4] parameter(0), sharding={devices=[2,4,1,1]<=[8]}
  w = f32[3,3,3,4] parameter(1), sharding={replicated}
  ROOT dx = f32[2,16,6,3] convolution(dy, w), window={size=3x3 pad=2_1x1_1 lhs_dilate=2x1 rhs_reversal=1x1}, dim_labels=b01f_01oi->b01f, sharding={devices=[2,4,1,1]<=[8]}
}
"""
    out = _check(text, expect={"collective-permute": 1, "all-gather": 0})
    assert "lhs_dilate=2x1" in out


def test_base_dilation_out_of_phase_falls_back_with_remark():
    # 3 output rows per tile, base dilation 2: tiles start at different phases of the dilation
    text = """HloModule dgrad
ENTRY main {
  dy = f32[2,6,6,4] parameter(0), sharding={devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}
  w = f32[3,3,3,4] parameter(1), sharding={replicated}
  ROOT dx = f32[2,12,6,3] convolution(dy, w), window={size=3x3 pad=2_1x1_1 lhs_dilate=2x1}, dim_labels=b01f_01oi->b01f, sharding={devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}
}
"""
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=8)
    p.run(module)
    assert any("spatially sharded convolution input gathered" in r.message for r in p.remarks)
    assert verify_equivalent(text, print_module(module), num_devices=8).ok


POOL = """HloModule pool
{red} {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {red}(a, b)
}}
ENTRY main {{
  x = f32[{n},10] parameter(0), sharding={s}
  i = f32[] constant({init})
  ROOT y = f32[{o},10] reduce-window(x, i), window={{size={k}x1 stride={st}x1 pad={pad}x0_0}}, to_apply={red}, sharding={s}
}}
"""


@pytest.mark.parametrize("red,init,n,k,st,pad,o,s,cps", [
    ("maximum", "-inf", 16, 2, 2, "0_0", 8, "{devices=[8,1]<=[8]}", 0),   # aligned pool: local
    ("maximum", "-inf", 16, 3, 2, "1_0", 8, "{devices=[4,2]<=[8]}", 1),   # edge padding reads -inf
    ("add", "0", 13, 3, 1, "1_1", 13, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", 2),  # uneven
    ("add", "1.5", 10, 2, 1, "1_0", 10, "{devices=[2,4]<=[8]}", 1),      # init is no identity
])
def test_reduce_window_exchanges_halos(red, init, n, k, st, pad, o, s, cps):
    text = POOL.format(red=red, init=init, n=n, k=k, st=st, pad=pad, o=o, s=s)
    _check(text, expect={"collective-permute": cps, "all-gather": 0})


@pytest.mark.parametrize("groups", [(1, 1), (4, 2)], ids=["dense", "grouped"])
def test_conv_net_training_step_partitions_every_convolution_with_halos(groups):
    """The corpus conv net (batch on 'data', height on 'spatial'), differentiated by JAX: the
    forward convolutions, the input gradient (lhs_dilate=2), both kernel gradients and the
    max-pool gradient (select-and-scatter) are all partitioned without a gather; grouped
    (depthwise first layer: feature groups forward, batch groups in the kernel gradient) too."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "spatial"))
    dn, spec = ("NHWC", "HWIO", "NHWC"), P("data", "spatial", None, None)

    def wsc(y):
        return lax.with_sharding_constraint(y, NamedSharding(mesh, spec))

    def loss(w1, w2, x):
        y = wsc(jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn,
                                                     feature_group_count=groups[0])))
        y = wsc(lax.conv_general_dilated(y, w2, (2, 2), "SAME", dimension_numbers=dn,
                                         feature_group_count=groups[1]))
        y = wsc(lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"))
        return (y ** 2).mean()

    def step(w1, w2, x):
        value, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x)
        return value, w1 - 0.1 * g1, w2 - 0.1 * g2

    rng = np.random.default_rng(0)
    args = (jax.device_put(rng.normal(size=(3, 3, 4 // groups[0], 8)).astype(np.float32), NamedSharding(mesh, P())),
            jax.device_put(rng.normal(size=(3, 3, 8 // groups[1], 8)).astype(np.float32), NamedSharding(mesh, P())),
            jax.device_put(jnp.ones((2, 16, 16, 4)), NamedSharding(mesh, spec)))
    text = jax.jit(step).lower(*args).as_text(dialect="hlo")
    assert text.count(" convolution(") == 5 and " select-and-scatter(" in text
    out = _check(text, expect={"all-gather": 0, "all-to-all": 0})
    assert out.count(" all-reduce(") == 3  # the loss and the two kernel gradients


def test_propagation_carries_spatial_tiling_through_pooling_and_its_gradient():
    """Only the input is annotated: sharding-propagation takes its spatial tiling through the
    reduce-window's windowed dim and through select-and-scatter (operand and source), so the
    pool and its gradient run locally — no collective at all, as XLA's propagation would
    have them — and the result equals the unpartitioned module."""
    text = """HloModule pool_grad, allow_spmd_sharding_propagation_to_output={true}
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[16,6] parameter(0), sharding={devices=[8,1]<=[8]}
  ninf = f32[] constant(-inf)
  pooled = f32[8,6] reduce-window(x, ninf), window={size=2x1 stride=2x1}, to_apply=max
  g = f32[8,6] negate(pooled)
  zero = f32[] constant(0)
  ROOT dx = f32[16,6] select-and-scatter(x, g, zero), window={size=2x1 stride=2x1}, select=ge, scatter=add
}
"""
    module = parse_module(text)
    from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation

    ShardingPropagation().run(module)
    by_name = {i.name: i for i in module.entry.instructions}
    tiled = "{devices=[8,1]<=[8]}"
    assert [by_name[n].sharding.to_hlo() for n in ("pooled", "g", "dx")] == [tiled] * 3
    _check(text, expect={"collective-permute": 0, "all-gather": 0, "all-reduce": 0})


def test_a_window_as_wide_as_the_dim_is_a_scan_of_each_devices_columns():
    """JAX's cumsum on the CPU is a reduce-window as wide as the dim.  Propagation keeps the
    dim's tiling (a cumulative window, ir/cumulative.py) and the partitioner scans each
    device's 3 columns, gathers the 8 tiles' totals and, for the replicated user, the result:
    two all-gathers, no 24-wide window anywhere.  (Before the scan, the dim was left untiled
    and one all-gather of the input fed 24-wide windows on every device: one collective fewer
    at this toy size, and quadratic work in the dim at any size.)"""
    text = """HloModule cumsum
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[4,24] parameter(0), sharding={devices=[1,8]<=[8]}
  zero = f32[] constant(0)
  c = f32[4,24] reduce-window(x, zero), window={size=1x24 pad=0_0x23_0}, to_apply=add
  ROOT p = f32[4,27] pad(c, zero), padding=0_0x1_2, sharding={replicated}
}
"""
    out = _check(text, expect={"all-gather": 2, "collective-permute": 0})
    assert "size=1x3 pad=0_0x2_0" in out and "size=1x24" not in out, out


SELECT_AND_SCATTER = """HloModule pool_grad
{sel} {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction={sel}
}}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}
ENTRY main {{
  x = f32[{n},6] parameter(0), sharding={s}
  g = f32[{o},6] parameter(1), sharding={s}
  zero = f32[] constant(0)
  ROOT y = f32[{n},6] select-and-scatter(x, g, zero), window={{size={k}x1 stride={st}x1 pad={pad}x0_0}}, select={sel}, scatter=add, sharding={s}
}}
"""


@pytest.mark.parametrize("sel,n,k,st,pad,o,s", [
    ("GE", 16, 3, 2, "0_0", 7, "{devices=[8,1]<=[8]}"),       # ResNet-style overlapping max-pool
    ("GE", 16, 3, 2, "1_1", 8, "{devices=[4,2]<=[8]}"),       # SAME padding: edge rows never chosen
    ("LE", 16, 3, 1, "1_1", 16, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"),  # min, stride 1
    ("GT", 24, 4, 3, "2_1", 8, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"),  # pad 2_1, stride 3
    ("GE", 16, 5, 2, "2_2", 8, "{devices=[8,1]<=[8]}"),       # halo of two rows from farther tiles
    # uneven operand tiles (these were replicated)
    ("GE", 15, 3, 2, "0_0", 7, "{devices=[8,1]<=[8]}"),       # last tile holds one real row
    ("GE", 14, 3, 2, "1_1", 7, "{devices=[4,2]<=[8]}"),       # 4 rows a tile, 2 in the last
    ("LE", 10, 3, 1, "1_1", 10, "{devices=[8,1]<=[8]}"),      # tiles 5-7 hold no real row
    ("GT", 9, 2, 2, "0_1", 5, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"),  # last window padded
])
def test_select_and_scatter_with_windows_across_tiles_exchanges_halos(sel, n, k, st, pad, o, s):
    """The max-pool gradient with overlapping windows: each tile fetches the operand rows and
    source values of every window touching its rows, scatters locally and keeps its own rows —
    collective-permutes only, and equal to the unpartitioned module.  With uneven tiles the
    rows past the array take the never-selected value and the windows past the last one a
    zero source, so they add nothing."""
    text = SELECT_AND_SCATTER.format(sel=sel, n=n, k=k, st=st, pad=pad, o=o, s=s)
    out = _check(text, expect={"all-gather": 0, "all-reduce": 0})
    assert " collective-permute(" in out


GROUPED = """HloModule grouped
ENTRY main {{
  x = f32[{b},8,8,{cin}] parameter(0), sharding={sx}
  k = f32[3,3,{kin},{cout}] parameter(1), sharding={sk}
  ROOT c = f32[{ob},8,8,{cout}] convolution(x, k), window={{size=3x3 pad=1_1x1_1}}, dim_labels={labels}, {groups}, sharding={so}
}}
"""


@pytest.mark.parametrize("b,cin,kin,cout,ob,labels,groups,sx,sk,so,gathers", [
    # depthwise (64 groups) with channels over 8: every device convolves its 8 channels
    (4, 64, 1, 64, 4, "b01f_01io->b01f", "feature_group_count=64",
     "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", 0),
    # 8 groups of 4 channels, channels over 4 devices and batch over 2
    (4, 32, 4, 16, 4, "b01f_01io->b01f", "feature_group_count=8",
     "{devices=[2,1,1,4]<=[8]}", "{devices=[1,1,1,4,2]<=[8] last_tile_dim_replicate}",
     "{devices=[2,1,1,4]<=[8]}", 0),
    # 6 groups over 8 devices: only 2 tiles fit whole groups; still correct
    (2, 12, 2, 12, 2, "b01f_01io->b01f", "feature_group_count=6",
     "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", None),
    # 6 groups, channels over 4 and batch over 2: the 4 channel tiles merge into 2 tiles of 3
    # groups (an all-gather within pairs), the batch stays split — each device convolves a
    # quarter (this gathered everything and convolved it whole, as XLA does)
    (8, 12, 2, 12, 8, "b01f_01io->b01f", "feature_group_count=6",
     "{devices=[2,1,1,4]<=[8]}", "{devices=[1,1,1,4,2]<=[8] last_tile_dim_replicate}",
     "{devices=[2,1,1,4]<=[8]}", 2),
    # the depthwise kernel gradient: batch groups over the channel dim
    (16, 8, 8, 16, 3, "f01b_i01o->01bf", "batch_group_count=16",
     "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", "{devices=[1,1,1,8]<=[8]}", 0),
])
def test_grouped_convolutions_tile_whole_groups(b, cin, kin, cout, ob, labels, groups, sx, sk, so, gathers):
    """Grouped and depthwise convolutions (and the depthwise kernel gradient's batch groups)
    with the group dim sharded compute their own groups locally, as XLA does, instead of
    gathering everything."""
    if labels.startswith("f01b"):  # kernel gradient: x is [features, 8, 8, batch], k the output gradient
        text = f"""HloModule grouped
ENTRY main {{
  x = f32[{cin},8,8,{b}] parameter(0), sharding={sx}
  g = f32[{cin},8,8,{cout}] parameter(1), sharding={sk}
  ROOT c = f32[3,3,1,{cout}] convolution(x, g), window={{size=8x8 pad=1_1x1_1}}, dim_labels={labels}, {groups}, sharding={so}
}}
"""
    else:
        text = GROUPED.format(b=b, cin=cin, kin=kin, cout=cout, ob=ob, labels=labels, groups=groups,
                              sx=sx, sk=sk, so=so)
    expect = {} if gathers is None else {"all-gather": gathers}
    _check(text, expect=expect, no_missed=gathers is not None)


TOPK = """HloModule topk
ENTRY main {{
  x = f32[{b},{n}] parameter(0), sharding={s}
  ROOT t = (f32[{b},{k}], s32[{b},{k}]) {op}, sharding={{{s}, {s}}}
}}
"""


@pytest.mark.parametrize("b,n,k,s,op", [
    (16, 1024, 4, "{devices=[1,8]<=[8]}", 'custom-call(x), custom_call_target="TopK"'),
    (16, 1000, 3, "{devices=[2,4]<=[8]}", "topk(x), k=3, largest=true"),      # uneven last tiles
    (6, 64, 5, "{devices=[1,4,2]<=[8] last_tile_dim_replicate}", "topk(x), k=5, largest=false"),
])
def test_topk_along_the_sharded_dim_gathers_only_candidates(b, n, k, s, op):
    """top-k along a sharded dim: local top-k, t*k candidates all-gathered, a stable sort: the
    values and the (global) positions equal the unpartitioned op's, ties included."""
    text = TOPK.format(b=b, n=n, k=k, s=s, op=op)
    out = _check(text, expect={"all-gather": 2})
    assert " sort(" in out


DUS = """HloModule dus
ENTRY main {{
  x = f32[{n},{m}] parameter(0), sharding={sx}
  u = f32[{un},{um}] parameter(1), sharding={su}
  i = s32[] constant({i})
  j = s32[] constant({j})
  ROOT d = f32[{n},{m}] dynamic-update-slice(x, u, i, j), sharding={sx}
}}
"""


@pytest.mark.parametrize("n,m,un,um,i,j,sx,su", [
    (64, 32, 10, 32, 29, 0, "{devices=[8,1]<=[8]}", "{replicated}"),          # straddles two tiles
    (64, 32, 10, 32, 60, 0, "{devices=[8,1]<=[8]}", "{replicated}"),          # clamped to 54
    (64, 32, 10, 32, -5, 0, "{devices=[8,1]<=[8]}", "{replicated}"),          # clamped to 0
    (60, 30, 13, 7, 17, 20, "{devices=[4,2]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),  # uneven, both dims
])
def test_dynamic_update_slice_keeps_a_sharded_operand_in_place(n, m, un, um, i, j, sx, su):
    """A dynamic-update-slice into a sharded dim: every device writes the part of the update
    that falls in its rows (XLA's clamped offset included) — the operand never moves."""
    text = DUS.format(n=n, m=m, un=un, um=um, i=i, j=j, sx=sx, su=su)
    out = _check(text, expect={"all-to-all": 0, "collective-permute": 0})
    assert out.count(" all-gather(") <= 1  # at most the small update


EMBEDDING = """HloModule embedding
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}
ENTRY main {{
  table = f32[{v},16] parameter(0), sharding={st}
  ids = s32[4,6] parameter(1), sharding={si}
  g = f32[4,6,16] gather(table, ids), offset_dims={{2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=2, slice_sizes={{1,16}}, sharding={sg}
  u = f32[4,6,16] parameter(2), sharding={si3}
  z = f32[{v},16] broadcast(f32[] constant(0)), dimensions={{}}
  s = f32[{v},16] scatter(z, ids, u), update_window_dims={{2}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=add, sharding={st}
  ROOT t = (f32[4,6,16], f32[{v},16]) tuple(g, s), sharding={{{sg}, {st}}}
}}
"""


@pytest.mark.parametrize("v,st,si,sg,si3", [
    (64, "{devices=[8,1]<=[8]}", "{replicated}", "{replicated}", "{replicated}"),
    (60, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
     "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", "{replicated}"),     # uneven vocabulary tiles
    (32, "{devices=[4,1,2]<=[4,2]T(1,0) last_tile_dim_replicate}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
     "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}"),
])
def test_embedding_sharded_by_vocabulary_gathers_and_scatters_locally(v, st, si, sg, si3):
    """A table sharded by rows (vocabulary): the lookup gathers from each device's rows with
    shifted, masked indices and sums the partial results; the scatter-add of the gradient
    scatters into each device's rows (out-of-range updates are skipped) — the table never moves.
    Except where gathering the table costs less: in the last case the ids' batch tiling runs
    over other devices than the table's replicas, so summing would first gather the ids and
    move 2,352 bytes a device; the [32,16] table gathered over its 4 row tiles moves 1,536."""
    text = EMBEDDING.format(v=v, st=st, si=si, sg=sg, si3=si3)
    out = _check(text, expect={})
    module = parse_module(out)
    gathered = [i for i in module.entry.instructions
                if i.opcode is Opcode.ALL_GATHER and i.operands[0].name == "table"]
    if v == 32:
        assert [i.array_shape.dims for i in gathered] == [(32, 16)]
        (lookup,) = [i for i in module.entry.instructions if i.opcode is Opcode.GATHER]
        assert lookup.operands[0] is gathered[0]
    else:
        assert not gathered


def test_take_along_a_sharded_axis_with_batching_dims():
    """take_along_axis over a vocabulary-sharded dim (explicit batching dims, batch over data):
    masked local gathers and one small all-reduce — the logits never move."""
    text = """HloModule tal
ENTRY main {
  logits = f32[8,6,40] parameter(0), sharding={devices=[2,1,4]<=[8]}
  labels = s32[8,6,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT g = f32[8,6,1] gather(logits, labels), offset_dims={}, collapsed_slice_dims={2}, start_index_map={2}, operand_batching_dims={0,1}, start_indices_batching_dims={0,1}, index_vector_dim=3, slice_sizes={1,1,1}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
}
"""
    out = _check(text, expect={"all-gather": 0, "all-reduce": 1})
    assert "f32[4,6,10] parameter(0)" in out


VARIADIC_RW = """HloModule rwv
{reducer}
ENTRY main {{
  x = f32[4,{n},16] parameter(0), sharding={{devices=[1,8,1]<=[8]}}
  {second}
  ROOT r = (f32[4,{o},16], {etype}[4,{o},16]) reduce-window(x, y, {inits}), window={{size=1x{k}x1 {win}}}, to_apply=red, sharding={{{{devices=[1,8,1]<=[8]}}, {{devices=[1,8,1]<=[8]}}}}
}}
"""
SUM_MAX = """red {
  a0 = f32[] parameter(0)
  a1 = f32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = f32[] parameter(3)
  s = f32[] add(a0, b0)
  m = f32[] maximum(a1, b1)
  ROOT t = (f32[], f32[]) tuple(s, m)
}"""
ARGMAX = """red {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  ge = pred[] compare(av, bv), direction=GE
  v = f32[] select(ge, av, bv)
  i = s32[] select(ge, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}"""


@pytest.mark.parametrize("reducer,etype,n,k,win,o,gathers", [
    # a sum and a max at once over padded windows: every operand's halo, padding rows filled
    # with each reduction's identity (XLA skips them)
    (SUM_MAX, "f32", 32, 3, "stride=1x2x1 pad=0_0x1_0x0_0", 16, 0),
    # an argmax (select reducer, no identity) whose windows read real rows only: halos, no mask
    (ARGMAX, "s32", 34, 3, "", 32, 0),
    # the same argmax over padded windows: no value may stand for the padding, so the windowed
    # dim is not kept tiled (its tiling moves to the free last dim: all-to-alls, no gather)
    (ARGMAX, "s32", 32, 3, "pad=0_0x1_1x0_0", 32, 0),
])
def test_variadic_reduce_window_exchanges_every_operand_halo(reducer, etype, n, k, win, o, gathers):
    second = (f"y = f32[4,{n},16] parameter(1), sharding={{devices=[1,8,1]<=[8]}}" if etype == "f32" else
              f"y = s32[4,{n},16] iota(), iota_dimension=1, sharding={{devices=[1,8,1]<=[8]}}")
    inits = ("f32[] constant(0), f32[] constant(-inf)" if etype == "f32"
             else "f32[] constant(-inf), s32[] constant(0)")
    text = VARIADIC_RW.format(reducer=reducer, second=second, etype=etype, n=n, k=k, win=win, o=o, inits=inits)
    out = _check(text, expect={"all-gather": gathers})
    if "pad=0_0x1_1" in win:
        assert " all-to-all(" in out and " collective-permute(" not in out
    else:
        assert " collective-permute(" in out and " all-to-all(" not in out


def test_select_and_scatter_with_dilation_on_a_tiled_dim_stays_replicated():
    """A dilated select-and-scatter has no executable meaning to check against (StableHLO's
    select_and_scatter has no dilation; XLA:CPU rejects the dilated form), so a tiled dilated
    dim is not split: replicated, with a remark saying why."""
    text = """HloModule dil, num_partitions=8
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[16,6] parameter(0), sharding={devices=[8,1]<=[8]}
  g = f32[7,6] parameter(1), sharding={devices=[8,1]<=[8]}
  zero = f32[] constant(0)
  ROOT y = f32[16,6] select-and-scatter(x, g, zero), window={size=2x1 stride=2x1 rhs_dilate=2x1}, select=ge, scatter=add, sharding={devices=[8,1]<=[8]}
}
"""
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=8)
    p.run(module)
    assert [r for r in p.remarks if r.kind == "missed" and "dilation" in r.message], p.remarks
    (sas,) = [i for i in module.entry.instructions if i.opcode.value == "select-and-scatter"]
    assert sas.shape.to_hlo(False) == "f32[16,6]"
