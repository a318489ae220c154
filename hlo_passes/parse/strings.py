"""HLO string literals: `"..."` with C escapes, as XLA's lexer reads them (absl::CUnescape).

JSON is close but not the same: HLO strings take `\\'`, `\\?`, `\\x41`, octal `\\101` and raw
control characters, which JSON refuses.
"""

from __future__ import annotations

import re

_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "?": "?", "a": "\a", "b": "\b",
           "f": "\f", "v": "\v"}
_ESCAPE = re.compile(r"\\(?:([ntr\\\"'?abfv])|x([0-9a-fA-F]{1,2})|([0-7]{1,3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.?))",
                     re.S)


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
        if hex_:
            return chr(int(hex_, 16))
        if octal:
            return chr(int(octal, 8) & 0xFF)
        code = int(u4 or u8 or "0", 16) if (u4 or u8) else None
        if code is not None:
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"invalid unicode escape \\u{u4 or u8}")
            return chr(code)
        raise ValueError(f"invalid escape sequence \\{bad} in a string")

    return _ESCAPE.sub(one, body)
