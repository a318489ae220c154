"""reduce: a local reduce, then an all-reduce over the devices that hold the other tiles of
the reduced dimensions.

    %r = f32[8] reduce(f32[16,8] %a, %zero), dimensions={0}   (%a: {devices=[4,1]<=[4]})
  becomes
    %l = f32[8] reduce(f32[4,8] %a, %zero), dimensions={0}
    %r = f32[8] all-reduce(%l), replica_groups={{0,1,2,3}}, use_global_device_ids=true

Padding of uneven tiles is replaced by the reducer's identity first.  Reducers
that are not a single known binary op (variadic argmax-style reduces) reduce in two stages,
as XLA's partitioner does: each device reduces its tile, the G partial results of each group
(the devices holding the other tiles of the reduced dims) are all-gathered along a new
trailing dim of size G, and that dim is reduced again with the same reducer (padding of uneven
tiles takes the init value first).  Each device sends G partial results, not its tile.

    %r = (f32[20], s32[20]) reduce(f32[20,36] %v {devices=[2,4]}, s32[20,36] %i, ...), dimensions={1}
  becomes
    %l = (f32[10], s32[10]) reduce(f32[10,9] %v, s32[10,9] %i, ...), dimensions={1}
    %g = f32[10,4] all-gather(f32[10,1] reshape(gte(%l, 0))), dimensions={1}  (and the s32)
    %r = (f32[10], s32[10]) reduce(%g, %g.1, ...), dimensions={1}
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.ir.shape import TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.cost_model import Estimate
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.passes.spmd.partition_context import (PValue, groups_varying, is_manual, local_shape,
                                                       reducer_opcode, tile_map, to_sharding)
from hlo_passes.passes.spmd.reshard import cost
from hlo_passes.passes.spmd.tile_map import TileMap


@handles(Opcode.REDUCE)
def reduce(p: HandlerContext, instr: Instruction) -> PValue:
    target = p.target(instr)
    reduced = list(instr.dimensions)
    operand = instr.operands[0]
    rank = operand.array_shape.rank
    kept = [d for d in range(rank) if d not in reduced]
    op_value = p.value(operand)
    opcode = reducer_opcode(instr.called_computation("to_apply"))
    num_inputs = len(instr.operands) // 2
    op_tm = tile_map(op_value.sharding, rank, p.n) if not op_value.sharding.is_tuple else None
    partial = (num_inputs == 1 and opcode is not None and op_tm is not None
               and any(op_tm.dims[d] > 1 for d in reduced))
    em = p.em
    if partial:
        assert op_tm is not None and opcode is not None  # (what `partial` says)
        x = em.mask_padding(op_value.instr, op_tm, tuple(operand.array_shape.dims), reduced,
                            Reduction(opcode, operand.array_shape.element_type).identity)
        init = p.operand_as(instr, 1, Sharding.replicated())
        out_tm = op_tm.remap(len(kept), {i: d for i, d in enumerate(kept)})
        local = p.clone(instr, [x, init], local_shape(instr.shape, to_sharding(out_tm)))
        summed = em.all_reduce(local, groups_varying(op_tm, reduced), opcode)
        return p.reshard(PValue(summed, to_sharding(out_tm), instr.shape), target)
    if op_tm is not None and any(op_tm.dims[d] > 1 for d in reduced):
        return _two_stage(p, instr, op_tm, reduced, kept, num_inputs)
    # Reduced dims untiled: each device reduces whole rows of the result tiles it holds.
    first_target = target.element(0) if target.is_tuple else target
    out_rank = len(kept)
    tm = tile_map(first_target, out_rank, p.n)
    s_in = to_sharding(tm.remap(rank, {d: i for i, d in enumerate(kept)}))
    s_out = to_sharding(tm)
    if op_tm is not None and not is_manual(op_value.sharding):
        # Or reduce where the first input lies and move the (smaller) result: the target's
        # tiling in another device order would otherwise permute the whole input.
        own_in = to_sharding(op_tm)
        own_out = to_sharding(op_tm.remap(out_rank, {i: d for i, d in enumerate(kept)}))
        model, n = p.ctx.cost_model, p.n
        inputs = [(p.operand(instr, i).sharding, instr.operands[i].shape) for i in range(num_inputs)]
        outputs = instr.shape.elements if isinstance(instr.shape, TupleShape) else (instr.shape,)

        def inputs_to(dst: Sharding) -> Estimate:
            return sum((cost(s, dst, shape, n, model) for s, shape in inputs), Estimate())

        in_place = inputs_to(own_in) + sum((cost(own_out, first_target, shape, n, model) for shape in outputs),
                                           Estimate())
        if in_place < inputs_to(s_in):
            s_in, s_out = own_in, own_out
    operands = [p.operand_as(instr, i, s_in) for i in range(num_inputs)]
    operands += [p.operand_as(instr, i, Sharding.replicated()) for i in range(num_inputs, 2 * num_inputs)]
    out = Sharding.tuple_of([s_out] * num_inputs) if instr.shape.is_tuple else s_out
    new = p.clone(instr, operands, local_shape(instr.shape, out))
    return p.reshard(PValue(new, out, instr.shape), target)


def _two_stage(p: HandlerContext, instr: Instruction, op_tm: TileMap, reduced: list[int], kept: list[int],
               num_inputs: int) -> PValue:
    """A reduce over tiled dims with any reducer: local reduce of every input at the first
    input's tiling, all-gather of the partial results of each group along a new trailing dim,
    and a second reduce of that dim (see the module docstring)."""
    em, b = p.em, p.em.b()
    operand = instr.operands[0]
    dims = tuple(operand.array_shape.dims)
    tiled = [d for d in reduced if op_tm.dims[d] > 1]
    s_in = to_sharding(op_tm)
    inits = [p.operand_as(instr, num_inputs + i, Sharding.replicated()) for i in range(num_inputs)]
    mask = em.valid_mask(op_tm, dims, tiled)
    xs = []
    for i in range(num_inputs):
        x = p.operand_as(instr, i, s_in)
        if mask is not None:
            x = b.select(mask, x, b.broadcast(inits[i], x.array_shape))
        xs.append(x)
    out_tm = op_tm.remap(len(kept), {i: d for i, d in enumerate(kept)})
    s_out = to_sharding(out_tm)
    out = Sharding.tuple_of([s_out] * num_inputs) if instr.shape.is_tuple else s_out
    local = p.clone(instr, xs + inits, local_shape(instr.shape, out))
    groups = groups_varying(op_tm, tiled)
    parts = []
    for k in range(num_inputs):
        r = b.get_tuple_element(local, k) if instr.shape.is_tuple else local
        shape = r.array_shape
        r1 = b.reshape(r, shape.with_dims(tuple(shape.dims) + (1,)))
        parts.append(em.all_gather(r1, len(shape.dims), groups))
    final_shape = local.shape
    final = b.op(Opcode.REDUCE, final_shape, parts + inits, dimensions=(len(kept),),
                 called={"to_apply": instr.called_computation("to_apply")})
    return p.reshard(PValue(final, out, instr.shape), p.target(instr))
