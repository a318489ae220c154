"""reduce: a local reduce, then an all-reduce over the devices that hold the other tiles of
the reduced dimensions.

    %r = f32[8] reduce(f32[16,8] %a, %zero), dimensions={0}   (%a: {devices=[4,1]<=[4]})
  becomes
    %l = f32[8] reduce(f32[4,8] %a, %zero), dimensions={0}
    %r = f32[8] all-reduce(%l), replica_groups={{0,1,2,3}}, use_global_device_ids=true

Padding of uneven tiles is replaced by the reducer's identity first.  Reducers
that are not a single known binary op (variadic argmax-style reduces) instead
gather the reduced dimensions and reduce locally.
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.handlers import HandlerContext, handles
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.spmd.partition_context import (PValue, groups_varying, local_shape,
                                                       reducer_opcode, tile_map, to_sharding)


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
    # Reduced dims untiled: each device reduces whole rows of the result tiles it holds.
    first_target = target.element(0) if target.is_tuple else target
    out_rank = len(kept)
    tm = tile_map(first_target, out_rank, p.n)
    s_in = to_sharding(tm.remap(rank, {d: i for i, d in enumerate(kept)}))
    s_out = to_sharding(tm)
    operands = [p.operand_as(instr, i, s_in) for i in range(num_inputs)]
    operands += [p.operand_as(instr, i, Sharding.replicated()) for i in range(num_inputs, 2 * num_inputs)]
    out = Sharding.tuple_of([s_out] * num_inputs) if instr.shape.is_tuple else s_out
    new = p.clone(instr, operands, local_shape(instr.shape, out))
    return p.reshard(PValue(new, out, instr.shape), target)
