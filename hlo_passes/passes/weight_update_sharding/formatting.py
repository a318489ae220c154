"""The paper's data formatting: how the values of one update map to per-device chunks.

Every value of an update region holds the same S elements (a weight's shape, or a reshape of
it).  Device i of a group of N updates chunk i of a buffer of P = N·c elements:

    flat (the paper's):  x → reshape [S] → pad [P]                      chunk i = elements [i·c, (i+1)·c)
    tiled on dim k:      x → transpose (k first) → pad dim 0 to N·c_k → reshape [P]

A flat chunk is a contiguous piece of the row-major weight, padded at the end.  A tiled chunk is
tile i of the weight along dimension k, `c_k = ceil(d_k / N)` rows of it: this is what lets the
optimizer state *stay* sharded between steps (`keep-state-sharded`), because a tile of an array
is an HLO sharding of that array (`sharding={devices=[N,1]<=[N]}` on the state parameter and
output) while an arbitrary contiguous piece is not.  Dimension k is chosen to need the least
padding: ResNet's `[3,3,16,16]` kernel over 8 devices tiles dimension 2, not the 3 rows of
dimension 0, which would pad it to 8/3 of its size.

Padding goes at the end of the buffer in both layouts, so "is this element real" is
`offset + position < S` either way (whole-tensor reductions mask the padding with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes.ir.attributes import PaddingConfig
from hlo_passes.ir.builder import Builder
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.shape import ArrayShape, Layout


@dataclass(frozen=True)
class Formatting:
    """The chunking of one component: group size `n`, canonical dims, and `tile_dim` (None: flat)."""

    n: int
    dims: tuple[int, ...]
    tile_dim: int | None = None

    @classmethod
    def flat(cls, n: int, dims: tuple[int, ...]) -> "Formatting":
        return cls(n, tuple(dims), None)

    @classmethod
    def best_tiled(cls, n: int, dims: tuple[int, ...]) -> "Formatting":
        """Tiled on the dimension that needs the least padding (the first of equals)."""
        if not dims:
            return cls.flat(n, dims)
        size = math.prod(dims)

        def padded(k: int) -> int:
            return -(-dims[k] // n) * n * (size // dims[k]) if dims[k] else 0
        best = min(range(len(dims)), key=lambda k: (padded(k), k))
        return cls(n, tuple(dims), best)

    # ------------------------------------------------------------ sizes --
    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def chunk(self) -> int:
        if self.tile_dim is None:
            return -(-self.size // self.n)
        k = self.tile_dim
        return -(-self.dims[k] // self.n) * (self.size // self.dims[k] if self.dims[k] else 0)

    @property
    def padded(self) -> int:
        return self.chunk * self.n

    @property
    def is_tiled(self) -> bool:
        return self.tile_dim is not None

    @property
    def perm(self) -> tuple[int, ...]:
        k = self.tile_dim
        return (k,) + tuple(i for i in range(len(self.dims)) if i != k)

    @property
    def moved_dims(self) -> tuple[int, ...]:
        return tuple(self.dims[p] for p in self.perm)

    def tile_dims(self) -> tuple[int, ...]:
        """The per-device tile of a tiled value (dimension k cut to c_k rows)."""
        k = self.tile_dim
        return tuple(-(-d // self.n) if i == k else d for i, d in enumerate(self.dims))

    def flat_tile_dim(self, dims: tuple[int, ...]) -> int | None:
        """Flat layout: the dimension of a value of `dims` whose tiles are exactly the chunks
        (every dimension before it 1, it divisible by N, no padding), else None."""
        if self.is_tiled or self.padded != self.size:
            return None
        for j, d in enumerate(dims):
            if d != 1:
                return j if d % self.n == 0 else None
        return None

    # ------------------------------------------------------- instructions --
    def format(self, b: Builder, value: Instruction) -> Instruction:
        """`value` (S elements) laid out as the [P] buffer whose chunk i is device i's."""
        etype = value.shape.element_type
        if self.is_tiled and self.tile_dim != 0:
            value = b.transpose(value, self.perm)
        moved = self.moved_dims if self.is_tiled else None
        if self.is_tiled and self.padded != self.size:
            rows = self.padded // (self.size // self.dims[self.tile_dim])
            config = ((0, rows - moved[0], 0),) + tuple((0, 0, 0) for _ in moved[1:])
            value = b.pad(value, b.constant(0, etype), PaddingConfig(config))
        target = self.padded if self.is_tiled else self.size
        if value.shape.dims != (target,):
            value = b.reshape(value, ArrayShape(etype, (target,)))
        if not self.is_tiled and self.padded != self.size:
            value = b.pad(value, b.constant(0, etype), PaddingConfig(((0, self.padded - self.size, 0),)))
        return value

    def unformat(self, b: Builder, buffer: Instruction, shape: ArrayShape) -> Instruction:
        """A gathered [P] buffer back to a value of `shape` (S elements)."""
        etype = shape.element_type
        if not self.is_tiled:
            out = buffer
            if self.padded != self.size:
                out = b.slice(out, (0,), (self.size,))
            return out if shape.rank == 1 and out.shape.dims == shape.dims else b.reshape(out, shape.without_layout())
        k = self.tile_dim
        rows = self.padded // (self.size // self.dims[k]) if self.dims[k] else 0
        moved = self.moved_dims
        out = b.reshape(buffer, ArrayShape(etype, (rows,) + moved[1:]))
        if rows != moved[0]:
            out = b.slice(out, (0,) * len(moved), moved)
        if k != 0:
            out = b.transpose(out, _inverse(self.perm))
        return out

    def from_tile(self, b: Builder, tile: Instruction) -> Instruction:
        """A device's tile of a tiled value (a kept-sharded state parameter) as its [chunk]."""
        etype = tile.shape.element_type
        if self.is_tiled and self.tile_dim != 0:
            tile = b.transpose(tile, self.perm)
        return b.reshape(tile, ArrayShape(etype, (self.chunk,)))

    def to_tile(self, b: Builder, chunk: Instruction, tile_dims: tuple[int, ...]) -> Instruction:
        """A [chunk] as the device's tile of dims `tile_dims` (layout: default)."""
        etype = chunk.shape.element_type
        if not self.is_tiled or self.tile_dim == 0:
            return b.reshape(chunk, ArrayShape(etype, tile_dims, layout=Layout.default_for_rank(len(tile_dims))))
        moved = tuple(tile_dims[p] for p in self.perm)
        out = b.reshape(chunk, ArrayShape(etype, moved))
        out = b.transpose(out, _inverse(self.perm))
        out.shape = ArrayShape(etype, tile_dims, layout=Layout.default_for_rank(len(tile_dims)))
        return out

    def describe(self) -> str:
        how = f"tiled on dimension {self.tile_dim}" if self.is_tiled else "flattened"
        pad = f", padded to {self.padded}" if self.padded != self.size else ""
        return f"{how}{pad}"


def _inverse(perm) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)
