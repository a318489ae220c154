"""Shapes and layouts from the grammar's parse of them, checked as XLA's parser checks them.

Shared by the module builder (inline, while the LALR parser reads a module) and by
`parse_shape`, which the line scanner and the readers of shapes inside attribute values
(`operand_layout_constraints=`, `literal=`) use.

    f32[2,<=4]{1,0:T(8,128)S(1)}    dimensions >= 0 and within int64; a layout names one
                                     entry per dimension; its extras come in XLA's order
                                     D(..) T(..)(..) L(..) #(..) *(..) E(..) S(..) SC(..) M(..)
    f32[2]{0:P(f32[2])}             rejected: a physical shape is for sparse arrays only
    token[2]                        rejected: token and opaque are scalars
"""

from __future__ import annotations

import functools
import re
from typing import Any, cast

import lark

from hlo_passes.ir.shape import ArrayShape, Layout, Shape, TupleShape
from hlo_passes.ir.types import PRIMITIVE_TYPES_BY_NAME
from hlo_passes.parse.errors import SemanticError
from hlo_passes.parse.grammar import InlineParser
from hlo_passes.parse.limits import INT64_MAX, MAX_TUPLE_DEPTH, parse_int64

_INT = r"\s*-?[0-9]+\s*"
_LAYOUT_EXTRAS = re.compile(rf"""\s*
    (?:D\(\s*(?:[DCSH]\+?~?(?:\s*,\s*[DCSH]\+?~?)*)?\s*\)\s*)?
    (?:T(?:\(\s*(?:(?:-?[0-9]+|\*)\s*(?:,\s*(?:-?[0-9]+|\*)\s*)*)?\))+\s*)?
    (?:L\({_INT}\)\s*)?
    (?:\#\(\s*[a-z][a-z0-9]*\s*\)\s*)?
    (?:\*\(\s*[a-z][a-z0-9]*\s*\)\s*)?
    (?:E\({_INT}\)\s*)?
    (?:S\({_INT}\)\s*)?
    (?:SC(?:\({_INT}:\s*(?:-?[0-9]+\s*(?:,\s*-?[0-9]+\s*)*)?\))+\s*)?
    (?:M\({_INT}\)\s*)?""", re.X)


_NEGATIVE_TILE = re.compile(r"(?:^|[\s)])T(?:\([^()]*\))*\([^()]*?(-[0-9]+)")


def _int(token: lark.Token) -> int:
    try:
        return parse_int64(token.value)
    except ValueError as e:
        raise SemanticError(str(e), token) from None


def _size(token: lark.Token, what: str) -> int:
    """A dimension size or bound: within int64 (parse_int64 would read 2^63..2^64-1 as negative)."""
    size = _int(token)
    if size < 0:
        if not token.value.startswith("-"):
            raise SemanticError(f"{what} {token.value} exceeds the largest 64-bit integer (2^63-1)", token)
        raise SemanticError(f"{what} {size} is negative", token)
    return size


def check_layout_extras(extras: str) -> str | None:
    """Why XLA's parser would reject the text after ':' in a layout, or None."""
    if re.search(r"(?:^|[\s)])P\(", extras):
        return "layout has a physical shape, but is not for a sparse array"
    negative = _NEGATIVE_TILE.search(extras)
    if negative is not None:  # XLA aborts the process on one
        return (f"tile dimension {negative.group(1)} is negative: a tile dimension is a size, or '*' to "
                "combine dimensions")
    if not _LAYOUT_EXTRAS.fullmatch(extras):
        return (f"cannot read layout attributes {extras.strip()!r}: expected D(dim level types: D, C, S or H), "
                "T(tile)..., L(n), #(type), *(type), E(bits), S(memory space), SC(split), M(bytes), in this order")
    return None


class ShapeBuilder(lark.Transformer[lark.Token, Any]):
    """Transformer callbacks for the grammar's shape rules (array, tuple, layout, dims)."""

    def __init__(self) -> None:
        super().__init__(visit_tokens=False)

    def static_dim(self, c: list[lark.Token]) -> tuple[int, bool, bool]:
        return _size(c[0], "dimension size"), False, False

    def bounded_dim(self, c: list[lark.Token]) -> tuple[int, bool, bool]:
        return _size(c[0], "dimension bound"), True, False

    def unbounded_dim(self, c: list[lark.Token]) -> tuple[int, bool, bool]:
        return -1, False, True

    def layout(self, c: list[lark.Token]) -> Layout:
        tok = c[0]
        body = tok.value[1:-1]
        m2m, colon, extras = body.partition(":")
        if not m2m.strip() and not colon:
            raise SemanticError("expects a layout (minor-to-major dimensions) inside '{}'", tok)
        items = [x.strip() for x in m2m.split(",")] if m2m.strip() else []
        if any(not x for x in items):
            raise SemanticError(f"cannot read layout {tok.value!r}", tok)
        try:
            dims = tuple(parse_int64(x) for x in items)
        except ValueError as e:
            raise SemanticError(f"cannot read layout: {e}", tok) from None
        if colon:
            problem = check_layout_extras(extras)
            if problem is not None:
                raise SemanticError(problem, tok)
        return Layout(dims, extras)

    def array_shape(self, c: list[Any]) -> ArrayShape:
        type_tok = c[0]
        etype = PRIMITIVE_TYPES_BY_NAME.get(type_tok.value)
        if etype is None:
            raise SemanticError(f"unknown element type '{type_tok.value}'", type_tok)
        layout = c[-1] if c and isinstance(c[-1], Layout) else None
        dims = [d for d in c[1:] if isinstance(d, tuple)]
        if dims and not etype.is_array:
            raise SemanticError(f"{etype.value} is a scalar type; it takes no dimensions", type_tok)
        if layout is not None and len(layout.minor_to_major) != len(dims):
            raise SemanticError(f"Dimensions size is {len(dims)}, but minor to major size is "
                                f"{len(layout.minor_to_major)}", type_tok)
        if layout is not None and any(not 0 <= d < len(dims) for d in layout.minor_to_major):
            raise SemanticError(f"layout {layout.to_hlo()} names a dimension outside 0..{len(dims) - 1}", type_tok)
        return ArrayShape(etype, tuple(d[0] for d in dims),
                          tuple(d[1] for d in dims) if any(d[1] for d in dims) else (),
                          layout, tuple(d[2] for d in dims) if any(d[2] for d in dims) else ())

    def tuple_shape(self, c: list[Shape]) -> TupleShape:
        if any(type(e) is TupleShape for e in c) and 1 + max(depth(e) for e in c) > MAX_TUPLE_DEPTH:
            raise SemanticError(f"tuple shapes are nested more than {MAX_TUPLE_DEPTH} deep (MAX_TUPLE_DEPTH)")
        return TupleShape(tuple(c))


def depth(shape: Shape) -> int:
    """How many tuples deep a shape nests (0 for an array), without recursion."""
    best, stack = 0, [(shape, 0)]
    while stack:
        s, d = stack.pop()
        if type(s) is TupleShape:
            best = max(best, d + 1)
            stack.extend((e, d + 1) for e in s.elements)
    return best


@functools.cache
def _shape_parser() -> InlineParser:
    """The grammar's `shape` rule read by a ShapeBuilder, shared by every parse: ShapeBuilder keeps
    no state and InlineParser is reentrant, so threads may use it at once."""
    return InlineParser(ShapeBuilder())


# Shape text -> Shape, shared by every parse: shapes are frozen values, and a model repeats a
# few hundred shape spellings tens of thousands of times (and across the files of a dump).
# Failures are not cached (lru_cache does not keep exceptions).
@functools.lru_cache(maxsize=1 << 16)
def parse_shape(text: str) -> Shape:
    """The Shape spelled `text` (SemanticError or a lark UnexpectedInput when it does not read).

    Read without a parse tree, so a deeply nested tuple is refused at MAX_TUPLE_DEPTH rather
    than recursing."""
    return cast(Shape, _shape_parser().parse(text, "shape"))


__all__ = ["INT64_MAX", "ShapeBuilder", "check_layout_extras", "depth", "parse_shape"]
