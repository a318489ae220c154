"""Does a rewrite pay?  Priced with the partitioner's cost model (`spmd.cost_model`).

The pass rewrites each component in a trial run on the module first (`Module.trial`) and prices both sides:

    without  the gradient all-reduces + the update on whole tensors (+ what only it read)
    with     the reduce-scatters, the update on chunks, the formatting (reshape, pad, slice),
             the scalar all-reduces of whole-tensor reductions, the all-gathers of new weights
             and of optimizer state the signature returns whole

Each collective is priced by its wire volume on a ring (`instruction_estimate`).  Everything
else is priced as XLA runs it: the update fuses into one kernel (`kernel_estimate`), which
reads each of its inputs once and writes each of its outputs once — a `dynamic-slice` of an
input (through the reshape and pad that format it) reads only its chunk.  Adding up each
elementwise op's traffic instead would count an AdamW update's ten or so passes over the
weight where XLA makes one, and overstate what sharding it saves several times over.

On a wire, a reduce-scatter plus an all-gather of the same buffer is one all-reduce, so with
the optimizer state kept sharded the rewrite moves the same bytes and saves (N-1)/N of the
update: it always pays.  When the signature returns replicated state (an Adam step under
`jax.jit` returns both moments whole), each state tensor costs one more all-gather: the
rewrite trades certain compute for extra communication, and how much of that communication a
schedule hides is the one thing the cost model assumes (the profile's `overlap`).  So it pays
only when it is no slower both with the profile's overlap and with none (`Price.pays`): on the
accelerator profile a fused update reads and writes about 7 bytes per weight byte for AdamW
(5 for momentum), where one more all-gather per state tensor costs as much as ~7.4 bytes of
memory traffic each, so replicated state is declined, as it should be.  A declined component
gets a remark with both estimates.

Latency only breaks ties in those comparisons, as everywhere in the cost model: the pass packs
its small reduce-scatters and all-gathers into one each, so a component's own collectives cost
no latency of their own.  A component whose reduce-scatter packing leaves alone (too large, or
dependent on another member) does pay one collective's latency more than the all-reduce it
replaces, and is kept only if it pays with it (`Price.pays_its_latency`).

Memory: a rewrite never holds more per device than the step it replaces (the update's inputs
and outputs whole, as before, plus chunks), and with kept state it holds 1/N of the state.  The
time estimate does not weigh that saving, so a component that keeps its state sharded
(`keep-state-sharded=true`) is not declined for its padding or its latency: those are what the
option asks to pay for it; only state it still all-gathers is priced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.cost_model import ZERO, CostModel, Estimate, HardwareProfile, instruction_estimate
from hlo_passes.stats import computation_work, instruction_work

Users = Callable[[Instruction], Iterable[Instruction]]

# Not kernel work: the kernel reads them (parameters, constants) or they only name values.
_NOT_KERNEL = (Opcode.PARAMETER, Opcode.CONSTANT, Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE)
# Ops a fused kernel folds into its reads: a dynamic-slice through these reads only its chunk.
_FORMATTING = (Opcode.RESHAPE, Opcode.BITCAST, Opcode.PAD, Opcode.COPY, Opcode.CONVERT)


def kernel_estimate(region: Iterable[Instruction], module: Module, model: CostModel, *,
                    users: Users = lambda i: i.users, roots: frozenset[Instruction] = frozenset()) -> Estimate:
    """The cost of `region` (instructions of one computation) as XLA would run it: each
    collective on its own, every connected group of the other ops one fused kernel bound by its
    FLOPs or by the bytes it reads (each outside input once; through a dynamic-slice, only the
    chunk; a broadcast or iota outside, only what it is made from) and writes (each value
    something outside the group reads, or in `roots`, once).
    `users` gives an instruction's users as they were (the region priced before a rewrite)."""
    region = list(dict.fromkeys(region))
    total = ZERO
    work = [i for i in region if not i.opcode.is_collective and i.opcode not in _NOT_KERNEL
            and i.shape.is_array]
    for instr in region:
        if instr.opcode.is_collective:
            total = total + instruction_estimate(instr, module, model)
    # Kernels: connected components of the work ops through operand edges.
    parent = {i: i for i in work}

    def find(x: Instruction) -> Instruction:
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in work:
        for o in i.operands:
            if o in parent:
                parent[find(o)] = find(i)
    kernels: dict[Instruction, list[Instruction]] = {}
    for i in work:
        kernels.setdefault(find(i), []).append(i)
    for members in kernels.values():
        total = total + _kernel(members, model, users, roots)
    return total


def _kernel(members: list[Instruction], model: CostModel, users: Users, roots: frozenset[Instruction]) -> Estimate:
    if all(m.opcode in (Opcode.RESHAPE, Opcode.BITCAST) for m in members):
        return ZERO  # a row-major reshape is a bitcast: no kernel
    inside = set(members)

    def read(value: Instruction, by: Instruction) -> int:
        """Bytes `by` (inside) makes the kernel read of `value`: a dynamic-slice only its chunk."""
        full = value.shape.byte_size()
        if value.opcode in (Opcode.BROADCAST, Opcode.IOTA):  # XLA fuses these into their readers
            return sum(o.shape.byte_size() for o in value.operands)
        if by.opcode is Opcode.DYNAMIC_SLICE and by.operands[0] is value:
            return min(full, by.shape.byte_size())
        if by.opcode in _FORMATTING:
            later = list(dict.fromkeys(users(by)))  # `by` whole is needed only if it is written
            if later and by not in roots and all(u in inside for u in later):
                return min(full, sum(read(by, u) for u in later))
        return full

    flops, written, reads = 0, 0, {}
    for m in members:
        flops += instruction_work(m).operations
        if m.opcode is Opcode.FUSION:
            flops += computation_work(m.called_computation("calls")).operations
        if m in roots or any(u not in inside for u in users(m)):
            written += m.shape.byte_size()
        for o in m.operands:
            if o not in inside and o.shape.is_array:
                reads[o] = reads.get(o, 0) + read(o, m)
    read_bytes = sum(min(o.shape.byte_size(), n) for o, n in reads.items())
    etype = max((m.shape.element_type for m in members), key=lambda t: t.byte_size if t.is_array else 0)
    return model.compute(flops, read_bytes + written, etype)


@dataclass(frozen=True)
class Price:
    without: Estimate
    with_rewrite: Estimate
    profile: HardwareProfile

    @property
    def pays(self) -> bool:
        """No slower with the profile's overlap, nor with none (`Estimate`'s order: latency
        only breaks ties, as everywhere in the cost model)."""
        return not (self.without < self.with_rewrite
                    or self.unhidden(self.without) < self.unhidden(self.with_rewrite))

    def unhidden(self, e: Estimate) -> Estimate:
        """`e` with none of its communication hidden by the schedule."""
        return replace(e, seconds=e.seconds + self.profile.overlap * e.comm_seconds)

    @property
    def pays_its_latency(self) -> bool:
        """No slower with each collective's latency counted, with the profile's overlap or none:
        for a rewrite whose collectives packing leaves alone."""
        lat = self.profile.collective_latency
        w, wo = self.with_rewrite, self.without
        return (w.seconds + w.collectives * lat <= (wo.seconds + wo.collectives * lat) * (1 + 1e-9)
                and w.step_seconds(self.profile) <= wo.step_seconds(self.profile) * (1 + 1e-9))

    def describe(self, latency: bool = False) -> str:
        w, wo = self.with_rewrite, self.without
        if latency:
            return (f"with the rewrite {w.describe()}, {_time(w.step_seconds(self.profile))} with nothing "
                    f"overlapped and {w.collectives} latencies; without {wo.describe()}, "
                    f"{_time(wo.step_seconds(self.profile))} with nothing overlapped and {wo.collectives} "
                    f"latencies ({self.profile.name} profile)")
        return (f"with the rewrite {w.describe()}, {_time(self.unhidden(w).seconds)} with nothing overlapped; "
                f"without {wo.describe()}, {_time(self.unhidden(wo).seconds)} with nothing overlapped "
                f"({self.profile.name} profile)")


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds >= 1e-6 else f"{seconds * 1e9:.3f} ns"
