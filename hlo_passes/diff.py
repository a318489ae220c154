"""Structural diff of two modules, blind to renumbering.

Computations are matched by name, then the rest by signature.  Within a matched pair,
instructions are matched in three rounds:

1. structurally, operands first: same opcode, shape, attributes (metadata aside), called
   computations, literal and already-matched operands (a same-named candidate wins);
   such pairs are equal whatever their names, so `add.3` → `add.7` is no change;
2. by name, among the rest: reported as changed;
3. by opcode and shape, among the rest: reported as changed.

What is left is added or removed.

    diff = diff_modules(parse_module(a), parse_module(b))
    print(diff.format())        # "" when equal
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.printer import print_instruction

_IGNORED_ATTRIBUTES = frozenset({"metadata", "control-predecessors"})


@dataclass(frozen=True)
class InstructionChange:
    kind: str  # "added" | "removed" | "changed"
    before: str = ""  # printed line in A
    after: str = ""  # printed line in B
    what: str = ""  # for "changed": which parts differ

    def format(self) -> str:
        if self.kind == "added":
            return f"  + {self.after}"
        if self.kind == "removed":
            return f"  - {self.before}"
        return f"  ~ {self.what}\n    - {self.before}\n    + {self.after}"


@dataclass
class ComputationDiff:
    name: str  # as in A (B's name after an arrow when renamed)
    changes: list[InstructionChange] = field(default_factory=list)


@dataclass
class ModuleDiff:
    computations_removed: list[str] = field(default_factory=list)
    computations_added: list[str] = field(default_factory=list)
    computations: list[ComputationDiff] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.computations_removed or self.computations_added
                    or any(c.changes for c in self.computations))

    def format(self) -> str:
        lines = [f"- computation {n}" for n in self.computations_removed]
        lines += [f"+ computation {n}" for n in self.computations_added]
        for comp in self.computations:
            if comp.changes:
                lines.append(f"@@ computation {comp.name} @@")
                lines += [c.format() for c in comp.changes]
        return "\n".join(lines) + ("\n" if lines else "")


def diff_modules(a: Module, b: Module) -> ModuleDiff:
    result = ModuleDiff()
    pairs = _match_computations(a, b)
    matched_b = {id(cb) for _, cb in pairs}
    matched_a = {id(ca) for ca, _ in pairs}
    result.computations_removed = [c.name for c in a.computations if id(c) not in matched_a]
    result.computations_added = [c.name for c in b.computations if id(c) not in matched_b]
    comp_map = {id(ca): cb for ca, cb in pairs}
    for ca, cb in pairs:
        name = ca.name if ca.name == cb.name else f"{ca.name} -> {cb.name}"
        result.computations.append(ComputationDiff(name, _diff_computation(ca, cb, comp_map)))
    return result


# ------------------------------------------------------------ computations --
def _signature(c: Computation) -> tuple:
    return (tuple(p.shape.to_hlo(False) for p in c.parameters),
            c.root.shape.to_hlo(False) if c.root is not None else "", c.is_entry)


def _match_computations(a: Module, b: Module) -> list[tuple[Computation, Computation]]:
    by_name = {c.name: c for c in b.computations}
    pairs, used = [], set()
    # The entries are each other's whatever their names (a partitioner renames main to main_spmd).
    if a.entry is not None and b.entry is not None and a.entry.name != b.entry.name \
            and a.entry.name not in by_name:
        pairs.append((a.entry, b.entry))
        used.add(id(b.entry))
    for ca in a.computations:
        if any(ca is p for p, _ in pairs):
            continue
        cb = by_name.get(ca.name)
        if cb is not None and id(cb) not in used:
            pairs.append((ca, cb))
            used.add(id(cb))
    rest_a = [c for c in a.computations if all(c is not p for p, _ in pairs)]
    for ca in rest_a:  # renamed: the first unmatched computation with the same signature
        for cb in b.computations:
            if id(cb) not in used and _signature(cb) == _signature(ca):
                pairs.append((ca, cb))
                used.add(id(cb))
                break
    return pairs


# ------------------------------------------------------------ instructions --
def _attributes(instr: Instruction) -> tuple:
    return tuple(sorted((k, a.text(k)) for k, a in instr.attributes.items()
                        if k not in _IGNORED_ATTRIBUTES and k not in instr.called))


def _called(instr: Instruction, comp_map: dict[int, Computation] | None) -> tuple:
    out = []
    for key, value in sorted(instr.called.items(), key=lambda kv: kv[0]):
        comps = value if isinstance(value, tuple) else (value,)
        if comp_map is None:
            out.append((key, tuple(c.name for c in comps)))
        else:
            out.append((key, tuple(comp_map[id(c)].name if id(c) in comp_map else f"?{c.name}"
                                   for c in comps)))
    return tuple(out)


def _key(instr: Instruction, operands: tuple, called: tuple) -> tuple:
    return (instr.opcode, instr.shape.to_hlo(), operands, _attributes(instr), called, instr.literal,
            instr.parameter_number, instr.is_root)


def _diff_computation(ca: Computation, cb: Computation,
                      comp_map: dict[int, Computation]) -> list[InstructionChange]:
    match: dict[Instruction, Instruction] = {}
    taken: set[Instruction] = set()
    b_keys: dict[tuple, list[Instruction]] = {}
    for ib in cb.post_order():
        key = _key(ib, tuple(map(id, ib.operands)), _called(ib, None))
        b_keys.setdefault(key, []).append(ib)
    # 1. structural, operands first
    for ia in ca.post_order():
        if any(o not in match for o in ia.operands):
            continue
        key = _key(ia, tuple(id(match[o]) for o in ia.operands), _called(ia, comp_map))
        candidates = [c for c in b_keys.get(key, ()) if c not in taken]
        if candidates:
            chosen = next((c for c in candidates if c.name == ia.name), candidates[0])
            match[ia] = chosen
            taken.add(chosen)
    # 2. by name; 3. by opcode and shape
    b_by_name = {i.name: i for i in cb.instructions}
    for ia in ca.post_order():
        if ia in match:
            continue
        ib = b_by_name.get(ia.name)
        if ib is not None and ib not in taken:
            match[ia] = ib
            taken.add(ib)
    for ia in ca.post_order():
        if ia in match:
            continue
        ib = next((i for i in cb.post_order() if i not in taken and i.opcode is ia.opcode
                   and i.shape.to_hlo(False) == ia.shape.to_hlo(False)), None)
        if ib is not None:
            match[ia] = ib
            taken.add(ib)
    changes = []
    for ia in ca.post_order():
        ib = match.get(ia)
        if ib is None:
            changes.append(InstructionChange("removed", before=print_instruction(ia)))
            continue
        what = _differences(ia, ib, match, comp_map)
        if what:
            changes.append(InstructionChange("changed", print_instruction(ia), print_instruction(ib),
                                             f"{ia.name}: " + ", ".join(what)))
    for ib in cb.post_order():
        if ib not in taken:
            changes.append(InstructionChange("added", after=print_instruction(ib)))
    return changes


def _differences(ia: Instruction, ib: Instruction, match, comp_map) -> list[str]:
    what = []
    if ia.opcode is not ib.opcode:
        what.append(f"opcode {ia.opcode.value} -> {ib.opcode.value}")
    if ia.shape.to_hlo() != ib.shape.to_hlo():
        what.append(f"shape {ia.shape.to_hlo()} -> {ib.shape.to_hlo()}")
    if len(ia.operands) != len(ib.operands) or any(match.get(x) is not y for x, y in zip(ia.operands, ib.operands)):
        what.append("operands")
    if _attributes(ia) != _attributes(ib):
        keys = {k for k, _ in set(_attributes(ia)) ^ set(_attributes(ib))}
        what.append("attributes " + ", ".join(sorted(keys)))
    if _called(ia, comp_map) != _called(ib, None):
        what.append("called computations")
    if ia.literal != ib.literal or ia.parameter_number != ib.parameter_number:
        what.append("value")
    if ia.is_root != ib.is_root:
        what.append("root" if ib.is_root else "no longer root")
    return what
