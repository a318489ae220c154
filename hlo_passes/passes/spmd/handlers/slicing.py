"""Ops that are local on every dimension they do not slice, pad, join or sort:
slice, pad, concatenate, dynamic-slice, dynamic-update-slice, reverse, sort (and
reduce-window on the dims handlers/reduce_window.py does not exchange halos for).

The result's sharding with those dimensions untiled is used for the operands
(so a sharding along them is all-gathered first), the op runs locally, and the
result is resharded (usually a local slice) to its own sharding.  Slice and pad
keep a tiled dim tiled instead when a halo exchange moves less (`_shifted`).

    %s = f32[16,4] slice(f32[16,8] %a), slice={[0:16], [0:4]}, sharding={devices=[4,1]<=[4]}
  is local on dim 0: %s = f32[4,4] slice(f32[4,8] %a), slice={[0:4], [0:4]}
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction

import math
from typing import Sequence

import numpy as np

from hlo_passes.ir.attributes import PaddingConfig, SliceSpec, WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.cost_model import ZERO, Estimate, cheapest
from hlo_passes.passes.spmd.partition_context import (PValue, groups_varying, is_manual, local_shape, tile_map,
                                                       tm_local_dims, to_sharding)
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap


# The operand holding dim 0's start index, in the dynamic slicing ops `local_except` runs
_FIRST_START = {Opcode.DYNAMIC_SLICE: 1, Opcode.DYNAMIC_UPDATE_SLICE: 2}


def local_except(p: HandlerContext, instr: Instruction, fixed: Sequence[int]) -> PValue:
    """Run `instr` locally with every dim in `fixed` untiled in operands and result.

    Which tiling of the other dims: the result's own (a fixed dim's tiles gathered), or — as
    XLA does for a sort along its sharded dim — the fixed dim's tiling moved onto a free dim
    that has none, or folded into a free dim's tiles as their minor part (an all-to-all there
    and back, every device working on its share instead of the whole array).  The cost model
    picks."""
    target = p.target(instr)
    first = instr.shape.elements[0] if isinstance(instr.shape, TupleShape) else instr.shape
    assert isinstance(first, ArrayShape), f"{instr.name}: expected an array or a tuple of arrays"
    first_target = target.element(0) if target.is_tuple else target
    tm = tile_map(first_target, first.rank, p.n)
    s = _cheapest_local_tiling(p, instr, first, first_target, tm, fixed)
    first_start = _FIRST_START.get(instr.opcode)
    operands: list[Instruction] = []
    for i, op in enumerate(instr.operands):
        if (first_start is not None and i >= first_start and i - first_start not in fixed
                and op.opcode is not Opcode.CONSTANT):
            # XLA clamps a start into [0, dim - size]: along a dim the slice spans whole it is
            # 0 whatever computes it, and that computation (with what it gathered) is left dead
            operands.append(p.em.b().constant(0, op.array_shape.element_type))
            continue
        want = s if isinstance(op.shape, ArrayShape) and op.shape.rank == first.rank else Sharding.replicated()
        operands.append(p.operand_as(instr, i, want))
    out = Sharding.tuple_of([s] * len(instr.shape.elements)) if isinstance(instr.shape, TupleShape) else s
    new = p.clone(instr, operands, local_shape(instr.shape, out))
    if instr.opcode is Opcode.SLICE:
        spec: SliceSpec = instr.attr("slice")
        dims = new.operands[0].array_shape.dims
        limits = tuple(l if d in fixed else dims[d] for d, l in enumerate(spec.limits))
        new.set_attr("slice", SliceSpec(spec.starts, limits, spec.strides))
    elif instr.opcode is Opcode.DYNAMIC_SLICE:
        new.set_attr("dynamic_slice_sizes", tuple(new.array_shape.dims))
    return p.reshard(PValue(new, out, instr.shape), target)


def _cheapest_local_tiling(p: HandlerContext, instr: Instruction, first: ArrayShape, first_target: Sharding,
                          tm: TileMap, fixed: Sequence[int]) -> Sharding:
    """The sharding `local_except` runs `instr` in (see there)."""
    rank = first.rank
    free = [d for d in range(rank) if d not in fixed]
    candidates = [tm.keep_dims(free)]
    sources = [tm]
    data = instr.operands[0]
    if isinstance(data.shape, ArrayShape) and data.shape.rank == rank:
        sources.append(tile_map(p.value(data).sharding, rank, p.n))
    for source in sources:
        base = source.keep_dims(free)
        for f in fixed:
            t = source.dims[f]
            if t == 1:
                continue
            for g in free:
                if base.dims[g] == 1 and first.dims[g] % t == 0 and first.dims[g] >= t:
                    moved = source.remap(rank, {d: d for d in free if d != g} | {g: f})
                elif base.dims[g] > 1 and first.dims[g] % (base.dims[g] * t) == 0:
                    # g is tiled already (a 2-D mesh): f's tiles become g's minor tiles
                    moved = source.remap(rank, {d: d for d in free} | {f: f}).fold(g, f)
                else:
                    continue
                if moved.to_sharding() is not None:
                    candidates.append(moved)
    if len(candidates) == 1:
        return to_sharding(candidates[0])
    model, n = p.ctx.cost_model, p.n
    priced: list[tuple[Sharding, Estimate]] = []
    for cand in candidates:
        s = to_sharding(cand)
        c = ZERO
        for i, op in enumerate(instr.operands):
            if isinstance(op.shape, ArrayShape) and op.shape.rank == rank:
                c += p.move_cost(op, s)
        local_bytes = local_shape(first, s).byte_size()
        flops = local_bytes // max(1, first.element_type.byte_size) * max(1, math.ceil(math.log2(
            max(2, max(first.dims[d] for d in fixed) if fixed else 2)))) if instr.opcode is Opcode.SORT else 0
        touched = local_bytes
        if instr.opcode is Opcode.DYNAMIC_UPDATE_SLICE:
            # in place: it writes the update's elements, not the buffer (charged the whole buffer,
            # a plan untiling a big zero buffer lost by 4% of time to one moving it twice)
            touched = local_shape(instr.operands[1].array_shape, s).byte_size()
        c += model.compute(flops, 2 * touched, first.element_type)
        c += cost(s, first_target, first, n, model)
        priced.append((s, c))
    chosen = cheapest(priced)
    assert chosen is not None  # (there are candidates)
    return chosen[0]


@handles(Opcode.SLICE)
def slice_(p: HandlerContext, instr: Instruction) -> PValue:
    (user,) = instr.users if len(instr.users) == 1 else (None,)
    if user is not None and instr.parent is not None and _rotation(p, user) is not None:
        # Never read: the only user, a concatenate, rotates this slice's operand itself (`_rotate`).
        return _unread_stand_in(p, instr)
    merged = _slice_of_pad(p, instr)
    if merged is not None:
        return merged
    spec: SliceSpec = instr.attr("slice")
    dims = instr.operands[0].array_shape.dims
    fixed = [d for d in range(len(dims))
             if (spec.starts[d], spec.limits[d], spec.strides[d]) != (0, dims[d], 1)]
    # output row r reads input row r * stride + start: a size-1 window
    windows = {d: WindowDimension(1, spec.strides[d], -spec.starts[d]) for d in fixed}
    done = _shifted(p, instr, fixed, windows, zero_padding=True, reads_outside=False)
    if done is None:
        done = _summed_from_holders(p, instr, fixed)
    return done if done is not None else local_except(p, instr, fixed)


def _unread_stand_in(p: HandlerContext, instr: Instruction) -> PValue:
    """What a value its only user partitions without reading stands for: zeros, replicated, no
    collective, gone at the partitioner's DCE."""
    shape = instr.array_shape
    return PValue(p.em.broadcast_scalar(0, shape.element_type, shape.dims), Sharding.replicated(), instr.shape,
                  stand_in=True)


def _slice_of_pad(p: HandlerContext, instr: Instruction) -> PValue | None:
    """A unit-stride slice of a pad (no interior padding) that is the pad's only user is one pad
    of the pad's operand, its padding possibly negative: low - start and high - (N - limit)
    on each dim (N the padded size), as XLA's partitioner merges them.  Partitioned as that
    pad, the shift costs one exchange of the rows it moves, not one for the pad and another for
    the slice.  None when the pattern does not apply."""
    src = instr.operands[0]
    if not _merges_with_slice(p, src):
        return None
    spec: SliceSpec = instr.attr("slice")
    cfg = src.attr("padding").dimensions
    dims = src.array_shape.dims
    merged = PaddingConfig(tuple((lo - s, hi - (n - lim), 0) for (lo, hi, _), s, lim, n
                                 in zip(cfg, spec.starts, spec.limits, dims)))
    attrs = {k: v for k, v in instr.attributes.items() if k not in ("slice", "sharding")}
    fake = Instruction(Opcode.PAD, instr.shape, [src.operands[0], src.operands[1]], name=instr.name,
                       attributes=attrs)
    fake.set_attr("padding", merged)
    fake.set_attr("sharding", p.target(instr))
    try:
        return pad(p, fake)
    finally:
        fake.drop_operands()


def _merges_with_slice(p: HandlerContext, pad_: Instruction) -> bool:
    """Is `pad_` (no interior padding, not the root, outside manual regions) used only by one
    unit-stride slice, which then partitions as one pad of its operand (`_slice_of_pad`)?"""
    if pad_.opcode is not Opcode.PAD or len(pad_.users) != 1 or pad_.is_root:
        return False
    (user,) = pad_.users
    if user.opcode is not Opcode.SLICE or user.operands[0] is not pad_:
        return False
    if any(st != 1 for st in user.attr("slice").strides) or any(c[2] != 0 for c in pad_.attr("padding").dimensions):
        return False
    return not any(is_manual(s) for s in (p.target(pad_), p.target(user), p.value(pad_.operands[0]).sharding))


@handles(Opcode.PAD)
def pad(p: HandlerContext, instr: Instruction) -> PValue:
    if instr.parent is not None and _merges_with_slice(p, instr):
        # Never read: the only user, a slice, partitions as one pad of this pad's operand
        # (`_slice_of_pad`).
        return _unread_stand_in(p, instr)
    cfg: PaddingConfig = instr.attr("padding")
    fixed = [d for d, c in enumerate(cfg.dimensions) if c != (0, 0, 0)]
    # output row r reads input row (r - low) / (interior + 1) where that is whole
    windows = {d: WindowDimension(1, 1, cfg.dimensions[d][0], 0, cfg.dimensions[d][2] + 1) for d in fixed}
    # rows outside the operand are this pad's edge padding: a zero pad value is what the
    # collective-permutes deliver there, so only uneven tiles' don't-care rows need the mask
    done = _shifted(p, instr, fixed, windows, zero_padding=_is_positive_zero(instr.operands[1]))
    return done if done is not None else local_except(p, instr, fixed)


def _is_positive_zero(x: Instruction) -> bool:
    """Is `x` a scalar constant +0 (all bits zero: what a collective-permute delivers to a device
    it sends nothing to, and what an exchange's buffers start as)?"""
    if x.opcode is not Opcode.CONSTANT or x.array_shape.rank != 0 or str(x.literal).lstrip().startswith("-"):
        return False  # (a -0 reads as +0 from its literal)
    try:
        v = np.asarray(x.literal_value())
    except (ValueError, TypeError, KeyError):  # a literal numpy cannot hold: not known to be zero
        return False
    return not any(v.tobytes())


def _shifted(p: HandlerContext, instr: Instruction, fixed: list[int], windows: dict[int, WindowDimension],
             zero_padding: bool, reads_outside: bool = True) -> PValue | None:
    """Slice or pad with the result's tiling kept on the dims it tiles among `fixed`: each device
    takes the input rows its output tile reads from its neighbours (halo exchange, as a
    reduce-window of size 1 would), then slices or pads them locally.  None when no dim gains
    (an exchange moving as much as a gather, or rows that do not line up the same way per tile).

        %s = f32[8,4] slice(f32[16,4] %a), slice={[2:10], [0:4]}, both tiled 4 ways on dim 0
      device t needs rows [2+2t, 4+2t): the first two of its own tile or of its left
      neighbour's -> one collective-permute, a dynamic-slice, no all-gather."""
    target = p.target(instr)
    operand = instr.operands[0]
    tm = tile_map(target, instr.array_shape.rank, p.n)
    exchanges: list[halos.Halo] = []
    untiled: list[int] = []
    for d in fixed:
        t = tm.dims[d]
        size, out = operand.array_shape.dims[d], instr.array_shape.dims[d]
        out_local = -(-out // t)
        rows = t > 1 and halos.window_rows(windows[d], t, [i * out_local for i in range(t)], out_local, [0] * t, 1)
        h = rows and halos.plan(d, size, t, rows, zero_padding,
                                active=[i * out_local < out for i in range(t)], reads_outside=reads_outside)
        if not h or h.bytes(1) >= (t - 1) * h.local:  # gathering moves no more
            untiled.append(d)
        else:
            exchanges.append(h)
    if not exchanges:
        return None
    s = to_sharding(tm.keep_dims([d for d in range(tm.rank) if d not in untiled]))
    x = p.operand_as(instr, 0, s)
    fill = None
    others = [p.operand_as(instr, 1, Sharding.replicated())] if instr.opcode is Opcode.PAD else []
    if instr.opcode is Opcode.PAD and any(h.mask for h in exchanges):
        fill = others[0]
    for h in exchanges:
        x = halos.exchange(p.em, x, tm, h, fill)
    new = p.clone(instr, [x, *others], local_shape(instr.shape, s))
    local = {h.dim: h.rows.local for h in exchanges}
    ext = x.array_shape.dims
    if instr.opcode is Opcode.SLICE:
        spec: SliceSpec = instr.attr("slice")
        parts = [(spec.starts[d], spec.limits[d], spec.strides[d]) if d in untiled
                 else (local[d].padding_low, ext[d] - local[d].padding_high, local[d].stride) if d in local
                 else (0, ext[d], 1) for d in range(len(ext))]
        new.set_attr("slice", SliceSpec(*(tuple(c) for c in zip(*parts))))
    else:
        cfg = instr.attr("padding").dimensions
        new.set_attr("padding", PaddingConfig(tuple(
            cfg[d] if d in untiled
            else (local[d].padding_low, local[d].padding_high, local[d].lhs_dilation - 1) if d in local
            else (0, 0, 0) for d in range(len(ext)))))
    return p.reshard(PValue(new, s, instr.shape), target)


@handles(Opcode.CONCATENATE)
def concatenate(p: HandlerContext, instr: Instruction) -> PValue:
    rot = _rotation(p, instr)
    if rot is not None:
        return _rotate(p, instr, *rot)
    return local_except(p, instr, list(instr.dimensions))


def _rotation(p: HandlerContext, concat: Instruction) -> tuple[Instruction, int, int] | None:
    """(x, dim, k) when `concat` is concatenate(slice(x, [N-k:N]), slice(x, [0:N-k])) along
    `dim` (x rotated right by k rows), each slice used only there, and the result tiled evenly
    along `dim` outside manual regions; None otherwise."""
    if concat.opcode is not Opcode.CONCATENATE or len(concat.operands) != 2:
        return None
    a, b = concat.operands
    if a.opcode is not Opcode.SLICE or b.opcode is not Opcode.SLICE or a is b:
        return None
    x = a.operands[0]
    if b.operands[0] is not x or len(a.users) != 1 or len(b.users) != 1 or a.is_root or b.is_root:
        return None
    (dim,) = concat.dimensions
    dims = x.array_shape.dims
    n = dims[dim]
    sa, sb = a.attr("slice"), b.attr("slice")
    for spec in (sa, sb):
        if any(st != 1 for st in spec.strides) or any(
                (spec.starts[d], spec.limits[d]) != (0, dims[d]) for d in range(len(dims)) if d != dim):
            return None
    k = sa.limits[dim] - sa.starts[dim]
    if not (sa.limits[dim] == n and sb.starts[dim] == 0 and sb.limits[dim] == n - k and 0 < k < n):
        return None
    target = p.target(concat)
    if target.is_tuple or any(is_manual(s) for s in (target, p.target(a), p.target(b), p.value(x).sharding)):
        return None
    tm = tile_map(target, len(dims), p.n)
    t = tm.dims[dim]
    if t == 1 or n % t:
        return None
    return x, dim, k


def _rotate(p: HandlerContext, instr: Instruction, x: Instruction, dim: int, k: int) -> PValue:
    """x rotated right by k rows along an evenly tiled `dim` (XLA's merged slice-then-concat):
    with tiles of L rows, result tile c holds the last k % L rows of operand tile
    c - k // L - 1 and the first L - k % L rows of operand tile c - k // L (tiles modulo t),
    so it takes at most two collective-permutes of parts of one tile, none for a part that
    stays on its device."""
    target = p.target(instr)
    tm = tile_map(target, instr.array_shape.rank, p.n)
    t = tm.dims[dim]
    local = p.resharded(x, target).instr
    rows = local.array_shape.dims[dim]
    q, rem = divmod(k, rows)
    b = p.em.b()

    def part(lo: int, hi: int, shift: int) -> Instruction:
        starts = [0] * local.array_shape.rank
        limits = list(local.array_shape.dims)
        starts[dim], limits[dim] = lo, hi
        piece = b.slice(local, starts, limits) if (lo, hi) != (0, rows) else local
        return _permute_tiles(p, piece, tm, dim, shift)

    pieces = []
    if rem:
        pieces.append(part(rows - rem, rows, (q + 1) % t))
    pieces.append(part(0, rows - rem, q % t))
    out = b.concatenate(pieces, dim) if len(pieces) > 1 else pieces[0]
    return PValue(out, target, instr.shape)


def _permute_tiles(p: HandlerContext, piece: Instruction, tm: TileMap, dim: int, shift: int) -> Instruction:
    """`piece` moved from the device holding tile c of `dim` to the one holding tile c + shift
    (modulo the tile count), the other tile coordinates, the manual group and the replica
    index among a tile's holders kept; unchanged when shift is 0."""
    if shift == 0:
        return piece
    t = tm.dims[dim]
    holder: dict[tuple[int, ...], int] = {}
    seen: dict[tuple[int, ...], int] = {}
    keys = []
    for dev in range(tm.num_devices):
        tile = tuple(int(c) for c in tm.coords[dev]) + (int(tm.manual[dev]),)
        j = seen.get(tile, 0)
        seen[tile] = j + 1
        keys.append(tile + (j,))
        holder[tile + (j,)] = dev
    pairs = []
    for dev, key in enumerate(keys):
        dst = list(key)
        dst[dim] = (dst[dim] + shift) % t
        pairs.append((dev, holder[tuple(dst)]))
    return p.em.collective_permute(piece, pairs)


@handles(Opcode.REVERSE)
def reverse(p: HandlerContext, instr: Instruction) -> PValue:
    """A reverse of tiled dims that split evenly runs locally on the operand tiled with the
    tile order of those dims reversed (XLA's ReverseSharding): the device holding result tile
    c of a reversed dim cut in t reverses operand tile t-1-c, so a tiled operand moves by at
    most one collective-permute.  Uneven dims (whose reversed tiles would straddle two
    operand tiles) are gathered, as are the reversed dims when that moves less."""
    rev = list(instr.dimensions)
    target = p.target(instr)
    dims = instr.array_shape.dims
    if not target.is_tuple and rev:
        tm = tile_map(target, len(dims), p.n)
        if (any(tm.dims[d] > 1 for d in rev)
                and all(dims[d] % tm.dims[d] == 0 for d in rev)):
            coords = tm.coords.copy()
            for d in rev:
                coords[:, d] = tm.dims[d] - 1 - coords[:, d]
            flipped = TileMap(tm.dims, coords, tm.manual, tm.manual_size).to_sharding()
            if flipped is not None:
                model, n = p.ctx.cost_model, p.n
                src = p.value(instr.operands[0]).sharding
                local = _cheapest_local_tiling(p, instr, instr.array_shape, target, tm, rev)
                shape = instr.operands[0].shape
                if not (cost(src, local, shape, n, model) + cost(local, target, shape, n, model)
                        < cost(src, flipped, shape, n, model)):
                    x = p.operand_as(instr, 0, flipped)
                    new = p.clone(instr, [x], local_shape(instr.shape, target))
                    return PValue(new, target, instr.shape)
    return local_except(p, instr, rev)


@handles(Opcode.SORT)
def sort(p: HandlerContext, instr: Instruction) -> PValue:
    return local_except(p, instr, list(instr.dimensions))


@handles(Opcode.DYNAMIC_SLICE)
def dynamic_slice(p: HandlerContext, instr: Instruction) -> PValue:
    sizes: tuple[int, ...] = instr.attr("dynamic_slice_sizes")
    dims = instr.operands[0].array_shape.dims
    fixed = [d for d in range(len(dims)) if sizes[d] != dims[d]]
    done = _summed_from_holders(p, instr, fixed)
    return done if done is not None else local_except(p, instr, fixed)


def _summed_from_holders(p: HandlerContext, instr: Instruction, fixed: Sequence[int]) -> PValue | None:
    """A slice or dynamic-slice that cuts a window out of dims its operand is tiled on, taken
    where the operand lies: each device cuts the part of the window its own tile holds (zeros
    elsewhere), and an all-reduce over the devices tiling those dims adds the parts into the
    window, whole on each of them.  It moves the window's bytes, where making the cut dims
    whole first (an all-to-all or all-gather of the operand) moves the operand's: a row or an
    element of a big array costs what it holds, as in XLA's partition.  Taken when the cost
    model prices it below `local_except`'s plan; None otherwise (or for a strided cut of a
    tiled dim).  Adding zeros keeps every value but a zero's sign (-0.0 comes back 0.0)."""
    operand = instr.operands[0]
    src = p.value(operand)
    shape, out_shape = operand.array_shape, instr.array_shape
    s_op, target = src.sharding, p.target(instr)
    if src.stand_in or s_op.is_tuple or is_manual(s_op) or is_manual(target) or s_op.kind.value != "tiled":
        return None
    rank = shape.rank
    tm = tile_map(s_op, rank, p.n)
    cut = [d for d in fixed if tm.dims[d] > 1]
    if not cut:
        return None
    spec: SliceSpec | None = instr.attr("slice") if instr.opcode is Opcode.SLICE else None
    if spec is not None and any(spec.strides[d] != 1 for d in cut):
        return None
    summed = to_sharding(tm.keep_dims([d for d in range(rank) if d not in cut]))
    if summed is None:
        return None
    model, n = p.ctx.cost_model, p.n
    local_out = local_shape(out_shape, summed)
    group = math.prod(tm.dims[d] for d in cut)
    mine = model.collective("all-reduce", local_out.byte_size(), group) + cost(summed, target, out_shape, n, model)
    first_target = target.element(0) if target.is_tuple else target
    theirs_sharding = _cheapest_local_tiling(p, instr, out_shape, first_target, tile_map(first_target, rank, n), fixed)
    theirs = p.move_cost(operand, theirs_sharding) + cost(theirs_sharding, target, out_shape, n, model)
    if not mine < theirs:
        return None
    em = p.em
    b = em.b()
    etype = shape.element_type
    local = tm_local_dims(tm, shape.dims)
    # (no mask for uneven tiles' padding rows: they lie past the array's end, where a window,
    # clamped inside the array, never reaches)
    x = src.instr
    if spec is not None:  # the dims it does not cut are whole here: slice them as the op does
        x = b.slice(x, [0 if d in cut else spec.starts[d] for d in range(rank)],
                    [local[d] if d in cut else spec.limits[d] if d in fixed else local[d] for d in range(rank)],
                    [1 if d in cut else spec.strides[d] for d in range(rank)])
    zero = b.constant(False if etype is PrimitiveType.PRED else 0, etype)
    # pad each cut dim by the window on both sides: a start (clamped as the op clamps it into
    # [0, size - window]) less the tile's offset plus the window then always lies in
    # [0, tile + window], and a window beside the tile reads padding
    x = b.pad(x, zero, PaddingConfig(tuple((out_shape.dims[d], out_shape.dims[d], 0) if d in cut else (0, 0, 0)
                                           for d in range(rank))))
    s32 = PrimitiveType.S32
    starts: list[Instruction] = []
    for d in range(rank):
        w = out_shape.dims[d]
        if d not in cut:
            if spec is None and d in fixed:
                starts.append(p.operand_as(instr, 1 + d, Sharding.replicated()))
            else:
                starts.append(b.constant(0, s32))
            continue
        if spec is not None:
            start = b.constant(spec.starts[d], s32)
        else:
            index = p.operand_as(instr, 1 + d, Sharding.replicated())
            if index.array_shape.element_type is not s32:
                index = b.convert(index, s32)
            start = b.maximum(b.minimum(index, b.constant(shape.dims[d] - w, s32)), b.constant(0, s32))
        offset = em.device_scalar(tm.coords[:, d] * local[d] - w)
        starts.append(b.subtract(start, offset))
    window = b.dynamic_slice(x, starts, local_out.dims)
    whole = em.sum_of_parts(window, groups_varying(tm, cut))
    return p.reshard(PValue(whole, summed, instr.shape), target)


@handles(Opcode.DYNAMIC_UPDATE_SLICE)
def dynamic_update_slice(p: HandlerContext, instr: Instruction) -> PValue:
    dims, upd = instr.array_shape.dims, instr.operands[1].array_shape.dims
    sliced = [d for d in range(len(dims)) if upd[d] != dims[d]]
    target = p.target(instr)
    if not sliced and not target.is_tuple:
        # The update is as large as the operand: XLA clamps every start to 0, so the result is
        # the update, whatever the operand holds (`jax.lax.dynamic_update_index_in_dim` into a
        # stack of one, a scan's carry written whole).  Only the update moves, to the result's
        # sharding; cutting both to a common tiling moved the operand too, for nothing.
        return PValue(p.operand_as(instr, 1, target), target, instr.shape)
    tm = tile_map(target, len(dims), p.n)
    if sliced and all(tm.dims[d] > 1 for d in sliced) and not target.is_tuple:
        model, n = p.ctx.cost_model, p.n
        update_sharding = to_sharding(tm.keep_dims([d for d in range(len(dims)) if d not in sliced]))
        in_place = p.move_cost(instr.operands[0], target) + p.move_cost(instr.operands[1], update_sharding)
        moved = _cheapest_local_tiling(p, instr, instr.array_shape, target, tm, sliced)
        via = (p.move_cost(instr.operands[0], moved) + p.move_cost(instr.operands[1], moved)
               + cost(moved, target, instr.shape, n, model))
        fed = _update_fed_by_halo(p, instr, tm, sliced)
        if fed is not None and fed[1] < in_place and fed[1] < via:
            return _update_from_neighbours(p, instr, tm, sliced[0], fed[0])
        if not via < in_place:
            return _update_in_place(p, instr, tm, sliced, update_sharding)
    return local_except(p, instr, sliced)


def _update_fed_by_halo(p: HandlerContext, instr: Instruction, tm: TileMap,
                        sliced: list[int]) -> tuple[halos.Halo, Estimate] | None:
    """(exchange, its price) for a dynamic-update-slice at a constant start along its one
    sliced dim d, tiled k ways by the result `tm`: the update takes the same tiling of d (its
    own rows split k ways) and each result tile t fetches, by a halo exchange, the update rows
    [s_t, s_t + w) it is written with (w = min(U, L): U update rows, L rows per result tile,
    s_t = clamp(t*L - o, 0, U - w)).  Only the rows that change device move, where the in-place
    form gathers the whole update on every device (XLA gathers operand and update).  None
    when the start is not a constant or another sliced dim is tiled."""
    if len(sliced) != 1:
        return None
    d = sliced[0]
    start = instr.operands[2 + d]
    if start.opcode is not Opcode.CONSTANT or start.array_shape.rank != 0:
        return None
    update = instr.operands[1]
    size, rows = instr.array_shape.dims[d], update.array_shape.dims[d]
    k = tm.dims[d]
    local = -(-size // k)
    at = min(max(int(start.literal_value()), 0), size - rows)  # XLA clamps the start
    width = min(rows, local)
    starts = tuple(min(max(t * local - at, 0), rows - width) for t in range(k))
    active = [t * local < min(at + rows, size) and t * local + local > at for t in range(k)]
    window = halos.WindowRows(starts, width, WindowDimension(width))
    halo = halos.plan(d, rows, k, window, True, active, reads_outside=False)
    model = p.ctx.cost_model
    out = to_sharding(tm)
    u_local = local_shape(update.array_shape, out)
    moving = (p.move_cost(instr.operands[0], out) + p.move_cost(update, out)
              + model.transfer(halo.bytes(halos.row_bytes(u_local.dims, d, update.array_shape.element_type.byte_size)),
                               halo.permutes))
    return halo, moving


def _update_from_neighbours(p: HandlerContext, instr: Instruction, tm: TileMap, d: int,
                            halo: halos.Halo) -> PValue:
    """The `_update_fed_by_halo` form: each device's window of update rows is written into its
    tile padded by w rows on both sides at w + o + s_t - t*L — where the update starts inside
    the tile, ends inside it, or covers it — and the padding cut off again: no mask, and a
    tile the update misses writes into its padding."""
    b = p.em.b()
    out = to_sharding(tm)
    x = p.operand_as(instr, 0, out)
    u = p.operand_as(instr, 1, out)
    window = halos.exchange(p.em, u, tm, halo, None)
    size, rows = instr.array_shape.dims[d], instr.operands[1].array_shape.dims[d]
    local = -(-size // tm.dims[d])
    width = halo.rows.width
    at = min(max(int(instr.operands[2 + d].literal_value()), 0), size - rows)
    dims = tuple(x.array_shape.dims)
    pad_cfg = PaddingConfig(tuple((width, width, 0) if k == d else (0, 0, 0) for k in range(len(dims))))
    padded = b.pad(x, b.constant(0, x.array_shape.element_type), pad_cfg)
    where = np.asarray([width + at + s - t * local for t, s in enumerate(halo.rows.starts)], np.int64)
    zero = b.constant(0)
    offsets = [p.em.device_scalar(where[tm.coords[:, d]]) if k == d else zero for k in range(len(dims))]
    written = b.dynamic_update_slice(padded, window, offsets)
    lows = [width if k == d else 0 for k in range(len(dims))]
    new = b.slice(written, lows, [lo + m for lo, m in zip(lows, dims)])
    return p.reshard(PValue(new, out, instr.shape), p.target(instr))


def _update_in_place(p: HandlerContext, instr: Instruction, tm: TileMap, sliced: list[int],
                     update_sharding: Sharding) -> PValue:
    """A dynamic-update-slice that keeps the operand tiled along the dims it updates part of:
    every device holds the whole update along those dims and writes the part that falls in its
    rows, wherever the (clamped, dynamic) offset puts it — no communication for the operand.

        local tile t holds global rows [s, s + L); the update covers [o, o + U).  The tile,
        padded by U rows on each side, takes the whole update at U + o - s: an update that
        misses the tile lands (clamped) in the padding, which is cut off again."""
    b = p.em.b()
    update = instr.operands[1]
    dims, upd = tuple(instr.array_shape.dims), tuple(update.array_shape.dims)
    out = to_sharding(tm)
    x = p.operand_as(instr, 0, out)
    u = p.operand_as(instr, 1, update_sharding)
    local = tm_local_dims(tm, dims)
    rank = len(dims)
    s32 = PrimitiveType.S32
    zero = b.constant(0)
    pad_cfg: list[tuple[int, int, int]] = []
    starts: list[Instruction] = []
    for d in range(rank):
        if d not in sliced:
            pad_cfg.append((0, 0, 0))
            starts.append(zero)
            continue
        o = p.operand_as(instr, 2 + d, Sharding.replicated())
        if o.array_shape.element_type is not s32:
            o = b.convert(o, s32)
        # XLA clamps the start so that the update fits: 0 <= o <= N - U
        o = b.op(Opcode.CLAMP, o.shape, [zero, o, b.constant(dims[d] - upd[d])])
        # at U + o - s in the padded tile: the table holds s - U, one subtraction per device
        first = p.em.device_scalar(tm.coords[:, d] * local[d] - upd[d])
        pad_cfg.append((upd[d], upd[d], 0))
        starts.append(b.subtract(o, first))
    padded = b.pad(x, b.constant(0, x.array_shape.element_type), PaddingConfig(tuple(pad_cfg)))
    written = b.dynamic_update_slice(padded, u, starts)
    lows = [c[0] for c in pad_cfg]
    new = b.slice(written, lows, [lo + n for lo, n in zip(lows, local)])
    return p.reshard(PValue(new, out, instr.shape), p.target(instr))


