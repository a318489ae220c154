"""What the collective passes share: how a collective reads (reduction kind, group mode,
group size) and the grouping engine every combiner runs (XLA's CombineInstructionsByKey), over
XLA's instruction post order and reachability (post_order.py).

The grouping engine, as XLA runs it:

* Each candidate gets a key (`combine_key`; None = never combined).  Equal keys may merge.
* Repeatedly walk the computation in XLA's post order (the schedule's order when the module
  is scheduled).  The first remaining candidate opens a group; later candidates with its key
  join it until the group would pass `combine-threshold-in-bytes` (result bytes) or reaches
  `combine-threshold-count`, or until a candidate depends (through operands or control edges)
  on a member: then the group closes and the candidate waits for the next walk.  A candidate
  larger than the byte threshold alone, or with more than one operand, is dropped.  Groups of
  two or more are rewritten.  Each walk sees the computation as the earlier rewrites left it:
  its post order and its reachability are those of the rewritten computation, so a later group
  can never close a cycle through an earlier one.  XLA rebuilds both after every rewrite; here
  `post_order.CombineOrder` updates them for what the rewrite changed (the same order, the
  same answers, without a walk over the whole computation per group), except in a scheduled
  module or an MPMD program with shared channel ids, which rebuild as XLA does.
* In a scheduled module a candidate also closes the group when an instruction scheduled
  between the group's first member and it depends on a member (the merged collective could
  not take the last member's place in the schedule without moving that instruction).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, ClassVar, Hashable, Sequence

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.collective_groups import GroupMode, group_mode, participant_groups  # noqa: F401 (the family's vocabulary)
from hlo_passes.ir.module import Module
from hlo_passes.ir.reduction import Reduction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.collectives.domains import DomainMap
from hlo_passes.passes.collectives.post_order import (CombineOrder, Reachability, channel_dependencies,
                                                      xla_post_order)
from hlo_passes.passes.pass_base import ModulePass


def combinable_reduction(instr: Instruction) -> Reduction | None:
    """The reduction of an all-reduce or reduce-scatter as XLA's GetAllReduceKey accepts it:
    `to_apply` is exactly two parameters and one binary reduction (no other instruction)."""
    to_apply = instr.called.get("to_apply")
    if not isinstance(to_apply, Computation) or len(to_apply) != 3:
        return None
    return Reduction.of(to_apply)


# ----------------------------------------------------------------- groups --
def replica_groups(instr: Instruction) -> ReplicaGroups:
    return instr.replica_groups


def uniform_group_size(instr: Instruction, module: Module) -> int | None:
    groups = participant_groups(instr, module)
    sizes = {len(g) for g in groups} if groups else set()
    return sizes.pop() if len(sizes) == 1 else None


# ------------------------------------------------------------- combining --
def result_bytes(instr: Instruction) -> int:
    return instr.shape.byte_size()


def combine_by_key(comp: Computation, keys: dict[Instruction, Hashable], *, threshold_bytes: int,
                   threshold_count: int, combine: Callable[[list[Instruction]], Instruction],
                   size: Callable[[Instruction], int] = result_bytes, scheduled: bool = False) -> int:
    """XLA's CombineInstructionsByKey (see the module docstring).  `keys` maps each candidate to
    its key and is consumed.  `combine(members)` replaces each member by a new instruction
    computed from one new merged instruction (`replace_members`).  Returns how many groups were
    combined."""
    groups: dict[Hashable, set[Instruction]] = {}
    for instr, key in keys.items():
        groups.setdefault(key, set()).add(instr)
    combined = 0
    tracked = None if scheduled or channel_dependencies(comp) else CombineOrder(comp, keys)
    sequence: list[Instruction] = []
    position: dict[Instruction, int] = {}
    stale = True
    while keys:
        if stale and tracked is not None:
            reach = tracked.reach
            candidates = tracked.in_order(keys)
        elif stale:  # scheduled, or an MPMD program: rebuilt after every rewrite, as XLA
            deps = channel_dependencies(comp)
            post = xla_post_order(comp, deps)
            reach = Reachability(post, deps)
            sequence = comp.instructions if scheduled else post
            position = {instr: k for k, instr in enumerate(sequence)}
            candidates = [instr for instr in sequence if instr in keys]
        stale = False
        members: list[Instruction] = []
        total = 0
        group: set[Instruction] = set()
        for instr in candidates:
            key = keys.get(instr)
            if key is None:
                continue
            if not members:
                group = groups[key]
            if instr not in group:
                continue
            if len(instr.operands) != 1 or not instr.shape.is_array:
                del keys[instr]
                continue
            n = size(instr)
            if n > threshold_bytes:
                del keys[instr]
                continue
            if total + n > threshold_bytes:
                break
            if any(reach.reaches(m, instr) for m in members):
                break
            if scheduled and members and not _trivially_reschedulable(members, instr, sequence, position, reach):
                break
            members.append(instr)
            total += n
            del keys[instr]
            if len(members) >= threshold_count:
                break
        if len(members) > 1:
            if tracked is not None:
                tracked.merge(members, combine)
            else:
                combine(members)
            combined += 1
            stale = True
    return combined


def _trivially_reschedulable(members: list[Instruction], target: Instruction, sequence: list[Instruction],
                             position: dict[Instruction, int], reach: Reachability) -> bool:
    """No instruction scheduled between the first member and `target` (other than members)
    depends on a member: the merged collective can sit where `target` is."""
    inside = set(members)
    for curr in sequence[position[members[0]] + 1:position[target]]:
        if curr in inside:
            continue
        if any(reach.reaches(m, curr) for m in members):
            return False
    return True


def replace_members(comp: Computation, members: Sequence[Instruction], combined: Instruction,
                    results: Sequence[Instruction]) -> None:
    """Replace each member (an array-shaped collective) with its result `results[i]`, taken
    from `combined`; members' control edges move onto `combined`."""
    for member, value in zip(members, results):
        member.replace_all_uses_with(value)
        member.move_control_predecessors_to(combined)
        member.move_control_successors_to(combined)
        comp.remove(member)


def tuple_sharding(module: Module, members: Sequence[Instruction]) -> Sharding | None:
    """The combined collective's sharding (XLA's CreateTupleSharding): each member's, replicated
    where a member has none; None when no member has one.  Also None in a module of one
    partition: XLA CPU's import rejects a tuple sharding on a multi-result collective there
    ("Failed to get shape"), and a replica program runs the same without it (the members'
    shardings stay on the get-tuple-elements that replace them)."""
    if all(m.sharding is None for m in members) or module.num_partitions <= 1:
        return None
    return Sharding.tuple_of(m.sharding if m.sharding is not None else Sharding.replicated() for m in members)


def shape_free(sharding: Sharding | None) -> Sharding | None:
    """`sharding` when it says nothing about dimensions (replicated, maximal, manual), so that it
    also holds for a reshaped or transposed value; else None."""
    if sharding is not None and sharding.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL,
                                                  ShardingKind.MANUAL):
        return sharding
    return None


def callers_of(module: Module) -> dict[Computation, list[Instruction]]:
    callers: dict[Computation, list[Instruction]] = {}
    for instr in module.all_instructions():
        for called in instr.called_computations():
            callers.setdefault(called, []).append(instr)
    return callers


def unique_caller(comp: Computation, callers: dict[Computation, list[Instruction]],
                  opcode: Opcode) -> Instruction | None:
    """XLA's GetUniqueCaller: the one instruction calling `comp`, when it has `opcode`."""
    who = callers.get(comp, [])
    return who[0] if len(who) == 1 and who[0].opcode is opcode else None


def most_frequent_dimension(dims: Sequence[int], ranks: Sequence[int]) -> int:
    """XLA's FindMostFrequentGatherDim/ScatterDim: the most frequent dimension (the smallest on
    a tie) when every member has it, else 0."""
    counts = Counter(dims)
    best = max(counts.values())
    dim = min(d for d, c in counts.items() if c == best)
    return dim if dim < min(ranks) else 0


def erase_if_dead(instr: Instruction) -> None:
    """Erase `instr` and then its operands while they are unused and free of side effects."""
    work = [instr]
    while work:
        x = work.pop()
        if (x.parent is None or x.users or x.is_root or x.control_successors or x.has_side_effect
                or x.opcode is Opcode.PARAMETER):
            continue
        comp = x.parent
        operands = list(x.operands)
        comp.remove(x)
        work.extend(operands)


class CombinerPass(ModulePass):
    """The frame every combiner shares (XLA's Run of each combiner): nothing happens when a
    threshold is not positive, or when the module holds a layout-constrained collective of
    this pass's `opcode`; while-loop bodies are skipped when the pass has a
    `combine_while_loops` option set to false; fusion computations are skipped.  In each other
    computation every instruction of `opcode` gets `combine_key(instr, domain_id)` and
    `combine_by_key` merges equal keys; the pass rewrites each group with `combine`.
    `member_bytes` is what the byte threshold counts (the result)."""

    opcode: ClassVar[Opcode]
    checks_constrained_layout: ClassVar[bool] = True

    def combine_key(self, instr: Instruction, domain: int) -> Hashable | None:
        raise NotImplementedError

    def combine(self, module: Module, comp: Computation, members: list[Instruction]) -> Instruction:
        raise NotImplementedError

    def member_bytes(self, instr: Instruction) -> int:
        return result_bytes(instr)

    def run(self, module: Module) -> bool:
        o = self.options
        if o.combine_threshold_in_bytes <= 0 or o.combine_threshold_count <= 0:
            self.remark(None, "a threshold is not positive: nothing is combined", "missed")
            return False
        if self.checks_constrained_layout:
            for instr in module.all_instructions():
                if instr.opcode is self.opcode and instr.constrain_layout:
                    self.remark(instr, f"the module has a layout-constrained {self.opcode.value}: "
                                "nothing is combined (as XLA)", "missed")
                    return False
        callers = callers_of(module)
        scheduled = bool(module.header_attr("is_scheduled", False))
        combined = 0
        for comp in list(module.computations):
            if not any(i.opcode is self.opcode for i in comp.instructions):
                continue
            if unique_caller(comp, callers, Opcode.FUSION) is not None:
                continue
            if not getattr(o, "combine_while_loops", True) and unique_caller(comp, callers, Opcode.WHILE):
                self.remark(None, f"{comp.name} is a while loop's body or condition: not combined "
                            "(combine-while-loops=false)", "missed")
                continue
            domains = DomainMap(comp)
            keys = {}
            for instr in comp.instructions:
                if instr.opcode is self.opcode:
                    key = self.combine_key(instr, domains.metadata_id(instr))
                    if key is not None:
                        keys[instr] = key
            if len(keys) < 2:
                continue
            combined += combine_by_key(
                comp, keys, threshold_bytes=o.combine_threshold_in_bytes,
                threshold_count=o.combine_threshold_count, size=self.member_bytes, scheduled=scheduled,
                combine=lambda members, comp=comp: self.combine(module, comp, members))
        return combined > 0
