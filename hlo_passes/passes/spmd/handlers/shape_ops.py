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
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction

import itertools
import math
from typing import Iterator

import numpy as np

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.cost_model import Estimate
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import (PValue, is_manual, local_shape, same_placement, tile_map,
                                                       tm_local_dims, to_sharding)
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap, reshape_tile_map


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
    return PValue(p.clone(instr, [x], local_shape(instr.shape, target)), target, instr.shape)


@handles(Opcode.RESHAPE, Opcode.BITCAST)
def reshape(p: HandlerContext, instr: Instruction) -> PValue:
    """Local reshape on a sharding whose tiles are contiguous chunks of both shapes, chosen by
    price among: the target's tiling carried back to the operand, the operand's own tiling
    carried forward (then the result is resharded, e.g. by an all-to-all), and replication."""
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
    op_tm, out_tm, uneven = plan
    if uneven:
        p.remark(instr, "replicated: reshape splits or merges a sharded dimension unevenly", kind="missed")
    out = to_sharding(out_tm)
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    return p.reshard(PValue(_local(p, instr, x, out), out, instr.shape), target)


def _reshape_plan(p: HandlerContext, tm: TileMap, target: Sharding, op_sharding: Sharding, element: ArrayShape,
                  shape: ArrayShape) -> tuple[TileMap, TileMap, bool]:
    """(operand map, result map, replicated because a sharded dim splits unevenly) for a reshape
    from `element` to `shape`: the cheapest candidate (see `reshape`).  It depends on the
    shardings and shapes only, so the handler keeps it per run (a model has the same reshapes in
    every layer, and pricing the candidates is most of a reshape's time)."""
    in_dims, out_dims = tuple(element.dims), tuple(shape.dims)
    n = p.n
    replicated = TileMap.replicated(len(in_dims), n)
    candidates = [reshape_tile_map(c, out_dims, in_dims) for c in _coarsenings(tm)]
    candidates.append(tile_map(op_sharding, len(in_dims), n))
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
    full = cost(op_sharding, Sharding.replicated(), element, n, p.ctx.cost_model)
    uneven = False
    if best is None or (full < best[0] and tm.num_tiles > 1):
        uneven = tm.num_tiles > 1
        best = (full, replicated, TileMap.replicated(len(out_dims), n))
    return best[1], best[2], uneven


def _local(p: HandlerContext, instr: Instruction, x: Instruction, out: Sharding) -> Instruction:
    new = p.clone(instr, [x], local_shape(instr.shape, out))
    if new.opcode is Opcode.BITCAST:
        new.opcode = Opcode.RESHAPE
    return new


def _coarsenings(tm: TileMap) -> Iterator[TileMap]:
    """`tm` itself, then `tm` with tiled dims cut into fewer, larger tiles (c -> c // g), from
    which the target is a local slice away: f32[10,4] -> f32[40] tiled 4 ways (tiles of 10)
    has no operand tiling, tiled 2 ways (tiles of 20) does."""
    divisors = [[g for g in range(1, t + 1) if t % g == 0] for t in tm.dims]
    for gs in itertools.product(*divisors):
        coords = tm.coords // np.asarray(gs, np.int64) if tm.rank else tm.coords
        yield TileMap(tuple(t // g for t, g in zip(tm.dims, gs)), coords, tm.manual, tm.manual_size)


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
