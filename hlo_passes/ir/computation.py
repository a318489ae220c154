"""Computation: an ordered set of instructions with parameters and a root."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, cast

from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.instruction import NO_CALLS, NO_CONTROL_EDGES, Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.source import SourceSpan

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module


class IRError(Exception):
    """A structural misuse of the IR (erasing a used instruction, a foreign operand, ...)."""


class _Insertions:
    """Instructions inserted next to others and not yet folded into a computation's order
    (see `Computation._fold_insertions`).  A computation holds one only while some are
    pending: most never do (a model has thousands of small reducer computations)."""

    __slots__ = ("before", "after", "pending", "removed")

    def __init__(self) -> None:
        self.before: dict[Instruction, list[Instruction]] = {}
        self.after: dict[Instruction, list[Instruction]] = {}
        self.pending: set[Instruction] = set()
        self.removed: set[Instruction] = set()  # erased while insertions next to them were pending


class Computation:
    def __init__(self, name: str, *, is_entry: bool = False):
        self.name = name
        self.is_entry = is_entry
        # Instruction order.  Inserting before or after an instruction is recorded next to it
        # (`_insertions`) and folded into the order when the order is next read: a pass that
        # inserts thousands of instructions in the middle (inlining, partitioning) pays once,
        # not once per instruction.
        self._order: dict[Instruction, None] = {}
        self._insertions: _Insertions | None = None
        self.parameters: list[Instruction] = []
        self.root: Instruction | None = None
        self.module: Module | None = None
        self.attributes: dict[str, Attr] = {}  # e.g. execution_thread
        self.print_signature = True
        self._additions: tuple[list[Instruction], ...] = ()  # open `recording_additions` logs
        self.span: SourceSpan | None = None  # where the text named it; None when a pass made it

    @property
    def _instructions(self) -> dict[Instruction, None]:
        """The instructions in order (an insertion-ordered dict used as an ordered set)."""
        if self._insertions is not None:
            self._fold_insertions()
        return self._order

    @_instructions.setter
    def _instructions(self, order: dict[Instruction, None]) -> None:
        self._order = order
        self._insertions = None

    def _fold_insertions(self) -> None:
        """Put every pending instruction at its place: the ones inserted before an instruction
        come right before it (in insertion order), the ones inserted after it right after it
        (the latest first), recursively for insertions next to pending ones."""
        out: dict[Instruction, None] = {}
        pending = cast(_Insertions, self._insertions)
        before, after, removed = pending.before, pending.after, pending.removed
        for first in self._order:
            if first not in before and first not in after:
                if first not in removed:
                    out[first] = None
                continue
            stack: list[tuple[bool, Instruction]] = [(False, first)]
            while stack:
                emit, x = stack.pop()
                if emit:
                    if x not in removed:
                        out[x] = None
                    continue
                stack.extend((False, a) for a in reversed(after.get(x, ())))
                stack.append((True, x))
                stack.extend((False, b) for b in reversed(before.get(x, ())))
        self._order = out
        self._insertions = None

    @property
    def instructions(self) -> list[Instruction]:
        return list(self._instructions)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(list(self._instructions))

    def __len__(self) -> int:
        pending = self._insertions
        if pending is None:
            return len(self._order)
        return len(self._order) + len(pending.pending) - len(pending.removed)

    def __contains__(self, instr: Instruction) -> bool:
        pending = self._insertions
        if pending is None:
            return instr in self._order
        return (instr in self._order or instr in pending.pending) and instr not in pending.removed

    def _unordered(self) -> Iterator[Instruction]:
        """Every instruction held, pending insertions (and their erased anchors) included, in
        no particular order and without folding (`discard`)."""
        yield from self._order
        if self._insertions is not None:
            yield from self._insertions.pending

    def _copy_body_from(self, other: "Computation", comp_map: dict[Computation, Computation]) -> None:
        """Fill this (empty) computation with copies of `other`'s instructions, in order, calling
        the computations `comp_map` maps `other`'s callees to (Module.clone)."""
        mapping: dict[Instruction, Instruction] = {}

        def callee(value: Computation | tuple[Computation, ...]) -> Computation | tuple[Computation, ...]:
            return tuple(comp_map[c] for c in value) if isinstance(value, tuple) else comp_map[value]

        for instr in other.post_order():  # operands first, whatever order the text had
            new = Instruction(instr.opcode, instr.shape, [mapping[o] for o in instr.operands], name=instr.name,
                              attributes=instr.shared_attributes(),
                              called={k: callee(v) for k, v in instr.called.items()} if instr.called else None,
                              literal=instr.literal, parameter_number=instr.parameter_number, span=instr._span)
            new.parent = self
            mapping[instr] = new
            if new.opcode is Opcode.PARAMETER:
                self._register_parameter(new)
        self._instructions = dict.fromkeys(mapping[i] for i in other._instructions)
        for instr in other._instructions:
            for pred in instr.control_predecessors:
                mapping[instr].add_control_predecessor(mapping[pred])
        self.root = mapping[other.root] if other.root is not None else None

    # ------------------------------------------------------------ building --
    def add(self, instr: Instruction, *, name_hint: str | None = None,
            before: Instruction | None = None, after: Instruction | None = None) -> Instruction:
        """Add `instr` (operands must already be here) with a module-unique name."""
        if instr.parent is not None:
            raise IRError(f"{instr.name} already belongs to computation {instr.parent.name}")
        for op in instr.operands:
            if op.parent is not self:
                raise IRError(f"operand {op.name} of new instruction {instr.name} is not in {self.name}")
        if self.module is not None:
            instr.name = self.module.names.unique(name_hint or instr.name)
        instr.parent = self
        if self._insertions is not None and instr in self._insertions.removed:
            self._fold_insertions()  # added again: its old place must go first
        if before is None and after is None:
            self._order[instr] = None  # after everything, pending insertions included
        else:
            anchor = cast(Instruction, before if before is not None else after)
            if anchor not in self:
                raise IRError(f"cannot insert {instr.name} next to {anchor.name}: it is not in {self.name}")
            pending = self._insertions
            if pending is None:
                pending = self._insertions = _Insertions()
            if before is not None:
                pending.before.setdefault(anchor, []).append(instr)
            else:
                pending.after.setdefault(anchor, []).insert(0, instr)
            pending.pending.add(instr)
        if instr.opcode is Opcode.PARAMETER:
            self._register_parameter(instr)
        for log in self._additions:
            log.append(instr)
        return instr

    @contextmanager
    def recording_additions(self) -> Iterator[list[Instruction]]:
        """The instructions added here while the block runs, in the order they were added (some
        may be erased again: check `in`).  A rewrite that prices what it made reads them here
        instead of diffing the whole computation before and after: per rewrite, the cost is
        what it added, not the computation's size."""
        log: list[Instruction] = []
        self._additions = (*self._additions, log)
        try:
            yield log
        finally:
            self._additions = tuple(open_log for open_log in self._additions if open_log is not log)

    def _register_parameter(self, instr: Instruction) -> None:
        n = cast(int, instr.parameter_number)  # a parameter has its number
        while len(self.parameters) <= n:
            self.parameters.append(None)  # type: ignore[arg-type]  # a gap until that parameter is added
        if self.parameters[n] is not None:
            raise IRError(f"{self.name} has two parameters numbered {n}")
        self.parameters[n] = instr

    def remove(self, instr: Instruction) -> None:
        """Erase `instr`; it must have no users and not be the root."""
        if instr.users:
            users = ", ".join(u.name for u in instr.users)
            raise IRError(f"cannot erase {instr.name}: still used by {users}")
        if instr is self.root:
            raise IRError(f"cannot erase {instr.name}: it is the root of {self.name}")
        if instr.control_successors:
            raise IRError(f"cannot erase {instr.name}: it is a control predecessor")
        instr.drop_operands()
        pending = self._insertions
        if pending is not None and (instr in pending.pending or instr in pending.before or instr in pending.after):
            pending.removed.add(instr)  # a tombstone: what was inserted next to it keeps its place
        else:
            del self._order[instr]
        if instr.opcode is Opcode.PARAMETER:
            self.parameters[instr.parameter_number] = None  # type: ignore[call-overload]  # gaps hold None
            while self.parameters and self.parameters[-1] is None:
                self.parameters.pop()
        if self.module is not None:
            self.module.names.release(instr.name)
        instr.parent = None

    def replace(self, old: Instruction, new: Instruction) -> Instruction:
        """Put `new` (added here if not yet) in place of `old` and erase `old`: its users, its
        root role and its control edges (both ways) move to `new`."""
        if new.parent is None:
            self.add(new, before=old)
        old.replace_all_uses_with(new)
        old.move_control_successors_to(new)
        old.move_control_predecessors_to(new)
        self.remove(old)
        return new

    def discard(self) -> None:
        """Break the reference cycles inside a computation nobody will use again (its
        instructions' operand, user and control edges, their callees and parent), so that
        reference counting frees it at once rather than the cyclic collector (Module.discard;
        the partitioner, for the computations it replaced).  Pending insertions (a computation
        a pass has worked on may hold some not yet folded into the order) are reached too,
        without folding."""
        for instr in self._unordered():
            instr.operands = ()
            instr._users = None
            instr.control_predecessors = NO_CONTROL_EDGES
            instr.control_successors = NO_CONTROL_EDGES
            instr.called = NO_CALLS
            instr.parent = None
        self._instructions = {}
        self.parameters = []
        self.root = None
        self.module = None

    # ----------------------------------------------------------- traversal --
    def post_order(self) -> list[Instruction]:
        """Operands (and control predecessors) before users; ties keep stored order."""
        stored = self._instructions
        if self._is_topological(stored):
            # The walk below would emit the stored order unchanged: when it starts from an
            # instruction, everything before it is emitted and so are its operands.
            return list(stored)
        order: list[Instruction] = []
        state: dict[Instruction, int] = {}
        for start in self._instructions:
            if start in state:
                continue
            stack = [(start, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    if state.get(node) != 2:
                        state[node] = 2
                        order.append(node)
                    continue
                if state.get(node):
                    continue
                state[node] = 1
                stack.append((node, True))
                preds = node.operands
                if node.control_predecessors:
                    preds = (*preds, *node.control_predecessors)
                for op in reversed(preds):
                    if op.parent is self and not state.get(op):
                        stack.append((op, False))
        return order

    def _is_topological(self, stored: dict[Instruction, None]) -> bool:
        """Does every operand and control predecessor in this computation come before its user
        in `stored`?  (Most computations are stored so: the parser and the passes add operands
        first.)"""
        seen: set[Instruction] = set()
        add = seen.add
        for instr in stored:
            for op in instr.operands:
                if op not in seen and op.parent is self:
                    return False
            if instr.control_predecessors:
                for op in instr.control_predecessors:
                    if op not in seen and op.parent is self:
                        return False
            add(instr)
        return True

    def sort_topologically(self) -> None:
        self._instructions = dict.fromkeys(self.post_order())

    def find(self, name: str) -> Instruction | None:
        for instr in self._instructions:
            if instr.name == name:
                return instr
        return None

    def parameter_shapes(self) -> list[Shape]:
        return [p.shape for p in self.parameters]

    def __repr__(self) -> str:
        return f"<computation {self.name}: {len(self)} instructions>"
