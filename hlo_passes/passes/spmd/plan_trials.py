"""Whole-program trials where propagation resolves a conflict by rule and the cost depends on
everything downstream: the partitioner runs each plan to the end and keeps the cheaper.

The conflict this handles is an embedding lookup (a gather) whose table is sharded along the
features it slices whole and whose ids are sharded along the batch over the same devices.
The lookup's result can follow the ids (batch-sharded activations: each matmul against a
feature-sharded weight either gathers the weight or moves the activation to the features and
reduce-scatters its partial sums back to the batch) or the table (feature-sharded
activations: every matmul contracts over sharded features and all-reduces its partial sums,
the weights never move, and what lies between the matmuls runs whole on every device).
GSPMD's propagation takes the ids' sharding first, always; Shardy's lets the larger tensor
win, always.  One instruction's choice decides every later layer's plan, so no
per-instruction price can see which is cheaper; the estimate of the whole partitioned program
can.  Where the lookup feeds matmuls whose weights outweigh the activations (few tokens, wide
layers), the table's plan wins clearly.  On a Flax GPT step with FSDP (504 tokens) the ids'
plan is kept at d=256, 1024 and 4096.  The table's plan saves collectives (38-40 against
53-77) and is the faster by exposed time (0.554 against 0.701 ms at d=1024; it is XLA's Shardy
plan, 0.550), but it runs the norms and attention whole on every device (8% more FLOPs) and
wins by latency alone: the trade `cost_model.cheapest` refuses for every decision, since
taken by exposed time the same trial wins at d=64 too, with 1.9x the FLOPs of XLA's GSPMD plan.

So, before propagation (only when the module has a gather whose result no user annotated
and whose table is annotated tiled along a dim the gather slices whole),
the module is kept as a snapshot; after the default plan is partitioned and estimated, each
conflicting lookup (at most `MAX_TRIALS`, the first found) is tried the other
way: the snapshot is rebuilt, the lookup's result annotated with the table's sharding,
propagated, partitioned and estimated, and the program `cheapest` takes is kept (a trial must
also win by `MARGIN` of exposed time, latency included).  A remark says which
and by how much.  Every plan is a correct program: the trial changes cost, never meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.cost_model import CostModel, Estimate, cheapest, module_estimate
from hlo_passes.passes.spmd.propagation_gather import passthrough_sharding

if TYPE_CHECKING:
    from hlo_passes.ir.snapshot import ModuleSnapshot
    from hlo_passes.passes.pass_base import ModulePass, Remark

# Each trial partitions the whole module again; two cover the lookups a model has (tokens and
# positions) without letting a module of many gathers multiply the pass's time.
MAX_TRIALS = 2

# A trial must win by more than the estimate's noise to replace the default plan.
MARGIN = 0.005


@dataclass(frozen=True)
class Alternative:
    """A lookup whose result could take `sharding` (its table's) instead of the one it got."""

    gather: str
    sharding: Sharding


def lookups_worth_a_trial(module: Module) -> bool:
    """Is there a gather whose result the user left to propagation and whose table carries a
    sharding that tiles a dim the gather slices whole (worth a snapshot: only such a lookup can
    conflict with its ids)?  The table is followed back through copies, converts and the
    parameters of called computations (JAX looks up in a `_take` call) to its annotation.
    A module whose tables are replicated or sharded along the vocabulary (a Megatron step)
    keeps no snapshot."""
    callers: dict[Computation, list[Instruction]] | None = None
    for instr in module.all_instructions():
        if instr.opcode is not Opcode.GATHER or "sharding" in instr.attributes:
            continue
        if callers is None:
            callers = _call_sites(module)
        table = _annotated_source(instr.operands[0], callers)
        if table is not None and table.sharding is not None and not table.sharding.is_tuple \
                and not table.sharding.is_manual and passthrough_sharding(instr, table.sharding) is not None:
            return True
    return False


def _call_sites(module: Module) -> dict[Computation, list[Instruction]]:
    sites: dict[Computation, list[Instruction]] = {}
    for instr in module.all_instructions():
        if instr.opcode is Opcode.CALL:
            for callee in instr.called_computations():
                sites.setdefault(callee, []).append(instr)
    return sites


def _annotated_source(value: Instruction, callers: dict[Computation, list[Instruction]],
                      depth: int = 8) -> Instruction | None:
    """The annotated instruction of `value`'s shape that `value` copies (None if none found)."""
    while depth > 0:
        depth -= 1
        if "sharding" in value.attributes:
            return value
        if value.opcode in (Opcode.COPY, Opcode.CONVERT) or (
                value.opcode is Opcode.BITCAST and value.operands[0].shape == value.shape):
            value = value.operands[0]
            continue
        if value.opcode is Opcode.PARAMETER and value.parameter_number is not None:
            sites = callers.get(value.parent) if value.parent is not None else None
            if not sites:
                return None
            value = sites[0].operands[value.parameter_number]
            continue
        return None
    return None


def alternatives(module: Module, annotated: set[str]) -> list[Alternative]:
    """The gathers (the first `MAX_TRIALS`) whose propagated result does not keep the tiling
    their operand's sharding would pass through to it."""
    found: list[Alternative] = []
    for instr in module.all_instructions():
        if instr.opcode is not Opcode.GATHER or instr.name in annotated:
            continue
        operand = instr.operands[0].sharding
        result = instr.sharding
        if operand is None or result is None or operand.is_manual or result.is_manual or result.is_tuple:
            continue
        passed = passthrough_sharding(instr, operand)
        if passed is None or passed.is_manual or _keeps_tiling(result, passed):
            continue
        if len(found) >= MAX_TRIALS:
            break
        found.append(Alternative(instr.name, passed))
    return found


def annotated_gathers(module: Module) -> set[str]:
    return {instr.name for instr in module.all_instructions()
            if instr.opcode is Opcode.GATHER and "sharding" in instr.attributes}


def _keeps_tiling(result: Sharding, passed: Sharding) -> bool:
    """Does `result` tile every dim `passed` tiles, as many ways?"""
    if not result.is_tiled:
        return False
    have, want = result.data_tile_dims, passed.data_tile_dims
    return all(w == 1 or h == w for h, w in zip(have, want))


def try_alternatives(module: Module, before: "ModuleSnapshot", found: list[Alternative], model: CostModel,
                     plan: Callable[[Module], None], owner: "ModulePass", mark: int) -> None:
    """`module` is the default plan, partitioned.  Rebuild `before` once per alternative, plan it
    that way (`plan`: propagation, partitioning, cleanup), and keep whichever is cheapest.  The
    remarks `owner` made from `mark` on are the default plan's: a kept trial's replace them."""
    best = module_estimate(module, model)
    default = best
    chosen: tuple[Alternative, Module] | None = None
    chosen_remarks: list["Remark"] = []
    for k, alt in enumerate(found):
        trial = Module(module.name)
        trial.restore(before)  # a snapshot builds once: the next trial's is taken again from this one
        if k < len(found) - 1:
            before = trial.snapshot()
        gather = _find(trial, alt.gather)
        if gather is None:
            trial.discard()
            continue
        gather.sharding = alt.sharding
        start = len(owner.remarks)
        plan(trial)
        remarks = owner.remarks[start:]
        del owner.remarks[start:]
        estimate = module_estimate(trial, model)
        winner = cheapest([(False, best), (True, estimate)])
        if winner is not None and winner[0] and _exposed(estimate) < _exposed(best) * (1 - MARGIN):
            if chosen is not None:
                chosen[1].discard()
            best, chosen, chosen_remarks = estimate, (alt, trial), remarks
        else:
            owner.remark(None, f"{alt.gather}: following its table's sharding {alt.sharding.to_hlo()} was tried "
                               f"and kept out ({_describe(estimate)} against {_describe(best)})", "note")
            trial.discard()
    if chosen is None:
        return
    alt, trial = chosen
    owner.remarks[mark:] = chosen_remarks
    owner.remark(None, f"{alt.gather}: its result follows its table's sharding {alt.sharding.to_hlo()} rather than "
                       f"its ids' ({_describe(best)} against {_describe(default)}): the activations after it keep "
                       "the table's tiling", "applied")
    old = module.computations
    module.__dict__.update(trial.__dict__)
    for comp in module.computations:
        comp.module = module
    for comp in old:
        comp.discard()


def _exposed(estimate: Estimate) -> float:
    """Compute plus the communication and latency the profile's overlap leaves exposed."""
    return estimate.seconds + estimate.latency_seconds


def _describe(estimate: Estimate) -> str:
    return f"{_exposed(estimate) * 1e3:.3f} ms exposed, {estimate.collectives} collectives"


def _find(module: Module, name: str) -> Instruction | None:
    for instr in module.all_instructions():
        if instr.name == name:
            return instr
    return None


__all__ = ["Alternative", "MAX_TRIALS", "alternatives", "annotated_gathers", "try_alternatives",
           "lookups_worth_a_trial"]
