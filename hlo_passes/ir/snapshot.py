"""ComputationSnapshot: a computation's body kept compactly, to be built again (rollback).

The pass manager's rollback policy takes a snapshot of the whole module before each pass it
may undo (collective-fusion: one per sub-pass) and almost always drops it unused.  A
`Module.clone()` as snapshot costs as much memory as the module: each instruction an object
with its own operand list, users and attribute dict, about 450 bytes, which made the
snapshot the largest thing alive while collective-fusion ran on a big partitioned step.

A snapshot keeps, per computation, flat lists of what each instruction is made of (opcode,
shape, name, attribute slots, literal, parameter number, span: immutable values shared with
the module) and its operands as positions in one int array: about 100 bytes an instruction,
and a few objects for the garbage collector where a clone has hundreds of thousands.

`build` makes the instructions in the same order, with the same arguments, as
`Computation._copy_body_from` (what `Module.clone` runs): a module restored from a snapshot
is the module a clone taken at the same time would have given, down to the order of each
instruction's users.

    before = module.snapshot()      # a ModuleSnapshot: one ComputationSnapshot per computation
    ...                             # a pass edits the module, then fails
    module.restore(before)          # the module as it was, in new objects
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Mapping

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module  # cycle: module imports this module

# What an instruction calls, by position in the module's computation list.
CalledIndices = Mapping[str, "int | tuple[int, ...]"]


class ComputationSnapshot:
    """One computation: its header fields and its instructions in post order (operands first)."""

    __slots__ = ("name", "is_entry", "attributes", "print_signature", "span", "opcodes", "shapes", "names",
                 "attribute_items", "rare", "spans", "operand_ends", "operands", "order", "control", "root")

    def __init__(self, comp: Computation, comp_index: dict[Computation, int]):
        self.name = comp.name
        self.is_entry = comp.is_entry
        self.attributes = dict(comp.attributes)
        self.print_signature = comp.print_signature
        self.span = comp.span
        post_order = comp.post_order()
        position = {instr: i for i, instr in enumerate(post_order)}
        self.opcodes = [i.opcode for i in post_order]
        self.shapes = [i.shape for i in post_order]
        self.names = [i.name for i in post_order]
        # Attribute slots as (key, slot, key, slot ...): a tuple holds them in 16 bytes a pair
        # where a dict copy takes ~100 bytes even when empty.
        self.attribute_items: list[tuple[Any, ...]] = [
            tuple(x for item in i.attributes.items() for x in item) if i.attributes else () for i in post_order]
        # Literal, parameter number and callees: few instructions have any.
        self.rare: list[tuple[str | None, int | None, CalledIndices | None] | None] = [
            (i.literal, i.parameter_number, _called_indices(i, comp_index) if i.called else None)
            if i.literal is not None or i.parameter_number is not None or i.called else None
            for i in post_order]
        self.spans = [i._span for i in post_order]
        ends = array("i")
        operands = array("i")
        for instr in post_order:
            operands.extend(position[o] for o in instr.operands)  # operands are earlier in post order
            ends.append(len(operands))
        self.operand_ends = ends
        self.operands = operands
        order = comp._instructions
        self.order = array("i", (position[i] for i in order))
        # (instruction, predecessor) pairs in the order `_copy_body_from` adds them.
        self.control = array("i", (x for instr in order for pred in instr.control_predecessors
                                   for x in (position[instr], position[pred])))
        self.root = position[comp.root] if comp.root is not None else -1

    def new_computation(self) -> Computation:
        """The computation with its header fields and no instructions yet (`fill` adds them,
        once every computation of the module exists)."""
        comp = Computation(self.name, is_entry=self.is_entry)
        comp.attributes = dict(self.attributes)
        comp.print_signature = self.print_signature
        comp.span = self.span
        return comp

    def fill(self, comp: Computation, computations: list[Computation]) -> None:
        """Make the instructions into `comp` (from `new_computation`); `computations` are the
        restored module's, by the positions the snapshot recorded callees at."""
        made: list[Instruction] = []
        operands, ends = self.operands, self.operand_ends
        start = 0
        for i, opcode in enumerate(self.opcodes):
            end = ends[i]
            items = self.attribute_items[i]
            rare = self.rare[i]
            literal, parameter_number, called = rare if rare is not None else (None, None, None)
            new = Instruction(opcode, self.shapes[i], [made[j] for j in operands[start:end]], name=self.names[i],
                              attributes=dict(zip(items[::2], items[1::2])) if items else None,
                              called=_callees(called, computations) if called else None,
                              literal=literal, parameter_number=parameter_number, span=self.spans[i])
            new.parent = comp
            made.append(new)
            if opcode is Opcode.PARAMETER:
                comp._register_parameter(new)
            start = end
        comp._instructions = dict.fromkeys(made[i] for i in self.order)
        control = self.control
        for k in range(0, len(control), 2):
            made[control[k]].add_control_predecessor(made[control[k + 1]])
        comp.root = made[self.root] if self.root >= 0 else None


def _called_indices(instr: Instruction, comp_index: dict[Computation, int]) -> CalledIndices:
    return {key: tuple(comp_index[c] for c in value) if isinstance(value, tuple) else comp_index[value]
            for key, value in instr.called.items()}


def _callees(called: CalledIndices, computations: list[Computation]) -> dict[str, Any]:
    return {key: tuple(computations[c] for c in value) if isinstance(value, tuple) else computations[value]
            for key, value in called.items()}


class ModuleSnapshot:
    """A module's header (in `header`: a module with no computations, its attributes, debug
    tables and print style copied) and its computations' snapshots, in module order."""

    __slots__ = ("header", "computations", "entry")

    def __init__(self, header: "Module", computations: list[ComputationSnapshot], entry: int):
        self.header = header
        self.computations = computations
        self.entry = entry  # position of the entry computation, -1 for none
