"""Tuples, sharding annotations and manual (shard_map) regions.

`custom-call(%x), custom_call_target="Sharding"` is a resharding and disappears:
its users read %x in the annotated sharding.  Manual regions are already
per-device code: SPMDFullToShardShape hands the local tile of its operand to the
region, SPMDShardToFullShape reads the region's result as that tile, and
everything in between is copied unchanged.  A partially manual region whose values
propagation also tiles over the automatic devices (XLA's propagation does that through
`unspecified_dims`) is still copied unchanged: every device of a manual group gets the
group's whole shard (the automatic tiling gathered on the way in) and the result is read as
that shard, replicated over the automatic devices.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.tile_map import TileMap
from hlo_passes.passes.spmd.handlers import HandlerContext, handles, handles_custom_call
from hlo_passes.passes.spmd.partition_context import PValue, is_manual, local_shape


@handles(Opcode.TUPLE)
def tuple_(p: HandlerContext, instr: Instruction) -> PValue:
    values = [p.value(op) for op in instr.operands]
    new = p.clone(instr, [v.instr for v in values], _tuple_shape([v.instr.shape for v in values]))
    return PValue(new, Sharding.tuple_of(v.sharding for v in values), instr.shape)


@handles(Opcode.GET_TUPLE_ELEMENT)
def get_tuple_element(p: HandlerContext, instr: Instruction) -> PValue:
    t = p.operand(instr, 0)
    index = instr.attr("index")
    new = p.clone(instr, [t.instr], t.instr.shape.elements[index])
    return PValue(new, t.sharding.element(index), instr.shape)


@handles(Opcode.OPTIMIZATION_BARRIER)
def barrier(p: HandlerContext, instr: Instruction) -> PValue:
    v = p.operand(instr, 0)
    return PValue(p.clone(instr, [v.instr], v.instr.shape), v.sharding, instr.shape)


@handles_custom_call("Sharding")
def sharding_annotation(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    if is_manual(target):
        return PValue(p.operand(instr, 0).instr, target, instr.shape)
    return p.resharded(instr.operands[0], target)


@handles_custom_call("SPMDFullToShardShape")
def full_to_shard(p: HandlerContext, instr: Instruction) -> PValue:
    operand_sharding = (instr.operands[0].sharding if "sharding" in instr.operands[0].attributes
                        else p.operand(instr, 0).sharding)
    operand_sharding = _manual_part(operand_sharding, p.target(instr), instr.shape.rank, p.n)
    x = p.operand_as(instr, 0, operand_sharding)
    want = local_shape(instr.operands[0].shape, operand_sharding)
    if tuple(want.dims) != tuple(instr.shape.dims):
        p.em.metadata = instr.attributes.get("metadata")
        x = p.em.slice_to(x, tuple(instr.shape.dims))
    return PValue(x, p.target(instr), instr.shape)


@handles_custom_call("SPMDShardToFullShape")
def shard_to_full(p: HandlerContext, instr: Instruction) -> PValue:
    x = p.operand(instr, 0).instr
    region = instr.operands[0].sharding if "sharding" in instr.operands[0].attributes else None
    target = p.target(instr)
    if region is not None:
        target = _manual_part(target, region, instr.shape.rank, p.n)
    want = local_shape(instr.shape, target)
    if tuple(want.dims) != tuple(x.shape.dims):
        x = p.em.pad_to(x, tuple(want.dims))
    return PValue(x, target, instr.shape)


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
    called = {}
    for key, comp in instr.called.items():
        if instr.opcode in (Opcode.CALL, Opcode.WHILE, Opcode.CONDITIONAL):
            comps = comp if isinstance(comp, tuple) else (comp,)
            new = tuple(p.partition_manual(c) for c in comps)
            called[key] = new if isinstance(comp, tuple) else new[0]
    operands = [p.value(op).instr for op in instr.operands]
    return PValue(p.clone(instr, operands, instr.shape, **called), p.target(instr), instr.shape)


def _tuple_shape(elements):
    from hlo_passes.ir.shape import TupleShape

    return TupleShape(tuple(elements))


__all__ = ["barrier", "full_to_shard", "get_tuple_element", "manual", "shard_to_full", "sharding_annotation",
           "tuple_"]
