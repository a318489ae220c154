"""One body per call site while shardings are chosen, merged back where the sites agree.

XLA's import inlines every `call` before sharding propagation, so each call site's copy of a
body takes the shardings of its own surroundings.  Our propagation walks such an inlined copy
too, but writes its result back onto the module, which keeps its calls: a body called from
several sites whose shardings differ can hold only one of them, and the partitioner then
reshards every other site's arguments to it.  In a scanned transformer that is ruinous: the
loop body reads each stacked weight through the same `dynamic_index_in_dim` body, the weights
are sharded along different dims, and every site but the first all-to-alls its whole stack
(all layers) on every iteration to slice one layer out of it.

So before the shardings are written back, every computation called from more than one `call`
gets a copy per extra site (XLA's FlattenCallGraph, for calls), and afterwards the copies whose
shardings agree (and whose own calls went to the same bodies) are merged back, callees first:
where the sites agree the module is what it was, names included; where they differ, each
group of agreeing sites keeps a body of its own.
"""

from __future__ import annotations

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding

_CONTROL_FLOW = (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL)
# Copies of called bodies stop at this many times the module's instructions (at least the floor).
COPY_BUDGET = 4
COPY_FLOOR = 20_000
# Per instruction of a body (in post order): its sharding and the ids of the bodies it calls.
_BodyKey = tuple[tuple[Sharding | None, tuple[int, ...]], ...]


class CallSiteCopies:
    """`flatten(module)` gives each call its own body; `merge_back()` undoes what was not needed."""

    def __init__(self, module: Module):
        self.module = module
        self.copies: dict[Computation, list[Computation]] = {}  # original body -> its extra copies
        self.site: dict[Computation, Instruction] = {}  # a copy -> the one call that calls it

    @classmethod
    def flatten(cls, module: Module) -> "CallSiteCopies":
        """Copy every body reached through `call` from the entry once per call site beyond the
        first.  Bodies are taken callers first, so when a body's turn comes every site that
        will ever call it exists (its callers' copies included), and each copy is made from
        the body itself, whose own calls still go to bodies not yet copied: a copy is never
        copied again, and each has exactly one site.

        Copies multiply along chains of calls (a body calling its callee twice, ten levels
        deep, is 2^10 sites of the innermost), so they stop at a budget of copied instructions
        (`COPY_BUDGET` times the module's own, at least `COPY_FLOOR`): the sites beyond it
        share their body, as if flattening had not been done for them."""
        self = cls(module)
        if module.entry is None:
            return self
        reachable = module.reachable_computations(through=lambda instr: instr.opcode in _CONTROL_FLOW)
        callers_first = [c for c in reversed(module.computation_post_order()) if id(c) in reachable]
        budget = max(COPY_FLOOR, COPY_BUDGET * sum(len(c.instructions) for c in callers_first))
        sites: dict[int, list[Instruction]] = {}  # id of a body -> the calls that call it, in order

        def register(body: Computation) -> None:
            for instr in body.instructions:
                if instr.opcode is Opcode.CALL:
                    sites.setdefault(id(instr.called["to_apply"]), []).append(instr)

        for body in callers_first:
            for site in sites.get(id(body), [])[1:]:
                if budget < len(body.instructions):
                    break
                budget -= len(body.instructions)
                copy = module.clone_computation(body, suffix="site")
                self.copies.setdefault(body, []).append(copy)
                self.site[copy] = site
                site.called = dict(site.called, to_apply=copy)
                register(copy)
            register(body)
        return self

    def merge_back(self) -> list[tuple[Computation, int]]:
        """Merge each body's copies that agree with an earlier one (the original first), callees
        first; returns (body, copies kept) for the bodies whose sites still disagree."""
        if not self.copies:
            return []
        kept: list[tuple[Computation, int]] = []
        going: list[Computation] = []
        canonical: dict[int, Computation] = {}  # id of a merged copy -> the body that replaced it
        for original in self.module.computation_post_order():  # callees first
            copies = self.copies.get(original)
            if not copies:
                continue
            representatives: dict[_BodyKey, Computation] = {}
            for comp in (original, *copies):
                key = self._key(comp, canonical)
                first = representatives.setdefault(key, comp)
                if first is comp:
                    continue
                site = self.site[comp]
                site.called = dict(site.called, to_apply=first)
                canonical[id(comp)] = first
                going.append(comp)
            if len(representatives) > 1:
                kept.append((original, len(representatives) - 1))
        self.module.remove_computations(going)
        for comp in going:
            comp.discard()  # freed now rather than by the cyclic collector
        return kept

    @staticmethod
    def _key(comp: Computation, canonical: dict[int, Computation]) -> "_BodyKey":
        """What must agree for two copies of one body to be one: per instruction (copies share
        their structure and post order), its sharding and the bodies it calls."""

        def sharding(instr: Instruction) -> Sharding | None:
            return instr.sharding if "sharding" in instr.attributes else None

        return tuple((sharding(i), tuple(id(canonical.get(id(c), c)) for c in i.called_computations()))
                     for i in comp.post_order())

