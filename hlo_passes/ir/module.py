"""Module: computations, the entry, header attributes and debug tables."""

from __future__ import annotations

import gc
import re
from bisect import bisect_left
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, cast

from hlo_passes.ir.attributes import Attr, reader_for
from hlo_passes.ir.computation import Computation, IRError
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.snapshot import ComputationsSnapshot, ModuleSnapshot
from hlo_passes.ir.types import PRIMITIVE_TYPES_BY_NAME


class NameTable:
    """Hands out unique names in XLA's style: `add`, `add.1`, `add.2`, ...

    `taken`, when given, lists the names already in use; it is read on the table's first
    use, so that a parsed module that no pass renames or extends never builds the table.
    Those names are then kept in one sorted list, looked up by bisection: 8 bytes a name,
    where a dict (or a set) of them takes 40 to 50, and two or three tables of a big module's
    names (tens of thousands) are alive while spmd-partition runs (the module's, its flattened
    copy's) and while weight-update-sharding prices its rewrite (the module's, the trial's).
    Names reserved or handed out afterwards go into a dict, names of the list released
    afterwards into a set; once those hold more than an eighth of the list's length
    (`_FOLD_FRACTION`), they are folded into the list (the released ones dropped from it, the
    new ones merged in).  The partitioner releases the source module's names one by one and
    names a module's worth of new instructions: unfolded, the set and the dict came to several
    times the list (on the partitioned 24-layer GPT step, 1.1 MiB of released names where the
    list is 0.13).  A fold costs a pass over the list, once every eighth of its length of
    changes (about 3% of spmd-partition's time).
    """

    _SUFFIX = re.compile(r"^(.*?)(?:\.(\d+))?$")
    # Changes kept beside the sorted list before they are folded into it: this fraction of its
    # length, and at least `_FOLD_MIN` (a small module's table is never folded: the changes a
    # pass makes to it stay few).
    _FOLD_FRACTION = 8
    _FOLD_MIN = 1024

    def __init__(self, taken: Callable[[], Iterable[str]] | None = None) -> None:
        self._taken = taken
        self._sorted: list[str] | None = None if taken is not None else []  # `taken`, once read
        self._added: dict[str, None] = {}  # in use, not in `_sorted`
        self._released: set[str] = set()  # names of `_sorted` free again
        self._next: dict[str, int] = {}
        # Fold once `_added` and `_released` hold more names than this together.
        self._fold_at = self._FOLD_MIN

    def _read(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(cast(Callable[[], Iterable[str]], self._taken)())  # until first use
            self._taken = None
            self._fold_at = max(self._FOLD_MIN, len(self._sorted) // self._FOLD_FRACTION)
        return self._sorted

    def _used(self, name: str) -> bool:
        if name in self._added:
            return True
        names = self._sorted
        if names is None:
            names = self._read()
        k = bisect_left(names, name)
        return k < len(names) and names[k] == name and name not in self._released

    def _fold(self) -> None:
        """Fold the names added and released since the list was made into it (see the class
        docstring).  The callers check `_fold_at` themselves: the partitioner names and releases
        a module's worth of instructions, and a method call per change showed in its time."""
        released = self._released
        names = [n for n in self._read() if n not in released] if released else self._read()
        names += sorted(self._added)  # two sorted runs: the sort merges them in one pass
        names.sort()
        self._sorted, self._added, self._released = names, {}, set()
        self._fold_at = max(self._FOLD_MIN, len(names) // self._FOLD_FRACTION)

    def reserve(self, name: str) -> bool:
        """Record an existing name; False when it was taken already."""
        if self._used(name):
            return False
        self._added[name] = None
        if len(self._added) + len(self._released) > self._fold_at:
            self._fold()
        return True

    def settle(self) -> None:
        """Read the names in use now, where they are still to be read on first use: for a table
        kept aside while its module changes (Module.trial), which must not read the changes."""
        self._read()

    def release(self, name: str) -> None:
        if name in self._added:
            del self._added[name]
        elif self._used(name):
            self._released.add(name)
            if len(self._added) + len(self._released) > self._fold_at:
                self._fold()

    def unique(self, hint: str) -> str:
        hint = hint.lstrip("%") or "instruction"
        used = self._used
        if not used(hint) and hint not in PRIMITIVE_TYPES_BY_NAME:  # XLA reads `s1`, `f32` as types
            self._added[hint] = None
            if len(self._added) + len(self._released) > self._fold_at:
                self._fold()
            return hint
        base = cast(re.Match[str], self._SUFFIX.match(hint)).group(1) or hint  # matches any text
        n = self._next.get(base, 1)
        while used(f"{base}.{n}"):
            n += 1
        self._next[base] = n + 1
        name = f"{base}.{n}"
        self._added[name] = None
        if len(self._added) + len(self._released) > self._fold_at:
            self._fold()
        return name

    def __contains__(self, name: str) -> bool:
        return self._used(name)


@dataclass
class DebugTables:
    """FileNames / FunctionNames / FileLocations / StackFrames that newer XLA prints.

    Used to point remarks at the user's source line; printed back as parsed.
    """

    file_names: dict[int, str] = field(default_factory=dict)
    function_names: dict[int, str] = field(default_factory=dict)
    file_locations: dict[int, dict[str, int]] = field(default_factory=dict)
    stack_frames: dict[int, dict[str, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.file_names or self.function_names or self.file_locations or self.stack_frames)

    def source_location(self, stack_frame_id: int) -> tuple[str, int] | None:
        """(file, line) of the innermost frame of `stack_frame_id`."""
        frame = self.stack_frames.get(stack_frame_id)
        if frame is None:
            return None
        loc = self.file_locations.get(frame.get("file_location_id", -1))
        if loc is None:
            return None
        return self.file_names.get(loc.get("file_name_id", -1), "?"), loc.get("line", 0)


@dataclass
class PrintStyle:
    """How names and operands were spelled in the parsed text, reused when printing."""

    percent_names: bool = True
    operand_shapes: bool = False


class Module:
    def __init__(self, name: str):
        self.name = name
        self.attributes: dict[str, Attr] = {}
        self.computations: list[Computation] = []
        self.entry: Computation | None = None
        self.tables = DebugTables()
        self.style = PrintStyle()
        self.names = NameTable()  # instruction names, unique across the module
        self.computation_names = NameTable()
        # Entry signature as parsed, to know when entry_computation_layout must be rebuilt.
        self.parsed_entry_signature: tuple[tuple[Shape, ...], Shape] | None = None
        self._next_channel: int | None = None  # see new_channel_id
        # XLA's copy insertion has run (the jax.jit hook's stages): buffer identity is part of
        # the module's meaning and passes must not merge values that share an in-place buffer
        # (ir/buffers.py).  Not part of the text: a module read from a file is compiled from
        # the start, copy insertion included.
        self.copies_inserted = False

    def new_channel_id(self) -> int:
        """A channel id no instruction of the module uses: the one allocator every pass that
        creates a collective takes ids from (the module is scanned once, on first use)."""
        if self._next_channel is None:
            used = [i.attr("channel_id") for i in self.all_instructions() if i.has_attr("channel_id")]
            self._next_channel = max([0] + [c for c in used if isinstance(c, int)]) + 1
        cid = self._next_channel
        self._next_channel += 1
        return cid

    def take_names_of_parsed_instructions(self) -> None:
        """The names of the computations and instructions now in the module are taken
        (recorded when a name is first asked for: a big module's set of names is large)."""
        comps = tuple(self.computations)
        self.names = NameTable(lambda: (instr.name for comp in comps for instr in comp._instructions))
        self.computation_names = NameTable(lambda: (comp.name for comp in comps))

    # -------------------------------------------------------- computations --
    def add_computation(self, comp: Computation, *, entry: bool = False, before: Computation | None = None,
                        name_hint: str | None = None) -> Computation:
        comp.name = self.computation_names.unique(name_hint or comp.name)
        comp.module = self
        if before is not None:
            self.computations.insert(self.computations.index(before), comp)
        else:
            self.computations.append(comp)
        for instr in comp.instructions:
            if not self.names.reserve(instr.name):
                instr.name = self.names.unique(instr.name)
        if entry:
            comp.is_entry = True
            self.entry = comp
        return comp

    def remove_computation(self, comp: Computation) -> None:
        self.remove_computations([comp])

    def reachable_computations(self, through: Callable[[Instruction], bool] | None = None) -> set[int]:
        """The ids of the entry and of the computations it reaches, calling through every
        instruction or only those `through` accepts (a work list, not a recursive local
        function: see `computation_post_order`)."""
        if self.entry is None:
            return set()
        reachable = {id(self.entry)}
        work = [self.entry]
        while work:
            for instr in work.pop().instructions:
                if instr.called and (through is None or through(instr)):
                    for callee in instr.called_computations():
                        if id(callee) not in reachable:
                            reachable.add(id(callee))
                            work.append(callee)
        return reachable

    def remove_unreachable_computations(self) -> list[Computation]:
        """Remove the computations the entry does not reach (through any called computation);
        returns them, callers before callees."""
        if self.entry is None:
            return []
        reachable = self.reachable_computations()
        dropped = [comp for comp in reversed(self.computation_post_order())  # callers before callees
                   if id(comp) not in reachable]
        self.remove_computations(dropped)
        return dropped

    def remove_computations(self, comps: Iterable[Computation]) -> None:
        """Remove `comps`, none of which may be called from a computation that stays.  One scan
        of the module for all of them (dead-code elimination drops a model's unreachable
        computations together, not one whole-module scan each)."""
        going = {id(c): c for c in comps}
        for other in self.computations:
            if id(other) in going:
                continue
            for instr in other.instructions:
                for callee in instr.called_computations():
                    if id(callee) in going:
                        raise IRError(f"cannot remove {callee.name}: called by {instr.name}")
        self.computations[:] = [c for c in self.computations if id(c) not in going]
        for comp in going.values():
            self.computation_names.release(comp.name)
            for instr in comp.instructions:
                self.names.release(instr.name)

    def computation(self, name: str) -> Computation:
        for comp in self.computations:
            if comp.name == name:
                return comp
        raise KeyError(name)

    def all_instructions(self) -> Iterator[Instruction]:
        for comp in self.computations:
            yield from comp.instructions

    def fused_computations(self) -> set[Computation]:
        """The computations fusions call: their instructions are one kernel, not ops of their own."""
        return {c for i in self.all_instructions() if i.opcode is Opcode.FUSION for c in i.called_computations()}

    def computation_post_order(self) -> list[Computation]:
        """Callees before callers (each computation's callees in the order its instructions
        call them).  A loop with a stack, not a recursive local function: such a function
        refers to itself through its closure, a cycle that keeps the order it built, and the
        computations in it, alive until the cyclic collector runs, which the partitioner holds
        off while it works (a module's worth of discarded computations, on a 24-layer step)."""
        seen: set[int] = set()
        order: list[Computation] = []
        for comp in self.computations:
            if id(comp) in seen:
                continue
            seen.add(id(comp))
            stack = [(comp, _callees(comp))]
            while stack:
                top, callees = stack[-1]
                for callee in callees:
                    if id(callee) not in seen:
                        seen.add(id(callee))
                        stack.append((callee, _callees(callee)))
                        break
                else:
                    stack.pop()
                    order.append(top)
        return order

    def clone_computation(self, comp: Computation, suffix: str = "clone") -> Computation:
        """A deep copy of `comp` (sharing its callees) added to this module."""
        new = Computation(f"{comp.name}.{suffix}")
        new.print_signature = comp.print_signature
        new.attributes = dict(comp.attributes)
        new.span = comp.span
        mapping: dict[Instruction, Instruction] = {}
        for instr in comp.post_order():
            copy = Instruction(instr.opcode, instr.shape, [mapping[o] for o in instr.operands],
                               name=f"{instr.name}.{suffix}", attributes=instr.shared_attributes(),
                               called=dict(instr.called), literal=instr.literal,
                               parameter_number=instr.parameter_number, span=instr._span)
            mapping[instr] = copy
            copy.parent = new
            new._instructions[copy] = None
            if copy.parameter_number is not None and copy.opcode.value == "parameter":
                new._register_parameter(copy)
        for instr in comp.instructions:
            for pred in instr.control_predecessors:
                mapping[instr].add_control_predecessor(mapping[pred])
        new.root = mapping[cast(Instruction, comp.root)]
        return self.add_computation(new, before=comp)

    def clone(self) -> "Module":
        """A deep copy: the same text when printed, no object shared that a pass may change
        (computations, instructions, use-def and control edges, the name tables).  Attribute
        slots and shapes are immutable values and are shared.  What passes and the runtime use
        instead of printing and parsing a module again.

        The cyclic garbage collector is paused while copying: a copy makes no garbage, but its
        hundreds of thousands of new objects would trigger full collections that walk every
        object alive (the module itself included), which made a rollback snapshot of a large
        module cost more per instruction the larger the module."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._clone()
        finally:
            if enabled:
                gc.enable()

    def _clone(self) -> "Module":
        copy = self._header_copy()
        comp_map: dict[Computation, Computation] = {}
        for comp in self.computations:
            new = Computation(comp.name, is_entry=comp.is_entry)
            new.attributes = dict(comp.attributes)
            new.print_signature = comp.print_signature
            new.span = comp.span
            new.module = copy
            comp_map[comp] = new
        for comp in self.computations:
            comp_map[comp]._copy_body_from(comp, comp_map)
        copy.computations = [comp_map[c] for c in self.computations]
        copy.entry = comp_map[self.entry] if self.entry is not None else None
        copy.take_names_of_parsed_instructions()
        return copy

    def _header_copy(self) -> "Module":
        """A module with this one's name, attributes, debug tables and print style, and no
        computations."""
        copy = Module(self.name)
        copy.attributes = dict(self.attributes)
        copy.tables = DebugTables(dict(self.tables.file_names), dict(self.tables.function_names),
                                  {k: dict(v) for k, v in self.tables.file_locations.items()},
                                  {k: dict(v) for k, v in self.tables.stack_frames.items()})
        copy.style = PrintStyle(self.style.percent_names, self.style.operand_shapes)
        copy.parsed_entry_signature = self.parsed_entry_signature
        copy.copies_inserted = self.copies_inserted
        return copy

    def snapshot(self) -> ModuleSnapshot:
        """What `restore` needs to put the module back as it is now: like a `clone()`, but
        kept compactly (a quarter of the memory, see ir/snapshot.py) and not a module until it
        is restored.  A rollback snapshot."""
        return ModuleSnapshot(self._header_copy(), self.computations, self.entry)

    @contextmanager
    def trial(self, changing: Iterable[Computation] | None = None) -> Iterator["Module"]:
        """The module itself, to change for a trial and have back afterwards: what a pass that
        rewrites a `clone()` to see the outcome needs (weight-update-sharding prices its rewrite
        so), without a second module alive.  A clone costs as much memory as the module; the
        snapshot this keeps instead, a quarter (ir/snapshot.py), which made the clone of a big
        partitioned step the largest thing alive in that pass.

        `changing` names the computations the block may change (all of them when not given):
        only those are kept in the snapshot, and the block must leave the others as they are;
        it may add computations and remove any (the list of computations comes back as it
        was).  Weight-update-sharding changes the entry and its update regions only, not the
        thousands of reducers and fused computations beside them.

        Inside, the module hands out names and channel ids as a fresh clone would (new tables
        and allocator, read from the module as it is).  On leaving, however the block ends, the
        computations it may have changed are refilled from the snapshot (the same computation
        objects, new instruction objects: none taken from them inside or before stays part of
        them; the module is what a `clone()` taken before would be, but for the untouched
        computations' objects, which stay), the computations it added are dropped, and the
        module gets back the very name tables and channel allocator it had, so that names and
        ids given out later are those it would have given had no trial run."""
        snapshot = ComputationsSnapshot(self._header_copy(), self.computations, self.entry,
                                        self.computations if changing is None else changing)
        self.names.settle()
        self.computation_names.settle()
        kept = (self.names, self.computation_names, self._next_channel)
        self.take_names_of_parsed_instructions()
        self._next_channel = None
        try:
            yield self
        finally:
            enabled = gc.isenabled()
            gc.disable()  # as in `clone`: refilling makes no garbage
            try:
                for comp in snapshot.restore(self):
                    comp.discard()  # (the trial's objects freed now, not left to the cyclic collector)
            finally:
                if enabled:
                    gc.enable()
            self._take_header(snapshot.header)
            self.names, self.computation_names, self._next_channel = kept

    def discard(self) -> None:
        """Break the reference cycles inside a module nobody will use again (a rollback snapshot
        whose pass succeeded), so that reference counting frees it at once.  Left to the cyclic
        collector, a whole-module snapshot stays alive until the next full collection, which
        `clone` holds off while it copies: two snapshots would be alive at once.  (A module a
        pass has worked on may hold insertions not yet folded into the order: those too.)"""
        for comp in self.computations:
            comp.discard()
        self.computations = []
        self.entry = None

    def restore(self, snapshot: ModuleSnapshot) -> None:
        """Become the module `snapshot` was taken of, as it was then, in place (callers keep
        holding this object), in new computation and instruction objects: what a `clone()`
        taken at the time would be.  `snapshot` must not be used afterwards."""
        enabled = gc.isenabled()
        gc.disable()  # as in `clone`: building makes no garbage
        try:
            restored = snapshot.build()
            restored.take_names_of_parsed_instructions()
        finally:
            if enabled:
                gc.enable()
        self.__dict__.update(restored.__dict__)
        for comp in self.computations:
            comp.module = self

    def _take_header(self, header: "Module") -> None:
        """`header`'s name, header attributes, debug tables, print style and parsed entry
        signature (a `_header_copy`) become this module's."""
        self.name, self.attributes, self.tables = header.name, header.attributes, header.tables
        self.style = header.style
        self.parsed_entry_signature = header.parsed_entry_signature

    # ------------------------------------------------------------- header --
    def header_attr(self, key: str, default: Any = None) -> Any:
        slot = self.attributes.get(key)
        if slot is None:
            return default
        return slot.value(reader_for(key))

    def set_header_attr(self, key: str, value: Any) -> None:
        self.attributes[key] = Attr(value=value)

    @property
    def num_partitions(self) -> int:
        return cast(int, self.header_attr("num_partitions", 1))

    @num_partitions.setter
    def num_partitions(self, n: int) -> None:
        self.set_header_attr("num_partitions", n)

    @property
    def replica_count(self) -> int:
        return cast(int, self.header_attr("replica_count", 1))

    def __repr__(self) -> str:
        return f"<module {self.name}: {len(self.computations)} computations>"


def _callees(comp: Computation) -> Iterator[Computation]:
    """The computations `comp`'s instructions call, in order (repeats included)."""
    for instr in comp._instructions:
        if instr.called:
            yield from instr.called_computations()
