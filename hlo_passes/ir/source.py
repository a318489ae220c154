"""SourceSpan: where in HLO text an instruction or a computation was read from.

The parser gives every instruction it reads the position of its name (`ROOT %add.3 = ...` points
at `add.3`), nested operands and `%t#1` elements the position of their opcode or reference, and
every computation the position of its name in its header.  Instructions a pass creates have no
span (None); `Module.clone` and `Module.clone_computation` keep them.  Spans are never printed:
printed text does not depend on where a module came from.  Diagnostics on a parsed instruction
(the parser's checks after reading, the verifier's errors) say `file:line:col` from its span.
"""

from __future__ import annotations

from typing import NamedTuple


class SourceSpan(NamedTuple):
    """`file:line:column` (1-based) of the start of an instruction or computation's name.

    One per parsed instruction, so it is small: a named tuple (64 bytes, like the plain tuple
    the parser stores, see SpanFields), the file name shared by every span of a parse, no end
    position (an error shows the source line and a caret at the start)."""

    file: str | None  # None: text with no file name (a string, stdin)
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file or '<input>'}:{self.line}:{self.column}"


# A span's fields as a plain tuple: what the parser hands an Instruction (a plain tuple costs a
# quarter of a SourceSpan to make, once per instruction of a big dump); `Instruction.span`
# names it on first read.
SpanFields = tuple[str | None, int, int]
