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

from hlo_passes.ir.attributes import Window
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd.handlers import handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.handlers.slicing import local_except
from hlo_passes.passes.spmd.partition_context import (PValue, identity_value, local_shape, reducer_opcode,
                                                       tile_map, to_sharding)


@handles(Opcode.REDUCE_WINDOW)
def reduce_window(p, instr) -> PValue:
    window = instr.attr("window")
    windowed = [d for d, w in enumerate(window.dimensions)
                if (w.size, w.stride, w.padding_low, w.padding_high, w.lhs_dilation, w.rhs_dilation)
                != (1, 1, 0, 0, 1, 1)]
    reducer = None if instr.shape.is_tuple else reducer_opcode(instr.called["to_apply"])
    if reducer is None:
        return local_except(p, instr, windowed)
    target = p.target(instr)
    operand = instr.operands[0]
    tm = tile_map(target, instr.shape.rank, p.n)
    exchanges, fixed = [], []
    for d in windowed:
        t = tm.dims[d]
        if t == 1:
            continue
        w, size = window.dimensions[d], operand.shape.dims[d]
        out_local = -(-instr.shape.dims[d] // t)
        rows = halos.window_rows(w, t, [i * out_local for i in range(t)], out_local, [0] * t, w.size)
        active = [i * out_local < instr.shape.dims[d] for i in range(t)]
        h = rows and halos.plan(d, size, t, rows, zero_padding=False, active=active)
        if h is None or h.left + h.right >= (t - 1) * h.local:  # gathering moves no more
            fixed.append(d)
        else:
            exchanges.append(h)
    if not exchanges:
        return local_except(p, instr, windowed)
    s = to_sharding(tm.keep_dims([d for d in range(tm.rank) if d not in fixed]))
    x = p.operand_as(instr, 0, s)
    init = p.operand_as(instr, 1, Sharding.replicated())
    etype = instr.shape.element_type
    fill = p.em.constant(identity_value(reducer, etype), etype) if any(h.mask for h in exchanges) else None
    dims = list(window.dimensions)
    for h in exchanges:
        x = halos.exchange(p.em, x, tm, h, fill)
        dims[h.dim] = h.rows.local
    new = p.clone(instr, [x, init], local_shape(instr.shape, s))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, s, instr.shape), target)



@handles(Opcode.SELECT_AND_SCATTER)
def select_and_scatter(p, instr) -> PValue:
    window = instr.attr("window")
    operand, source = instr.operands[0], instr.operands[1]
    target = p.target(instr)
    tm = tile_map(target, instr.shape.rank, p.n)
    dims = list(window.dimensions)
    for d, w in enumerate(window.dimensions):
        t = tm.dims[d]
        if t == 1 or (w.size, w.stride, w.padding_low, w.padding_high) == (1, 1, 0, 0):
            continue
        size, out = operand.shape.dims[d], source.shape.dims[d]
        rows = None if size % t or out % t else halos.window_rows(
            w, t, [i * (out // t) for i in range(t)], out // t, [0] * t, w.size)
        h = rows and halos.plan(d, size, t, rows, zero_padding=False)
        if h is None or h.left or h.right or h.mask or rows.width != h.local or any(h.offsets):
            return replicate(p, instr, "select-and-scatter windows cross tile boundaries (no reverse halo)")
        dims[d] = rows.local
    s = to_sharding(tm)
    x = p.operand_as(instr, 0, s)
    src = p.operand_as(instr, 1, s)
    init = p.operand_as(instr, 2, Sharding.replicated())
    new = p.clone(instr, [x, src, init], local_shape(instr.shape, s))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, s, instr.shape), target)


__all__ = ["reduce_window", "select_and_scatter"]
