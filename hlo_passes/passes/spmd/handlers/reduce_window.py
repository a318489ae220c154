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

Variadic reduce-windows exchange every operand's halo alike.  Rows outside the
array need a value that adds nothing, so a dim whose windows reach them stays
tiled only when the reducer is known binary ops, one per operand (a sum and a
max at once); for other reducers (an argmax's select) only dims whose windows
read real rows alone.  Dims whose halo would move more than gathering them (or
whose tiles do not line up with a base dilation) are untiled first
(`slicing.local_except`).

select-and-scatter is local when every tile's windows cover exactly its own rows
(pooling windows that tile the tiles, as in a 2x2 stride-2 max pool over even
tiles); otherwise each tile fetches the operand rows and source values of every
window touching its rows (halos; uneven tiles too, their padding masked) and
recomputes the shared windows, for scatter = add, a comparison select and windows
without gaps (stride <= size).  With
base or window dilation it stays replicated: StableHLO's select_and_scatter has
no dilation and XLA:CPU cannot run the dilated form (its source shape check
disagrees with HLO's), so there is no executable meaning to preserve.

A cumulative reduction (JAX's cumsum/cummax/cumprod on the CPU: a window as wide as the dim,
padded N-1 rows below for a prefix or above for a suffix) over a tiled dim would read every
row before (after) its own on each device: a halo as wide as the dim, or the dim gathered,
and the whole quadratic window computed for each row.  It is a scan, so the standard
decomposition runs instead (`_scan`): each device scans its own rows, the devices along the
dim all-gather one row each — their tiles' totals — and each combines the totals of the tiles
before (after) its own with its local scan:

    %r = f32[64,256] reduce-window(%x, %zero), window={size=64x1 pad=63_0x0_0}   (%x, %r: [8,1])
  becomes
    %l = f32[8,256] reduce-window(f32[8,256] %x, %zero), window={size=8x1 pad=7_0x0_0}
    %g = f32[8,256] all-gather(slice(%l) row 7), dimensions={0}        (the tiles' totals)
    %c = f32[256] reduce(select(iota < tile, %g, 0), %zero), dimensions={0}
    %r = f32[8,256] add(broadcast(%c), %l)

It needs the init value to be the reducer's identity (`ir/cumulative.py`).  The cost model prices it
beside the halo exchange or gather the other reduce-windows take.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.attributes import Window, WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd.cost_model import cheapest
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import Int64Array, TileMap
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.handlers.slicing import local_except
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.cumulative import CumulativeWindow
from hlo_passes.ir.reduction import REDUCTION_OPCODES, Reduction
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.partition_context import (PValue, groups_varying, local_shape, reducer_opcode,
                                                       root_of, tile_map, to_sharding)


@handles(Opcode.REDUCE_WINDOW)
def reduce_window(p: HandlerContext, instr: Instruction) -> PValue:
    window = instr.window
    assert window is not None, f"{instr.name}: a reduce-window has a window"
    windowed = window.windowed_dims()
    count = len(instr.operands) // 2  # operands, then as many init values
    fills = _identities(instr.called_computation("to_apply"), count)
    target = p.target(instr)
    first = target.element(0) if target.is_tuple else target
    out = _first_array(instr)
    operand = instr.operands[0]
    tm = tile_map(first, out.rank, p.n)
    exchanges: list[halos.Halo] = []
    fixed: list[int] = []
    for d in windowed:
        t = tm.dims[d]
        if t == 1:
            continue
        w, size = window.dimensions[d], operand.array_shape.dims[d]
        out_local = -(-out.dims[d] // t)
        rows = halos.window_rows(w, t, [i * out_local for i in range(t)], out_local, [0] * t, w.size)
        active = [i * out_local < out.dims[d] for i in range(t)]
        h = halos.plan(d, size, t, rows, zero_padding=False, active=active) if rows is not None else None
        if h is None or h.bytes(1) >= (t - 1) * h.local:  # gathering moves no more
            fixed.append(d)
        elif h.mask and fills is None:  # rows outside the array, and no value that adds nothing
            fixed.append(d)
        else:
            exchanges.append(h)
    scan = CumulativeWindow.of(instr)
    if scan is not None and tm.dims[scan.dim] > 1 and _scan_is_cheaper(p, instr, tm, scan, exchanges):
        return _scan(p, instr, tm, scan)
    if not exchanges:
        return local_except(p, instr, windowed)
    s = to_sharding(tm.keep_dims([d for d in range(tm.rank) if d not in fixed]))
    xs = [p.operand_as(instr, i, s) for i in range(count)]
    inits = [p.operand_as(instr, count + i, Sharding.replicated()) for i in range(count)]
    dims = list(window.dimensions)
    for h in exchanges:
        dims[h.dim] = h.rows.local
    for i, x in enumerate(xs):
        etype = x.array_shape.element_type
        fill = p.em.constant(fills[i], etype) if fills is not None and any(h.mask for h in exchanges) else None
        for h in exchanges:
            x = halos.exchange(p.em, x, tm, h, fill)
        xs[i] = x
    result = Sharding.tuple_of([s] * count) if instr.shape.is_tuple else s
    new = p.clone(instr, xs + inits, local_shape(instr.shape, result))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, result, instr.shape), target)


def _scan_is_cheaper(p: HandlerContext, instr: Instruction, tm: TileMap, scan: CumulativeWindow,
                     exchanges: list[halos.Halo]) -> bool:
    """Does the cost model prefer the scan to what `reduce_window` would otherwise do along the
    scanned dim: exchange a halo as wide as the dim (when `exchanges` plans one) or gather the
    dim, then run the N-wide window for each local row?  (`local_except` may instead move the
    dim's tiles onto a free dim, an all-to-all each way that still runs N-wide windows on N/k
    rows: k times the scan's FLOPs; it is priced here as the gather.)"""
    model, n = p.ctx.cost_model, p.n
    d, shape = scan.dim, instr.array_shape
    etype, tiles, rows = shape.element_type, tm.dims[scan.dim], shape.dims[scan.dim]
    operand_sharding = p.value(instr.operands[0]).sharding
    target = p.target(instr)
    s = to_sharding(tm)
    local = local_shape(shape, s)
    row = local.element_count // local.dims[d]
    around = cost(operand_sharding, s, shape, n, model) + cost(s, target, shape, n, model)
    scanned = (around
               + model.compute(local.element_count * (local.dims[d] - 1), 2 * local.byte_size(), etype)
               + model.collective("all-gather", tiles * row * etype.byte_size, tiles)
               + model.compute(tiles * row + local.element_count, (tiles * row + 2 * local.element_count)
                               * etype.byte_size, etype))
    halo = next((h for h in exchanges if h.dim == d), None)
    if halo is not None:
        existing = (around + model.transfer(halo.bytes(row * etype.byte_size), halo.permutes)
                    + model.compute(local.element_count * (rows - 1), 2 * local.byte_size(), etype))
    else:
        gathered = to_sharding(tm.keep_dims([k for k in range(tm.rank) if k != d]))
        whole = local_shape(shape, gathered)
        existing = (cost(operand_sharding, gathered, shape, n, model)
                    + model.compute(whole.element_count * (rows - 1), 2 * whole.byte_size(), etype)
                    + cost(gathered, target, shape, n, model))
    chosen = cheapest([(True, scanned), (False, existing)])
    assert chosen is not None  # (there are candidates)
    return chosen[0]


def _scan(p: HandlerContext, instr: Instruction, tm: TileMap, scan: CumulativeWindow) -> PValue:
    """The cumulative reduction by local scans and the tiles' totals (module docstring).

    Uneven tiles pad the last tiles at their end.  A prefix never reads that padding for a
    row inside the array, and the padded tiles' totals only reach padded rows; a suffix reads
    it for every row of the last real tile and sends it to all earlier tiles in that tile's
    total, so its operand's padding takes the identity first."""
    em, b = p.em, p.em.b()
    d, shape = scan.dim, instr.array_shape
    window = instr.window
    assert window is not None, f"{instr.name}: a reduce-window has a window"
    etype, tiles = shape.element_type, tm.dims[d]
    s = to_sharding(tm)
    identity = scan.identity
    x = p.operand_as(instr, 0, s)
    if scan.suffix:
        x = em.mask_padding(x, tm, tuple(shape.dims), [d], identity)
    neutral = em.constant(identity, etype)
    rows = local_shape(shape, s).dims[d]
    dims = list(window.dimensions)
    dims[d] = WindowDimension(rows, 1, 0, rows - 1) if scan.suffix else WindowDimension(rows, 1, rows - 1, 0)
    local = p.clone(instr, [x, neutral], local_shape(instr.shape, s))
    local.set_attr("window", Window(tuple(dims)))
    local_dims = local.array_shape.dims
    edge = 0 if scan.suffix else rows - 1  # the row that reduces the whole tile
    total = b.slice(local, [edge if k == d else 0 for k in range(len(local_dims))],
                    [edge + 1 if k == d else size for k, size in enumerate(local_dims)])
    totals = em.all_gather(total, d, groups_varying(tm, [d]))  # row j: tile j's total
    totals_shape = totals.array_shape
    tile_ids = ArrayShape(PrimitiveType.S32, (tiles,))
    mine = b.broadcast(em.device_scalar(tm.coords[:, d]), tile_ids)
    before = b.compare(b.iota(tile_ids, 0), mine, "GT" if scan.suffix else "LT")
    before = b.broadcast(before, ArrayShape(PrimitiveType.PRED, totals_shape.dims), [d])
    earlier = b.select(before, totals, b.broadcast(neutral, totals_shape))
    carry = b.reduce(earlier, neutral, [d], instr.called_computation("to_apply"))
    carried = b.broadcast(carry, local.array_shape, [k for k in range(len(local_dims)) if k != d])
    before_after = [local, carried] if scan.suffix else [carried, local]  # rows in order
    if scan.reduction is not None:
        result = b.op(scan.reduction.opcode, local.shape, before_after)
    else:  # a region of its own (a logaddexp): applied elementwise
        result = b.op(Opcode.MAP, local.shape, before_after, dimensions=tuple(range(len(local_dims))),
                      called={"to_apply": scan.combiner})
    return p.reshard(PValue(result, s, instr.shape), p.target(instr))


def _first_array(instr: Instruction) -> ArrayShape:
    """The result's shape, or a variadic reduce-window's first result's (all have its dims)."""
    shape = instr.shape
    out = shape.elements[0] if isinstance(shape, TupleShape) else shape
    if not isinstance(out, ArrayShape):
        raise TypeError(f"{instr.name}: expected array results, got {shape.to_hlo()}")
    return out


def _identities(comp: Computation, count: int) -> list[bool | int | float] | None:
    """Per operand, the value that never changes the reduction (the padding rows of a halo take
    it: XLA skips a window's rows outside the array, so they must add nothing), or None when
    the reducer is not `count` independent binary reductions (`add` for one operand; for a
    variadic one a tuple whose i-th element is `a_i OP b_i`, e.g. a sum and a max at once)."""
    if count == 1:
        reduction = Reduction.of(comp)
        return None if reduction is None else [reduction.identity]
    params, root = comp.parameters, comp.root
    if len(params) != 2 * count or root is None or root.opcode is not Opcode.TUPLE or len(root.operands) != count:
        return None
    found: list[bool | int | float] = []
    for i, element in enumerate(root.operands):
        pair = {id(params[i]), id(params[count + i])}
        if (element.opcode not in REDUCTION_OPCODES or len(element.operands) != 2
                or {id(o) for o in element.operands} != pair
                or not isinstance(element.shape, ArrayShape) or element.shape.rank != 0):
            return None
        try:
            found.append(Reduction(element.opcode, element.shape.element_type).identity)
        except ValueError:  # `and` over floats: no identity
            return None
    return found


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
        if _windows_within_tiles(w, size, out, t):
            continue  # the window stays as it is on every tile
        rows = None if size % t or out % t else halos.window_rows(
            w, t, [i * (out // t) for i in range(t)], out // t, [0] * t, w.size)
        h = halos.plan(d, size, t, rows, zero_padding=False) if rows is not None else None
        if rows is None or h is None or h.left or h.right or h.mask or rows.width != h.local or any(h.offsets):
            crossing.append(d)
        else:
            dims[d] = rows.local
    if crossing and any(window.dimensions[d].lhs_dilation != 1 or window.dimensions[d].rhs_dilation != 1
                        for d in crossing):
        return replicate(p, instr, "select-and-scatter with base or window dilation on a tiled dim: StableHLO's "
                                   "select_and_scatter has no dilation and XLA cannot run the dilated form, "
                                   "so there is no semantics to split across tiles")
    if crossing:
        return _select_and_scatter_with_halos(p, instr, tm, target) or replicate(
            p, instr, "select-and-scatter windows cross tile boundaries and no halo exchange "
                      "applies (a scatter other than add, a select other than a comparison, a stride "
                      "larger than the window, or halos larger than a gather)")
    s = to_sharding(tm)
    x = p.operand_as(instr, 0, s)
    src = p.operand_as(instr, 1, s)
    init = p.operand_as(instr, 2, Sharding.replicated())
    new = p.clone(instr, [x, src, init], local_shape(instr.shape, s))
    new.set_attr("window", Window(tuple(dims)))
    return p.reshard(PValue(new, s, instr.shape), target)


def _windows_within_tiles(w: WindowDimension, size: int, out: int, t: int) -> bool:
    """Do the windows along a dim tiled `t` ways (`size` operand rows, `out` source rows) fall
    each inside one tile, the same number to every tile, a tile's first window at its first row?
    Then every tile runs the same window on its own rows and source rows, with no exchange.  So
    it is when windows leave gaps or just touch (size <= stride, no padding or dilation) and a
    tile is a whole number of strides: a window [k*stride, k*stride + size) never passes the next
    stride's start.  Rows no window covers receive the init value, on a tile as in the whole (a
    stride-2 max-pool's gradient with 1-row windows: XLA runs it locally; this fell back to
    gathering both operands)."""
    if (w.lhs_dilation, w.rhs_dilation, w.padding_low, w.padding_high) != (1, 1, 0, 0) or w.size > w.stride:
        return False
    if size % t or out % t:
        return False
    local = size // t
    return local % w.stride == 0 and local // w.stride == out // t


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
        if w.lhs_dilation != 1 or w.rhs_dilation != 1 or w.stride > w.size:
            # (windows with gaps between them: a tile may meet no window, and the rows its
            # windows read do not start at a whole stride of its own; random modules gave
            # out-of-bounds slices and wrong sums there)
            return None
        # Uneven tiles: the last tiles' padded rows lie past the array, where the operand halo's
        # mask puts the never-selected value and the source halo's puts 0 (windows past the
        # last one add nothing); the padded result rows are don't-care.
        L, s, pl = -(-size // t), w.stride, w.padding_low
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
