"""Shapes: arrays (with optional layout and dynamic dimensions) and tuples.

Shapes are frozen values: passes build new ones with `with_dims` / `with_layout`
rather than mutating.  Printing matches XLA's `ShapeUtil::HumanStringWithLayout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hlo_passes.ir.types import PrimitiveType


@dataclass(frozen=True, slots=True)
class Layout:
    """`{1,0}` or `{1,0:T(8,128)S(1)}`: minor-to-major order plus XLA's layout extras kept verbatim."""

    minor_to_major: tuple[int, ...]
    extras: str = ""  # the text after ':' (tiles, memory space, element size), unparsed

    def to_hlo(self) -> str:
        body = ",".join(map(str, self.minor_to_major))
        return "{" + body + (":" + self.extras if self.extras else "") + "}"

    @staticmethod
    def default_for_rank(rank: int) -> "Layout":
        return Layout(tuple(range(rank - 1, -1, -1)))


class Shape:
    """Common base of ArrayShape and TupleShape."""

    __slots__ = ()

    # Class attributes, set by each kind (not properties): every pass asks them of every
    # instruction, propagation millions of times on a big module.
    is_tuple: bool = False
    is_array: bool = False

    def to_hlo(self, with_layout: bool = True) -> str:
        raise NotImplementedError

    def byte_size(self) -> int:
        raise NotImplementedError

    def leaves(self) -> list["ArrayShape"]:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.to_hlo()


@dataclass(frozen=True, slots=True)
class ArrayShape(Shape):
    """`f32[8,<=16]{1,0}`; `token[]` and `opaque[]` are arrays of rank 0 of those types."""

    element_type: PrimitiveType
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()  # per dim: True for `<=N` (bounded dynamic)
    layout: Layout | None = field(default=None, compare=True)
    unbounded: tuple[bool, ...] = ()  # per dim: True for `?`
    _text: str | None = field(default=None, init=False, compare=False, repr=False)
    _bare_text: str | None = field(default=None, init=False, compare=False, repr=False)  # without layout
    is_array = True  # not a field (no annotation): see Shape

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def element_count(self) -> int:
        return math.prod(self.dims)

    def byte_size(self) -> int:
        if not self.element_type.is_array:
            return 0
        return self.element_count * self.element_type.byte_size

    def leaves(self) -> list["ArrayShape"]:
        return [self]

    def with_dims(self, dims: tuple[int, ...] | list[int]) -> "ArrayShape":
        """Same type and layout (kept when the rank is unchanged), new dimensions."""
        dims = tuple(int(d) for d in dims)
        layout = self.layout if self.layout is not None and len(dims) == self.rank else (
            Layout.default_for_rank(len(dims)) if self.layout is not None else None)
        return interned(ArrayShape(self.element_type, dims, (), layout))

    def with_element_type(self, element_type: PrimitiveType) -> "ArrayShape":
        return interned(replace(self, element_type=element_type))

    def without_layout(self) -> "ArrayShape":
        return interned(replace(self, layout=None))

    def with_layout(self, layout: "Layout | None") -> "ArrayShape":
        return interned(replace(self, layout=layout))

    def _dim_text(self, i: int) -> str:
        if self.unbounded and self.unbounded[i]:
            return "?"
        if self.dynamic and self.dynamic[i]:
            return f"<={self.dims[i]}"
        return str(self.dims[i])

    def to_hlo(self, with_layout: bool = True) -> str:
        cached = self._text if with_layout else self._bare_text
        if cached is not None:
            return cached
        dims = ",".join(self._dim_text(i) for i in range(self.rank))
        text = f"{self.element_type.value}[{dims}]"
        if with_layout and self.layout is not None and (self.rank or self.layout.extras):
            # a scalar's default layout is empty, and XLA prints (and parses) no `{}` for it
            text += self.layout.to_hlo()
        # shapes are shared and printed often (and layout-insensitive CSE keys every value by
        # its text without layout)
        object.__setattr__(self, "_text" if with_layout else "_bare_text", text)
        return text


@dataclass(frozen=True, slots=True)
class TupleShape(Shape):
    """`(f32[8], s32[])`."""

    elements: tuple[Shape, ...] = ()
    is_tuple = True  # not a field (no annotation): see Shape

    def byte_size(self) -> int:
        return sum(e.byte_size() for e in self.elements)

    def leaves(self) -> list[ArrayShape]:
        return [leaf for e in self.elements for leaf in e.leaves()]

    def to_hlo(self, with_layout: bool = True) -> str:
        return "(" + ", ".join(e.to_hlo(with_layout) for e in self.elements) + ")"


_LEAF_OFFSETS: dict[int, tuple[Shape, list[int]]] = {}


def leaf_range(shape: Shape, index: int) -> tuple[int, int]:
    """(first leaf, leaf count) of tuple element `index` of the tuple shape `shape`, in the
    depth-first order of its array leaves (how XLA numbers a tuple sharding's entries).  The
    offsets of a shape are computed once (a while loop's state can have hundreds of elements,
    asked about one by one)."""
    if not isinstance(shape, TupleShape):
        raise TypeError(f"expected a tuple shape, got {shape.to_hlo()}")
    entry = _LEAF_OFFSETS.get(id(shape))
    if entry is None or entry[0] is not shape:
        offsets = [0]
        for e in shape.elements:
            offsets.append(offsets[-1] + len(e.leaves()))
        if len(_LEAF_OFFSETS) > 10_000:
            _LEAF_OFFSETS.clear()
        entry = _LEAF_OFFSETS[id(shape)] = (shape, offsets)
    offsets = entry[1]
    return offsets[index], offsets[index + 1] - offsets[index]


# Shapes that passes derive (`with_dims` ...), one object per value.  A partitioned module
# has a per-device shape for every instruction but only tens of distinct ones; without this
# each would hold its own copy (with its dims tuple and printed text), about 200 bytes an
# instruction.  A value cache: what it returns equals what it is given.  Bounded, because a
# long-lived process (the test suite, a server) sees many modules' shapes.
_INTERNED: dict[ArrayShape, ArrayShape] = {}
_INTERNED_LIMIT = 1 << 16


def interned(shape: ArrayShape) -> ArrayShape:
    """The shared object equal to `shape` (`shape` itself the first time)."""
    found = _INTERNED.get(shape)
    if found is None:
        if len(_INTERNED) >= _INTERNED_LIMIT:
            _INTERNED.clear()
        found = _INTERNED[shape] = shape
    return found


def scalar(element_type: PrimitiveType) -> ArrayShape:
    return ArrayShape(element_type, ())


TOKEN_SHAPE = ArrayShape(PrimitiveType.TOKEN, ())
