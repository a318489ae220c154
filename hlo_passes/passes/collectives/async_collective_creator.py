"""async-collective-creator: split all-reduce, all-gather and collective-permute into
start/done pairs, with each done placed just before the first instruction that needs it.

    ar = f32[64] all-reduce(g), replica_groups={{0,1,2,3}}, to_apply=add
    h = f32[64] exponential(x)            (independent of ar)
    ROOT s = f32[64] add(ar, h)
  becomes
    ar-start = f32[64] all-reduce-start(g), replica_groups={{0,1,2,3}}, to_apply=add
    h = f32[64] exponential(x)            (overlaps the communication)
    ar-done = f32[64] all-reduce-done(ar-start)
    ROOT s = f32[64] add(ar-done, h)

Start shapes follow XLA: all-reduce-start has the result's shape; all-gather-start is
`(operand, result)`; collective-permute-start is `(operand, result, u32[], u32[])`.  Control
predecessors go to the start, control successors wait for the done.

XLA's CPU client takes modules through StableHLO, whose importer turns the start/done pairs
back into synchronous collectives: the output runs and computes the same, but the CPU backend
does not overlap it.  The pass is therefore not part of collective-fusion's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass

_PAIRS = {
    Opcode.ALL_REDUCE: (Opcode.ALL_REDUCE_START, Opcode.ALL_REDUCE_DONE),
    Opcode.ALL_GATHER: (Opcode.ALL_GATHER_START, Opcode.ALL_GATHER_DONE),
    Opcode.COLLECTIVE_PERMUTE: (Opcode.COLLECTIVE_PERMUTE_START, Opcode.COLLECTIVE_PERMUTE_DONE),
}
_U32 = ArrayShape(PrimitiveType.U32, ())


@register_pass
class AsyncCollectiveCreator(ModulePass):
    name = "async-collective-creator"
    summary = "Split collectives into start/done pairs with the done just before its first user"

    @dataclass(frozen=True)
    class Options:
        all_reduce: bool = option(True, "convert all-reduces")
        all_gather: bool = option(True, "convert all-gathers")
        collective_permute: bool = option(True, "convert collective-permutes")

    def run(self, module: Module) -> bool:
        wanted = {Opcode.ALL_REDUCE: self.options.all_reduce, Opcode.ALL_GATHER: self.options.all_gather,
                  Opcode.COLLECTIVE_PERMUTE: self.options.collective_permute}
        changed = False
        for comp in module.computations:
            for instr in comp.instructions:
                if wanted.get(instr.opcode) and self._eligible(instr):
                    self._split(comp, instr)
                    changed = True
        return changed

    @staticmethod
    def _eligible(instr: Instruction) -> bool:
        if instr.opcode is Opcode.ALL_GATHER:
            return instr.shape.is_array and len(instr.operands) == 1
        if instr.opcode is Opcode.COLLECTIVE_PERMUTE:
            return instr.shape.is_array and len(instr.operands) == 1
        return True

    def _split(self, comp: Computation, instr: Instruction) -> None:
        start_op, done_op = _PAIRS[instr.opcode]
        if instr.opcode is Opcode.ALL_REDUCE:
            start_shape = instr.shape
        elif instr.opcode is Opcode.ALL_GATHER:
            start_shape = TupleShape((instr.operands[0].shape, instr.shape))
        else:
            start_shape = TupleShape((instr.operands[0].shape, instr.shape, _U32, _U32))
        order = comp.instructions
        position = {x: i for i, x in enumerate(order)}
        first_user = min(instr.users, key=position.__getitem__) if instr.users else None
        start = Builder(comp, before=instr).op(start_op, start_shape, instr.operands,
                                               name=f"{instr.name}-start", called=dict(instr.called))
        start.attributes.update(instr.attributes)
        done = Builder(comp, before=first_user).op(done_op, instr.shape, [start], name=f"{instr.name}-done")
        for pred in instr.control_predecessors:
            start.add_control_predecessor(pred)
        for succ in list(instr.control_successors):
            succ.control_predecessors.remove(instr)
            instr.control_successors.remove(succ)
            succ.add_control_predecessor(done)
        instr.replace_all_uses_with(done)
        comp.remove(instr)
        between = (position[first_user] - position[instr] - 1) if first_user is not None else 0
        self.remark(start, f"{instr.opcode.value} split; {max(between, 0)} instructions between start and done",
                    "applied")
