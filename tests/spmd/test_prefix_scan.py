"""Cumulative reductions over a tiled dim (handlers/reduce_window.py, `_scan`): JAX's cumsum,
cummax and cumprod on the CPU are reduce-windows as wide as the dim, which the partitioner
runs as local scans plus an all-gather of each tile's total, not as the dim gathered (or a
halo as wide as the dim) and the whole quadratic window computed per row.

Each case is verified on its devices against XLA's run of the unpartitioned module and
asserts the plan: one all-gather, of one row per tile, and FLOPs well under what any plan
that runs N-wide windows over its own rows costs.  The last cases are not scans (a window
narrower than the dim, a stride, an init value other than the identity) and keep the
existing plans; they guard that the scan does not take them."""

from __future__ import annotations

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.runtime.xla_backend import cost_analysis
from tests.spmd.partitioning import collectives, partition_verified

_REDUCERS = {
    "add": ("f32", "add", "0"),
    "max": ("f32", "maximum", "-inf"),
    "min": ("s32", "minimum", "2147483647"),
    "mul": ("f32", "multiply", "1"),
    "or": ("pred", "or", "false"),
    # JAX's cumulative logsumexp: a region of its own, started from -inf (its identity)
    "logaddexp": ("f32", None, "-inf"),
}
_LOGADDEXP = """  d = f32[] subtract(a, b)
  unordered = pred[] compare(d, d), direction=NE
  sum = f32[] add(a, b)
  top = f32[] maximum(a, b)
  e = f32[] exponential(f32[] negate(f32[] abs(d)))
  rest = f32[] add(top, f32[] log-plus-one(e))
  ROOT c = f32[] select(unordered, sum, rest)"""


def _cumulative(dims: tuple[int, ...], dim: int, tiling: str, n: int, reducer: str = "add",
                reverse: bool = False, init: str | None = None, stride: int = 1, size: int | None = None,
                operand_sharding: str | None = None) -> str:
    """A module whose ROOT is a cumulative `reducer` along `dim` of a `dims` array, sharded by
    `tiling` on `n` devices, as is its operand unless `operand_sharding` says otherwise (the
    reduce-window JAX emits for `lax.cumsum(x, axis=dim, reverse=reverse)` and its kin, when
    `size`, `stride` and `init` are left alone)."""
    etype, opcode, identity = _REDUCERS[reducer]
    rows = dims[dim]
    size = rows if size is None else size
    pad = f"0_{size - 1}" if reverse else f"{size - 1}_0"
    sizes = "x".join(str(size) if k == dim else "1" for k in range(len(dims)))
    pads = "x".join(pad if k == dim else "0_0" for k in range(len(dims)))
    strides = "x".join(str(stride) if k == dim else "1" for k in range(len(dims)))
    body = _LOGADDEXP if opcode is None else f"  ROOT c = {etype}[] {opcode}(a, b)"
    out = list(dims)
    out[dim] = (rows - 1) // stride + 1  # (rows + size - 1 padded rows, windows `size` wide)
    shape = ",".join(map(str, dims))
    out_shape = ",".join(map(str, out))
    return f"""HloModule cumulative, num_partitions={n}
r {{
  a = {etype}[] parameter(0)
  b = {etype}[] parameter(1)
{body}
}}
ENTRY e {{
  x = {etype}[{shape}] parameter(0), sharding={operand_sharding or tiling}
  init = {etype}[] constant({init if init is not None else identity})
  ROOT s = {etype}[{out_shape}] reduce-window(x, init), window={{size={sizes} stride={strides} pad={pads}}}, to_apply=r, sharding={tiling}
}}
"""


def _assert_scanned(module, dim: int, rows: int, tiles: int, unpartitioned: str) -> None:
    """One all-gather, of one row per tile along `dim`; a local window `ceil(rows / tiles)`
    wide; and, where that window is at least 4 wide (narrower ones cost what the masks and
    the combine around them cost), FLOPs under half of what running the `rows`-wide window for
    this device's own rows alone costs (the least any plan that gathers the dim, or exchanges
    a halo as wide as it, computes)."""
    assert collectives(module) == {"all-gather": 1}, collectives(module)
    (gather,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_GATHER]
    assert gather.array_shape.dims[dim] == tiles, gather.array_shape
    (window,) = [i for i in module.all_instructions() if i.opcode is Opcode.REDUCE_WINDOW]
    assert window.window.dimensions[dim].size == -(-rows // tiles), window.window
    # FLOPs XLA counts per window row (one for a named reducer, the region's for a logaddexp)
    elements = parse_module(unpartitioned).entry.root.array_shape.element_count
    per_row = cost_analysis(unpartitioned)["flops"] / (elements * (rows - 1))
    own_rows_whole_window = window.array_shape.element_count * (rows - 1) * per_row
    if -(-rows // tiles) >= 4:
        assert cost_analysis(print_module(module))["flops"] < own_rows_whole_window / 2


SCANS = [
    # (id, dims, dim, tiling, devices, reducer, reverse)
    # even tiles; uneven ones, whose last tile's padding a suffix must mask (7 tiles of 10 rows
    # for 64, 3 of 22)
    ("cumsum_even_8", (64, 32), 0, "{devices=[8,1]<=[8]}", 8, "add", False),
    ("cumsum_uneven_7", (64, 256), 0, "{devices=[7,1]<=[7]}", 7, "add", False),
    ("reverse_cumsum_uneven_3", (64, 32), 0, "{devices=[3,1]<=[3]}", 3, "add", True),
    ("reverse_cumsum_uneven_7", (64, 16), 0, "{devices=[7,1]<=[7]}", 7, "add", True),
    ("cummax_uneven_7", (64, 16), 0, "{devices=[7,1]<=[7]}", 7, "max", False),
    ("reverse_cummax_uneven_3", (16, 64), 1, "{devices=[1,3]<=[3]}", 3, "max", True),
    # other reducers and types; the scanned dim the minor one
    ("cummin_s32_minor_dim", (8, 64), 1, "{devices=[1,8]<=[8]}", 8, "min", False),
    ("cumprod", (4, 24), 1, "{devices=[1,4]<=[4]}", 4, "mul", False),
    ("cumulative_or_pred_reverse", (40, 6), 0, "{devices=[8,1]<=[8]}", 8, "or", True),
    # a reducer that is a region of its own (combined by a map of it)
    ("cumlogsumexp_uneven_7", (64, 16), 0, "{devices=[7,1]<=[7]}", 7, "logaddexp", False),
    ("reverse_cumlogsumexp", (4, 64), 1, "{devices=[1,8]<=[8]}", 8, "logaddexp", True),
    # 9 rows in tiles of 2: tiles 5-7 hold padding only, and their totals must reach no real row
    ("tiles_past_the_last_row", (9, 256), 0, "{devices=[8,1]<=[8]}", 8, "add", False),
    ("tiles_past_the_last_row_reverse", (9, 256), 0, "{devices=[8,1]<=[8]}", 8, "add", True),
    # the other dim tiled too (the totals gathered within each column of tiles), a transposed
    # device order, partial replication
    ("other_dim_tiled_too", (64, 32), 0, "{devices=[4,2]<=[8]}", 8, "max", False),
    ("other_dim_tiled_transposed_mesh", (30, 32), 0, "{devices=[4,2]<=[2,4]T(1,0)}", 8, "add", True),
    ("partially_replicated", (64, 32), 0, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", 8, "add", False),
    ("partially_replicated_reverse_uneven", (3, 30, 4), 1,
     "{devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", 8, "add", True),
]


@pytest.mark.parametrize("dims, dim, tiling, n, reducer, reverse",
                         [pytest.param(*case[1:], id=case[0]) for case in SCANS])
def test_cumulative_reduction_is_local_scans_and_one_gather_of_totals(dims, dim, tiling, n, reducer, reverse):
    text = _cumulative(dims, dim, tiling, n, reducer, reverse)
    module, _ = partition_verified(text, n)
    _assert_scanned(module, dim, dims[dim], module.entry.parameters[0].sharding.tile_dims[dim], text)


def test_cumsum_annotated_on_seven_devices_matches_the_issue_reproducer():
    """The module of issue 11 (cumsum_n7.hlo): before, every device gathered all 64 rows and
    ran the 64-wide window over them, 6.4x the FLOPs of XLA's own partition."""
    text = """HloModule m, num_partitions=7
r_add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  p0 = f32[64,256] parameter(0), sharding={devices=[7,1]<=[7]}
  z = f32[] constant(0)
  ROOT r = f32[64,256] reduce-window(p0, z), window={size=64x1 pad=63_0x0_0}, to_apply=r_add, sharding={devices=[7,1]<=[7]}
}
"""
    module, out = partition_verified(text, 7)
    assert collectives(module) == {"all-gather": 1}
    assert "f32[7,256] all-gather" in out
    assert "window={size=10x1 pad=9_0x0_0}" in out
    assert cost_analysis(out)["flops"] < 40_000  # 1,032,192 before; XLA's own partition: 161,281


def test_replicated_operand_scans_its_own_rows_without_moving_them():
    """An operand every device holds whole: each takes its rows (a local slice), then as above."""
    text = _cumulative((64, 32), 0, "{devices=[8,1]<=[8]}", 8, operand_sharding="{replicated}")
    module, out = partition_verified(text, 8)
    assert collectives(module) == {"all-gather": 1}
    assert "window={size=8x1 pad=7_0x0_0}" in out


FALLBACKS = [
    # a window narrower than the dim: a halo exchange, not a scan
    ("window_narrower_than_the_dim", dict(size=40)),
    # every second prefix: strided
    ("strided_prefix", dict(stride=2)),
    # init 1 for a sum is not its identity: XLA's own result depends on how it splits the window
    ("init_not_the_identity", dict(init="1")),
]


@pytest.mark.parametrize("options", [pytest.param(o, id=name) for name, o in FALLBACKS])
def test_windows_that_are_not_scans_keep_the_existing_plans(options):
    text = _cumulative((64, 32), 0, "{devices=[8,1]<=[8]}", 8, **options)
    module, out = partition_verified(text, 8)
    windows = [i for i in module.all_instructions() if i.opcode is Opcode.REDUCE_WINDOW]
    assert len(windows) == 1 and windows[0].window.dimensions[0].size == options.get("size", 64), out
    assert not any(i.opcode is Opcode.REDUCE for i in module.all_instructions()), out


def test_unannotated_cumsum_takes_its_operands_tiling_and_scans():
    """Propagation carries the operand's tiling into a cumsum no annotation reaches (the dim's
    window is as wide as the dim, but a scan: ir/cumulative.py), so the partitioner scans each
    device's 10 rows where it had gathered all 64 and run 64-row windows on every device (the
result, which nothing annotates, is gathered after)."""
    text = """HloModule m, num_partitions=7
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[64,256] parameter(0), sharding={devices=[7,1]<=[7]}
  z = f32[] constant(0)
  c = f32[64,256] reduce-window(x, z), window={size=64x1 pad=63_0x0_0}, to_apply=add
  ROOT n = f32[64,256] negate(c)
}
"""
    module, _ = partition_verified(text, 7)
    (scan,) = [i for i in module.all_instructions() if i.opcode is Opcode.REDUCE_WINDOW]
    assert scan.window.dimensions[0].size == 10, scan.window
    assert collectives(module) == {"all-gather": 2}  # the totals, then the (replicated) result
