"""broadcast, transpose, reshape: the result's tiles map to operand tiles dim by dim.

    %t = f32[8,16] transpose(%a), dimensions={1,0}, sharding={devices=[2,1]<=[2]}
  needs %a in {devices=[1,2]<=[2]}; then the local transpose is the answer.

A reshape is local when each tiled result dim is the major dim of a group of
dims that reshape into each other and the tile count divides both sides evenly
(f32[16,32] -> f32[512] tiled 8 ways); anything else is replicated.
"""

from __future__ import annotations

from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.handlers import handles
from hlo_passes.passes.spmd.handlers.fallback import replicate
from hlo_passes.passes.spmd.partition_context import PValue, local_shape, tile_map, to_sharding


@handles(Opcode.BROADCAST)
def broadcast(p, instr) -> PValue:
    target = p.target(instr)
    dims = instr.attr("dimensions") or ()
    tm = tile_map(target, instr.shape.rank, p.n)
    op_tm = tm.remap(len(dims), {k: d for k, d in enumerate(dims)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    return PValue(p.clone(instr, [x], local_shape(instr.shape, target)), target, instr.shape)


@handles(Opcode.TRANSPOSE, Opcode.COPY)
def transpose(p, instr) -> PValue:
    target = p.target(instr)
    rank = instr.shape.rank
    perm = instr.attr("dimensions") if instr.opcode is Opcode.TRANSPOSE else tuple(range(rank))
    tm = tile_map(target, rank, p.n)
    op_tm = tm.remap(rank, {perm[i]: i for i in range(rank)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    return PValue(p.clone(instr, [x], local_shape(instr.shape, target)), target, instr.shape)


def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]):
    """Pairs (dims of a, dims of b) of minimal groups with equal element counts; size-1 dims join
    the group before them."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        ga, gb = [], []
        pa = pb = 1
        if i < len(a):
            ga.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gb.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                ga.append(i); pa *= a[i]; i += 1
            elif j < len(b):
                gb.append(j); pb *= b[j]; j += 1
            else:
                return None
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            ga.append(i); i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gb.append(j); j += 1
        groups.append((ga, gb))
    return groups


@handles(Opcode.RESHAPE, Opcode.BITCAST)
def reshape(p, instr) -> PValue:
    target = p.target(instr)
    in_dims, out_dims = tuple(instr.operands[0].shape.dims), tuple(instr.shape.dims)
    tm = tile_map(target, len(out_dims), p.n)
    source = {}
    groups = reshape_groups(in_dims, out_dims) if tm.num_tiles > 1 else []
    if groups is None:
        return replicate(p, instr, "reshape with mismatched element counts")
    for ga, gb in groups:
        tiled = [j for j in gb if tm.dims[j] > 1]
        if not tiled:
            continue
        j = next((k for k in gb if out_dims[k] > 1), gb[0])  # the group's major non-trivial dims
        i = next((k for k in ga if in_dims[k] > 1), ga[0])
        t = tm.dims[j]
        if tiled != [j] or in_dims[i] % t or out_dims[j] % t:
            return replicate(p, instr, "reshape splits or merges a sharded dimension unevenly")
        source[i] = j
    op_tm = tm.remap(len(in_dims), source)
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    new = p.clone(instr, [x], local_shape(instr.shape, target))
    if new.opcode is Opcode.BITCAST:
        new.opcode = Opcode.RESHAPE
    return PValue(new, target, instr.shape)
