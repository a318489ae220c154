"""Elementwise ops, constants and iota: computed tile by tile in the result's sharding.

    %c = f32[16,8] add(%a, %b), sharding={devices=[4,1]<=[4]}
  becomes, with %a and %b resharded to {devices=[4,1]<=[4]} first,
    %c = f32[4,8] add(%a, %b)

Padding of uneven tiles needs no care here: padded elements are "don't care"
until a reduction or dot over that dimension masks them.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.handlers import HandlerContext, handles, handles_custom_call
from hlo_passes.passes.spmd.cost_model import ZERO, cheapest
from hlo_passes.passes.spmd.partition_context import PValue, is_manual, local_shape, tile_map, to_sharding
from hlo_passes.passes.spmd.reshard import cost


@handles(*ELEMENTWISE_UNARY, *ELEMENTWISE_BINARY, *ELEMENTWISE_TERNARY, Opcode.MAP)
def elementwise(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    if instr.array_shape.rank == 0:
        target = Sharding.replicated()
    where = _where_to_compute(p, instr, target)
    operands = []
    for i, op in enumerate(instr.operands):
        want = Sharding.replicated() if op.array_shape.rank == 0 else where
        operands.append(p.operand_as(instr, i, want))
    value = PValue(p.clone(instr, operands, local_shape(instr.shape, where)), where, instr.shape)
    return value if where == target else p.reshard(value, target)


def _where_to_compute(p: HandlerContext, instr: Instruction, target: Sharding) -> Sharding:
    """The sharding to compute `instr` in: its target, or one of its operands' shardings when
    the cost model prices computing there and resharding the result to the target as cheaper.

    A result wanted less tiled than its operands (a value returned replicated, a where feeding a
    gathered output) is cheaper computed where the operands lie and resharded once: one
    collective for the result instead of one per operand, and each device computes its tile,
    not the whole array (`x * 2 + 1` returned replicated from a sharded `x` gathered `x * 2`
    and added on the whole array on every device: 4.5× XLA's FLOPs; `where(c, a, b)` gathered
    all three operands).  XLA's partitioner computes such ops in their own sharding too.  Not for
    more bytes on the wire than the target's plan."""
    if instr.array_shape.rank == 0 or instr.opcode is Opcode.MAP:
        return target
    arrays = [op for op in instr.operands if op.array_shape.rank > 0]
    candidates = [target]
    for op in arrays:
        s = p.value(op).sharding
        if s not in candidates and not s.is_tuple and not is_manual(s) and not is_manual(target) \
                and s.kind is not ShardingKind.MAXIMAL:
            candidates.append(s)
    if len(candidates) == 1:
        return target
    model, n = p.ctx.cost_model, p.n
    shape = instr.array_shape
    priced = []
    for cand in candidates:
        c = ZERO
        for op in arrays:
            c += p.move_cost(op, cand)
        local = local_shape(shape, cand)
        c += model.compute(local.element_count, local.byte_size() * (len(arrays) + 1), shape.element_type)
        c += cost(cand, target, shape, n, model)
        priced.append((cand, c))
    # Never for more bytes on the wire than computing in the target (a convert to a wider type
    # computed before its gather would move the wider elements): only the FLOPs and the
    # collectives an operand's sharding saves are worth taking.
    in_target = priced[0][1]
    chosen = cheapest([(cand, c) for cand, c in priced if c.bytes <= in_target.bytes])
    assert chosen is not None  # (the target is a candidate)
    return chosen[0]


@handles(Opcode.BITCAST_CONVERT)
def bitcast_convert(p: HandlerContext, instr: Instruction) -> PValue:
    """Elementwise, unless the element width changes: then the result has one minor dim more
    (narrower type) or less (wider type).  The dims both shapes share keep the target's tiling;
    the minor one is computed whole on every device (its elements are one element's bytes)."""
    operand = instr.operands[0]
    if operand.array_shape.rank == instr.array_shape.rank:
        return elementwise(p, instr)
    shared = min(operand.array_shape.rank, instr.array_shape.rank)
    target = p.target(instr)
    tm = tile_map(target, instr.array_shape.rank, p.n)
    out_tm = tm.keep_dims(list(range(shared)))
    op_tm = out_tm.remap(operand.array_shape.rank, {d: d for d in range(shared)})
    x = p.operand_as(instr, 0, to_sharding(op_tm))
    out = to_sharding(out_tm)
    return p.reshard(PValue(p.clone(instr, [x], local_shape(instr.shape, out)), out, instr.shape), target)


@handles(Opcode.CONSTANT)
def constant(p: HandlerContext, instr: Instruction) -> PValue:
    full = PValue(p.clone(instr, [], instr.shape), Sharding.replicated(), instr.shape)
    return p.reshard(full, p.target(instr)) if instr.shape.is_array else full


@handles(Opcode.IOTA)
def iota(p: HandlerContext, instr: Instruction) -> PValue:
    """A local iota plus this device's offset along the iota dimension."""
    target = p.target(instr)
    shape = local_shape(instr.array_shape, target)
    dim: int = instr.attr("iota_dimension")
    tm = tile_map(target, instr.array_shape.rank, p.n)
    if tm.dims[dim] == 1:
        return PValue(p.clone(instr, [], shape), target, instr.shape)
    # the offset is added along the iota dim only, then broadcast: one add per row, not per element
    em, b = p.em, p.em.b()
    size = shape.dims[dim]
    etype = instr.array_shape.element_type
    rows = shape.with_dims((size,))
    line = b.iota(rows, 0)
    offset = em.device_scalar(tm.coords[:, dim] * size)
    if etype is not PrimitiveType.S32:
        offset = b.convert(offset, etype)
    line = b.add(line, b.broadcast(offset, rows))
    x = b.broadcast(line, shape, [dim]) if shape.rank > 1 else line
    return PValue(x, target, instr.shape)


@handles(Opcode.GET_DIMENSION_SIZE)
def get_dimension_size(p: HandlerContext, instr: Instruction) -> PValue:
    """The size of a static dim is the global one, whatever the operand's tiling: a constant on
    every device, the operand never read (XLA's partitioner answers the same).  A bounded dynamic
    dim's size is only known at run time, from the whole operand: replicated."""
    dim: int = instr.attr("dimensions")[0]
    operand = instr.operands[0].array_shape
    if operand.dynamic and operand.dynamic[dim]:
        from hlo_passes.passes.spmd.handlers.fallback import replicate  # (it imports this module)

        return replicate(p, instr, "get-dimension-size of a dynamic dimension")
    size = p.em.constant(operand.dims[dim], instr.array_shape.element_type)
    return PValue(size, Sharding.replicated(), instr.shape)


@handles(Opcode.RNG)
def rng(p: HandlerContext, instr: Instruction) -> PValue:
    """XLA's HandleRng: each device draws only what it holds, its tile, from the replicated
    distribution parameters (the numbers differ from an unpartitioned draw, as any two rng draws
    do: XLA gives rng no fixed stream).  Devices that hold the same tile (replicated or partially
    replicated shardings, maximal ones read as replicated) must hold the same numbers: the first
    of each such group draws and an all-reduce (add over zeros from the others) hands its tile to
    the rest, as XLA does for a replicated rng."""
    target = p.target(instr)
    tm = tile_map(target, instr.array_shape.rank, p.n)
    params = [p.operand_as(instr, i, Sharding.replicated()) for i in range(len(instr.operands))]
    shape = local_shape(instr.array_shape, target)
    drawn = p.clone(instr, params, shape)
    holders = np.concatenate([tm.coords, tm.manual[:, None]], axis=1)
    _, same_tile = np.unique(holders, axis=0, return_inverse=True)
    same_tile = same_tile.reshape(-1)
    if len(np.unique(same_tile)) == p.n:  # every device its own tile: nothing to share
        return PValue(drawn, target, instr.shape)
    groups = [np.flatnonzero(same_tile == k).tolist() for k in np.unique(same_tile)]
    first = np.zeros(p.n, np.int64)
    first[[g[0] for g in groups]] = 1
    em, b = p.em, p.em.b()
    etype = instr.array_shape.element_type
    draws = b.compare(em.device_scalar(first), b.constant(0), "NE")
    zeros = em.broadcast_scalar(0, etype, tuple(shape.dims))
    mine = b.select(b.broadcast(draws, shape.with_element_type(PrimitiveType.PRED)), drawn, zeros)
    return PValue(em.all_reduce(mine, groups, Opcode.ADD), target, instr.shape)


# Custom-calls that change where a value lives (host offloading) or only annotate it, not its
# values: each device moves its own tile (XLA's partitioner passes them through the same way).
PASSTHROUGH_CUSTOM_CALLS = ("MoveToHost", "MoveToDevice", "annotate_device_placement", "PinToDevice",
                            "InspectSharding")


@handles_custom_call(*PASSTHROUGH_CUSTOM_CALLS)
def passthrough_custom_call(p: HandlerContext, instr: Instruction) -> PValue:
    if len(instr.operands) != 1 or instr.shape.is_tuple or instr.operands[0].shape != instr.shape:
        from hlo_passes.passes.spmd.handlers.fallback import replicate

        return replicate(p, instr, f"{instr.custom_call_target} of a shape it changes")
    return elementwise(p, instr)
