"""broadcast, transpose, reshape: the result's tiles map to operand tiles dim by dim.

    %t = f32[8,16] transpose(%a), dimensions={1,0}, sharding={devices=[2,1]<=[2]}
  needs %a in {devices=[1,2]<=[2]}; then the local transpose is the answer.

A reshape is local when its tiles are contiguous chunks of the row-major order of
each group of dims that reshape into each other, on both sides:

    f32[16,32] -> f32[512] tiled 8 ways           operand tiled [8,1]
    f32[4,32]  -> f32[128] tiled 8 ways           operand tiled [4,2] (rows whole, then halves)
    f32[64]    -> f32[4,16] tiled [4,2]           operand tiled 8 ways

Otherwise the handler prices the operand's own tiling carried forward (a local
reshape, then the result is resharded: an all-to-all or permute rather than a
gather of everything) against gathering the operand, and takes the cheaper.

A group whose tiles do not line up on the two sides (f32[7,10] -> f32[14,5], both
tiled 2 ways: device 1 holds input rows 4..6, its output rows 7..13 start half way
through input row 3) has one more candidate, as GSPMD's reshape with halo exchange:
each input tile is cut into sub-rows of g elements (g = gcd of the input row and
the output tile's element counts, here 5) and a halo exchange (halo.py) gives every
device exactly the sub-rows of its output tile (device 1 receives one sub-row of
5 elements from device 0), which reshape locally into the result tile.
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction

import math
from dataclasses import dataclass


from hlo_passes.ir.attributes import WindowDimension
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import halo as halos
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.cost_model import Estimate
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import (PValue, is_manual, local_shape, same_placement, tile_map,
                                                       tm_local_dims, to_sharding)
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap, reshape_groups, reshape_tile_map


@handles(Opcode.BROADCAST)
def broadcast(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    dims = instr.dimensions
    tm = tile_map(target, instr.array_shape.rank, p.n)
    op_tm = tm.remap(len(dims), {k: d for k, d in enumerate(dims)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    return PValue(p.clone(instr, [x], local_shape(instr.shape, target)), target, instr.shape)


@handles(Opcode.TRANSPOSE, Opcode.COPY)
def transpose(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    if instr.shape.is_tuple:  # a tuple-shaped copy (XLA allows one): each element takes its target
        x = p.operand_as(instr, 0, target)
        return PValue(p.clone(instr, [x], x.shape), target, instr.shape)
    rank = instr.array_shape.rank
    perm = instr.dimensions if instr.opcode is Opcode.TRANSPOSE else tuple(range(rank))
    tm = tile_map(target, rank, p.n)
    op_tm = tm.remap(rank, {perm[i]: i for i in range(rank)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    if instr.opcode is Opcode.COPY and x is not p.operand(instr, 0).instr and x.opcode.is_collective:
        # A copy that reshards (a function result's boundary, `copy` with a sharding): the
        # collective's result is already a new buffer; copying it again would only move the
        # whole value once more in memory.
        return PValue(x, target, instr.shape)
    return PValue(p.clone(instr, [x], local_shape(instr.shape, target)), target, instr.shape)


@handles(Opcode.RESHAPE, Opcode.BITCAST)
def reshape(p: HandlerContext, instr: Instruction) -> PValue:
    """Local reshape on a sharding whose tiles are contiguous chunks of both shapes, chosen by
    price among: the target's tiling carried back to the operand, the operand's own tiling or
    a coarser one carried forward (then the result is resharded, e.g. by an all-to-all), and
    replication."""
    target = p.target(instr)
    in_dims, out_dims = tuple(instr.operands[0].array_shape.dims), tuple(instr.array_shape.dims)
    n = p.n
    tm = tile_map(target, len(out_dims), n)
    op_value = p.operand(instr, 0)
    if is_manual(target) or is_manual(op_value.sharding):  # inside shard_map: the target's own tiling only
        found = _local_reshape(reshape_tile_map(tm, out_dims, in_dims), in_dims, out_dims)
        if found is None or not same_placement(found[1], tm):
            return replicate(p, instr, "reshape splits or merges a sharded dimension unevenly")
        x = p.operand_as(instr, 0, to_sharding(found[0]))
        return PValue(_local(p, instr, x, target), target, instr.shape)
    element, shape = instr.operands[0].array_shape, instr.array_shape
    key = (su.exact(target), su.exact(op_value.sharding), element, shape)
    plan = p.ctx.reshape_plans.get(key)
    if plan is None:
        plan = p.ctx.reshape_plans[key] = _reshape_plan(p, tm, target, op_value.sharding, element, shape)
    op_tm, out_tm, uneven, by_halo = plan
    if uneven:
        p.remark(instr, "replicated: reshape splits or merges a sharded dimension unevenly", kind="missed")
    out = to_sharding(out_tm)
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    if by_halo is not None:
        return p.reshard(PValue(_reshape_by_halo(p, instr, x, op_tm, by_halo, out), out, instr.shape), target)
    return p.reshard(PValue(_local(p, instr, x, out), out, instr.shape), target)


@dataclass(frozen=True)
class HaloReshape:
    """A reshape group whose input and output tiles do not line up, done by a halo exchange:
    operand dim `in_dim` (the group's leading non-1 dim, the only one tiled there) is cut into
    sub-rows of `sub_row` elements — its local tile [rows, rest...] viewed as
    [rows * rest / sub_row, sub_row] — and `halo` (over that view's sub-row dim, which stands
    where the group starts) gives each device the sub-rows of its output tile, which reshape
    locally into it."""

    in_dim: int
    group_in: tuple[int, ...]   # the group's operand dims (consecutive)
    sub_row: int
    halo: halos.Halo


def _halo_reshape(tm: TileMap, in_dims: tuple[int, ...],
                  out_dims: tuple[int, ...]) -> tuple[TileMap, HaloReshape] | None:
    """(operand map, exchange) producing the result tiled exactly as `tm` where one reshape
    group's tiles do not carry across: `tm` tiles only that group's leading non-1 output dim (c
    rows of Rout elements, k tiles of ceil(c/k) rows), the operand takes the same tiling on the
    group's leading non-1 input dim (a rows of Rin elements), and every other group carries as
    a local reshape.  Output tile t is elements [t*chunk, (t+1)*chunk) of the group's row-major
    order (chunk = ceil(c/k)*Rout): sub-rows [t*chunk/g, (t+1)*chunk/g) of g = gcd(Rin, chunk)
    elements.  None when no group fits that form."""
    for ins, outs in reshape_groups(in_dims, out_dims):
        tiled = [o for o in outs if tm.dims[o] > 1]
        big_in = [i for i in ins if in_dims[i] != 1]
        big_out = [o for o in outs if out_dims[o] != 1]
        if (len(tiled) != 1 or not big_in or not big_out or tiled[0] != big_out[0]
                or (len(big_in) == 1 and len(big_out) == 1)):  # (a size-1 dim tiled: nothing to exchange)
            continue
        out_dim, in_dim = tiled[0], big_in[0]
        rest = tm.keep_dims([d for d in range(len(out_dims)) if d != out_dim])
        found = _local_reshape(reshape_tile_map(rest, out_dims, in_dims), in_dims, out_dims)
        if found is None or not same_placement(found[1], rest) or any(found[0].dims[i] > 1 for i in ins):
            continue
        op_tm = found[0].merge(tm.remap(len(in_dims), {in_dim: out_dim}))
        if op_tm is None:
            continue
        k, a, c = tm.dims[out_dim], in_dims[in_dim], out_dims[out_dim]
        r_in = math.prod(in_dims[i] for i in ins if i > in_dim)
        r_out = math.prod(out_dims[o] for o in outs if o > out_dim)
        chunk = -(-c // k) * r_out
        g = math.gcd(r_in, chunk)
        local = -(-a // k) * r_in // g        # sub-rows per input tile
        width = chunk // g                    # sub-rows per output tile
        # the padded view: every input tile holds `local` sub-rows (the last one's padding
        # only feeds the result's padding, so it is never masked)
        rows = halos.WindowRows(tuple(t * width for t in range(k)), width, WindowDimension(width))
        active = [t * -(-c // k) < c for t in range(k)]
        # (planned over the view's sub-row dim, which stands where the group starts)
        halo = halos.plan(ins[0], local * k, k, rows, True, active, reads_outside=False)
        # Output tiles that drift past the neighbouring input tiles (f32[12,8] -> f32[96] over
        # 8 devices: tile 7 reads input tile 5) take one permute per distance; the price decides
        # against gathering (`reshape_merge`: 3 permutes receiving 6 KiB against a gather
        # receiving 28 KiB; XLA's partition permutes too, 7 KiB).
        return op_tm, HaloReshape(in_dim, tuple(ins), g, halo)
    return None


def _halo_reshape_cost(p: HandlerContext, op_tm: TileMap, by_halo: HaloReshape, element: ArrayShape) -> Estimate:
    """What the exchange moves per device: its sub-rows, each of `sub_row` elements times the
    local dims outside the group."""
    local = tm_local_dims(op_tm, tuple(element.dims))
    outside = math.prod(d for i, d in enumerate(local) if i not in by_halo.group_in)
    row = outside * by_halo.sub_row * element.element_type.byte_size
    return p.ctx.cost_model.transfer(by_halo.halo.bytes(row), by_halo.halo.permutes)


def _reshape_by_halo(p: HandlerContext, instr: Instruction, x: Instruction, op_tm: TileMap, by_halo: HaloReshape,
                     out: Sharding) -> Instruction:
    """The result tile from the operand tile `x` (tiled by `op_tm`) by `by_halo`'s exchange."""
    b = p.em.b()
    dims = list(x.array_shape.dims)
    first, last = by_halo.group_in[0], by_halo.group_in[-1]
    group_elems = math.prod(dims[first:last + 1])
    view = dims[:first] + [group_elems // by_halo.sub_row, by_halo.sub_row] + dims[last + 1:]
    viewed = b.reshape(x, x.array_shape.with_dims(tuple(view)))
    view_tm = op_tm.remap(len(view), {d: d for d in range(first)} | {first: by_halo.in_dim}
                          | {first + 2 + j: last + 1 + j for j in range(len(dims) - last - 1)})
    window = halos.exchange(p.em, viewed, view_tm, by_halo.halo, None)
    return b.reshape(window, local_shape(instr.array_shape, out))


def _reshape_plan(p: HandlerContext, tm: TileMap, target: Sharding, op_sharding: Sharding, element: ArrayShape,
                  shape: ArrayShape) -> tuple[TileMap, TileMap, bool, "HaloReshape | None"]:
    """(operand map, result map, replicated because a sharded dim splits unevenly, the halo
    exchange that makes the result tile when its tiles do not line up with the operand's) for a reshape
    from `element` to `shape`: the cheapest candidate (see `reshape`).  It depends on the
    shardings and shapes only, so the handler keeps it per run (a model has the same reshapes in
    every layer, and pricing the candidates is most of a reshape's time)."""
    in_dims, out_dims = tuple(element.dims), tuple(shape.dims)
    n = p.n
    replicated = TileMap.replicated(len(in_dims), n)
    # `tm` cut into fewer, larger tiles from which the target is a local slice away: f32[10,4]
    # -> f32[40] tiled 4 ways (tiles of 10) has no operand tiling, tiled 2 ways (tiles of 20) does
    candidates = [reshape_tile_map(c, out_dims, in_dims) for c in tm.coarsenings()]
    # The operand's own tiling, then coarser ones: a split whose tiles do not line up with the
    # new minor dim (f32[96] in 8 tiles of 12 -> f32[12,8]) lines up after gathering over the
    # fewest devices (pairs: 4 tiles of 24, 3 rows of 8 each), where it was gathered whole.
    candidates.extend(tile_map(op_sharding, len(in_dims), n).coarsenings())
    best: tuple[Estimate, TileMap, TileMap] | None = None
    for want in candidates:
        found = _local_reshape(want, in_dims, out_dims)
        if found is None:
            continue
        op_tm, out_tm = found
        model = p.ctx.cost_model
        price = (cost(op_sharding, to_sharding(op_tm), element, n, model)
                 + cost(to_sharding(out_tm), target, shape, n, model))
        if best is None or price < best[0]:
            best = (price, op_tm, out_tm)
        if price.bytes == 0 and price.seconds == 0:  # nothing moves: no candidate can beat it
            break
    by_halo: HaloReshape | None = None
    if best is None or not same_placement(best[2], tm):
        found_halo = _halo_reshape(tm, in_dims, out_dims)
        if found_halo is not None:
            op_tm, exchange = found_halo
            into = cost(op_sharding, to_sharding(op_tm), element, n, p.ctx.cost_model)
            price = (into + _halo_reshape_cost(p, op_tm, exchange, element)
                     + cost(to_sharding(tm), target, shape, n, p.ctx.cost_model))
            # Only from an operand already tiled for the exchange: reached by a reshard first (an
            # all-to-all into an uneven tiling, then the permutes) the plan wins per instruction
            # by transfer time and loses in the step (gpt_dense in spmd_models: the heads-tiled
            # [b,s,3,h,e] -> [b,s,3*h*e] of a fused qkv, +3.6% estimated step at d=256, +0.6% at
            # 4096, against gathering the heads and slicing, XLA's plan).
            if into.collectives == 0 and (best is None or price < best[0]):
                best, by_halo = (price, op_tm, tm), exchange
    full = cost(op_sharding, Sharding.replicated(), element, n, p.ctx.cost_model)
    uneven = False
    if best is None or (full < best[0] and tm.num_tiles > 1):
        uneven = tm.num_tiles > 1
        best, by_halo = (full, replicated, TileMap.replicated(len(out_dims), n)), None
    return best[1], best[2], uneven, by_halo


def _local(p: HandlerContext, instr: Instruction, x: Instruction, out: Sharding) -> Instruction:
    new = p.clone(instr, [x], local_shape(instr.shape, out))
    if new.opcode is Opcode.BITCAST:
        new.opcode = Opcode.RESHAPE
    return new


def _local_reshape(want: TileMap, in_dims: tuple[int, ...],
                   out_dims: tuple[int, ...]) -> tuple[TileMap, TileMap] | None:
    """(operand map, result map) nearest `want` whose local reshape is exact: `want` less the
    tiling that does not carry across the reshape, when that round-trips; else None."""
    out_tm = reshape_tile_map(want, in_dims, out_dims)
    op_tm = reshape_tile_map(out_tm, out_dims, in_dims)
    if not same_placement(reshape_tile_map(op_tm, in_dims, out_dims), out_tm):
        return None
    if op_tm.to_sharding() is None or out_tm.to_sharding() is None:
        return None
    if math.prod(tm_local_dims(op_tm, in_dims)) != math.prod(tm_local_dims(out_tm, out_dims)):
        return None  # uneven tiles pad differently on the two sides
    return op_tm, out_tm
