"""Module statistics for `--stats` and the benchmarks: instructions by opcode,
collectives by kind (count and bytes each device sends into them), and FLOPs.

FLOPs count 2·M·N·K for dots and convolutions (per output element: 2 × the
contracted size), one per output element for elementwise ops and reductions'
inputs, and nothing for data movement.  Fusion and call bodies are counted once
per call site; while bodies once.  Collectives are counted once each, or (`executed`) as many
times as one run of the entry executes them (a scanned model's loop body times its layers)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.while_loop import trip_count

_DONE = {Opcode.ALL_REDUCE_DONE, Opcode.ALL_GATHER_DONE, Opcode.COLLECTIVE_PERMUTE_DONE}


@dataclass
class ModuleStats:
    opcodes: Counter = field(default_factory=Counter)
    collective_count: Counter = field(default_factory=Counter)
    collective_bytes: Counter = field(default_factory=Counter)
    flops: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    def format(self, title: str = "") -> str:
        lines = [title] if title else []
        lines.append(f"  instructions: {self.instructions}   flops: {self.flops:,}")
        top = ", ".join(f"{op} {n}" for op, n in self.opcodes.most_common(12))
        lines.append(f"  by opcode: {top}")
        if self.collective_count:
            for kind in sorted(self.collective_count):
                n = self.collective_count[kind]
                lines.append(f"  {kind}: {n} op{'s' if n != 1 else ''}, {self.collective_bytes[kind]:,} bytes")
        else:
            lines.append("  collectives: none")
        return "\n".join(lines)


def collective_kind(instr: Instruction) -> str | None:
    """`all-reduce`, `all-gather`, ... for a collective (an async `-start` counts as its
    kind, its `-done` not at all); None for anything else."""
    if instr.opcode.is_collective and instr.opcode not in _DONE:
        return instr.opcode.value.removesuffix("-start")
    return None


def collective_bytes(instr: Instruction) -> int:
    """Bytes each device sends into a collective: the size of its operands."""
    return sum(o.shape.byte_size() for o in instr.operands)


def _flops(instr: Instruction) -> int:
    op = instr.opcode
    if op is Opcode.DOT:
        contracting = instr.dot_dimensions.lhs_contracting
        k = math.prod(instr.operands[0].shape.dims[d] for d in contracting) if contracting else 1
        return 2 * instr.shape.element_count * k
    if op is Opcode.CONVOLUTION:
        kernel = instr.operands[1].shape
        labels = instr.conv_labels
        out_feature = kernel.dims[labels.kernel_output_feature] if labels is not None else 1
        return 2 * instr.shape.element_count * max(1, kernel.element_count // max(out_feature, 1))
    if op.is_elementwise and instr.shape.is_array:
        return instr.shape.element_count
    if op in (Opcode.REDUCE, Opcode.REDUCE_WINDOW) and instr.operands[0].shape.is_array:
        return instr.operands[0].shape.element_count
    return 0


def module_stats(module: Module, *, executed: bool = False) -> ModuleStats:
    """Static counts (each instruction once), or with `executed` the collectives as a step runs
    them: a while body's times its trip count where the module says it (see ir/while_loop.py;
    once where unknown), a computation called from several places once per call."""
    stats = ModuleStats()
    runs = _executions(module) if executed else None
    for comp in module.computations:
        times = 1 if runs is None else runs.get(comp, 0)
        for instr in comp.instructions:
            stats.opcodes[instr.opcode.value] += 1
            kind = collective_kind(instr)
            if kind is not None and times:
                stats.collective_count[kind] += times
                stats.collective_bytes[kind] += times * collective_bytes(instr)
    stats.flops = _entry_flops(module.entry, set())
    return stats


def _executions(module: Module) -> dict[Computation, int]:
    """How many times each computation reachable from the entry through control flow runs in
    one execution of the entry (computations nothing executes are left out)."""
    runs: dict[Computation, int] = {}
    if module.entry is None:
        return runs
    runs[module.entry] = 1
    for comp in reversed(module.computation_post_order()):  # callers before callees
        times = runs.get(comp, 0)
        if not times:
            continue
        for instr in comp.instructions:
            if instr.opcode not in _CONTROL_FLOW:
                continue
            per_call = times
            if instr.opcode is Opcode.WHILE:
                per_call = times * (trip_count(instr) or 1)
            for callee in instr.called_computations():
                runs[callee] = runs.get(callee, 0) + per_call
    return runs


_CONTROL_FLOW = (Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL, Opcode.ASYNC_START)


def _entry_flops(comp, stack: set, done: dict | None = None) -> int:
    """FLOPs of one run of `comp`, its called computations counted once per call (each
    computation's total is computed once: a body reached along many paths of calls, one calling
    its callee twice thirty deep, is 2^30 paths but thirty computations)."""
    done = {} if done is None else done
    if comp in done:
        return done[comp]
    total = 0
    stack.add(comp)
    for instr in comp.instructions:
        total += _flops(instr)
        for callee in instr.called_computations():
            if callee not in stack and instr.opcode in (Opcode.FUSION, Opcode.CALL, Opcode.WHILE,
                                                         Opcode.CONDITIONAL, Opcode.ASYNC_START):
                total += _entry_flops(callee, stack, done)
    stack.discard(comp)
    done[comp] = total
    return total
