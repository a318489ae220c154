"""The one error type a user sees for bad HLO text: `file:line:col: error: ...`."""

from __future__ import annotations


class HloParseError(Exception):
    """Malformed or inconsistent HLO text, with its position and the source line."""

    def __init__(self, message: str, *, filename: str = "<input>", line: int = 0, column: int = 0,
                 source_line: str = ""):
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
        caret = " " * max(self.column - 1, 0) + "^"
        return f"{head}\n{self.source_line}\n{caret}"


class SemanticError(Exception):
    """Raised inside the parser's callbacks; turned into HloParseError with the position."""

    def __init__(self, message: str, token=None, pos: int | None = None):
        super().__init__(message)
        self.message = message
        self.token = token
        self.pos = pos


def position_of(text: str, pos: int) -> tuple[int, int, str]:
    """(line, column, source line) of character offset `pos`, 1-based."""
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    if end < 0:
        end = len(text)
    return line, pos - start + 1, text[start:end]
