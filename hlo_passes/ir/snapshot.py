"""ModuleSnapshot: a module kept compactly, to be built again (rollback).

The pass manager's rollback policy takes a snapshot of the whole module before each pass it
may undo (collective-fusion: one per sub-pass) and almost always drops it unused.  A
`Module.clone()` as snapshot costs as much memory as the module: each instruction an object
with its own operand list, users and attribute dict, about 450 bytes, which made the
snapshot the largest thing alive while collective-fusion ran on a big partitioned step.

A snapshot keeps flat lists, one entry per instruction of the whole module (computation by
computation, each in post order), of what the instruction is made of (opcode, shape, name,
attribute slots as the module's shared attribute dict, literal, parameter number, span:
immutable values shared with the module),
and its operands as positions in one int array: about 120 bytes an instruction, a quarter of
a clone (measured on the partitioned 24-layer GPT step), and a few objects for the garbage
collector where a clone has hundreds of thousands.

`build` makes the instructions in the same order, with the same arguments, as
`Computation._copy_body_from` (what `Module.clone` runs): a module restored from a snapshot
is the module a clone taken at the same time would have given, down to the order of each
instruction's users.

    before = module.snapshot()      # a ModuleSnapshot
    ...                             # a pass edits the module, then fails
    module.restore(before)          # the module as it was, in new objects

A `ComputationsSnapshot` keeps only some computations of a module in the same flat lists, and
the module's list of computation objects beside them: `Module.trial` takes one of the
computations its block may change, and on leaving refills those same computation objects with
new instructions (weight-update-sharding's trial keeps the entry and the update regions, not
the module's thousands of reducers and per-device copies of called computations).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Iterable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction, SharedAttributes
from hlo_passes.ir.opcode import Opcode

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module  # cycle: module imports this module

# What an instruction calls: (key, computation position or tuple of positions, key, ...), by
# position in the module's computation list.
CalledPositions = tuple[Any, ...]


class _ComputationRecord:
    """A computation's header fields, and where its instructions, order and control edges are
    in the snapshot's flat lists."""

    __slots__ = ("position", "name", "is_entry", "attributes", "print_signature", "span", "start", "end",
                 "order_start", "order_end", "control_start", "control_end", "root")

    def __init__(self, comp: Computation, position: int):
        self.position = position  # in the module's list of computations
        self.name = comp.name
        self.is_entry = comp.is_entry
        self.attributes = dict(comp.attributes)
        self.print_signature = comp.print_signature
        self.span = comp.span
        # Set by ModuleSnapshot._take: [start, end) of each range in the snapshot's lists.
        self.start = self.end = self.order_start = self.order_end = self.control_start = self.control_end = 0
        self.root = -1  # the root's post-order position

    def new_computation(self) -> Computation:
        comp = Computation(self.name, is_entry=self.is_entry)
        self.reset(comp)
        return comp

    def reset(self, comp: Computation) -> None:
        """Give `comp` (empty) the header fields it had."""
        comp.name = self.name
        comp.is_entry = self.is_entry
        comp.attributes = dict(self.attributes)
        comp.print_signature = self.print_signature
        comp.span = self.span


class _FlatComputations:
    """The contents of some computations of a module in flat lists (see the module docstring),
    one `_ComputationRecord` each; what their instructions call is kept by position in the
    module's list of computations."""

    __slots__ = ("records", "opcodes", "shapes", "names", "attribute_items", "rare", "spans", "operand_ends",
                 "operands", "order", "control")

    def __init__(self, taken: Iterable[Computation], comp_position: dict[Computation, int]):
        self.records: list[_ComputationRecord] = []
        self.opcodes: list[Opcode] = []
        self.shapes: list[Any] = []
        self.names: list[str] = []
        # Attribute slots as (key, slot, key, slot ...), () for none: a tuple holds them in 16
        # bytes a pair where a dict copy takes ~100 bytes even when empty.
        self.attribute_items: list[SharedAttributes | None] = []  # shared with the module: read-only
        # (literal, parameter number, callees) of the few instructions that have any, else None.
        self.rare: list[tuple[str | None, int | None, CalledPositions | None] | None] = []
        self.spans: list[Any] = []
        self.operand_ends = array("i")  # per instruction: where its operands end in `operands`
        self.operands = array("i")  # positions in the instruction's computation's post order
        self.order = array("i")  # each computation's instruction order, as post-order positions
        self.control = array("i")  # (instruction, predecessor) position pairs
        for comp in taken:
            self._take(comp, comp_position)

    def _take(self, comp: Computation, comp_position: dict[Computation, int]) -> None:
        record = _ComputationRecord(comp, comp_position[comp])
        post_order = comp.post_order()
        position = {instr: i for i, instr in enumerate(post_order)}
        record.start, record.end = len(self.opcodes), len(self.opcodes) + len(post_order)
        self.opcodes += [i.opcode for i in post_order]
        self.shapes += [i.shape for i in post_order]
        self.names += [i.name for i in post_order]
        self.attribute_items += [i.shared_attributes() for i in post_order]
        self.rare += [(i.literal, i.parameter_number, _called_positions(i, comp_position) if i.called else None)
                      if i.literal is not None or i.parameter_number is not None or i.called else None
                      for i in post_order]
        self.spans += [i._span for i in post_order]
        operands, ends = self.operands, self.operand_ends
        base = len(operands)  # ends are counted from the computation's first operand
        for instr in post_order:
            operands.extend(position[o] for o in instr.operands)  # operands are earlier in post order
            ends.append(len(operands) - base)
        order = comp._instructions
        record.order_start = len(self.order)
        self.order.extend(position[i] for i in order)
        record.order_end = len(self.order)
        # (instruction, predecessor) pairs in the order `_copy_body_from` adds them.
        record.control_start = len(self.control)
        self.control.extend(x for instr in order for pred in instr.control_predecessors
                            for x in (position[instr], position[pred]))
        record.control_end = len(self.control)
        record.root = position[comp.root] if comp.root is not None else -1
        self.records.append(record)

    def _fill(self, comp: Computation, record: _ComputationRecord, computations: list[Computation],
              operand_base: int) -> int:
        """Make `record`'s instructions into `comp`; returns where the next computation's
        operands start."""
        made: list[Instruction] = []
        operands, ends = self.operands, self.operand_ends
        start = operand_base
        for k in range(record.start, record.end):
            end = operand_base + ends[k]
            opcode = self.opcodes[k]
            items = self.attribute_items[k]
            rare = self.rare[k]
            literal, parameter_number, called = rare if rare is not None else (None, None, None)
            new = Instruction(opcode, self.shapes[k], [made[j] for j in operands[start:end]], name=self.names[k],
                              attributes=items,
                              called=_callees(called, computations) if called else None,
                              literal=literal, parameter_number=parameter_number, span=self.spans[k])
            new.parent = comp
            made.append(new)
            if opcode is Opcode.PARAMETER:
                comp._register_parameter(new)
            start = end
        comp._instructions = dict.fromkeys(made[i] for i in self.order[record.order_start:record.order_end])
        control = self.control
        for k in range(record.control_start, record.control_end, 2):
            made[control[k]].add_control_predecessor(made[control[k + 1]])
        comp.root = made[record.root] if record.root >= 0 else None
        return start


class ModuleSnapshot(_FlatComputations):
    """A module's header (`header`: a module with no computations, its attributes, debug tables
    and print style copied by `Module.snapshot`) and the contents of all its computations."""

    __slots__ = ("header", "entry")

    def __init__(self, header: "Module", computations: list[Computation], entry: Computation | None):
        comp_position = {comp: k for k, comp in enumerate(computations)}
        super().__init__(computations, comp_position)
        self.header = header
        self.entry = comp_position[entry] if entry is not None else -1

    def build(self) -> "Module":
        """The module, built again: `header` with new computations and instructions."""
        module = self.header
        computations = [r.new_computation() for r in self.records]
        for comp in computations:
            comp.module = module
        operand_base = 0
        for comp, record in zip(computations, self.records):
            operand_base = self._fill(comp, record, computations, operand_base)
        module.computations = computations
        module.entry = computations[self.entry] if self.entry >= 0 else None
        return module


class ComputationsSnapshot(_FlatComputations):
    """Some computations of a module (`taken`), to be put back in place: the module's header
    (as `ModuleSnapshot`'s), its list of computation objects and entry, and the contents of
    the taken computations.  `restore` gives the module back that list (computations added
    since are dropped, removed ones come back) and refills the taken computation objects with
    new instructions, as a clone's; the others are the objects they are, as they are: whoever
    takes the snapshot must not change them (adding computations, or removing any from the
    module, is fine).  Refilled rather than replaced, a taken computation stays the one the
    module's other instructions call."""

    __slots__ = ("header", "computations", "entry")

    def __init__(self, header: "Module", computations: list[Computation], entry: Computation | None,
                 taken: Iterable[Computation]):
        self.header = header
        self.computations = list(computations)
        self.entry = entry
        super().__init__(taken, {comp: k for k, comp in enumerate(computations)})

    def restore(self, module: "Module") -> list[Computation]:
        """Put the taken computations back into their objects and the module's computation list
        back as it was; returns the computations added since (no longer in the module), for the
        caller to discard.  The snapshot must not be used afterwards."""
        kept = set(self.computations)
        added = [comp for comp in module.computations if comp not in kept]
        operand_base = 0
        for record in self.records:
            comp = self.computations[record.position]
            comp.discard()  # what the block left in it: its cycles broken, freed at once
            record.reset(comp)
            comp.module = module
            operand_base = self._fill(comp, record, self.computations, operand_base)
        module.computations = self.computations
        module.entry = self.entry
        return added


def _called_positions(instr: Instruction, comp_position: dict[Computation, int]) -> CalledPositions:
    return tuple(x for key, value in instr.called.items()
                 for x in (key, tuple(comp_position[c] for c in value) if isinstance(value, tuple)
                           else comp_position[value]))


def _callees(called: CalledPositions, computations: list[Computation]) -> dict[str, Any]:
    return {called[k]: tuple(computations[c] for c in called[k + 1]) if isinstance(called[k + 1], tuple)
            else computations[called[k + 1]] for k in range(0, len(called), 2)}
