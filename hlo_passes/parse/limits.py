"""Explicit bounds on what one HLO text may ask of the parser.

XLA's parser reads integers as int64 and recurses up to its own depth limit; a
Python parser also has to keep small inputs from asking for huge allocations
(`parameter(99999999999999999999)`, replica groups over 10^9 devices).  Every
limit is reported as a `file:line:col` error naming it.

    MAX_NESTING      operands nested inside operands (`negate(negate(...))`)
    MAX_TUPLE_DEPTH  tuple shapes inside tuple shapes (and so tuple constants)
    MAX_DEVICES      devices a sharding, replica-group list or mesh may name
    INT64_MIN/MAX every integer in the text (as XLA's lexer reads them)
"""

from __future__ import annotations

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

# XLA's parser accepts about 1,000 levels of nested operands; so does ours (built without
# recursion).
MAX_NESTING = 1000

# Shapes are frozen values whose hash, equality and printing recurse through C code, which
# Python bounds at a few hundred levels; XLA reads deeper tuples, hlo-passes stops here.
MAX_TUPLE_DEPTH = 256

# The largest device count a sharding, a replica-group list or a mesh may describe: iota
# forms expand to one entry per device, so 2^31 devices would be tens of GB.  A million
# covers every machine XLA targets today.
MAX_DEVICES = 1 << 20

# The most characters of a token quoted back in an error message, and of the source line
# shown under it (a 10 MB line must not become 50 MB of stderr).
MAX_QUOTED = 80
MAX_SHOWN_LINE = 240


def parse_int64(text: str) -> int:
    """An integer token as XLA reads it: ASCII digits, optional '-', within int64 (unsigned
    64-bit values are read as their two's complement, as XLA's lexer does)."""
    body = text[1:] if text.startswith("-") else text
    if not body or len(body) > 20 or not body.isascii() or not body.isdigit():
        raise ValueError(f"expects an integer, got {quote(text)}")
    value = int(text)
    if INT64_MIN <= value <= INT64_MAX:
        return value
    if 0 <= value <= UINT64_MAX:
        return value - (1 << 64)
    raise ValueError(f"integer {quote(text)} is out of range for a 64-bit integer")


def quote(text: str, limit: int = MAX_QUOTED) -> str:
    """`text` in quotes for a message, cut to `limit` characters."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return repr(text)
