"""The pieces the grammar's callbacks and the line scanner hand to the module builder.

Both parser paths (the Lark grammar, inline, and the line scanner) produce these and the
builder (module_parser.ModuleBuilder) consumes them; each is a small immutable record,
told apart by its type:

    f32[4] p            TypedOperand(shape, ref)            an operand with its shape written
    negate(x)           NestedOperand(None, opcode, [x])    an instruction written as an operand
    {1, 2}              TextRange(start, end)               a literal (or a bracket group), by offsets
    (p: f32[]) -> f32[] Signature([(p, f32[])], f32[])
    ENTRY %e (...) {    ComputationHeader(True, e, Signature, span of e)
    HloModule m, k=v    ModuleHeader(m, [(k, Attr)])
    FileNames 1 "a.py"  DebugTable("file_names", {1: "a.py"})
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.source import SpanFields
from hlo_passes.parse.errors import TokenLike

# An operand as read: a name (a lark Token, the line scanner's Token, or a str), an instruction
# already resolved (the line scanner resolves names defined above), or one of the records below.
Operand = Any


class TextRange(NamedTuple):
    """Offsets [start, end) of a piece of the text being read: a literal, a bracket group."""

    start: int
    end: int


class TypedOperand(NamedTuple):
    """`f32[4]{0} p`: an operand written with its shape (which must agree with p's)."""

    shape: Shape
    ref: Operand  # a name, or the instruction it names


class NestedOperand(NamedTuple):
    """`f32[4] negate(p)` or `negate(p)`: an anonymous instruction written in place of an operand."""

    shape: Shape | None  # None: inferred from its operands
    opcode: TokenLike
    operands: list[Operand]


class ParsedInstruction(NamedTuple):
    """One instruction line, built: the instruction and whether the line was marked ROOT."""

    instr: Instruction
    is_root: bool


class Signature(NamedTuple):
    """`(p: f32[4], q: s32[]) -> f32[4]` of a computation header."""

    parameters: Sequence[tuple[TokenLike, Shape]]
    result: Shape


class ComputationHeader(NamedTuple):
    """`ENTRY %name (signature) {`, and where its name is."""

    is_entry: bool
    name: TokenLike
    signature: Signature | None
    span: SpanFields


class ModuleHeader(NamedTuple):
    """`HloModule name, key=value, ...`."""

    name: TokenLike
    attributes: list[tuple[TokenLike, Attr]]


class DebugTable(NamedTuple):
    """One of the FileNames / FunctionNames / FileLocations / StackFrames tables of newer dumps;
    `key` is the DebugTables field it fills."""

    key: str
    rows: dict[int, Any]


class TableRecord(NamedTuple):
    """`3 {file_name_id=1 line=2 ...}`: a FileLocations or StackFrames row, with its number's token."""

    number: int
    fields: dict[str, int]
    token: TokenLike


class AsyncChain(NamedTuple):
    """What an async-start begins and its -update/-done must continue."""

    wrapped: Opcode
    computation: Computation
    thread: str
