"""all-reduce-simplifier: collectives that need no communication.

* An all-reduce, all-gather or reduce-scatter whose every group holds one device returns its
  operand (a variadic one, the tuple of its operands):

      r = f32[8] all-reduce(x), replica_groups={{0},{1},{2},{3}}, to_apply=add   →  uses of r use x

* An all-reduce of a value every device computes alike (built from constants and iotas only)
  is that value for max/min/and/or, and the value times the group size for a sum:

      c = f32[8] broadcast(constant(2)); r = all-reduce(c) over 4 devices, add  →  multiply(c, 4)

XLA's all-reduce-simplifier does both (the second with its replication analysis); ours
treats only constant-built values as replicated.
"""

from __future__ import annotations

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.collective_groups import participant_groups
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass

_SIMPLIFIED = (Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER)
_IDEMPOTENT = frozenset({Opcode.MAXIMUM, Opcode.MINIMUM, Opcode.AND, Opcode.OR})
_DEVICE_DEPENDENT = frozenset({Opcode.PARAMETER, Opcode.REPLICA_ID, Opcode.PARTITION_ID, Opcode.RNG,
                               Opcode.RNG_BIT_GENERATOR, Opcode.RNG_GET_AND_UPDATE_STATE})


def built_from_constants(instr: Instruction, memo: dict[Instruction, bool]) -> bool:
    """True when `instr` depends on no parameter, device id, random number or side effect."""
    stack = [instr]
    while stack:
        x = stack[-1]
        if x in memo:
            stack.pop()
            continue
        if x.opcode in _DEVICE_DEPENDENT or x.has_side_effect or x.called_computations():
            memo[x] = False
            stack.pop()
            continue
        pending = [o for o in x.operands if o not in memo]
        if pending:
            stack.extend(pending)
            continue
        memo[x] = all(memo[o] for o in x.operands)
        stack.pop()
    return memo[instr]


@register_pass
class AllReduceSimplifier(ModulePass):
    name = "all-reduce-simplifier"
    summary = "Drop collectives over one-device groups; fold all-reduces of values every device shares"

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            memo: dict[Instruction, bool] = {}
            for instr in comp.post_order():
                if instr.opcode in _SIMPLIFIED and not instr.control_successors and not instr.control_predecessors:
                    changed |= self._simplify(module, comp, instr, memo)
        return changed

    def _simplify(self, module: Module, comp: Computation, instr: Instruction, memo) -> bool:
        groups = participant_groups(instr, module)
        if groups and all(len(g) == 1 for g in groups):
            b = Builder(comp, before=instr)
            operands = list(instr.operands)
            if instr.shape.is_tuple:
                if [o.shape.dims for o in operands] != [s.dims for s in instr.shape.elements]:
                    return False
                replacement = b.tuple(operands)
            else:
                if operands[0].shape.dims != instr.shape.dims:
                    return False
                replacement = operands[0]
            instr.replace_all_uses_with(replacement)
            comp.remove(instr)
            self.remark(replacement, f"{instr.name}: {instr.opcode.value} over one-device groups removed",
                        "applied")
            return True
        if instr.opcode is not Opcode.ALL_REDUCE or not instr.shape.is_array or len(instr.operands) != 1:
            return False
        kind = Reduction.of_instruction(instr)
        sizes = {len(g) for g in groups or ()}
        if kind is None or len(sizes) != 1 or not built_from_constants(instr.operands[0], memo):
            return False
        x = instr.operands[0]
        if kind.opcode in _IDEMPOTENT:
            replacement = x
        elif kind.opcode is Opcode.ADD and instr.shape.element_type.is_array and \
                instr.shape.element_type.value != "pred":
            b = Builder(comp, before=instr, metadata=instr.attributes.get("metadata"))
            n = b.constant(sizes.pop(), instr.shape.element_type)
            replacement = b.multiply(x, b.broadcast(n, x.shape.without_layout(), ()))
        else:
            return False
        instr.replace_all_uses_with(replacement)
        comp.remove(instr)
        self.remark(replacement, f"{instr.name}: all-reduce of a value every device computes alike folded",
                    "applied")
        return True
