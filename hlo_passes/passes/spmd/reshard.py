"""Resharding: turn a per-device value of one sharding into the same global value in another.

Two planners propose step lists and the one the cost model prices lower wins:

*greedy* (one step at a time, then the rest is resharded again):

1. same placement           -> nothing;
2. every device's new tile lies inside its current tile -> a local (dynamic-)slice,
   e.g. replicated -> {devices=[4,1]}: `dynamic-slice(x, offset[partition-id], 0)`;
3. same tile grid, other device order -> one collective-permute (devices that already
   hold their tile keep it);
4. the split moves from dim i to dim j over the same devices -> one all-to-all;
5. dims whose tiles are not nested in the target -> an all-gather per dim, over the
   devices that differ only in that dim's tile coordinate; then back to 2.

*grid-first* (reach the target's tile counts per dim, then fix the device order):

1. refine dims the target tiles finer, using replicas: a local slice
   ({devices=[2,1,2,2] last_tile_dim_replicate} -> [2,2,2]: each replica keeps a half);
2. move a factor g of a dim that is too fine into one that is too coarse: an all-to-all
   within groups of g devices ([4,2] -> [2,4]: the minor 2 of dim 0 moves to dim 1);
3. coarsen a dim that is still too fine: an all-gather over only the g devices that hold
   the pieces of one coarser tile ([8,1] -> [4,1,2] last_tile_dim_replicate gathers pairs);
4. equal tile counts, other device order: one collective-permute.

The steps of (2) and (3) are factor moves: the minor factor g of dim i's tile coordinate
c_i leaves it (c_i -> c_i // g) and, for an all-to-all, becomes the minor factor of dim
j (c_j -> c_j * g + c_i % g).

`plan` returns the steps without emitting anything, so handlers can compare
the cost (cost_model.py: estimated time, and bytes each device receives) of alternative
operand shardings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.cost_model import DEFAULT, ZERO, CostModel, Estimate  # noqa: F401
from hlo_passes.passes.spmd.partition_context import (DeviceGroups, Emitter, ManualGroupsMismatch, PartitionContext,
                                                       PValue, groups_varying, is_fully_manual, is_partially_manual,
                                                       manual_only, same_placement, tile_map, tm_local_dims,
                                                       to_sharding)
from hlo_passes.passes.spmd.tile_map import Int64Array, TileMap


@dataclass(frozen=True, eq=False)
class Step:
    kind: str  # "slice" | "permute" | "piece-permute" | "all-to-all" | "all-gather"
    dims: tuple[int, ...]  # all-gather: (dim, g); all-to-all: (from, to, g)
    bytes: int  # bytes each device receives
    result: TileMap  # the placement after this step


def _slice_offsets(src: TileMap, dst: TileMap, dims: tuple[int, ...], k: int) -> Int64Array | None:
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


def _slice_nested(src: TileMap, dst: TileMap, dims: tuple[int, ...], only: Iterable[int] | None = None) -> bool:
    """Does every device's `dst` tile lie inside its `src` tile (along `only` or all dims)?"""
    return all(_slice_offsets(src, dst, dims, k) is not None
               for k in (range(len(dims)) if only is None else only))


def _permute_pairs(src: TileMap, dst: TileMap) -> list[tuple[int, int]] | None:
    """(source, target) pairs moving each device's `dst` tile to it, or None if impossible."""
    holders: dict[tuple[int, ...], list[int]] = {}
    for d in range(src.num_devices):  # a tile moves only within its manual group
        holders.setdefault(tuple(src.coords[d]) + (int(src.manual[d]),), []).append(d)
    pairs: list[tuple[int, int]] = []
    used: set[int] = set()
    need = [d for d in range(dst.num_devices) if tuple(dst.coords[d]) != tuple(src.coords[d])]
    moving = set(need)
    for d in need:
        # devices that keep their tile last: one that sends nothing sends it to itself in the
        # same permute (`_emit_permute`)
        cands = sorted((s for s in holders.get(tuple(dst.coords[d]) + (int(dst.manual[d]),), []) if s not in used),
                       key=lambda s: s not in moving)
        if not cands:
            return None
        used.add(cands[0])
        pairs.append((cands[0], d))
    return pairs


# ------------------------------------------------------- factor moves --
def _fits(size: int, fine: int, g: int) -> bool:
    """Do g consecutive tiles of a `fine`-way split of `size` make one tile of the `fine // g`-way
    split (uneven sizes pad at the end, so this can fail: 10 split 4 ways is 3,3,3,1 but 2 ways 5,5)?"""
    return fine // g == 1 or -(-size // (fine // g)) == g * -(-size // fine)


def _moved(src: TileMap, i: int, j: int, g: int) -> TileMap:
    """The minor factor g of dim i's tiling becomes the minor factor of dim j's (an all-to-all)."""
    coords = src.coords.copy()
    coords[:, j] = src.coords[:, j] * g + src.coords[:, i] % g
    coords[:, i] = src.coords[:, i] // g
    dims = list(src.dims)
    dims[i], dims[j] = src.dims[i] // g, src.dims[j] * g
    return TileMap(tuple(dims), coords, src.manual, src.manual_size)


def _coarsened(src: TileMap, k: int, g: int) -> TileMap:
    """Dim k tiled g times coarser (an all-gather over the g devices of each coarse tile)."""
    coords = src.coords.copy()
    coords[:, k] = src.coords[:, k] // g
    dims = list(src.dims)
    dims[k] = src.dims[k] // g
    return TileMap(tuple(dims), coords, src.manual, src.manual_size)


def _factor_groups(src: TileMap, k: int, g: int) -> DeviceGroups:
    """The devices that differ only in the minor factor g of dim k's tile coordinate, ordered by it."""
    coords = np.concatenate([src.coords, (src.coords[:, k] % g)[:, None]], axis=1)
    coords[:, k] //= g
    view = TileMap(src.dims + (g,), coords, src.manual, src.manual_size)
    return groups_varying(view, [src.rank])


def _holders(tm: TileMap) -> int:
    return tm.num_devices // (tm.num_tiles * tm.manual_size)


def _refined(cur: TileMap, dst: TileMap, dims: tuple[int, ...]) -> TileMap | None:
    """`cur` tiled finer on the dims `dst` tiles finer, each replica keeping one piece of its tile
    (a local slice), or None when there are no replicas to split or no dim to refine.  The
    target's own coordinates are used where they nest, so that no permute follows."""
    budget = _holders(cur)
    factors: dict[int, int] = {}
    # A dim an all-to-all can fill (another dim is tiled too finely by the same factor) is
    # refined last: the replicas' budget goes first to the dims only a slice can tile, so the
    # all-to-all that follows moves the sliced, smaller tiles (a partial sum all-reduced over one
    # axis, wanted tiled on a new dim over it and with its batch tiling moved to another: the
    # slice first halves the all-to-all; refining the dim the all-to-all fills took the budget).
    move = _factor_move(cur, dst, dims)
    order = [k for k in range(cur.rank) if move is None or k != move[1]] + ([move[1]] if move else [])
    for k in order:
        want = dst.dims[k]
        if want > cur.dims[k] and want % cur.dims[k] == 0:
            f = math.gcd(want // cur.dims[k], budget)
            if f > 1 and (cur.dims[k] == 1 or _fits(dims[k], cur.dims[k] * f, f)):
                factors[k] = f
                budget //= f
    if not factors:
        return None
    new_dims = tuple(cur.dims[k] * factors.get(k, 1) for k in range(cur.rank))
    coords = cur.coords.copy()
    if all(dst.dims[k] == new_dims[k] and np.array_equal(dst.coords[:, k] // f, cur.coords[:, k])
           for k, f in factors.items()):
        for k in factors:
            coords[:, k] = dst.coords[:, k]
        cand = TileMap(new_dims, coords, cur.manual, cur.manual_size)
        if cand.to_sharding() is not None:
            return cand
    ks = list(factors)
    fs = [factors[k] for k in ks]
    per = math.prod(fs)
    members: dict[tuple[int, ...], list[int]] = {}
    for d in range(cur.num_devices):
        members.setdefault(tuple(cur.coords[d]) + (int(cur.manual[d]),), []).append(d)
    coords = cur.coords.copy()
    for devs in members.values():
        for q, d in enumerate(devs):
            sub = np.unravel_index(q % per, fs)
            for k, f, s in zip(ks, fs, sub):
                coords[d, k] = cur.coords[d, k] * f + int(s)
    return TileMap(new_dims, coords, cur.manual, cur.manual_size)


def _a2a_bytes(src: TileMap, dims: tuple[int, ...], esize: int, g: int) -> int:
    return math.prod(tm_local_dims(src, dims)) * esize * (g - 1) // g


def _gather_bytes(src: TileMap, dims: tuple[int, ...], esize: int, g: int) -> int:
    return math.prod(tm_local_dims(src, dims)) * esize * (g - 1)


def _grid_plan(src: TileMap, dst: TileMap, dims: tuple[int, ...], esize: int,
               slice_first: bool) -> list[Step] | None:
    """The grid-first plan (module docstring), or None when it gets stuck.  Slicing replicas
    first makes an all-to-all move less data; moving first can leave the replicas holding the
    target's own tiles, so that no permute is needed: both orders are priced."""
    steps: list[Step] = []
    cur = src
    for _ in range(4 * max(1, src.rank) + 4):
        if same_placement(cur, dst):
            return steps
        if cur.dims == dst.dims:
            if _permute_pairs(cur, dst) is None:
                return None
            steps.append(Step("permute", (), math.prod(tm_local_dims(cur, dims)) * esize, dst))
            return steps
        move = _factor_move(cur, dst, dims)
        nxt = _refined(cur, dst, dims) if slice_first or move is None else None
        if nxt is not None:
            steps.append(Step("slice", (), 0, nxt))
            cur = nxt
            continue
        if move is not None:
            i, j, g = move
            steps.append(Step("all-to-all", move, _a2a_bytes(cur, dims, esize, g), _moved(cur, i, j, g)))
            cur = steps[-1].result
            continue
        k, g = _coarsening(cur, dst, dims)
        if k is None:
            return None
        steps.append(Step("all-gather", (k, g), _gather_bytes(cur, dims, esize, g), _coarsened(cur, k, g)))
        cur = steps[-1].result
    return None


def _factor_move(cur: TileMap, dst: TileMap, dims: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(i, j, g): dim i is tiled g times too finely and dim j at least g times too coarsely."""
    for i in range(cur.rank):
        if cur.dims[i] <= dst.dims[i] or cur.dims[i] % dst.dims[i]:
            continue
        for j in range(cur.rank):
            if j == i or dst.dims[j] <= cur.dims[j] or dst.dims[j] % cur.dims[j]:
                continue
            g = math.gcd(cur.dims[i] // dst.dims[i], dst.dims[j] // cur.dims[j])
            if g > 1 and _fits(dims[i], cur.dims[i], g) and _fits(dims[j], cur.dims[j] * g, g):
                return i, j, g
    # A dim whose tiling the target's does not refine (2 ways to 3) must be whole at some point:
    # its factor moves into a dim the target tiles more finely rather than being gathered (a
    # [1,2] tiling with 3 replicas to [2,3] on 6 devices: an all-to-all within pairs, then each
    # replica slices its columns; half the wire bytes of gathering the columns).
    for i in range(cur.rank):
        if cur.dims[i] <= 1 or dst.dims[i] % cur.dims[i] == 0 or cur.dims[i] % dst.dims[i] == 0:
            continue
        for j in range(cur.rank):
            if j == i or dst.dims[j] <= cur.dims[j] or dst.dims[j] % cur.dims[j]:
                continue
            g = math.gcd(cur.dims[i], dst.dims[j] // cur.dims[j])
            if g > 1 and _fits(dims[i], cur.dims[i], g) and _fits(dims[j], cur.dims[j] * g, g):
                return i, j, g
    return None


def _coarsening(cur: TileMap, dst: TileMap, dims: tuple[int, ...]) -> tuple[int | None, int]:
    """(k, g): gather the minor factor g of dim k, which `dst` tiles more coarsely (or not as a
    multiple); a whole dim is gathered when a partial gather cannot reach the target.  Of
    several such dims, the one gathered over the fewest devices first: each gather sends what
    the earlier ones grew, so the small factors go first (a [4,2] tiling made replicated
    sends 1 + 2 tiles gathering the 2-way dim first, 1 + 4 the other way)."""
    found: tuple[int, int] | None = None
    for k in range(cur.rank):
        t, want = cur.dims[k], dst.dims[k]
        if t > want:
            g = t // want if t % want == 0 and _fits(dims[k], t, t // want) else t
            if found is None or g < found[1]:
                found = (k, g)
    if found is not None:
        return found
    for k in range(cur.rank):  # finer in dst but not reachable by slicing: start from whole
        t, want = cur.dims[k], dst.dims[k]
        if t > 1 and (want % t or not _fits(dims[k], want, want // t)):
            return k, t
    return None, 0


def _greedy_plan(src: TileMap, dst: TileMap, dims: tuple[int, ...], esize: int) -> list[Step]:
    steps: list[Step] = []
    for _ in range(4 * max(1, src.rank) + 4):
        if same_placement(src, dst):
            return steps
        if _slice_nested(src, dst, dims):
            steps.append(Step("slice", (), 0, dst))
            return steps
        if src.dims == dst.dims and _permute_pairs(src, dst) is not None:
            steps.append(Step("permute", (), math.prod(tm_local_dims(src, dims)) * esize, dst))
            return steps
        moved = _all_to_all_move(src, dst)
        if moved is not None:
            i, j = moved
            g = src.dims[i]
            steps.append(Step("all-to-all", (i, j, g), _a2a_bytes(src, dims, esize, g), _moved(src, i, j, g)))
            src = steps[-1].result
            continue
        bad = [k for k in range(src.rank) if src.dims[k] > 1 and not _slice_nested(src, dst, dims, [k])]
        if not bad:  # nested per dim but not jointly (device orders differ): gather everything tiled
            bad = [k for k in range(src.rank) if src.dims[k] > 1]
        k = min(bad, key=lambda d: src.dims[d])  # the fewest devices first (see _coarsening)
        g = src.dims[k]
        steps.append(Step("all-gather", (k, g), _gather_bytes(src, dims, esize, g), _coarsened(src, k, g)))
        src = steps[-1].result
    raise AssertionError("resharding did not converge")


def plan(src: TileMap, dst: TileMap, shape: ArrayShape, model: CostModel = DEFAULT) -> list[Step]:
    """The steps that reshard an array of `shape` from `src` to `dst`: the cheaper of the two
    planners' by the cost model's time (each collective pays its latency, so one gather can
    beat three small permutes; the greedy plan on ties)."""
    dims = tuple(shape.dims)
    esize = _elem_bytes(shape)
    best = _greedy_plan(src, dst, dims, esize)
    best_cost = steps_estimate(best, dims, esize, model)
    for slice_first in (True, False):
        grid = _grid_plan(src, dst, dims, esize, slice_first)
        if grid is None:
            continue
        grid_cost = steps_estimate(grid, dims, esize, model)
        if grid_cost < best_cost:
            best, best_cost = grid, grid_cost
    whole = _gather_then_slice_plan(src, dst, dims, esize)
    if whole is not None and steps_estimate(whole, dims, esize, model) < best_cost:
        best, best_cost = whole, steps_estimate(whole, dims, esize, model)
    pieces = _piece_permute_plan(src, dst, dims, esize)
    if pieces is not None and steps_estimate(pieces, dims, esize, model) < best_cost:
        best, best_cost = pieces, steps_estimate(pieces, dims, esize, model)
    early = _permutes_before_gathers(best, src, dims, esize)
    if early is not None and steps_estimate(early, dims, esize, model) < best_cost:
        best, best_cost = early, steps_estimate(early, dims, esize, model)
    summed = _sum_gathers(best, src, dims, esize)
    if summed is not None and steps_estimate(summed, dims, esize, model) < best_cost:
        best = summed
    return best


def _sum_gathers(steps: list[Step], src: TileMap, dims: tuple[int, ...], esize: int) -> list[Step] | None:
    """`steps` with each all-gather of a whole dim that only a few tiles hold data of (a dim
    smaller than its tile count: f32[1,100,3] tiled 8 ways on the 1, seven tiles all padding)
    made a sum-gather: every device writes its rows (zeros where its tile is padding) into a
    zero buffer of the whole dim at its offset, and an all-reduce adds the buffers.  The wire
    then carries twice the dim's real rows, not every tile's padding: a gather of m full tiles
    out of g moves (g-1) tiles, the sum 2(g-1)/g * m (XLA broadcasts such a row by a select and
    an all-reduce).  Only where the real tiles are full (m tiles of L rows make the dim) and
    fewer than half the tiles; None when no step qualifies."""
    out: list[Step] = []
    cur = src
    changed = False
    for step in steps:
        if step.kind == "all-gather":
            k, g = step.dims
            t, size = cur.dims[k], dims[k]
            rows = -(-size // t)
            real = -(-size // rows)
            if g == t and real * rows == size and 2 * real < g:
                whole = list(tm_local_dims(cur, dims))
                whole[k] = size
                wire = math.prod(whole) * esize * 2 * (g - 1) // g
                out.append(Step("sum-gather", (k, g), wire, step.result))
                changed = True
                cur = step.result
                continue
        out.append(step)
        cur = step.result
    return out if changed else None


def _permutes_before_gathers(steps: list[Step], src: TileMap, dims: tuple[int, ...], esize: int) -> list[Step] | None:
    """`steps` with every permute that follows an all-gather moved before it where
    `_permute_before_gather` can (latest first), also where more steps follow: a plan
    gather, permute, gather (a [1,4,1,2] tiling to [1,2,1,1] with 4 replicas on another
    device order) permutes the smaller tiles before the first gather, as XLA's partition
    does.  None when no permute moved."""
    moved = False
    i = len(steps) - 1
    while i >= 1:
        if steps[i].kind == "permute" and steps[i - 1].kind == "all-gather":
            early = _permute_before_gather(steps[:i + 1], src, steps[i].result, dims, esize)
            if early is not None:
                steps, moved = early + steps[i + 1:], True
        i -= 1
    return steps if moved else None


def _piece_plan(src: TileMap, dst: TileMap, dims: tuple[int, ...]) -> tuple[Int64Array, Int64Array] | None:
    """(senders, offsets) of the piece-permute step (`_piece_permute_plan`), or None where a
    target tile holding valid elements lies inside no source tile, or one permute cannot
    bring every such tile to its device.  senders[d]: the device whose tile device d receives
    its target tile from (d itself: it keeps it; -1: it needs nothing); offsets[k][s]: where
    device s's outgoing piece starts in its tile along dim k."""
    n, rank = dst.num_devices, dst.rank
    s_local = [-(-dims[k] // src.dims[k]) for k in range(rank)]
    d_local = [-(-dims[k] // dst.dims[k]) for k in range(rank)]
    a = dst.coords * np.asarray(d_local, np.int64)          # [n, rank] target tile starts
    b = src.coords * np.asarray(s_local, np.int64)          # [n, rank] source tile starts
    free = np.any(a >= np.asarray(dims, np.int64), axis=1)  # target wholly padding
    end_a = np.minimum(a + np.asarray(d_local, np.int64), np.asarray(dims, np.int64))
    end_b = np.minimum(b + np.asarray(s_local, np.int64), np.asarray(dims, np.int64))
    # inside[t, s]: target tile of t lies in source tile of s (same manual group)
    inside = np.all((a[:, None, :] >= b[None, :, :]) & (end_a[:, None, :] <= end_b[None, :, :]), axis=2)
    inside &= dst.manual[:, None] == src.manual[None, :]
    inside &= ~free[:, None]
    keeper = np.diagonal(inside).copy()
    senders = np.full(n, -1, np.int64)
    senders[keeper] = np.flatnonzero(keeper)
    sending = set(int(d) for d in np.flatnonzero(keeper))  # keepers send their piece to themselves
    for t in np.flatnonzero(~keeper & ~free):
        # free devices (nothing to keep) first, then other receivers
        cands = [int(c) for c in np.flatnonzero(inside[t]) if int(c) not in sending]
        if not cands:
            return None
        c = min(cands, key=lambda c: (not free[c], c))
        senders[t] = c
        sending.add(c)
    offsets = np.zeros((rank, n), np.int64)
    for d in range(n):
        c = int(senders[d])
        if c >= 0:
            offsets[:, c] = a[d] - b[c]
    return senders, offsets


def _piece_permute_plan(src: TileMap, dst: TileMap, dims: tuple[int, ...], esize: int) -> list[Step] | None:
    """One collective-permute where every target tile lies inside one source tile: each device
    that lacks its target tile receives it from a holder that sends nothing else (one that
    keeps nothing first), the holders slicing it from their tiles at per-device offsets, and
    the devices that hold their own tile send it to themselves.  Where the tiles do not nest
    evenly the other plans gather: [2,1,4] last_tile_dim_replicate -> [8,1] of 6 rows moves
    the one row device 3 lacks, not the 3-row tiles of an all-gather."""
    if not dst.same_manual(src) or same_placement(src, dst) or _piece_plan(src, dst, dims) is None:
        return None
    return [Step("piece-permute", (), math.prod(tm_local_dims(dst, dims)) * esize, dst)]


def _emit_piece_permute(em: Emitter, x: Instruction, src: TileMap, dst: TileMap, dims: tuple[int, ...]) -> Instruction:
    found = _piece_plan(src, dst, dims)
    assert found is not None, "a piece-permute step was planned where no single permute reaches the target"
    senders, offsets = found
    d_local = tm_local_dims(dst, dims)
    need = tuple(max(int(offsets[k].max()) + d_local[k], x.array_shape.dims[k]) for k in range(len(dims)))
    piece = em.local_slice(em.pad_to(x, need), list(offsets), d_local)
    pairs = [(int(c), t) for t, c in enumerate(senders) if c >= 0]
    if all(c == t for c, t in pairs):
        return piece
    return em.collective_permute(piece, pairs)


def _permute_before_gather(steps: list[Step], src: TileMap, dst: TileMap, dims: tuple[int, ...],
                           esize: int) -> list[Step] | None:
    """A plan ending in an all-gather and then a permute (the gather left the target's tiles on
    the wrong devices) with the permute moved before the gather, where it moves the smaller
    tiles: each device first takes the piece of its target tile that the gather then completes
    ([2,2,2] last_tile_dim_replicate -> [1,2,4] last_tile_dim_replicate: permute the halves of
    dim 0 so that each gather pair holds both halves of its target tile, as XLA's partitioner
    does).  None when the plan does not end so or no permute reaches the pieces.  `_permutes_before_gathers` tries
    it on every prefix of its plan that ends so, `dst` being that permute's placement: a pair
    in the middle ([2,4] -> [1,2,4] last_tile_dim_replicate gathers rows, permutes, gathers
    columns) moves the same way, the steps after it unchanged (they start from the same
    placement)."""
    if len(steps) < 2 or steps[-1].kind != "permute" or steps[-2].kind != "all-gather":
        return None
    before = steps[-3].result if len(steps) >= 3 else src
    k, g = steps[-2].dims
    if before.dims[k] != dst.dims[k] * g or any(before.dims[a] != dst.dims[a] for a in range(dst.rank) if a != k):
        return None
    # devices holding each target tile, split into g residues of dim k (who already holds a
    # residue's piece keeps it)
    holders: dict[tuple[int, ...], list[int]] = {}
    for d in range(dst.num_devices):
        holders.setdefault(tuple(dst.coords[d]) + (int(dst.manual[d]),), []).append(d)
    coords = dst.coords.copy()
    for devs in holders.values():
        if len(devs) % g:
            return None
        left = {r: len(devs) // g for r in range(g)}
        rest: list[int] = []
        for d in devs:
            own = int(before.coords[d, k])
            same = (own // g == dst.coords[d, k] and int(before.manual[d]) == int(dst.manual[d])
                    and all(before.coords[d, a] == dst.coords[d, a] for a in range(dst.rank) if a != k))
            if same and left[own % g]:
                left[own % g] -= 1
                coords[d, k] = own
            else:
                rest.append(d)
        for d in rest:
            r = next(r for r in range(g) if left[r])
            left[r] -= 1
            coords[d, k] = dst.coords[d, k] * g + r
    pieces = TileMap(before.dims, coords, dst.manual, dst.manual_size)
    if same_placement(before, pieces) or _permute_pairs(before, pieces) is None:
        return None
    permute = Step("permute", (), math.prod(tm_local_dims(before, dims)) * esize, pieces)
    return steps[:-2] + [permute, Step("all-gather", (k, g), steps[-2].bytes, _coarsened(pieces, k, g))]


def _gather_then_slice_plan(src: TileMap, dst: TileMap, dims: tuple[int, ...], esize: int) -> list[Step] | None:
    """Gather every tiled dim (over the fewest devices first), then slice the target's tile:
    always possible, and cheaper than the other plans where an all-to-all would leave tiles
    that an uneven target does not nest in (20 rows tiled 2 ways moved to 8 tiles of 3), so
    that a gather follows the all-to-all anyway.  None when there is nothing to gather."""
    steps: list[Step] = []
    cur = src
    while True:
        tiled = [k for k in range(cur.rank) if cur.dims[k] > 1]
        if not tiled:
            break
        k = min(tiled, key=lambda d: cur.dims[d])
        g = cur.dims[k]
        steps.append(Step("all-gather", (k, g), _gather_bytes(cur, dims, esize, g), _coarsened(cur, k, g)))
        cur = steps[-1].result
    if not steps:
        return None
    if not same_placement(cur, dst):
        if not _slice_nested(cur, dst, dims):
            return None
        steps.append(Step("slice", (), 0, dst))
    return steps


def steps_estimate(steps: list[Step], dims: tuple[int, ...], esize: int, model: CostModel) -> Estimate:
    """Time and bytes of a plan: a collective step pays latency + its received bytes over the
    link (Step.bytes is each device's share of the algorithm's wire volume), a slice the copy
    of its result tile, an all-to-all also the transpose that moves its exchanged chunks next
    to the dim they tile (`_emit_all_to_all`: never the identity), a copy of its result tile.
    Without that copy an all-to-all of a result looked cheaper than gathering a small operand
    and slicing a replicated one, whose slice copy was priced."""
    total = ZERO
    for step in steps:
        if step.kind == "slice":
            local = math.prod(tm_local_dims(step.result, dims)) * esize
            total = total + model.local_copy(local)
        else:
            total = total + model.transfer(step.bytes)
            if step.kind == "all-to-all":
                total = total + model.local_copy(math.prod(tm_local_dims(step.result, dims)) * esize)
    return total


def _nested_offsets(src: TileMap, dst: TileMap, dims: tuple[int, ...], k: int) -> Int64Array:
    """`_slice_offsets` where a slice step was planned, so every `dst` tile lies inside its `src` tile."""
    offsets = _slice_offsets(src, dst, dims, k)
    assert offsets is not None, "a slice step was planned where a target tile is not inside its source tile"
    return offsets


def _all_to_all_move(src: TileMap, dst: TileMap) -> tuple[int, int] | None:
    """(i, j) when moving dim i's split to dim j brings `src` closer to `dst`."""
    for i in range(src.rank):
        if src.dims[i] == 1 or dst.dims[i] != 1:
            continue
        for j in range(src.rank):
            if j == i or src.dims[j] != 1 or dst.dims[j] % src.dims[i]:
                continue
            moved = _moved(src, i, j, src.dims[i])
            if dst.dims[j] == src.dims[i] and not np.array_equal(moved.coords[:, j], dst.coords[:, j]):
                continue
            return i, j
    return None


def _elem_bytes(shape: ArrayShape) -> int:
    return shape.element_type.byte_size if shape.element_type.is_array else 0


# What a resharding the partitioner cannot do costs (a value leaving its manual groups): more
# than any real plan, so that a handler pricing candidates never picks it.
UNREACHABLE = Estimate(seconds=1e30, bytes=1 << 60, collectives=1 << 30)


def manual_frame(src: Sharding, dst: Sharding, rank: int, n: int) -> tuple[TileMap, TileMap] | None:
    """The tile maps a resharding from `src` to `dst` plans between, or None when the value
    passes through unchanged (fully manual: per-device code).

    Inside a partially manual region both keep the region's manual groups, and every plan step
    (the collectives' groups, permute pairs, offsets) stays within them.  A replicated sharding
    there means "whole in each manual group": a value the handlers computed replicated inside the
    region is its group's whole value, and a replicated value read by the region is the same
    everywhere.  Any other mix (a tiling over all devices, other manual groups) raises
    ManualGroupsMismatch."""
    if is_fully_manual(src) or is_fully_manual(dst):
        return None
    src_tm, dst_tm = tile_map(src, rank, n), tile_map(dst, rank, n)
    src_pm, dst_pm = is_partially_manual(src), is_partially_manual(dst)
    if src_pm and not dst_pm and dst.is_replicated:
        dst_tm = manual_only(src_tm)
    elif dst_pm and not src_pm and src.is_replicated:
        src_tm = manual_only(dst_tm)
    if (src_pm or dst_pm) and not src_tm.same_manual(dst_tm):
        raise ManualGroupsMismatch(f"no resharding from {src.to_hlo()} to {dst.to_hlo()}: "
                                   "it would move data between manual groups")
    return src_tm, dst_tm


def cost(src: Sharding, dst: Sharding, shape: Shape, n: int, model: CostModel = DEFAULT) -> Estimate:
    """What resharding costs per device (ZERO for no-ops and tuples; local slices cost their copy;
    UNREACHABLE where it would leave the value's manual groups)."""
    if not isinstance(shape, ArrayShape) or src == dst:
        return ZERO
    key = (src, dst, shape, n, model.profile.name)
    found = _COSTS.get(key)
    if found is None:
        try:
            frame = manual_frame(src, dst, shape.rank, n)
        except ManualGroupsMismatch:
            frame, found = None, UNREACHABLE
        if frame is not None:
            steps = plan(*frame, shape, model)
            found = steps_estimate(steps, tuple(shape.dims), _elem_bytes(shape), model)
        _COSTS[key] = found = found or ZERO
        if len(_COSTS) > 100_000:
            _COSTS.clear()
    return found


# cost answers by value: (src, dst, shape, n, profile)
_COSTS: dict[tuple[Sharding, Sharding, ArrayShape, int, str], Estimate] = {}


# ------------------------------------------------------------- emitting --
def reshard(em: Emitter, value: PValue, dst: Sharding) -> PValue:
    """`value` with sharding `dst` (tuples element by element)."""
    shape = value.global_shape
    if isinstance(shape, TupleShape):
        if value.sharding == dst:
            return value
        b = em.b()
        parts: list[Instruction] = []
        for i in range(len(shape.elements)):
            elem = PValue(b.get_tuple_element(value.instr, i), value.sharding.subsharding(shape, i), shape.elements[i])
            parts.append(reshard(em, elem, dst.subsharding(shape, i)).instr)
        return PValue(b.tuple(parts), dst, shape)
    assert isinstance(shape, ArrayShape)
    frame = manual_frame(value.sharding, dst, shape.rank, em.n) if shape.element_type.is_array else None
    if frame is None:
        return PValue(value.instr, dst, shape)
    src_tm, dst_tm = frame
    steps = _plan_of(em.ctx, value.sharding, dst, frame, shape)
    if is_partially_manual(value.sharding) and not is_partially_manual(dst):
        dst = to_sharding(dst_tm)  # "replicated" inside the region: whole per manual group
    x = value.instr
    dims = tuple(shape.dims)
    for step in steps:
        if step.kind == "slice":
            x = _emit_slice(em, x, src_tm, step.result, dims)
        elif step.kind == "permute":
            x = _emit_permute(em, x, src_tm, step.result)
        elif step.kind == "piece-permute":
            x = _emit_piece_permute(em, x, src_tm, step.result, dims)
        elif step.kind == "all-to-all":
            i, j, g = step.dims
            x = _emit_all_to_all(em, x, src_tm, step.result, (i, j, g), dims)
        elif step.kind == "sum-gather":
            k, g = step.dims
            x = _emit_sum_gather(em, x, src_tm, k, g, dims)
        else:
            k, g = step.dims
            x = em.all_gather(x, k, _factor_groups(src_tm, k, g))
            x = em.slice_to(x, tuple(min(a, t) for a, t in zip(x.array_shape.dims, tm_local_dims(step.result, dims))))
        src_tm = step.result
    return PValue(x, dst, shape)


def _plan_of(ctx: PartitionContext, src: Sharding, dst: Sharding, frame: tuple[TileMap, TileMap],
             shape: ArrayShape) -> list[Step]:
    """`plan` between the maps `frame` of a resharding from `src` to `dst` (manual_frame's
    answer, a function of the two shardings), kept per run by the shardings' exact forms: every
    layer of a model reshards between the same few shardings."""
    key = (su.exact(src), su.exact(dst), shape)
    found = ctx.reshard_plans.get(key)
    if found is None:
        found = ctx.reshard_plans[key] = plan(*frame, shape, ctx.cost_model)
    return found


def _emit_sum_gather(em: Emitter, x: Instruction, src: TileMap, k: int, g: int, dims: tuple[int, ...]) -> Instruction:
    """The `_sum_gathers` step: dim k (tiled g ways, rows of L) made whole by adding, over the
    devices that tile it, zero buffers of the whole dim each holding one device's rows at its
    offset (a padding-only tile writes zeros; its offset is clamped into the buffer, where it
    overwrites zeros with zeros).  Adding zeros leaves every value as it was (-0.0 becomes 0.0);
    a pred value is or-ed."""
    b = em.b()
    etype = x.array_shape.element_type
    rows, size = x.array_shape.dims[k], dims[k]
    x = em.mask_padding(x, src, dims, [k], 0)
    whole = tuple(size if d == k else n for d, n in enumerate(x.array_shape.dims))
    buffer = b.broadcast(b.constant(0, etype), ArrayShape(etype, whole))
    starts = np.minimum(src.coords[:, k] * rows, size - rows)
    zero = b.constant(0)
    written = b.dynamic_update_slice(buffer, x, [em.device_scalar(starts) if d == k else zero
                                                 for d in range(len(whole))])
    return em.sum_of_parts(written, _factor_groups(src, k, g))


def _emit_slice(em: Emitter, x: Instruction, src: TileMap, dst: TileMap, dims: tuple[int, ...]) -> Instruction:
    s_local, d_local = tm_local_dims(src, dims), tm_local_dims(dst, dims)
    offsets = [_nested_offsets(src, dst, dims, k) for k in range(len(dims))]
    # the buffer must hold every slice whole (dynamic-slice would clamp and shift it)
    need = tuple(max(int(o.max()) + d, s) for o, d, s in zip(offsets, d_local, s_local))
    x = em.pad_to(x, need)
    return em.local_slice(x, offsets, d_local)


def _emit_permute(em: Emitter, x: Instruction, src: TileMap, dst: TileMap) -> Instruction:
    pairs = _permute_pairs(src, dst)
    assert pairs is not None, "a permute step was planned where no permutation reaches the target"
    keep = np.all(dst.coords == src.coords, axis=1).astype(np.int64)
    senders = {s for s, _ in pairs}
    kept = [int(d) for d in np.flatnonzero(keep)]
    if not senders.intersection(kept):
        # the devices that keep their tile send it to themselves: one permute, no select
        return em.collective_permute(x, sorted(pairs + [(d, d) for d in kept], key=lambda p: p[1]))
    moved = em.collective_permute(x, pairs)
    b = em.b()
    flag = b.compare(em.device_scalar(keep), b.constant(1), "EQ")
    pred = b.broadcast(flag, ArrayShape(PrimitiveType.PRED, tuple(x.array_shape.dims)))
    return b.select(pred, x, moved)


def _emit_all_to_all(em: Emitter, x: Instruction, src: TileMap, result: TileMap, move: tuple[int, int, int],
                     dims: tuple[int, ...]) -> Instruction:
    """Split dim j of the local value into g chunks, exchange them within each group of the g
    devices holding consecutive tiles of dim i, and concatenate the received chunks along dim i."""
    i, j, k = move
    local = list(tm_local_dims(src, dims))
    chunk_j = -(-local[j] // k)
    x = em.pad_to(x, tuple(chunk_j * k if a == j else local[a] for a in range(len(dims))))
    b = em.b()
    # [.., j: k*c, ..] -> [.., k, c, ..]; exchange along the new k dim
    split = list(x.array_shape.dims)
    split[j:j + 1] = [k, chunk_j]
    y = b.reshape(x, x.array_shape.with_dims(split))
    y = em.all_to_all(y, j, _factor_groups(src, i, k))
    # now dim j (size k) indexes the source's dim-i tile: move it just before dim i and merge
    rank = len(split)
    i_pos = i if i < j else i + 1
    perm = [a for a in range(rank) if a != j]
    perm.insert(perm.index(i_pos), j)
    y = b.transpose(y, perm)
    merged = list(y.array_shape.dims)
    at = perm.index(j)
    merged[at:at + 2] = [merged[at] * merged[at + 1]]
    y = b.reshape(y, y.array_shape.with_dims(merged))
    return em.slice_to(y, tuple(min(a, t) for a, t in zip(merged, tm_local_dims(result, dims))))
