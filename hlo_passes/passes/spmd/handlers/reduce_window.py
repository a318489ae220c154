"""reduce-window (and select-and-scatter, its gradient): local on tiled windowed dims after a
halo exchange (halo.py).

The operand takes the result's tiling; along each tiled dim with a window,
device t reads the input rows under its output rows' windows — nothing extra
when the stride steps over whole tiles (a 2x2 pool over 2-row tiles), else
halo rows from its neighbours — and rows outside the array read the reducer's
identity (XLA skips padding rather than reducing the init value into it, so the
identity, not the init value, reproduces its result).

    %p = f32[8,8] reduce-window(f32[16,8] %a, %ninf), window={size=2x1 stride=2x1}
         (%a and %p tiled [4,1])
  is local: f32[2,8] reduce-window(f32[4,8] %a, %ninf), window={size=2x1 stride=2x1}

Dims whose halo would move more than gathering them (or whose tiles do not
line up with a base dilation) are untiled first; variadic reduce-windows and
reducers that are not one known binary op untile every windowed dim
(`slicing.local_except`).

select-and-scatter is local when every tile's windows cover exactly its own rows
(pooling windows that tile the tiles, as in a 2x2 stride-2 max pool over even
tiles); scattering into a neighbour's rows would need the halo sent back and
summed, so other forms are computed replicated.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.attributes import Window, WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd.tile_map import Int64Array, TileMap
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.handlers.slicing import local_except
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.spmd.partition_context import (PValue, local_shape, reducer_opcode, root_of,
                                                       tile_map, to_sharding)


@handles(Opcode.REDUCE_WINDOW)
def reduce_window(p: HandlerContext, instr: Instruction) -> PValue:
    window = instr.window
    assert window is not None, f"{instr.name}: a reduce-window has a window"
    windowed = [d for d, w in enumerate(window.dimensions)
                if (w.size, w.stride, w.padding_low, w.padding_high, w.lhs_dilation, w.rhs_dilation)
                != (1, 1, 0, 0, 1, 1)]
    reducer = None if instr.shape.is_tuple else reducer_opcode(instr.called_computation("to_apply"))
    if reducer is None:
        return local_except(p, instr, windowed)
    target = p.target(instr)
    operand = instr.operands[0]
    tm = tile_map(target, instr.array_shape.rank, p.n)
    exchanges: list[halos.Halo] = []
    fixed: list[int] = []
    for d in windowed:
        t = tm.dims[d]
        if t == 1:
            continue
        w, size = window.dimensions[d], operand.array_shape.dims[d]
        out_local = -(-instr.array_shape.dims[d] // t)
        rows = halos.window_rows(w, t, [i * out_local for i in range(t)], out_local, [0] * t, w.size)
        active = [i * out_local < instr.array_shape.dims[d] for i in range(t)]
        h = halos.plan(d, size, t, rows, zero_padding=False, active=active) if rows is not None else None
        if h is None or h.bytes(1) >= (t - 1) * h.local:  # gathering moves no more
            fixed.append(d)
        else:
            exchanges.append(h)
    if not exchanges:
        return local_except(p, instr, windowed)
    s = to_sharding(tm.keep_dims([d for d in range(tm.rank) if d not in fixed]))
    x = p.operand_as(instr, 0, s)
    init = p.operand_as(instr, 1, Sharding.replicated())
    etype = instr.array_shape.element_type
    fill = p.em.constant(Reduction(reducer, etype).identity, etype) if any(h.mask for h in exchanges) else None
    dims = list(window.dimensions)
    for h in exchanges:
        x = halos.exchange(p.em, x, tm, h, fill)
        dims[h.dim] = h.rows.local
    new = p.clone(instr, [x, init], local_shape(instr.shape, s))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, s, instr.shape), target)



@handles(Opcode.SELECT_AND_SCATTER)
def select_and_scatter(p: HandlerContext, instr: Instruction) -> PValue:
    window = instr.window
    assert window is not None, f"{instr.name}: a select-and-scatter has a window"
    operand, source = instr.operands[0], instr.operands[1]
    target = p.target(instr)
    tm = tile_map(target, instr.array_shape.rank, p.n)
    dims = list(window.dimensions)
    crossing: list[int] = []
    for d, w in enumerate(window.dimensions):
        t = tm.dims[d]
        if t == 1 or (w.size, w.stride, w.padding_low, w.padding_high) == (1, 1, 0, 0):
            continue
        size, out = operand.array_shape.dims[d], source.array_shape.dims[d]
        rows = None if size % t or out % t else halos.window_rows(
            w, t, [i * (out // t) for i in range(t)], out // t, [0] * t, w.size)
        h = halos.plan(d, size, t, rows, zero_padding=False) if rows is not None else None
        if rows is None or h is None or h.left or h.right or h.mask or rows.width != h.local or any(h.offsets):
            crossing.append(d)
        else:
            dims[d] = rows.local
    if crossing:
        return _select_and_scatter_with_halos(p, instr, tm, target) or replicate(
            p, instr, "select-and-scatter windows cross tile boundaries and no halo exchange "
                      "applies (dilation, uneven operand tiles, a scatter other than add, a select "
                      "other than a comparison, or halos larger than a gather)")
    s = to_sharding(tm)
    x = p.operand_as(instr, 0, s)
    src = p.operand_as(instr, 1, s)
    init = p.operand_as(instr, 2, Sharding.replicated())
    new = p.clone(instr, [x, src, init], local_shape(instr.shape, s))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, s, instr.shape), target)


# The value padding rows take so that `select` never prefers them, per comparison direction.
_NEVER_SELECTED = {"GE": Opcode.MAXIMUM, "GT": Opcode.MAXIMUM, "LE": Opcode.MINIMUM, "LT": Opcode.MINIMUM}


def _select_and_scatter_with_halos(p: HandlerContext, instr: Instruction, tm: TileMap,
                                   target: Sharding) -> PValue | None:
    """select-and-scatter whose windows straddle tile boundaries, as GSPMD does it: output
    rows [tL, tL+L) of tile t receive from every window that touches them, so tile t fetches
    the source values of those windows (source halo; windows outside the array get source 0)
    and the operand rows they cover (operand halo; rows outside the array get a value the
    select never prefers), runs the select-and-scatter locally without padding, and keeps
    its own L rows.  Neighbouring tiles compute the windows they share twice; nothing is
    sent back.  Needs scatter = add (a zero source then adds nothing) and select = a
    comparison of its two parameters (which fixes the never-selected value); None otherwise.

    XLA skips padding positions instead of comparing against them: a window whose real rows
    are all at the never-selected value (all -inf for a max-pool) scatters its gradient into
    the padding, where XLA would give it to the first of those rows."""
    window = instr.window
    assert window is not None, f"{instr.name}: a select-and-scatter has a window"
    operand, source = instr.operands[0], instr.operands[1]
    if reducer_opcode(instr.called_computation("scatter")) is not Opcode.ADD:
        return None
    select_root = root_of(instr.called_computation("select"))
    params = instr.called_computation("select").parameters
    direction = select_root.attr("direction", None) if select_root.opcode is Opcode.COMPARE else None
    if (direction is None or str(direction) not in _NEVER_SELECTED
            or list(select_root.operands) != list(params)):
        return None
    etype = instr.array_shape.element_type
    operand_halos: list[halos.Halo] = []
    source_halos: list[halos.Halo] = []
    keep: list[Int64Array] = [np.zeros(p.n, np.int64) for _ in instr.array_shape.dims]
    local_dims = list(window.dimensions)
    for d, w in enumerate(window.dimensions):
        t = tm.dims[d]
        if t == 1 or (w.size, w.stride, w.padding_low, w.padding_high) == (1, 1, 0, 0):
            continue
        size, out = operand.array_shape.dims[d], source.array_shape.dims[d]
        if size % t or w.lhs_dilation != 1 or w.rhs_dilation != 1:
            return None
        L, s, pl = size // t, w.stride, w.padding_low
        first = [-(-(i * L + pl - w.size + 1) // s) for i in range(t)]    # first window touching tile i
        last = [((i + 1) * L - 1 + pl) // s for i in range(t)]             # last window touching tile i
        count = max(b - a + 1 for a, b in zip(first, last))
        source_rows = halos.WindowRows(tuple(first), count, WindowDimension(1))
        operand_rows = halos.WindowRows(tuple(a * s - pl for a in first), (count - 1) * s + w.size,
                                        WindowDimension(w.size, s))
        sh = halos.plan(d, out, t, source_rows, zero_padding=True)
        oh = halos.plan(d, size, t, operand_rows, zero_padding=False)
        if oh.bytes(1) >= (t - 1) * L or sh.bytes(1) >= (t - 1) * sh.local:
            return None  # gathering the operand and the source would move no more
        source_halos.append(sh)
        operand_halos.append(oh)
        local_dims[d] = WindowDimension(w.size, s)
        c = tm.coords[:, d]  # every device's tile along d
        keep[d] = c * L - np.asarray(operand_rows.starts, np.int64)[c]
    s_ = to_sharding(tm)
    x = p.operand_as(instr, 0, s_)
    src = p.operand_as(instr, 1, s_)
    init = p.operand_as(instr, 2, Sharding.replicated())
    never = p.em.constant(Reduction(_NEVER_SELECTED[str(direction)], etype).identity, etype)
    for h in operand_halos:
        x = halos.exchange(p.em, x, tm, h, never)
    for h in source_halos:
        src = halos.exchange(p.em, src, tm, h, None)
    extended = p.clone(instr, [x, src, init], x.shape)
    extended.set_attr("window", Window(tuple(local_dims)))
    mine = p.em.local_slice(extended, keep, local_shape(instr.array_shape, s_).dims)
    return p.reshard(PValue(mine, s_, instr.shape), target)


__all__ = ["reduce_window", "select_and_scatter"]
