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

from bisect import bisect_right, insort
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
            order = comp.instructions
            walk = _Split(comp, order)
            for instr in order:
                if wanted.get(instr.opcode) and self._eligible(instr):
                    self._split(walk, instr)
                    changed = True
        return changed

    @staticmethod
    def _eligible(instr: Instruction) -> bool:
        if instr.opcode is Opcode.ALL_GATHER:
            return instr.shape.is_array and len(instr.operands) == 1
        if instr.opcode is Opcode.COLLECTIVE_PERMUTE:
            return instr.shape.is_array and len(instr.operands) == 1
        return True

    def _split(self, walk: "_Split", instr: Instruction) -> None:
        comp = walk.comp
        start_op, done_op = _PAIRS[instr.opcode]
        if instr.opcode is Opcode.ALL_REDUCE:
            start_shape = instr.shape
        elif instr.opcode is Opcode.ALL_GATHER:
            start_shape = TupleShape((instr.operands[0].shape, instr.shape))
        else:
            start_shape = TupleShape((instr.operands[0].shape, instr.shape, _U32, _U32))
        first_user = min(instr.users, key=walk.position.__getitem__) if instr.users else None
        start = Builder(comp, before=instr).op(start_op, start_shape, instr.operands,
                                               name=f"{instr.name}-start", called=dict(instr.called))
        start.attributes.update(instr.attributes)
        walk.position[start] = walk.position[instr] - 0.5  # it was put right before instr
        done = Builder(comp, before=first_user).op(done_op, instr.shape, [start], name=f"{instr.name}-done")
        instr.move_control_predecessors_to(start)
        instr.move_control_successors_to(done)
        instr.replace_all_uses_with(done)
        comp.remove(instr)
        between = walk.between(instr, first_user) if first_user is not None else 0
        self.remark(start, f"{instr.opcode.value} split; {max(between, 0)} instructions between start and done",
                    "applied")


class _Split:
    """One computation's split walk: positions in the instruction order as it was before the
    walk, taken once (reading the order again per collective made the pass quadratic), each
    start's position (just before its collective's), and where the dones of earlier splits
    went.  Collectives are split in that order, so between a collective and its first user lie
    exactly the instructions that were there before the walk (earlier splits removed only
    earlier collectives, and put their starts before those) and the dones that earlier splits
    put before an instruction of that range or before the user.  (A user can be an earlier
    start: the order need not be topological, the combiners put a merged collective before the
    last member in post order.)"""

    def __init__(self, comp: Computation, order: list[Instruction]):
        self.comp = comp
        self.position: dict[Instruction, float] = {x: i for i, x in enumerate(order)}
        self.done_before: list[float] = []  # positions the dones were put before, sorted

    def between(self, instr: Instruction, first_user: Instruction) -> int:
        """How many instructions lie between `instr` and `first_user` (where its start and its
        done go); records that a done goes before `first_user`."""
        lo, hi = self.position[instr], self.position[first_user]
        dones = bisect_right(self.done_before, hi) - bisect_right(self.done_before, lo)
        insort(self.done_before, hi)
        return hi - lo - 1 + dones
