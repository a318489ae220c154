"""What the collective passes share: how a collective reads (reduction kind, group mode,
group size), a reachability index that keeps rewrites acyclic, and the grouping engine
the combiners use.

Reachability is a bitset per instruction (Python ints): bit i is set in `reach[x]` when
x depends, through operands or control predecessors, on the i-th instruction.  Merging a
set of instructions none of which reaches another can never create a cycle; after a merge
every instruction that reached a member reaches the merged instruction's inputs too, and
the index is updated in place so later groups are checked against the rewritten graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Sequence

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.ir.sharding import ShardingKind
from hlo_passes.ir.types import PrimitiveType

# Reductions a to_apply computation may spell, by the opcode of its root.
REDUCTION_OPCODES = frozenset({Opcode.ADD, Opcode.MULTIPLY, Opcode.MAXIMUM, Opcode.MINIMUM,
                               Opcode.AND, Opcode.OR, Opcode.XOR})


@dataclass(frozen=True)
class ReductionKind:
    """What a reduction computation means: `add` over f32, `maximum` over s32, ..."""

    opcode: Opcode
    element_type: PrimitiveType


def reduction_kind(comp: Computation | None) -> ReductionKind | None:
    """The meaning of a scalar binary reduction computation, or None when it is anything else."""
    if comp is None or len(comp.parameters) != 2 or comp.root is None:
        return None
    root = comp.root
    if root.opcode not in REDUCTION_OPCODES or not root.shape.is_array or root.shape.rank != 0:
        return None
    if set(map(id, root.operands)) != set(map(id, comp.parameters)) or len(root.operands) != 2:
        return None
    if any(p.shape != root.shape for p in comp.parameters):
        return None
    return ReductionKind(root.opcode, root.shape.element_type)


def reduction_of(instr: Instruction) -> ReductionKind | None:
    to_apply = instr.called.get("to_apply")
    return reduction_kind(to_apply) if isinstance(to_apply, Computation) else None


# ----------------------------------------------------------------- groups --
@dataclass(frozen=True)
class GroupMode:
    """How a collective's replica_groups are read (XLA's CollectiveOpGroupMode)."""

    has_channel: bool
    use_global_device_ids: bool

    @property
    def name(self) -> str:
        if not self.has_channel:
            return "cross-replica"
        return "flattened-id" if self.use_global_device_ids else "cross-replica-and-partition"


def group_mode(instr: Instruction) -> GroupMode:
    return GroupMode(instr.attr("channel_id") is not None, bool(instr.attr("use_global_device_ids", False)))


def replica_groups(instr: Instruction) -> ReplicaGroups:
    return instr.attr("replica_groups") or ReplicaGroups(())


def participant_groups(instr: Instruction, module: Module) -> list[tuple[int, ...]] | None:
    """The device groups (global ids, replica-major) a collective reduces over, or None when the
    mode cannot be spelled out (a cross-replica-and-partition collective over several partitions
    is read as such, with the partitions of each replica group joined)."""
    replicas, partitions = module.replica_count, module.num_partitions
    groups = replica_groups(instr).groups
    mode = group_mode(instr)
    if mode.use_global_device_ids:
        return [tuple(g) for g in groups] if groups else [tuple(range(replicas * partitions))]
    if mode.has_channel and instr.opcode in (Opcode.ALL_TO_ALL, Opcode.RAGGED_ALL_TO_ALL):
        # XLA reads an all-to-all with a channel as cross-partition: groups of partition ids
        partition_sets = [tuple(g) for g in groups] if groups else [tuple(range(partitions))]
        return [tuple(r * partitions + p for p in g) for r in range(replicas) for g in partition_sets]
    replica_sets = [tuple(g) for g in groups] if groups else [tuple(range(replicas))]
    if not mode.has_channel:
        # one group per (replica group, partition)
        return [tuple(r * partitions + p for r in g) for p in range(partitions) for g in replica_sets]
    return [tuple(r * partitions + p for r in g for p in range(partitions)) for g in replica_sets]


def uniform_group_size(instr: Instruction, module: Module) -> int | None:
    groups = participant_groups(instr, module)
    sizes = {len(g) for g in groups} if groups else set()
    return sizes.pop() if len(sizes) == 1 else None


# ----------------------------------------------------------- reachability --
class Reachability:
    """Transitive dependencies (operands and control predecessors) of one computation's
    instructions as bitsets; kept current as passes merge and add instructions."""

    def __init__(self, comp: Computation):
        self.bit: dict[Instruction, int] = {}
        self.reach: dict[Instruction, int] = {}
        self._next = 0
        for instr in comp.post_order():
            self.add(instr)

    def add(self, instr: Instruction) -> None:
        own = 1 << self._next
        self._next += 1
        self.bit[instr] = own
        r = own
        for dep in (*instr.operands, *instr.control_predecessors):
            r |= self.reach.get(dep, 0)
        self.reach[instr] = r

    def add_all(self, instrs: Iterable[Instruction]) -> None:
        """Add new instructions, operands before users."""
        new = [i for i in instrs if i not in self.bit]
        pending = set(new)

        def visit(x: Instruction) -> None:
            if x not in pending:
                return
            pending.discard(x)
            for dep in (*x.operands, *x.control_predecessors):
                visit(dep)
            self.add(x)

        for x in new:
            visit(x)

    def depends(self, a: Instruction, b: Instruction) -> bool:
        """True when `a` depends, transitively, on `b`."""
        return a is not b and bool(self.reach[a] & self.bit[b])

    def independent(self, a: Instruction, members: Iterable[Instruction]) -> bool:
        mask = 0
        for m in members:
            if self.reach[m] & self.bit[a]:
                return False
            mask |= self.bit[m]
        return not (self.reach[a] & mask)

    def merged(self, members: Sequence[Instruction], combined: Instruction,
               added: Iterable[Instruction]) -> None:
        """`members` were replaced by `combined` and the new `added` instructions."""
        self.add_all([*added, combined])
        mask = 0
        for m in members:
            mask |= self.bit.pop(m)
            self.reach.pop(m, None)
        inputs = self.reach[combined]
        for instr, r in self.reach.items():
            if r & mask:
                self.reach[instr] = r | inputs


# ------------------------------------------------------------- combining --
@dataclass
class _Group:
    members: list[Instruction] = field(default_factory=list)
    bytes: int = 0


def result_bytes(instr: Instruction) -> int:
    return instr.shape.byte_size()


def combinable_sharding(instr: Instruction) -> bool:
    """Collectives without sharding, or inside manual (shard_map) regions, may be combined."""
    s = instr.sharding
    if s is None:
        return True
    leaves = s.elements if s.kind is ShardingKind.TUPLE else (s,)
    return all(x.kind is ShardingKind.MANUAL for x in leaves)


def combine_in_computation(comp: Computation, candidates: Sequence[tuple[Instruction, Hashable]], *,
                           threshold_bytes: int, threshold_count: int,
                           rewrite: Callable[[list[Instruction]], tuple[Instruction, list[Instruction]]],
                           size: Callable[[Instruction], int] = result_bytes) -> int:
    """Merge candidates with equal keys, first fit, into groups of mutually independent members
    within the thresholds; `rewrite(members)` replaces them and returns (combined, new instrs).
    Returns how many groups were combined."""
    if len(candidates) < 2:
        return 0
    reach = Reachability(comp)
    by_key: dict[Hashable, list[Instruction]] = {}
    position = {instr: i for i, instr in enumerate(comp.post_order())}
    for instr, key in sorted(candidates, key=lambda c: position[c[0]]):
        by_key.setdefault(key, []).append(instr)
    combined_groups = 0
    for members_of_key in by_key.values():
        if len(members_of_key) < 2:
            continue
        groups: list[_Group] = []
        for instr in members_of_key:
            n = size(instr)
            if n > threshold_bytes:
                continue
            for g in groups:
                if (len(g.members) < threshold_count and g.bytes + n <= threshold_bytes
                        and reach.independent(instr, g.members)):
                    g.members.append(instr)
                    g.bytes += n
                    break
            else:
                groups.append(_Group([instr], n))
        for g in groups:
            # Earlier merges may have made members depend on one another: check again.
            kept: list[Instruction] = []
            for m in g.members:
                if reach.independent(m, kept):
                    kept.append(m)
            if len(kept) < 2:
                continue
            combined, added = rewrite(kept)
            reach.merged(kept, combined, added)
            combined_groups += 1
    return combined_groups


def replace_members(comp: Computation, members: Sequence[Instruction], combined: Instruction,
                    results: Sequence[Sequence[Instruction]]) -> list[Instruction]:
    """Replace each member with its results (one per leaf of the member's shape) taken from
    `combined`; moves control edges onto `combined`.  Returns the instructions added."""
    added: list[Instruction] = []
    b = Builder(comp, before=members[-1])
    for member, values in zip(members, results):
        if member.shape.is_tuple:
            for user in list(member.users):
                if user.opcode is Opcode.GET_TUPLE_ELEMENT:
                    user.replace_all_uses_with(values[user.attr("index")])
                    comp.remove(user)
            if member.users or member.is_root:
                t = b.tuple(list(values))
                added.append(t)
                member.replace_all_uses_with(t)
        else:
            member.replace_all_uses_with(values[0])
        for pred in list(member.control_predecessors):
            combined.add_control_predecessor(pred)
        for succ in list(member.control_successors):
            succ.control_predecessors.remove(member)
            member.control_successors.remove(succ)
            succ.add_control_predecessor(combined)
        comp.remove(member)
    return added


def collective_computations(module: Module) -> list[Computation]:
    """Computations that hold collectives (reduction computations never do)."""
    return [c for c in module.computations if any(i.opcode.is_collective for i in c.instructions)]


def most_common(values: Iterable[Hashable]):
    return Counter(values).most_common(1)[0][0]


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
    """The frame every combiner shares: per computation that holds collectives, key each
    instruction (`combine_key`: None = not a candidate), merge equal keys with
    `combine_in_computation` under the `threshold_bytes`/`threshold_count` options, and let the
    pass rewrite each group (`combine`).  `member_bytes` is what the byte threshold counts."""

    def combine_key(self, instr: Instruction) -> Hashable | None:
        raise NotImplementedError

    def combine(self, module: Module, comp: Computation,
                members: list[Instruction]) -> tuple[Instruction, list[Instruction]]:
        raise NotImplementedError

    def member_bytes(self, instr: Instruction) -> int:
        return result_bytes(instr)

    def run(self, module: Module) -> bool:
        combined = 0
        for comp in collective_computations(module):
            candidates = [(i, key) for i in comp.post_order() if (key := self.combine_key(i)) is not None]
            combined += combine_in_computation(
                comp, candidates, threshold_bytes=self.options.threshold_bytes,
                threshold_count=self.options.threshold_count, size=self.member_bytes,
                rewrite=lambda members, comp=comp: self.combine(module, comp, members))
        return combined > 0
