"""Does a rewrite pay?  Priced with the partitioner's cost model (`spmd.cost_model`).

The pass rewrites each component on a copy of the module first and prices both sides with the
same per-instruction estimate `module_estimate` adds up (compute bound by FLOPs or the bytes an
op touches, communication by the wire volume of each collective on a ring):

    without  the gradient all-reduces + the update on whole tensors (+ what only it read)
    with     the reduce-scatters, the update on chunks, the formatting (reshape, pad, slice),
             the scalar all-reduces of whole-tensor reductions, the all-gathers of new weights
             and of optimizer state the signature returns whole

On a wire, a reduce-scatter plus an all-gather of the same buffer is one all-reduce, so with the
optimizer state kept sharded the rewrite moves the same bytes and saves (N-1)/N of the update.
When the signature returns replicated state (an Adam step under `jax.jit` returns both moments
whole), each state tensor costs one more all-gather: it pays only when the update it shards
costs more than those gathers.  `Estimate`'s order decides (exposed seconds; on a tie fewer
collectives, then fewer bytes); a declined component gets a remark with both estimates.

Memory: a rewrite never holds more per device than the step it replaces (the update's inputs
and outputs whole, as before, plus chunks), and with kept state it holds 1/N of the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.cost_model import ZERO, CostModel, Estimate, instruction_estimate

_BODIES = (Opcode.FUSION, Opcode.CALL, Opcode.WHILE, Opcode.CONDITIONAL, Opcode.ASYNC_START)


def pricer(module: Module, model: CostModel) -> Callable[[Instruction], Estimate]:
    """An instruction's estimate, with the bodies it calls (as `module_estimate` counts them)."""
    bodies: dict[Computation, Estimate] = {}

    def body(comp: Computation) -> Estimate:
        known = bodies.get(comp)
        if known is None:
            bodies[comp] = ZERO  # a recursive call counts once
            known = ZERO
            for instr in comp.instructions:
                known = known + price(instr)
            bodies[comp] = known
        return known

    def price(instr: Instruction) -> Estimate:
        total = instruction_estimate(instr, module, model)
        if instr.opcode in _BODIES:
            for callee in instr.called_computations():
                total = total + body(callee)
        return total

    return price


@dataclass(frozen=True)
class Price:
    without: Estimate
    with_rewrite: Estimate

    @property
    def pays(self) -> bool:
        return not self.without < self.with_rewrite

    def describe(self, profile: str) -> str:
        return (f"with the rewrite {self.with_rewrite.describe()}; without {self.without.describe()} "
                f"({profile} profile)")
