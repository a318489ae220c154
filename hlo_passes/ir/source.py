"""SourceSpan: where in HLO text an instruction or a computation was read from.

The parser gives every instruction it reads the position of its name (`ROOT %add.3 = ...` points
at `add.3`), nested operands and `%t#1` elements the position of their opcode or reference, and
every computation the position of its name in its header.  Instructions a pass creates have no
span (None); `Module.clone` and `Module.clone_computation` keep them.  Spans are never printed:
printed text does not depend on where a module came from.  Diagnostics on a parsed instruction
(the parser's checks after reading, the verifier's errors) say `file:line:col` from its span.
"""

from __future__ import annotations

from typing import NamedTuple, cast


class SourceSpan(NamedTuple):
    """`file:line:column` (1-based) of the start of an instruction or computation's name.

    Made when a span is read (diagnostics); the parser stores an instruction's as one packed
    int (see SpanFields), and the file name is shared by every span of a parse.  No end
    position: an error shows the source line and a caret at the start."""

    file: str | None  # None: text with no file name (a string, stdin)
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file or '<input>'}:{self.line}:{self.column}"


# A span as the parser stores it on an instruction: one int packing the file (its number in
# `_FILES`), the line and the column.  One per parsed instruction, so it is small: 32 bytes,
# where a (file, line, column) tuple took 64 and its line number 32 more.  Values past the
# fields' widths (a 16-million-line file, a column past a million) are stored as that tuple
# instead; `Instruction.span` names either as a SourceSpan on first read.
SpanFields = int | tuple[str | None, int, int]
_COLUMN_BITS, _LINE_BITS, _FILE_BITS = 20, 24, 16  # 60 bits: a two-digit int
COLUMN_LIMIT = 1 << _COLUMN_BITS

# The file names spans were read from, numbered in the order first seen.  A name table, not
# state: a number means the same file for the whole process (two threads adding one name at
# once may give it two numbers, which name the same file).
_FILES: list[str | None] = [None]
_FILE_NUMBERS: dict[str | None, int] = {None: 0}


def file_base(file: str | None) -> int | None:
    """What every packed span of `file` starts from; None when the process has read more
    files than the packing numbers (their spans are tuples)."""
    number = _FILE_NUMBERS.get(file)
    if number is None:
        if len(_FILES) >= 1 << _FILE_BITS:
            return None
        number = len(_FILES)
        _FILES.append(file)
        _FILE_NUMBERS[file] = number
    return number << (_LINE_BITS + _COLUMN_BITS)


def line_base(file_base: int | None, line: int) -> int | None:
    """What every packed span on `line` starts from: the span of a column below COLUMN_LIMIT
    is this plus the column.  None when the line does not fit (store tuples)."""
    if file_base is None or line >= 1 << _LINE_BITS:
        return None
    return file_base | line << _COLUMN_BITS


def pack_span(file: str | None, line: int, column: int) -> SpanFields:
    """`file:line:column` as stored."""
    base = line_base(file_base(file), line)
    return base | column if base is not None and column < COLUMN_LIMIT else (file, line, column)


def unpack_span(span: SpanFields) -> SourceSpan:
    if type(span) is int:
        return SourceSpan(_FILES[span >> (_LINE_BITS + _COLUMN_BITS)], span >> _COLUMN_BITS & ((1 << _LINE_BITS) - 1),
                          span & (COLUMN_LIMIT - 1))
    return SourceSpan._make(cast("tuple[str | None, int, int]", span))
