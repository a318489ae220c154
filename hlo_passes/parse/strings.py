"""HLO string literals: `"..."` with C escapes, as XLA's lexer reads them (absl::CUnescape).

JSON is close but not the same: HLO strings take `\\'`, `\\?`, `\\x41`, octal `\\101` and raw
control characters (and raw newlines), which JSON refuses.
"""

from __future__ import annotations

import re

_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "?": "?", "a": "\a", "b": "\b",
           "f": "\f", "v": "\v"}
# absl::CUnescape, which XLA's lexer applies to a string: `\x` and `\X` take every hex digit that
# follows (`\x41b` is 0x41b, too large for a byte), octal takes up to three digits, each at most
# 0xff; `\u` takes exactly 4 hex digits, `\U` exactly 8 (a code point, not a surrogate).
_ESCAPE = re.compile(r"\\(?:([ntr\\\"'?abfv])|[xX]([0-9a-fA-F]*)|([0-7]{1,3})|u([0-9a-fA-F]{0,4})"
                     r"|U([0-9a-fA-F]{0,8})|(.?))", re.S)


def unquote(text: str) -> str:
    """The value of a quoted HLO string; ValueError for an escape XLA's lexer refuses."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError(f"expects a quoted string, got {text[:40]!r}")
    body = text[1:-1]
    if "\\" not in body:
        return body

    def one(m: re.Match[str]) -> str:
        simple, hex_, octal, u4, u8, bad = m.groups()
        if simple:
            return _SIMPLE[simple]
        if hex_ is not None:
            if not hex_:
                raise ValueError("\\x in a string must be followed by hex digits")
            value = int(hex_, 16)
            if value > 0xFF:
                raise ValueError(f"value of \\x{hex_} exceeds 0xff (\\x takes every hex digit that follows)")
            return chr(value)
        if octal:
            value = int(octal, 8)
            if value > 0xFF:
                raise ValueError(f"value of \\{octal} exceeds 0xff")
            return chr(value)
        if u4 is not None or u8 is not None:
            digits, width = (u4, 4) if u4 is not None else (u8, 8)
            letter = "u" if width == 4 else "U"
            if len(digits) != width:
                raise ValueError(f"\\{letter} in a string must be followed by {width} hex digits")
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"invalid unicode escape \\{letter}{digits}")
            return chr(code)
        raise ValueError(f"invalid escape sequence \\{bad} in a string")

    return _ESCAPE.sub(one, body)
