"""Tuples, sharding annotations and manual (shard_map) regions.

`custom-call(%x), custom_call_target="Sharding"` is a resharding and disappears:
its users read %x in the annotated sharding.  Fully manual regions (`{manual}`) are
already per-device code: SPMDFullToShardShape hands the local tile of its operand to the
region, SPMDShardToFullShape reads the region's result as that tile, and everything in
between is copied unchanged.

A partially manual region (`last_tile_dims={manual, ...}`) is per-device code along its
manual axes only; propagation (through `unspecified_dims`) may tile its values over the
other, automatic, axes, and the handlers partition them there like any value, within each
manual group.  At the borders each device holds its tile of its group's block:

    a = f32[16,8] parameter(0), sharding={devices=[4,2]<=[8]}               x: dim 0, y: dim 1
    r = f32[4,8] custom-call(a), custom_call_target="SPMDFullToShardShape",
          sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dims={manual}}   manual x, auto y
  becomes
    r = f32[4,4] ... the device's own tile of %a: nothing moves

Where a group's block is not cut evenly by the region's tiling, the region's input is gathered
over the automatic axes on the way in (and its result on the way out), with a remark.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.spmd.tile_map import TileMap
from hlo_passes.passes.spmd.handlers import HandlerContext, handles, handles_custom_call
from hlo_passes.passes.spmd.handlers.fallback import whole_in_manual_groups
from hlo_passes.passes.spmd.partition_context import (PValue, is_fully_manual, is_manual, is_partially_manual,
                                                       local_shape, tile_map)


@handles(Opcode.TUPLE)
def tuple_(p: HandlerContext, instr: Instruction) -> PValue:
    values = [p.value(op) for op in instr.operands]
    new = p.clone(instr, [v.instr for v in values], _tuple_shape([v.instr.shape for v in values]))
    return PValue(new, Sharding.tuple_of(v.sharding for v in values), instr.shape)


@handles(Opcode.GET_TUPLE_ELEMENT)
def get_tuple_element(p: HandlerContext, instr: Instruction) -> PValue:
    t = p.operand(instr, 0)
    index: int = instr.attr("index")
    new = p.clone(instr, [t.instr], _tuple_shape_of(t.instr).elements[index])
    return PValue(new, t.sharding.subsharding(instr.operands[0].shape, index), instr.shape)


@handles(Opcode.OPTIMIZATION_BARRIER)
def barrier(p: HandlerContext, instr: Instruction) -> PValue:
    v = p.operand(instr, 0)
    return PValue(p.clone(instr, [v.instr], v.instr.shape), v.sharding, instr.shape)


@handles_custom_call("Sharding")
def sharding_annotation(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    if is_fully_manual(target):
        return PValue(p.operand(instr, 0).instr, target, instr.shape)
    return p.resharded(instr.operands[0], target)


@handles_custom_call("SPMDFullToShardShape")
def full_to_shard(p: HandlerContext, instr: Instruction) -> PValue:
    """Each device takes its part of its manual group's shard: with the region tiled over its
    automatic axes, the operand is resharded to the tiling that cuts every group's block by
    the region's tiling (`_blocks_cut`), and the local tile is the region's value as it is."""
    operand = instr.operands[0]
    operand_sharding = operand.sharding or p.operand(instr, 0).sharding
    region = p.target(instr)
    cut = _blocks_cut(operand_sharding, region, operand.array_shape, instr.array_shape, p.n)
    if cut is not None:
        return PValue(p.operand_as(instr, 0, cut), region, instr.shape)
    whole = _manual_part(operand_sharding, region, instr.array_shape.rank, p.n)
    x = p.operand_as(instr, 0, whole)
    want = local_shape(operand.array_shape, whole)
    if tuple(want.dims) != tuple(instr.array_shape.dims):
        p.em.metadata = instr.attributes.get("metadata")
        x = p.em.slice_to(x, tuple(instr.array_shape.dims))
    if is_partially_manual(region) and any(t > 1 for t in tile_map(region, instr.array_shape.rank, p.n).dims):
        p.remark(instr, "replicated: the region's input is gathered over its automatic axes (its blocks are "
                 "not cut evenly by the region's tiling)", kind="missed")
        whole_region = whole_in_manual_groups(region, instr.shape, p.n)
        return p.reshard(PValue(x, whole_region, instr.shape), region)
    return PValue(x, region, instr.shape)


@handles_custom_call("SPMDShardToFullShape")
def shard_to_full(p: HandlerContext, instr: Instruction) -> PValue:
    operand = instr.operands[0]
    region = p.target(operand) if "sharding" in operand.attributes else p.operand(instr, 0).sharding
    target = p.target(instr)
    if is_partially_manual(region):
        cut = _blocks_cut(target, region, instr.array_shape, operand.array_shape, p.n)
        if cut is not None:
            x = p.operand_as(instr, 0, region)
            return p.reshard(PValue(x, cut, instr.shape), target)
        if any(t > 1 for t in tile_map(region, operand.array_shape.rank, p.n).dims):
            p.remark(instr, "replicated: the region's result is gathered over its automatic axes (its blocks are "
                     "not cut evenly by the region's tiling)", kind="missed")
        x = p.operand_as(instr, 0, whole_in_manual_groups(region, operand.shape, p.n))
    else:
        x = p.operand(instr, 0).instr
    if "sharding" in operand.attributes:
        target = _manual_part(target, region, instr.array_shape.rank, p.n)
    want = local_shape(instr.array_shape, target)
    if tuple(want.dims) != tuple(x.array_shape.dims):
        x = p.em.pad_to(x, tuple(want.dims))
    return PValue(x, target, instr.shape)


def _blocks_cut(full: Sharding, region: Sharding, full_shape: ArrayShape, region_shape: ArrayShape,
                n: int) -> Sharding | None:
    """The sharding of the global array (`full_shape`) whose tile on each device is that device's
    tile of the partially manual `region` value (`region_shape`, one block of the global array per
    manual group): block coordinates times the region's tile counts plus the region's own
    coordinates.  The manual groups' blocks are read off `full` (the sharding outside the
    region).  None when the region tiles nothing automatically, when the blocks are not the
    minor-free part of `full`'s tiling, or when a region tile is not a whole, unpadded part of
    its block."""
    rank = region_shape.rank
    if (not is_partially_manual(region) or full.is_tuple or is_manual(full) or full_shape.rank != rank
            or rank == 0):
        return None  # (a region inside a region keeps the old path)
    inner = TileMap.from_sharding(region, n, rank)
    outer = TileMap.from_sharding(full, n, rank) if full.kind is not ShardingKind.REPLICATED else (
        TileMap.replicated(rank, n))
    if inner is None or outer is None or all(t == 1 for t in inner.dims):
        return None
    coords = np.zeros((n, rank), np.int64)
    dims: list[int] = []
    for k in range(rank):
        size, part = full_shape.dims[k], region_shape.dims[k]
        if part == 0 or size % part:
            return None
        blocks = size // part
        if inner.dims[k] > 1 and part % inner.dims[k]:
            return None  # a padded region tile would not be a tile of the global array
        if blocks > 1:
            if outer.dims[k] % blocks:
                return None
            block = outer.coords[:, k] // (outer.dims[k] // blocks)
        else:
            block = np.zeros(n, np.int64)
        coords[:, k] = block * inner.dims[k] + inner.coords[:, k]
        dims.append(blocks * inner.dims[k])
    for group in range(inner.manual_size):  # every device of a group holds a piece of one block
        members = inner.manual == group
        blocks_of = coords[members] // np.asarray(inner.dims, np.int64)
        if len(blocks_of) and np.any(blocks_of != blocks_of[0]):
            return None
    cut = TileMap(tuple(dims), coords, np.zeros(n, np.int64)).to_sharding()
    return cut


def _manual_part(full: Sharding, region: Sharding, rank: int, n: int) -> Sharding:
    """`full` (the sharding outside a manual region) without the tiling the region's partially
    manual sharding puts on its automatic devices: what one manual group holds as a whole.
    Unchanged when the region tiles no dim automatically; replicated when the automatic
    tiling is not the minor part of `full`'s (not a layout propagation produces)."""
    inner = TileMap.from_sharding(region, n, rank) if is_manual(region) and rank else None
    if inner is None or all(t == 1 for t in inner.dims):
        return full
    outer = TileMap.from_sharding(full, n, rank)
    if outer is None or any(o % t for o, t in zip(outer.dims, inner.dims)):
        return Sharding.replicated()
    dims = tuple(o // t for o, t in zip(outer.dims, inner.dims))
    coords = outer.coords // np.asarray(inner.dims, np.int64)
    for group in range(inner.manual_size):  # one manual group holds one tile of the reduced map
        members = coords[inner.manual == group]
        if len(members) and np.any(members != members[0]):
            return Sharding.replicated()
    reduced = TileMap(dims, coords, np.zeros(n, np.int64)).to_sharding()
    return reduced if reduced is not None else Sharding.replicated()


def manual(p: HandlerContext, instr: Instruction) -> PValue:
    """Inside a manual region: the op is already per-device; copy it.  A `Sharding` annotation
    there computes nothing and disappears (a partitioned program has none; XLA rejects one
    without a sharding)."""
    if instr.custom_call_target == "Sharding":
        return PValue(p.value(instr.operands[0]).instr, p.target(instr), instr.shape)
    called: dict[str, Computation | tuple[Computation, ...]] = {}
    for key, comp in instr.called.items():
        if instr.opcode in (Opcode.CALL, Opcode.WHILE, Opcode.CONDITIONAL):
            comps = comp if isinstance(comp, tuple) else (comp,)
            new = tuple(p.partition_manual(c) for c in comps)
            called[key] = new if isinstance(comp, tuple) else new[0]
    operands = [p.value(op).instr for op in instr.operands]
    return PValue(p.clone(instr, operands, instr.shape, **called), p.target(instr), instr.shape)


def _tuple_shape(elements: list[Shape]) -> TupleShape:
    return TupleShape(tuple(elements))


def _tuple_shape_of(instr: Instruction) -> TupleShape:
    shape = instr.shape
    if not isinstance(shape, TupleShape):
        raise TypeError(f"{instr.name}: expected a tuple shape, got {shape.to_hlo()}")
    return shape


__all__ = ["barrier", "full_to_shard", "get_tuple_element", "manual", "shard_to_full", "sharding_annotation",
           "tuple_"]
