"""dce: remove instructions whose results nobody uses, and computations nobody calls.

    a = f32[8] negate(p)                 # unused: removed
    r = f32[8] all-reduce(p), ...        # unused but a collective: kept
    c = () custom-call(p), custom_call_target="log", custom_call_has_side_effect=true   # kept
    ROOT t = f32[8] add(p, p)

Side effects are the IR's per-opcode traits (`Instruction.has_side_effect`: collectives,
send/recv, infeed/outfeed, rng, async ops, side-effecting custom-calls, and control flow
whose body has any of those), never guessed here.  Parameters, roots and instructions
that are control predecessors of others stay.  XLA's pass of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass


def is_dead(instr: Instruction) -> bool:
    return (not instr.users and not instr.is_root and instr.opcode is not Opcode.PARAMETER
            and not instr.control_successors and not instr.has_side_effect)


@register_pass
class DeadCodeElimination(ModulePass):
    name = "dce"
    summary = "Remove unused instructions without side effects, and computations nobody calls"

    @dataclass(frozen=True)
    class Options:
        remove_dead_computations: bool = option(True, "also drop computations nobody calls")

    def run(self, module: Module) -> bool:
        removed = 0
        for comp in module.computations:
            removed += self._sweep(comp)
        dropped = self._drop_unreachable(module) if self.options.remove_dead_computations else []
        if removed or dropped:
            parts = [f"removed {removed} instruction{'s' if removed != 1 else ''}"] if removed else []
            if dropped:
                parts.append(f"dropped computation{'s' if len(dropped) != 1 else ''} nobody calls: "
                             f"{', '.join(dropped)}")
            self.remark(None, "; ".join(parts), kind="applied")
        return bool(removed or dropped)

    @staticmethod
    def _sweep(comp: Computation) -> int:
        """Users before operands, so a chain of dead instructions goes in one sweep."""
        removed = 0
        for instr in reversed(comp.post_order()):
            if is_dead(instr):
                comp.remove(instr)
                removed += 1
        return removed

    @staticmethod
    def _drop_unreachable(module: Module) -> list[str]:
        return [comp.name for comp in module.remove_unreachable_computations()]
