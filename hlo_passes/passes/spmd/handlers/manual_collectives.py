"""Collectives and device ids written inside a partially manual region (shard_map's own psum,
all_gather, ppermute, axis_index), on the region's values tiled over its automatic axes.

The program's collective names its own groups along the manual axes; each device's partners
are in other manual groups.  It stays right on tiles when every device of a group (or both
ends of a permute pair) holds the same tile, and the dims it moves data along (all-gather's,
reduce-scatter's, all-to-all's) are whole on every device: then the collective runs on the
tiles as it ran on the whole values.

    m = f32[8,8] ..., sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dims={manual}}    y: dim 1
    s = f32[8,8] all-reduce(m), replica_groups={{0,2,4,6},{1,3,5,7}}                    along x
  becomes
    s = f32[8,4] all-reduce(m), replica_groups={{0,2,4,6},{1,3,5,7}}   (0,2,4,6 hold one tile)

Otherwise (or for a variadic collective) ManualGroupsMismatch sends the op to the fallback: its
operand gathered over the automatic axes, the collective run on whole values.  partition-id and
replica-id are copied: the program computes its manual axis index from them.  Outside manual
regions replica-id is replicated (partitioning leaves replicas as they are) and partition-id
never arrives: spmd-partition refuses such a module first (`_refuse_what_it_cannot_partition`).

Outside manual regions a cross-replica all-reduce (no channel id) runs tile by tile; every other
collective there has no rule (fallback.replicate).
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.handlers.elementwise import elementwise
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import (ManualGroupsMismatch, PValue, is_partially_manual,
                                                       local_shape, pair_on_other_tiles, tile_map, to_sharding)

_MOVING_DIMS = {Opcode.ALL_GATHER: "dimensions", Opcode.REDUCE_SCATTER: "dimensions",
                Opcode.ALL_TO_ALL: "dimensions"}


@handles(Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
         Opcode.COLLECTIVE_PERMUTE)
def collective(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    operand_pm = len(instr.operands) == 1 and is_partially_manual(p.operand(instr, 0).sharding)
    if not (is_partially_manual(target) or operand_pm):
        if instr.opcode is Opcode.ALL_REDUCE and instr.channel_id is None and len(instr.operands) == 1:
            # combines each element with its twins on other replicas, never across partitions:
            # every replica's array is cut into the same tiles, so it runs tile by tile, as an
            # elementwise op does (XLA's partitioner treats it so); uneven tiles' padding meets
            # only padding
            return elementwise(p, instr)
        return replicate(p, instr)
    if instr.shape.is_tuple or len(instr.operands) != 1:
        raise ManualGroupsMismatch(f"{instr.name}: a variadic {instr.opcode.value} is not partitioned")
    if not is_partially_manual(target):  # propagation leaves collectives alone: keep the operand's tiling
        target = p.operand(instr, 0).sharding
    rank = instr.array_shape.rank
    moving = list(instr.dimensions) if instr.opcode in _MOVING_DIMS else []
    if instr.opcode is Opcode.ALL_TO_ALL and not moving:
        raise ManualGroupsMismatch(f"{instr.name}: a tuple all-to-all is not partitioned")
    tm = tile_map(target, rank, p.n).keep_dims([d for d in range(rank) if d not in moving])
    bad = pair_on_other_tiles(instr, tm)
    if bad is not None:
        raise ManualGroupsMismatch(f"{instr.name}: devices {bad[0]} and {bad[1]} exchange data but hold "
                                   "different tiles")
    sharding = to_sharding(tm)
    x = p.operand_as(instr, 0, sharding)
    new = p.clone(instr, [x], local_shape(instr.shape, sharding))
    return p.reshard(PValue(new, sharding, instr.shape), target)


@handles(Opcode.PARTITION_ID, Opcode.REPLICA_ID)
def device_id(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    if not is_partially_manual(target):
        return replicate(p, instr)
    return PValue(p.clone(instr, [], instr.shape), target, instr.shape)


__all__ = ["collective", "device_id"]
