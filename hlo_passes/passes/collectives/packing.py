"""Packing several arrays into one buffer and back, for collectives whose variadic form XLA's
CPU path cannot run (StableHLO's reduce_scatter and collective_permute take one operand).

`pack(b, xs, dims, parts)` views each x as `parts` equal chunks along its dimension `dims[i]`,
moves that dimension first, flattens every chunk into a row and concatenates the rows:
the result is `[parts, total]`, chunk j of every member in row j.  `unpack` inverts it for a
result with `rows` rows (1 after a reduce-scatter over row 0, `parts` for a permute).

    x f32[8,3] (dim 0, 4 parts) -> reshape [4,6]       \\
    y f32[2,4] (dim 1, 4 parts) -> transpose [4,2] -> reshape [4,2]  -> concatenate [4,8]
"""

from __future__ import annotations

import math
from typing import Sequence

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.shape import ArrayShape


def _front(rank: int, dim: int) -> list[int]:
    return [dim] + [i for i in range(rank) if i != dim]


def _inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def pack(b: Builder, xs: Sequence[Instruction], dims: Sequence[int], parts: int,
         added: list[Instruction]) -> Instruction:
    rows = []
    for x, dim in zip(xs, dims):
        shape: ArrayShape = x.shape
        if dim != 0:
            x = b.transpose(x, _front(shape.rank, dim))
            added.append(x)
        width = shape.element_count // parts
        row = b.reshape(x, ArrayShape(shape.element_type, (parts, width)))
        added.append(row)
        rows.append(row)
    packed = b.concatenate(rows, 1)
    added.append(packed)
    return packed


def unpack(b: Builder, packed: Instruction, shapes: Sequence[ArrayShape], dims: Sequence[int],
           parts: int, rows: int, added: list[Instruction]) -> list[Instruction]:
    """`shapes`: the result shape of each member (its dimension holding `rows/parts` of it)."""
    out, offset = [], 0
    for shape, dim in zip(shapes, dims):
        width = shape.element_count // rows
        piece = b.slice(packed, (0, offset), (rows, offset + width))
        offset += width
        front = _front(shape.rank, dim)
        moved = tuple(shape.dims[p] for p in front)
        value = b.reshape(piece, ArrayShape(shape.element_type, moved, (), shape.layout if dim == 0 else None))
        added += [piece, value]
        if dim != 0:
            value = b.transpose(value, _inverse(front))
            added.append(value)
        out.append(value)
    return out


def packed_width(shapes: Sequence[ArrayShape], parts: int) -> int:
    return sum(math.prod(s.dims) // parts for s in shapes)
