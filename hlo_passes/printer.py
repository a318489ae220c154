"""IR → HLO text that XLA's parser accepts.

Deterministic: print → parse → print gives the same bytes.  Computations print
callees first, as XLA's parser needs them.  Attributes parsed
from text print their original text; attributes set by passes print from their
typed values.  Called computations and control predecessors print from the IR
objects, so renaming a computation needs no text edits.  Instructions print in
a stable post-order (operands first, stored order otherwise), so instructions
that a pass appended still come after their operands.
"""

from __future__ import annotations

import gc
import io
from typing import TextIO

from hlo_passes.ir.attributes import quote
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import CALLED_COMPUTATION_KEYS, Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Layout, TupleShape


_OPCODE_TEXT = {op: op.value for op in Opcode}


def print_module(module: Module) -> str:
    out = io.StringIO()
    write_module(module, out)
    return out.getvalue()


def write_module(module: Module, out: TextIO) -> None:
    """`print_module`'s text, written to `out` as it is made: a big module's text (as large
    as the module's file, twice that while a string of it is built) need not be held whole."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # printing allocates many short strings and no cycles
    try:
        _Printer(module, out).module()
    finally:
        if gc_was_enabled:
            gc.enable()


def print_instruction(instr: Instruction) -> str:
    """One instruction's line as `print_module` writes it (for diagnostics)."""
    module = instr.parent.module if instr.parent is not None and instr.parent.module is not None else Module("")
    return _Printer(module, io.StringIO()).instruction(instr)


class _Printer:
    def __init__(self, module: Module, out: TextIO):
        self.m = module
        self.out = out
        self.pct = "%" if module.style.percent_names else ""
        self.operand_shapes = module.style.operand_shapes

    def module(self) -> None:
        m, w = self.m, self.out.write
        header = [f"HloModule {m.name}"]
        for key, attr in self._header_attrs():
            header.append(f"{key}={attr}")
        w(", ".join(header) + "\n\n")
        self.tables()
        order = callees_first(m.computations)
        for i, comp in enumerate(order):
            self.computation(comp)
            w("\n" if i < len(order) - 1 else "")

    def _header_attrs(self):
        # cycle: parse.module_parser runs the verifier, which prints with this module (this edge
        # is the one kept local: the printer should not load the parser)
        from hlo_passes.parse.module_parser import entry_signature

        m = self.m
        for key, attr in m.attributes.items():
            if key == "entry_computation_layout" and m.entry is not None and (
                    attr.raw is None or entry_signature(m) != m.parsed_entry_signature):
                yield key, entry_computation_layout(m)
            else:
                yield key, attr.text(key)

    def tables(self) -> None:
        t, w = self.m.tables, self.out.write
        if not t:
            return
        for title, rows in (("FileNames", t.file_names), ("FunctionNames", t.function_names)):
            if rows:
                w(title + "\n" + "".join(f"{k} {quote(v)}\n" for k, v in rows.items()) + "\n")
        for title, rows in (("FileLocations", t.file_locations), ("StackFrames", t.stack_frames)):
            if rows:
                w(title + "\n")
                for k, fields in rows.items():
                    w(f"{k} {{" + " ".join(f"{f}={v}" for f, v in fields.items()) + "}\n")
                w("\n")
        w("\n")

    def computation(self, comp: Computation) -> None:
        w, pct = self.out.write, self.pct
        head = ("ENTRY " if comp.is_entry else "") + pct + comp.name
        if comp.print_signature:
            params = ", ".join(f"{p.name}: {p.shape.to_hlo(False)}" for p in comp.parameters)
            head += f" ({params}) -> {comp.root.shape.to_hlo(False)}"
        w(head + " {\n")
        for instr in comp.post_order():
            w("  " + self.instruction(instr) + "\n")
        tail = "".join(f", {k}={a.text(k)}" for k, a in comp.attributes.items())
        w("}" + tail + "\n")

    def instruction(self, instr: Instruction) -> str:
        pct = self.pct
        opcode = instr.opcode
        if opcode is Opcode.CONSTANT:
            operands = instr.literal
        elif opcode is Opcode.PARAMETER:
            operands = str(instr.parameter_number)
        elif self.operand_shapes:
            operands = ", ".join(f"{o.shape.to_hlo()} {pct}{o.name}" for o in instr.operands)
        else:
            operands = ", ".join([pct + o.name for o in instr.operands])
        parent = instr.parent
        root = "ROOT " if parent is not None and parent.root is instr else ""
        text = f"{root}{pct}{instr.name} = {instr.shape.to_hlo()} {_OPCODE_TEXT[opcode]}({operands})"
        called = instr.called
        attributes = instr._attributes or {}  # (the dict itself: most instructions have none)
        if not called and not instr.control_predecessors:
            if not attributes:
                return text
            return text + "".join([f", {key}={attr.raw if attr.raw is not None else attr.text(key)}"
                                   for key, attr in attributes.items()])
        parts = []
        for key, attr in attributes.items():
            if key in called:
                parts.append(f"{key}={self.called(called[key])}")
            elif key == "control-predecessors" or key in CALLED_COMPUTATION_KEYS:
                continue  # printed from the IR below, or the pass removed the callee
            else:
                parts.append(f"{key}={attr.text(key)}")
        for key, callee in called.items():
            if key not in attributes:
                parts.append(f"{key}={self.called(callee)}")
        if instr.control_predecessors:
            parts.append("control-predecessors={" + ", ".join(pct + p.name for p in instr.control_predecessors) + "}")
        return text + "".join(", " + p for p in parts)

    def called(self, callee) -> str:
        if isinstance(callee, tuple):
            return "{" + ", ".join(self.pct + c.name for c in callee) + "}"
        return self.pct + callee.name


def callees_first(computations: list[Computation]) -> list[Computation]:
    """`computations` with every callee before its callers (XLA's parser reads a computation
    only after the ones it calls); the stored order where it already is so.  Iterative: call
    chains may be long."""
    order: list[Computation] = []
    done: set[int] = set()
    for root in computations:
        if id(root) in done:
            continue
        stack = [(root, iter(_callees(root)))]
        active = {id(root)}
        while stack:
            comp, callees = stack[-1]
            nxt = next(callees, None)
            if nxt is None:
                stack.pop()
                active.discard(id(comp))
                if id(comp) not in done:
                    done.add(id(comp))
                    order.append(comp)
            elif id(nxt) not in done and id(nxt) not in active:
                active.add(id(nxt))
                stack.append((nxt, iter(_callees(nxt))))
    return order


def _callees(comp: Computation) -> list[Computation]:
    out = []
    for instr in comp._instructions:
        if instr.called:
            out.extend(instr.called_computations())
    return out


def entry_computation_layout(module: Module) -> str:
    entry = module.entry
    params = ", ".join(_with_default_layout(p.shape) for p in entry.parameters)
    return "{(" + params + ")->" + _with_default_layout(entry.root.shape) + "}"


def _with_default_layout(shape) -> str:
    if isinstance(shape, TupleShape):
        return "(" + ", ".join(_with_default_layout(e) for e in shape.elements) + ")"
    assert isinstance(shape, ArrayShape)
    if shape.layout is None and shape.element_type.is_array and shape.rank > 0:  # XLA rejects `f32[]{}`
        shape = ArrayShape(shape.element_type, shape.dims, shape.dynamic, Layout.default_for_rank(shape.rank),
                           shape.unbounded)
    return shape.to_hlo()
