"""dce: remove instructions whose results nobody uses, and computations nobody calls.

    a = f32[8] negate(p)                 # unused: removed
    r = f32[8] all-reduce(p), channel_id=1, ...   # unused, cross-module, not SPMD: kept
    c = () custom-call(p), custom_call_target="log", custom_call_has_side_effect=true   # kept
    ROOT t = f32[8] add(p, p)

Side effects are the IR's per-opcode traits (`Instruction.has_side_effect`: collectives,
send/recv, infeed/outfeed, rng, async ops, side-effecting custom-calls, and control flow
whose body has any of those), never guessed here, with XLA's one refinement for the
synchronous collectives (all-reduce, all-gather, all-to-all, reduce-scatter,
collective-permute): they have an effect only with `constrain_layout=true`, or with a
channel id in a module that is not SPMD-partitioned, where each device may run another
program and a collective one of them dropped would leave the others waiting.  In an SPMD
program every device runs this same text, so every device drops the same unused collective.
XLA reads SPMD-ness from its compile options, which the text does not carry; JAX compiles
every multi-partition program SPMD, so `num_partitions > 1` is taken to mean SPMD.  With
`remove-cross-partition-collectives=true` (what XLA's partitioner cleanup runs) a dead
synchronous collective goes whatever its channel, and so does a dead while loop whose body's
only effects are such collectives; `constrain_layout` still keeps one.

Parameters, roots and instructions that are control predecessors of others stay.  XLA's pass
of the same name (HloDCE).
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass


# XLA's synchronous collectives: removable when dead unless an effect keeps them (see above).
SYNCHRONOUS_COLLECTIVES = frozenset({Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.ALL_TO_ALL, Opcode.REDUCE_SCATTER,
                                     Opcode.COLLECTIVE_PERMUTE})
CONTROL_FLOW = frozenset({Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL, Opcode.FUSION})


def is_dead(instr: Instruction, *, spmd: bool = False, drop_collectives: bool = False) -> bool:
    """Unused, not a parameter, root or control predecessor, and no effect keeps it."""
    return (not instr.users and not instr.is_root and instr.opcode is not Opcode.PARAMETER
            and not instr.control_successors and not has_effect(instr, spmd=spmd, drop_collectives=drop_collectives))


def has_effect(instr: Instruction, *, spmd: bool, drop_collectives: bool = False) -> bool:
    """XLA's HasSideEffect as HloDCE reads it (module docstring): `spmd` whether every device
    runs this module; `drop_collectives` HloDCE's remove_cross_partition_collective_ops, which
    reaches into while bodies only, as XLA's does."""
    op = instr.opcode
    if op in SYNCHRONOUS_COLLECTIVES:
        if instr.constrain_layout:
            return True
        if drop_collectives and op is not Opcode.COLLECTIVE_PERMUTE:
            return False
        return instr.channel_id is not None and not spmd
    if op in CONTROL_FLOW:
        inner = drop_collectives and op is Opcode.WHILE
        return any(has_effect(i, spmd=spmd, drop_collectives=inner)
                   for c in instr.called_computations() for i in c.instructions)
    return instr.has_side_effect


@register_pass
class DeadCodeElimination(ModulePass):
    name = "dce"
    summary = "Remove unused instructions without side effects, and computations nobody calls"

    @dataclass(frozen=True)
    class Options:
        remove_dead_computations: bool = option(True, "also drop computations nobody calls")
        remove_cross_partition_collectives: bool = option(
            False, "also drop dead collectives that carry a channel id in a module that is not SPMD "
                   "(XLA's remove_cross_partition_collective_ops; its partitioner's cleanup sets it)")

    def run(self, module: Module) -> bool:
        removed = 0
        spmd = module.num_partitions > 1
        for comp in module.computations:
            removed += self._sweep(comp, spmd, self.options.remove_cross_partition_collectives)
        dropped = self._drop_unreachable(module) if self.options.remove_dead_computations else []
        if removed or dropped:
            parts = [f"removed {removed} instruction{'s' if removed != 1 else ''}"] if removed else []
            if dropped:
                parts.append(f"dropped computation{'s' if len(dropped) != 1 else ''} nobody calls: "
                             f"{', '.join(dropped)}")
            self.remark(None, "; ".join(parts), kind="applied")
        return bool(removed or dropped)

    @staticmethod
    def _sweep(comp: Computation, spmd: bool, drop_collectives: bool) -> int:
        """Users before operands, so a chain of dead instructions goes in one sweep."""
        removed = 0
        for instr in reversed(comp.post_order()):
            if is_dead(instr, spmd=spmd, drop_collectives=drop_collectives):
                comp.remove(instr)
                removed += 1
        return removed

    @staticmethod
    def _drop_unreachable(module: Module) -> list[str]:
        return [comp.name for comp in module.remove_unreachable_computations()]
