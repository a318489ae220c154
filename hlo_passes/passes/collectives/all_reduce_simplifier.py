"""all-reduce-simplifier: collectives that need no communication.

* An all-reduce, all-gather or reduce-scatter whose every group holds one device returns its
  operand (a variadic one, the tuple of its operands):

      r = f32[8] all-reduce(x), replica_groups={{0},{1},{2},{3}}, to_apply=add   →  uses of r use x

* An all-reduce of a value that every device of each of its groups already holds alike is that
  value for max/min/and/or, and the value times the group size for a sum:

      c = f32[8] broadcast(constant(2)); r = all-reduce(c) over 4 devices, add  →  multiply(c, 4)
      s = f32[8] all-reduce(g), replica_groups={{0,1,2,3}}; r = all-reduce(s), same groups, add
                                                                             →  multiply(s, 4)

  "Alike" is `collectives.replication` (XLA's HloReplicationAnalysis, per group): constants
  and iotas, results of collectives whose groups contain ours, parameters the module declares
  replicated over the group (a replicated or group-uniform `sharding=`, or
  `parameter_replication` when the devices are replicas), device-id arithmetic that evaluates
  alike within each group, and deterministic ops of such values.  JAX's `pmean` of a value an
  earlier collective reduced is the common case.

XLA's all-reduce-simplifier does both.
"""

from __future__ import annotations

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.collective_groups import participant_groups
from hlo_passes.ir.reduction import Reduction
from hlo_passes.passes.collectives.replication import Groups, Replication, device_groups
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass

_SIMPLIFIED = (Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER)
_IDEMPOTENT = frozenset({Opcode.MAXIMUM, Opcode.MINIMUM, Opcode.AND, Opcode.OR})


class ReplicatedAllReduces:
    """Folds all-reduces of values their groups already share, one replication analysis per
    distinct set of groups (its answers are memoized per instruction)."""

    def __init__(self, module: Module):
        self.module = module
        self._analyses: dict[Groups, Replication] = {}

    def fold(self, ar: Instruction, *, sums_only: bool = False) -> Instruction | None:
        """Replace `ar` (in its computation) by what it computes without communication, when
        its operand is alike within each of its groups; returns the replacement, or None."""
        if (ar.opcode is not Opcode.ALL_REDUCE or not ar.shape.is_array or len(ar.operands) != 1
                or ar.control_predecessors or ar.control_successors):
            return None
        kind = Reduction.of_instruction(ar)
        groups = device_groups(ar, self.module)
        if kind is None or not groups or len({len(g) for g in groups}) != 1:
            return None
        if kind.opcode is not Opcode.ADD and (sums_only or kind.opcode not in _IDEMPOTENT):
            return None
        if kind.opcode is Opcode.ADD and ar.shape.element_type.value == "pred":
            return None
        replicated = self._analyses.get(groups)
        if replicated is None:
            replicated = self._analyses[groups] = Replication(self.module, groups)
        x = ar.operands[0]
        if not replicated(x):
            return None
        comp = ar.parent
        assert comp is not None
        if kind.opcode in _IDEMPOTENT:
            replacement = x
            ar.replace_all_uses_with(x)
            comp.remove(ar)
            return replacement
        b = Builder(comp, before=ar, metadata=ar.attributes.get("metadata"))
        n = b.constant(len(groups[0]), ar.shape.element_type)
        replacement = b.multiply(x, b.broadcast(n, x.shape.without_layout(), ()))
        replacement.shape = ar.shape  # keeps the all-reduce's layout
        comp.replace(ar, replacement)
        return replacement


@register_pass
class AllReduceSimplifier(ModulePass):
    name = "all-reduce-simplifier"
    summary = "Drop collectives over one-device groups; fold all-reduces of values every device shares"

    def run(self, module: Module) -> bool:
        changed = False
        replicated = ReplicatedAllReduces(module)
        for comp in module.computations:
            for instr in comp.post_order():
                if instr.opcode in _SIMPLIFIED and not instr.control_successors and not instr.control_predecessors:
                    changed |= self._simplify(module, comp, instr, replicated)
        return changed

    def _simplify(self, module: Module, comp: Computation, instr: Instruction,
                  replicated: ReplicatedAllReduces) -> bool:
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
        name = instr.name
        folded = replicated.fold(instr)
        if folded is None:
            return False
        self.remark(folded, f"{name}: all-reduce of a value every device of its groups holds alike folded",
                    "applied")
        return True
