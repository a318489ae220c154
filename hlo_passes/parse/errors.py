"""The one error type a user sees for bad HLO text: `file:line:col: error: ...`.

The message, the source line shown under it and the caret are bounded: a 10 MB
line shows a window of `MAX_SHOWN_LINE` characters around the column, and a
message quoting huge text is cut, so one bad file cannot flood a terminal.
"""

from __future__ import annotations

from typing import Any, Protocol

from hlo_passes.ir.source import SourceSpan
from hlo_passes.parse.limits import MAX_SHOWN_LINE

MAX_MESSAGE = 2000


class HloParseError(Exception):
    """Malformed or inconsistent HLO text, with its position and the source line."""

    def __init__(self, message: str, *, filename: str = "<input>", line: int = 0, column: int = 0,
                 source_line: str = ""):
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE:,} more characters)"
        self.message = message
        self.filename = filename
        self.line = line
        self.column = column
        self.source_line = source_line
        super().__init__(self.format())

    def format(self) -> str:
        head = f"{self.filename}:{self.line}:{self.column}: error: {self.message}"
        if self.line == 0:
            return head
        shown, caret_at = window(self.source_line, self.column - 1)
        return f"{head}\n{shown.translate(_LINE_BREAKING)}\n{' ' * caret_at}^"


# Characters str.splitlines() (and many terminals) break a line at, other than LF: shown as a space
# in the quoted source line, so that the caret stays under its column on the line below.
_LINE_BREAKING = str.maketrans({c: " " for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def window(line: str, index: int, width: int = MAX_SHOWN_LINE) -> tuple[str, int]:
    """(at most `width` characters of `line` around `index`, the index within them); cut ends
    are marked with '...'."""
    if len(line) <= width:
        return line, max(index, 0)
    start = max(0, min(index - width // 2, len(line) - width))
    end = start + width
    shown = line[start:end]
    caret = index - start
    if start > 0:
        shown = "..." + shown
        caret += 3
    if end < len(line):
        shown += "..."
    return shown, max(caret, 0)


class TokenLike(Protocol):
    """What the parser reads of a token: a lark Token, or the line scanner's lighter one."""

    @property
    def type(self) -> str: ...

    @property
    def value(self) -> Any: ...  # the token's text (a str)

    @property
    def start_pos(self) -> int | None: ...

    @property
    def end_pos(self) -> int | None: ...


class SemanticError(Exception):
    """Raised inside the parser's callbacks; turned into HloParseError with the position: the
    span of an instruction already built, else the token's offset, else `pos`."""

    def __init__(self, message: str, token: TokenLike | None = None, pos: int | None = None, *,
                 span: SourceSpan | None = None):
        super().__init__(message)
        self.message = message
        self.token = token
        self.pos = pos
        self.span = span


def position_of(text: str, pos: int) -> tuple[int, int, str]:
    """(line, column, source line) of character offset `pos`, 1-based."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    if end < 0:
        end = len(text)
    return line, pos - start + 1, text[start:end]


def line_at(text: str, line: int) -> str:
    """The text of line `line` (1-based) of `text`, without its newline ("" past the end)."""
    start = 0
    for _ in range(line - 1):
        start = text.find("\n", start) + 1
        if start == 0:
            return ""
    end = text.find("\n", start)
    return text[start:end if end >= 0 else len(text)]
