"""Recompute a small value whole instead of all-gathering it.

A value wanted replicated whose per-device parts came from cheap arithmetic on values every
device already holds whole can be computed again, whole, on every device: no collective at
all.  The common case is a layer norm's statistics in a feature-sharded (FSDP) layer: the
mean and variance are reduced over the sharded features (an all-reduce leaves them whole on
every device), then sliced to the batch sharding propagation gave the small [batch, seq]
tensors, a few elementwise ops run on the slice, and the result is all-gathered again to be
broadcast across the features.  The slice-compute-gather round trip pays a collective's
latency (10 µs on the accelerator profile) to save a few hundred FLOPs; recomputing the chain
from the all-reduced value costs nanoseconds.

The decision is the cost model's: the recomputed instructions' compute time (whole shapes)
against the move's exposed time plus its exposed latency (a large chain loses to the
all-gather).  It is the one place latency alone may justify replicating work, which
`cost_model.cheapest` never lets it do: that rule guards choices whose replicated work grows
with the model (a layer multiplied whole to save a collective); this one replicates only work
smaller than the latency it saves, a budgeted chain of cheap ops.  What counts as
"already held whole" is only what costs nothing more: a value whose per-device form is
replicated, a replicated reshard some user already asked for, the replicated value a slice was
cut from (`Partitioner._wider`), constants; every other operand is recomputed in turn, within
a budget of instructions, or the plan is dropped.  Only pure, deterministic ops are recomputed
(elementwise ops, shape ops, reductions with a scalar reducer): never a collective, a partition
id, a random number, a parameter or anything inside a manual region.

XLA's partitioner has no such step: its Shardy-era propagation keeps those statistics
replicated in the first place (the larger tensor wins a factor conflict), and its GSPMD-era
propagation gathers them as this partitioner did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.cost_model import ZERO, Estimate, instruction_estimate
from hlo_passes.passes.spmd.partition_context import PValue, is_manual
from hlo_passes.passes.spmd.reshard import cost as reshard_cost

if TYPE_CHECKING:
    from hlo_passes.passes.spmd.spmd_partitioner import Partitioner

# Ops recomputed whole from whole operands: pure functions of their operands (a reduce's
# scalar reducer is called, not partitioned: the clone keeps it as it is).  Not constants: a
# constant is held whole already (the partitioner slices its tiles from the whole literal),
# and a copy of a large literal would cost nothing by the model and much in the output.
_RECOMPUTABLE = frozenset({
    Opcode.BROADCAST, Opcode.RESHAPE, Opcode.TRANSPOSE, Opcode.SLICE, Opcode.CONCATENATE, Opcode.PAD,
    Opcode.REVERSE, Opcode.REDUCE, Opcode.IOTA, Opcode.DYNAMIC_SLICE,
    Opcode.DYNAMIC_UPDATE_SLICE,
})

# How many instructions one recompute may emit: the chains this is for (normalisation
# statistics and their gradients) are a few to a few dozen ops; longer ones are real work.
BUDGET = 48


def recomputed_whole(p: "Partitioner", op: Instruction, value: PValue, sharding: Sharding) -> PValue | None:
    """`op` computed again, replicated, where its current per-device `value` would need a
    collective to become `sharding` (replicated) and recomputing costs less; else None."""
    if not sharding.is_replicated or not op.shape.is_array or is_manual(value.sharding):
        return None
    model = p.ctx.cost_model
    move = reshard_cost(value.sharding, sharding, op.shape, p.ctx.n, model)
    if move.collectives == 0:
        return None
    plan: list[Instruction] = []
    if not _plan(p, op, sharding, plan, set()):
        return None
    work = ZERO
    for instr in plan:
        work = work + instruction_estimate(instr, p.ctx.module, model)
    if not _cheaper(work, move):
        return None
    for instr in plan:
        operands = [_whole(p, o, sharding) for o in instr.operands]
        new = p.clone(instr, operands, instr.shape)
        p.remember_reshard(instr, sharding, PValue(new, sharding, instr.shape))
    return _whole_value(p, op, sharding)


def _cheaper(work: Estimate, move: Estimate) -> bool:
    return work.seconds < move.seconds + move.latency_seconds


def _held_whole(p: "Partitioner", instr: Instruction, sharding: Sharding) -> PValue | None:
    """`instr`'s replicated per-device value if one exists already (nothing to pay)."""
    value = p.values.get(instr)
    if value is None:
        return None
    known = p.known_reshard(instr, sharding)  # (a recomputed stand-in included)
    if known is not None:
        return known
    if value.stand_in:  # zeros standing for a value nobody reads: not it
        return None
    if value.sharding.is_replicated:
        return value
    wider = p.wider_of(value)
    if wider is not None and wider.sharding.is_replicated:
        return wider
    return None


def _plan(p: "Partitioner", instr: Instruction, sharding: Sharding, plan: list[Instruction],
          seen: set[Instruction]) -> bool:
    """Append to `plan` (operands first) what must be recomputed for `instr` to be whole;
    False when something it needs cannot be had without a collective or the budget runs out."""
    if instr in seen or _held_whole(p, instr, sharding) is not None:
        return True
    if not _recomputable(instr) or len(plan) >= BUDGET:
        return False
    seen.add(instr)
    for operand in instr.operands:
        if not _plan(p, operand, sharding, plan, seen):
            return False
    plan.append(instr)
    return len(plan) <= BUDGET


def _recomputable(instr: Instruction) -> bool:
    if not instr.shape.is_array or instr.has_side_effect:
        return False
    op = instr.opcode
    if op is Opcode.REDUCE:
        return len(instr.operands) == 2
    return op.is_elementwise or op in _RECOMPUTABLE


def _whole(p: "Partitioner", instr: Instruction, sharding: Sharding) -> Instruction:
    return _whole_value(p, instr, sharding).instr


def _whole_value(p: "Partitioner", instr: Instruction, sharding: Sharding) -> PValue:
    found = _held_whole(p, instr, sharding)
    assert found is not None, f"{instr.name} was planned to be held whole"
    return found


__all__ = ["recomputed_whole", "BUDGET"]
