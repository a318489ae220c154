"""Resharding: turn a per-device value of one sharding into the same global value in another.

The cheapest step that applies is taken, then the rest is resharded again:

1. same placement           -> nothing;
2. every device's new tile lies inside its current tile -> a local (dynamic-)slice,
   e.g. replicated -> {devices=[4,1]}: `dynamic-slice(x, offset[partition-id], 0)`;
3. same tile grid, other device order -> one collective-permute (devices that already
   hold their tile keep it);
4. the split moves from dim i to dim j over the same devices -> one all-to-all;
5. dims whose tiles are not nested in the target -> an all-gather per dim, over the
   devices that differ only in that dim's tile coordinate; then back to 2.

`plan` returns the steps without emitting anything, so handlers can compare
the cost (bytes each device receives) of alternative operand shardings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.partition_context import (Emitter, PValue, groups_varying, is_manual,
                                                       same_placement, tile_map, tm_local_dims)
from hlo_passes.passes.spmd.tile_map import TileMap


@dataclass(frozen=True)
class Step:
    kind: str  # "slice" | "permute" | "all-to-all" | "all-gather"
    dims: tuple[int, ...] = ()  # all-gather: (dim,); all-to-all: (from, to)
    bytes: int = 0  # bytes each device receives


def _slice_offsets(src: TileMap, dst: TileMap, dims: tuple[int, ...], k: int) -> np.ndarray | None:
    """Per device, where its `dst` tile starts inside its `src` tile buffer along dim k, or None
    when some device's tile holds valid elements its buffer lacks.  Tiles lying wholly in the
    padding take offset 0 (any content will do)."""
    s_local, d_local = -(-dims[k] // src.dims[k]), -(-dims[k] // dst.dims[k])
    a, b = dst.coords[:, k] * d_local, src.coords[:, k] * s_local
    padding_only = a >= dims[k]
    ok = (a >= b) & (np.minimum(a + d_local, dims[k]) <= np.minimum(b + s_local, dims[k]))
    if not np.all(ok | padding_only):
        return None
    return np.where(padding_only, 0, a - b)


def _slice_nested(src: TileMap, dst: TileMap, dims: tuple[int, ...], only=None) -> bool:
    """Does every device's `dst` tile lie inside its `src` tile (along `only` or all dims)?"""
    return all(_slice_offsets(src, dst, dims, k) is not None
               for k in (range(len(dims)) if only is None else only))


def _permute_pairs(src: TileMap, dst: TileMap) -> list[tuple[int, int]] | None:
    """(source, target) pairs moving each device's `dst` tile to it, or None if impossible."""
    holders: dict[tuple, list[int]] = {}
    for d in range(src.num_devices):
        holders.setdefault(tuple(src.coords[d]), []).append(d)
    pairs, used = [], set()
    need = [d for d in range(dst.num_devices) if tuple(dst.coords[d]) != tuple(src.coords[d])]
    for d in need:
        cands = [s for s in holders.get(tuple(dst.coords[d]), []) if s not in used]
        if not cands:
            return None
        used.add(cands[0])
        pairs.append((cands[0], d))
    return pairs


def _all_to_all_result(src: TileMap, i: int, j: int) -> TileMap:
    coords = src.coords.copy()
    coords[:, j] = src.coords[:, i]
    coords[:, i] = 0
    dims = list(src.dims)
    dims[j], dims[i] = dims[i], 1
    return TileMap(tuple(dims), coords, src.manual, src.manual_size)


def _gathered(src: TileMap, k: int) -> TileMap:
    return src.keep_dims([d for d in range(src.rank) if d != k])


def _elem_bytes(shape: ArrayShape) -> int:
    return shape.element_type.byte_size if shape.element_type.is_array else 0


def plan(src: TileMap, dst: TileMap, shape: ArrayShape) -> list[Step]:
    """The steps that reshard an array of `shape` from `src` to `dst`."""
    steps: list[Step] = []
    dims = tuple(shape.dims)
    esize = _elem_bytes(shape)
    for _ in range(4 * max(1, src.rank) + 4):
        if same_placement(src, dst):
            return steps
        if _slice_nested(src, dst, dims):
            steps.append(Step("slice"))
            return steps
        if src.dims == dst.dims and _permute_pairs(src, dst) is not None:
            steps.append(Step("permute", (), math.prod(tm_local_dims(src, dims)) * esize))
            return steps
        moved = _all_to_all_move(src, dst)
        if moved is not None:
            i, j = moved
            local = math.prod(tm_local_dims(src, dims))
            steps.append(Step("all-to-all", (i, j), local * esize * (src.dims[i] - 1) // src.dims[i]))
            src = _all_to_all_result(src, i, j)
            continue
        bad = [k for k in range(src.rank) if src.dims[k] > 1 and not _slice_nested(src, dst, dims, [k])]
        if not bad:  # nested per dim but not jointly (device orders differ): gather everything tiled
            bad = [k for k in range(src.rank) if src.dims[k] > 1]
        k = bad[0]
        local = math.prod(tm_local_dims(src, dims))
        steps.append(Step("all-gather", (k,), local * esize * (src.dims[k] - 1)))
        src = _gathered(src, k)
    raise AssertionError("resharding did not converge")


def _all_to_all_move(src: TileMap, dst: TileMap) -> tuple[int, int] | None:
    """(i, j) when moving dim i's split to dim j brings `src` closer to `dst`."""
    for i in range(src.rank):
        if src.dims[i] == 1 or dst.dims[i] != 1:
            continue
        for j in range(src.rank):
            if j == i or src.dims[j] != 1 or dst.dims[j] % src.dims[i]:
                continue
            moved = _all_to_all_result(src, i, j)
            if dst.dims[j] == src.dims[i] and not np.array_equal(moved.coords[:, j], dst.coords[:, j]):
                continue
            return i, j
    return None


def cost(src: Sharding, dst: Sharding, shape: ArrayShape, n: int) -> int:
    """Bytes each device receives to reshard (0 for no-ops and local slices)."""
    if is_manual(src) or is_manual(dst) or not shape.is_array:
        return 0
    return sum(s.bytes for s in plan(tile_map(src, shape.rank, n), tile_map(dst, shape.rank, n), shape))


# ------------------------------------------------------------- emitting --
def reshard(em: Emitter, value: PValue, dst: Sharding) -> PValue:
    """`value` with sharding `dst` (tuples element by element)."""
    shape = value.global_shape
    if shape.is_tuple:
        if value.sharding == dst:
            return value
        b = em.b()
        parts = []
        for i in range(len(shape.elements)):
            elem = PValue(b.get_tuple_element(value.instr, i), value.sharding.element(i), shape.elements[i])
            parts.append(reshard(em, elem, dst.element(i)).instr)
        return PValue(b.tuple(parts), dst, shape)
    if is_manual(value.sharding) or is_manual(dst) or not shape.element_type.is_array:
        return PValue(value.instr, dst, shape)
    src_tm, dst_tm = tile_map(value.sharding, shape.rank, em.n), tile_map(dst, shape.rank, em.n)
    x = value.instr
    dims = tuple(shape.dims)
    for step in plan(src_tm, dst_tm, shape):
        if step.kind == "slice":
            x = _emit_slice(em, x, src_tm, dst_tm, dims)
            src_tm = dst_tm
        elif step.kind == "permute":
            x = _emit_permute(em, x, src_tm, dst_tm)
            src_tm = dst_tm
        elif step.kind == "all-to-all":
            i, j = step.dims
            x = _emit_all_to_all(em, x, src_tm, i, j, dims)
            src_tm = _all_to_all_result(src_tm, i, j)
        else:
            (k,) = step.dims
            x = em.all_gather(x, k, groups_varying(src_tm, [k]))
            src_tm = _gathered(src_tm, k)
            x = em.slice_to(x, tuple(min(a, g) if i == k else a
                                     for i, (a, g) in enumerate(zip(x.shape.dims, dims))))
    return PValue(x, dst, shape)


def _emit_slice(em: Emitter, x, src: TileMap, dst: TileMap, dims):
    s_local, d_local = tm_local_dims(src, dims), tm_local_dims(dst, dims)
    offsets = [[int(o) for o in _slice_offsets(src, dst, dims, k)] for k in range(len(dims))]
    # the buffer must hold every slice whole (dynamic-slice would clamp and shift it)
    need = tuple(max(max(o) + d, s) for o, d, s in zip(offsets, d_local, s_local))
    x = em.pad_to(x, need)
    return em.local_slice(x, offsets, d_local)


def _emit_permute(em: Emitter, x, src: TileMap, dst: TileMap):
    pairs = _permute_pairs(src, dst)
    moved = em.collective_permute(x, pairs)
    keep = [1 if tuple(dst.coords[d]) == tuple(src.coords[d]) else 0 for d in range(em.n)]
    if not any(keep):
        return moved
    from hlo_passes.ir.types import PrimitiveType

    b = em.b()
    flag = b.compare(em.device_scalar(keep), b.constant(1), "EQ")
    pred = b.broadcast(flag, ArrayShape(PrimitiveType.PRED, tuple(x.shape.dims)))
    return b.select(pred, x, moved)


def _emit_all_to_all(em: Emitter, x, src: TileMap, i: int, j: int, dims):
    """Split dim j of the local value into k chunks, exchange them within each dim-i group, and
    concatenate the received chunks along dim i."""
    k = src.dims[i]
    local = list(tm_local_dims(src, dims))
    chunk_j = -(-dims[j] // k)
    x = em.pad_to(x, tuple(chunk_j * k if a == j else local[a] for a in range(len(dims))))
    b = em.b()
    # [.., j: k*c, ..] -> [.., k, c, ..]; exchange along the new k dim
    split = list(x.shape.dims)
    split[j:j + 1] = [k, chunk_j]
    y = b.reshape(x, x.shape.with_dims(split))
    y = em.all_to_all(y, j, groups_varying(src, [i]))
    # now dim j (size k) indexes the source's dim-i tile: move it just before dim i and merge
    rank = len(split)
    i_pos = i if i < j else i + 1
    perm = [a for a in range(rank) if a != j]
    perm.insert(perm.index(i_pos), j)
    y = b.transpose(y, perm)
    merged = list(y.shape.dims)
    at = perm.index(j)
    merged[at:at + 2] = [merged[at] * merged[at + 1]]
    y = b.reshape(y, y.shape.with_dims(merged))
    return em.slice_to(y, tuple(min(a, dims[d]) if d == i else a for d, a in enumerate(merged)))
