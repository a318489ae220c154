"""Constants checked against their shape the way XLA's parser checks them.

A constant's text is kept verbatim in the IR; this module only decides whether
XLA would accept it, and where it would not, says why at the offending token:

* nesting and element counts per dimension (`f32[2,3] constant({1, 2, 3})` has
  rank 1 nesting for a rank 2 shape), `{...}` only at the outer level;
* integers within their type (u4 is 0..15, s4 is -8..7, u64 also takes -1 as
  2^64-1 like XLA's lexer), no decimals for integer types;
* floats that do not overflow their type once rounded to it (f16 takes 65519,
  not 65520; f8e4m3fn saturates nowhere: 465 is out of range), complex parts
  within the component type, values beyond a double are out of range;
* NaN payloads that fit the type's mantissa (`bf16 nan(0x80)` does not), and
  none at all for types without payloads (f8e4m3fn);
* tuple constants element by element.

XLA quirks kept on purpose: a single scalar for an array shape is accepted
(`f32[2] constant(1)`), stray commas inside braces are skipped, and a pred
takes any integer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence, cast

from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.types import PrimitiveType as T
from hlo_passes.parse.limits import INT64_MAX, INT64_MIN, UINT64_MAX, quote
from hlo_passes.parse.shapes import parse_shape


class LiteralProblem(ValueError):
    """A literal XLA would reject; `offset` is where, within the literal's text."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


_TOKEN = re.compile(r"""
    (?P<ws>\s+|/\*.*?\*/)
  | (?P<dots>\.\.\.)
  | (?P<punct>[{}(),])
  | (?P<nan>-?nan(?:\(0x(?P<payload>[0-9a-fA-F]+)\))?(?![A-Za-z0-9_.\-]))
  | (?P<inf>-?inf(?![A-Za-z0-9_.\-]))
  | (?P<decimal>-?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+))
  | (?P<int>-?[0-9]+)(?![A-Za-z0-9_.])
  | (?P<bool>(?:true|false)(?![A-Za-z0-9_.\-]))
""", re.X | re.S)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int
    payload: str | None = None


def tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            bad = re.match(r"\S+", text[pos:])
            raise LiteralProblem(f"unexpected token {quote(bad.group() if bad else text[pos])} in a literal", pos)
        kind = cast(str, m.lastgroup)  # the pattern is all named groups
        if kind == "payload":
            kind = "nan"
        if kind != "ws":
            out.append(_Tok(kind, m.group(kind), pos, m.group("payload")))
        pos = m.end()
    return out


# ------------------------------------------------------------- value ranges --
_INT_BITS = {T.S1: 1, T.S2: 2, T.S4: 4, T.S8: 8, T.S16: 16, T.S32: 32, T.S64: 64,
             T.U1: 1, T.U2: 2, T.U4: 4, T.U8: 8, T.U16: 16, T.U32: 32, T.U64: 64}

# Per floating-point type: the largest finite value, and the smallest magnitude that no
# longer rounds to a finite value (a tie rounds to even, which is infinity/NaN unless the
# largest value has an even mantissa, as f8e4m3fn's 448 has: 464 still rounds to 448).
_FLOAT_LIMITS = {
    T.F16: (65504.0, 65520.0, True),
    T.BF16: ((2 - 2 ** -7) * 2.0 ** 127, (2 - 2 ** -8) * 2.0 ** 127, True),
    T.F32: ((2 - 2 ** -23) * 2.0 ** 127, (2 - 2 ** -24) * 2.0 ** 127, True),
    T.F8E3M4: (15.5, 15.75, True),
    T.F8E4M3: (240.0, 248.0, True),
    T.F8E4M3FN: (448.0, 464.0, False),
    T.F8E4M3FNUZ: (240.0, 248.0, True),
    T.F8E4M3B11FNUZ: (30.0, 31.0, True),
    T.F8E5M2: (57344.0, 61440.0, True),
    T.F8E5M2FNUZ: (57344.0, 61440.0, True),
    T.F8E8M0FNU: (2.0 ** 127, 1.5 * 2.0 ** 127, True),
}
# NaN payload masks (mantissa bits, quiet bit included); types absent here take no payload.
_NAN_PAYLOAD_MASK = {
    T.F64: (1 << 52) - 1, T.F32: (1 << 23) - 1, T.F16: (1 << 10) - 1, T.BF16: (1 << 7) - 1,
    T.F8E5M2: 0b11, T.F8E4M3: 0b111, T.F8E3M4: 0b1111,
}
_QUIET_DOUBLE_PAYLOAD = 1 << 51
_COMPONENT = {T.C64: T.F32, T.C128: T.F64}


def _int_value(tok: _Tok) -> int:
    if len(tok.text.lstrip("-")) > 20:
        raise LiteralProblem(f"integer {quote(tok.text)} does not fit in 64 bits", tok.pos)
    value = int(tok.text)
    if INT64_MIN <= value <= INT64_MAX:
        return value
    if 0 <= value <= UINT64_MAX:  # XLA's lexer reads it as the int64 with the same bits
        return value - (1 << 64)
    raise LiteralProblem(f"integer {quote(tok.text)} does not fit in 64 bits", tok.pos)


def _check_int(tok: _Tok, etype: T) -> None:
    value = _int_value(tok)
    if etype is T.PRED:
        return  # any integer reads as a truth value
    bits = _INT_BITS[etype]
    if etype.is_signed_integer:
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if not low <= value <= high:
            raise LiteralProblem(f"value {tok.text} is out of range for literal's primitive type "
                                 f"{etype.value.upper()} namely [{low}, {high}]", tok.pos)
    else:
        unsigned = value & UINT64_MAX
        high = (1 << bits) - 1
        if unsigned > high:
            raise LiteralProblem(f"value {tok.text} is out of range for literal's primitive type "
                                 f"{etype.value.upper()} namely [0, {high}]", tok.pos)


def _double(tok: _Tok) -> float:
    if tok.kind == "int":
        return float(_int_value(tok))
    if tok.kind == "inf":
        return -math.inf if tok.text.startswith("-") else math.inf
    value = float(tok.text) if len(tok.text) < 400 else math.inf
    if math.isinf(value):
        raise LiteralProblem(f"constant {quote(tok.text)} is out of range for double (+/-1.79769e+308)", tok.pos)
    return value


def _check_nan(tok: _Tok, etype: T) -> None:
    if tok.payload is None:
        return
    if len(tok.payload) > 16:
        raise LiteralProblem(f"NaN payload 0x{tok.payload[:20]} is out of range", tok.pos)
    payload = int(tok.payload, 16)
    if payload == 0 or payload >= (1 << 52):
        raise LiteralProblem(f"NaN payload 0x{tok.payload} is out of range", tok.pos)
    mask = _NAN_PAYLOAD_MASK.get(etype)
    if mask is None:
        if payload != _QUIET_DOUBLE_PAYLOAD:
            raise LiteralProblem(f"tries to set NaN payload 0x{payload:x}, but {etype.value} does not support "
                                 "payloads", tok.pos)
        return
    if payload != _QUIET_DOUBLE_PAYLOAD and payload > mask:
        raise LiteralProblem(f"tries to set NaN payload 0x{payload:x}, but the NaN payload is out of range "
                             f"(0x{mask:x}) for {etype.value}", tok.pos)


def _check_float(tok: _Tok, etype: T) -> None:
    if tok.kind == "nan":
        _check_nan(tok, etype)
        return
    if tok.kind not in ("int", "decimal", "inf"):
        raise LiteralProblem(f"expect floating point value for primitive type: {etype.value.upper()}", tok.pos)
    value = _double(tok)
    limits = _FLOAT_LIMITS.get(etype)
    if limits is None or math.isinf(value):  # f64 (checked by _double), f4e2m1fn (saturates)
        return
    largest, overflow, tie_overflows = limits
    magnitude = abs(value)
    if (etype is T.F8E8M0FNU and value <= 0) or magnitude > overflow or (tie_overflows and magnitude == overflow):
        low = 2.0 ** -127 if etype is T.F8E8M0FNU else -largest
        raise LiteralProblem(f"value {tok.text} is out of range for literal's primitive type "
                             f"{etype.value.upper()} namely [{low:g}, {largest:g}]", tok.pos)


def _check_complex_part(tok: _Tok, etype: T, part: str) -> None:
    if tok.kind == "nan":
        return
    if tok.kind not in ("int", "decimal", "inf"):
        raise LiteralProblem(f"expect floating-point value for {part} part of complex number", tok.pos)
    value = _double(tok)
    if etype is T.C64 and not math.isinf(value) and abs(value) > _FLOAT_LIMITS[T.F32][0]:
        raise LiteralProblem(f"{part} part {tok.text} is out of range for literal's primitive type C64", tok.pos)


# ------------------------------------------------------------------ reader --
class _Reader:
    def __init__(self, toks: list[_Tok], end: int):
        self.toks = toks
        self.i = 0
        self.end = end

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self, what: str) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise LiteralProblem(f"expects {what}, but the literal ends", self.end)
        self.i += 1
        return tok

    def literal(self, shape: Shape) -> None:
        if type(shape) is TupleShape:
            self.tuple(shape)
        else:
            self.dense(shape)  # type: ignore[arg-type]

    def tuple(self, shape: TupleShape) -> None:
        tok = self.next("'(' in front of tuple elements")
        if tok.text != "(":
            raise LiteralProblem("expects '(' in front of tuple elements", tok.pos)
        first = self.peek()
        if first is not None and first.text == ")":
            self.i += 1
            return
        for i, element in enumerate(shape.elements):
            if i > 0:
                tok = self.next("','")
                if tok.text != ",":
                    raise LiteralProblem("expects ',' to separate tuple elements", tok.pos)
            self.literal(element)
        tok = self.next("')'")
        if tok.text != ")":
            raise LiteralProblem(f"expects ')' at the end of the tuple with {len(shape.elements)} elements", tok.pos)

    def dense(self, shape: ArrayShape) -> None:
        etype = shape.element_type
        if not etype.is_array:
            raise LiteralProblem(f"a constant of type {etype.value} has no literal", 0)
        dims, rank = shape.dims, len(shape.dims)
        seen = [0] * rank
        level = 0
        count = 0
        total = math.prod(dims)
        while True:
            tok = self.next("a literal")
            t = tok.text
            if t == "{":
                level += 1
                if level > rank:
                    raise LiteralProblem(f"expects nested array in rank {rank}, but sees larger", tok.pos)
                if level > 1:
                    seen[level - 2] += 1
                    if seen[level - 2] > dims[level - 2]:
                        raise LiteralProblem(f"expects {dims[level - 2]} elements in dimension {level - 2}, "
                                             "but sees more", tok.pos)
            elif t == "}":
                if level == 0:
                    raise LiteralProblem("unexpected '}' token", tok.pos)
                level -= 1
                if seen[level] != dims[level]:
                    raise LiteralProblem(f"expects {dims[level]} elements in dimension {level}, but sees "
                                         f"{seen[level]}", tok.pos)
                seen[level] = 0
            elif t == ",":
                pass
            elif tok.kind == "dots":
                if level != 1:
                    raise LiteralProblem(f"expects `...` at nest level 1, but sees it at nest level {level}", tok.pos)
                seen[0] = dims[0]
            elif t == "(":
                if not etype.is_complex:
                    raise LiteralProblem("unexpected '(' in literal. Parens are only valid for complex literals",
                                         tok.pos)
                self.element(rank, level, seen, dims, tok)
                self.complex_value(etype, tok)
                count += 1
            elif tok.kind in ("int", "decimal", "inf", "nan", "bool"):
                self.element(rank, level, seen, dims, tok)
                if count >= total:
                    raise LiteralProblem(f"tries to set value {tok.text} to a literal in shape "
                                         f"{shape.to_hlo(False)} at linear index {count}, but the index is out "
                                         "of range", tok.pos)
                self.value(etype, tok)
                count += 1
            else:
                raise LiteralProblem(f"unexpected token {quote(t)} in a literal", tok.pos)
            if level == 0:
                return

    def element(self, rank: int, level: int, seen: list[int], dims: Sequence[int], tok: _Tok) -> None:
        # XLA counts elements only when they are nested right, and ignores the verdict on a
        # value outside braces (so `f32[2] constant(1)` reads); a value at the wrong depth
        # inside braces is caught when its brace closes.
        if rank and level == rank:
            seen[rank - 1] += 1
            if seen[rank - 1] > dims[rank - 1]:
                raise LiteralProblem(f"expects {dims[rank - 1]} elements on the minor-most dimension, but "
                                     "sees more", tok.pos)

    def value(self, etype: T, tok: _Tok) -> None:
        if tok.kind == "bool":
            if etype is not T.PRED:
                raise LiteralProblem(f"expects a number for primitive type {etype.value.upper()}, got {tok.text}",
                                     tok.pos)
            return
        if etype is T.PRED or etype.is_integer:
            if tok.kind != "int":
                raise LiteralProblem(f"expects integer for primitive type: {etype.value.upper()}", tok.pos)
            _check_int(tok, etype)
        elif etype.is_float:
            _check_float(tok, etype)
        else:
            raise LiteralProblem(f"unsupported primitive type {etype.value.upper()} (complex values are "
                                 "written (real, imag))", tok.pos)

    def complex_value(self, etype: T, open_tok: _Tok) -> None:
        real = self.next("the real part of a complex number")
        _check_complex_part(real, etype, "real")
        comma = self.next("','")
        if comma.text != ",":
            raise LiteralProblem("expect comma after real part of complex literal", comma.pos)
        imag = self.next("the imaginary part of a complex number")
        _check_complex_part(imag, etype, "imaginary")
        close = self.next("')'")
        if close.text != ")":
            raise LiteralProblem("expect ')' after complex number", close.pos)


def check_literal(text: str, shape: Shape) -> None:
    """Raise LiteralProblem (with the offset in `text`) where XLA would reject `text` as the
    literal of a constant of `shape`."""
    toks = tokens(text)
    reader = _Reader(toks, len(text))
    reader.literal(shape)
    if reader.i < len(toks):
        raise LiteralProblem(f"expects ')' after constant literal, got {quote(toks[reader.i].text)}",
                             toks[reader.i].pos)


def check_shaped_literal(text: str) -> None:
    """A literal preceded by its shape, as custom-call's `literal=s32[2]{0} {1, 2}` writes it, or a
    parenthesised tuple of such literals (XLA's ParseLiteral without a given shape)."""
    stripped = text.strip()
    if stripped.startswith("("):
        if not stripped.endswith(")"):
            raise ValueError(f"expects ')' to close a tuple literal, got {quote(text)}")
        for part in _top_level_split(stripped[1:-1]):
            if part.strip():
                check_shaped_literal(part)
        return
    m = re.match(r"\s*[a-z][a-z0-9]*\[[^\]]*\](?:\{[^{}]*\}(?=\s*[{(\-0-9a-z.]))?", text)
    if m is None:
        raise ValueError(f"expects a shape and a literal, got {quote(text)}")
    try:
        shape = parse_shape(text[:m.end()])
    except Exception:  # noqa: BLE001 - any reading failure of the shape
        raise ValueError(f"expects a shape before the literal, got {quote(text[:m.end()])}") from None
    try:
        check_literal(text[m.end():], shape)
    except LiteralProblem as e:
        raise ValueError(str(e)) from None


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
