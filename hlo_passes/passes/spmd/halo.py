"""Halo exchange: give each device the window of a tiled dimension that its windowed op reads.

A convolution or reduce-window whose input is tiled along a windowed (spatial)
dimension needs, on device t, the input rows [lo_t, lo_t + width) — its own
tile plus some rows of its neighbours' tiles (the *halo*), or fewer rows when a
stride skips some.  GSPMD's answer, taken here:

1. every device sends its first/last rows to the neighbours that need them with
   one collective-permute per neighbour distance (usually one each way);
2. the received rows and the own tile are concatenated into an extended buffer
   covering global rows [t*L - left, t*L + L + right);
3. a (dynamic-)slice at a per-device offset cuts this device's window out of it;
4. rows outside the global array [0, size) are set to the op's padding value
   (zero for a convolution, the init value for a reduce-window): they are
   the op's edge padding or the don't-care padding of uneven tiles.  Rows from
   beyond the first/last device arrive as zeros from the collective-permute, so
   a zero-padded op over evenly tiled data needs no mask at all.

    x = f32[2,4,16,4] (rows 4t..4t+3 on device t), 3x3 conv, pad 1_1, stride 1
      %l = f32[2,1,16,4] slice(x), slice={[0:2], [3:4], ...}     last row -> right neighbour
      %h = f32[2,1,16,4] collective-permute(%l), source_target_pairs={{0,1},{1,2},{2,3}}
      %r = ... the first row -> left neighbour
      %e = f32[2,6,16,4] concatenate(%h, x, %r'), dimensions={1}
    then the local convolution runs on %e with pad 0_0 in that dimension.

`plan` works out the rows from the window per tile (`window_rows`); `exchange`
emits the collectives.  The op then runs locally with the window returned by
`window_rows` (its padding moved into the exchanged data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, TypedDict

import numpy as np

from hlo_passes.ir.attributes import PaddingConfig, WindowDimension
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.partition_context import DeviceGroups, Emitter, groups_varying
from hlo_passes.passes.spmd.tile_map import TileMap


@dataclass(frozen=True)
class WindowRows:
    """Per tile coordinate, the input rows a windowed op reads along one dimension, and the
    window the local op then runs with."""

    starts: tuple[int, ...]    # global index of the first row tile t reads
    width: int                 # rows every tile reads
    local: WindowDimension     # the window of the local op over those rows


def window_rows(w: WindowDimension, tiles: int, out_first: Sequence[int], out_count: int,
                win_first: Sequence[int], win_count: int) -> WindowRows | None:
    """Rows read when tile t computes outputs [out_first[t], +out_count) over window positions
    [win_first[t], +win_count) of window `w`; None when the tiles' rows do not line up with
    the base dilation the same way (the local op would need per-device padding)."""
    s, rd, ld, pl = w.stride, w.rhs_dilation, w.lhs_dilation, w.padding_low
    span = (out_count - 1) * s + (win_count - 1) * rd  # padded coords one tile's window covers
    starts: list[int] = []
    phase: int | None = None
    width: int | None = None
    for t in range(tiles):
        base = out_first[t] * s + win_first[t] * rd - pl  # first padded coord, from input row 0
        lo, hi = -(-base // ld), (base + span) // ld
        if phase is None:
            phase, width = lo * ld - base, hi - lo + 1
        elif (phase, width) != (lo * ld - base, hi - lo + 1):
            return None
        starts.append(lo)
    if phase is None or width is None or width < 1:
        return None
    high = span - phase - (width - 1) * ld
    local = WindowDimension(win_count, s, phase, high, ld, rd, w.reversal)
    return WindowRows(tuple(starts), width, local)


@dataclass(frozen=True)
class Halo:
    """How one tiled dimension is exchanged: rows taken from the left and right neighbours
    and where each tile's window starts in the extended buffer."""

    dim: int
    tiles: int
    size: int                  # global rows
    local: int                 # rows per tile (ceil)
    rows: WindowRows
    left: int                  # rows received from lower tiles
    right: int                 # rows received from higher tiles
    mask: bool                 # rows outside [0, size) must be set to the padding value
    active: tuple[bool, ...] | None = None  # tiles whose results are not all padding (None: all)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each tile's window starts in its extended buffer (tiles whose results are all
        padding read whatever lies nearest)."""
        last = self.left + self.local + self.right - self.rows.width
        return tuple(min(max(self.left - (t * self.local - lo), 0), last) for t, lo in enumerate(self.rows.starts))

    def bytes(self, row_bytes: int) -> int:
        """Bytes each device receives (the cheaper of the two ways to exchange, see `exchange`)."""
        return min(self.left + self.right, self.interval_rows) * row_bytes

    @property
    def permutes(self) -> int:
        """Collective-permutes the exchange sends."""
        if self.interval_rows < self.left + self.right:
            return sum(1 for t in self.transfers if t.remote)
        return -(-self.left // self.local) + -(-self.right // self.local)

    @property
    def transfers(self) -> tuple["Transfer", ...]:
        return interval_transfers(self)

    @property
    def interval_rows(self) -> int:
        """Rows a device receives when each takes only the rows its window needs."""
        return sum(t.rows for t in self.transfers if t.remote)


class _Step(TypedDict):
    """A collective-permute being packed by `interval_transfers`."""

    local: bool
    senders: set[int]
    receivers: set[int]
    pieces: list[tuple[int, int, int, int]]  # (dst tile, src tile, first global row, rows)


@dataclass(frozen=True)
class Transfer:
    """One step of an interval exchange: tile `dst` takes up to `rows` rows from tile `src` for
    each (src, dst) in `pairs` — by one collective-permute, or locally when src == dst (then
    every pair is local) — from `src_start[src]` of the source buffer, landing at `dst_start[dst]`
    of the window (tiles outside the step land in the scratch rows past the window)."""

    pairs: tuple[tuple[int, int], ...]
    rows: int
    src_start: tuple[int, ...]
    dst_start: tuple[int, ...]

    @property
    def remote(self) -> bool:
        return any(s != d for s, d in self.pairs)


def interval_transfers(h: "Halo") -> tuple[Transfer, ...]:
    """The steps that give each tile exactly the rows its window needs: a window far from its
    own tile (a slice from the middle of the array) takes them from one or two tiles, not from
    every tile in between.  Pieces are packed into as few collective-permutes as the rule
    "each device sends at most once and receives at most once per permute" allows, each
    tile's pieces in increasing row order (see `_exchange_intervals`)."""
    found = _TRANSFERS.get(h)
    if found is not None:
        return found
    width, local, size = h.rows.width, h.local, h.size
    pieces: list[tuple[int, int, int, int]] = []  # (dst tile, src tile, first global row, rows)
    for t, lo in enumerate(h.rows.starts):
        if h.active is not None and not h.active[t]:
            continue  # its results are all padding: it needs no rows
        need_lo, need_hi = max(lo, 0), min(lo + width, size)
        for src in range(h.tiles):
            a, b = max(need_lo, src * local), min(need_hi, (src + 1) * local, size)
            if a < b:
                pieces.append((t, src, a, b - a))
    steps: list[_Step] = []
    last_step: dict[int, int] = {}
    for t, src, a, n in sorted(pieces, key=lambda p: (p[2] - h.rows.starts[p[0]], p[0])):
        is_local = src == t
        first = last_step.get(t, -1) + 1
        for i in range(first, len(steps) + 1):
            if i == len(steps):
                steps.append({"local": is_local, "senders": set(), "receivers": set(), "pieces": []})
            step = steps[i]
            if step["local"] == is_local and src not in step["senders"] and t not in step["receivers"]:
                step["senders"].add(src)
                step["receivers"].add(t)
                step["pieces"].append((t, src, a, n))
                last_step[t] = i
                break
    transfers: list[Transfer] = []
    for step in steps:
        src_start, dst_start = [0] * h.tiles, [width] * h.tiles
        for t, src, a, _ in step["pieces"]:
            src_start[src] = a - src * local
            dst_start[t] = a - h.rows.starts[t]
        transfers.append(Transfer(tuple((src, t) for t, src, _, _ in step["pieces"]),
                                  max(n for *_, n in step["pieces"]), tuple(src_start), tuple(dst_start)))
    found = _TRANSFERS[h] = tuple(transfers)
    return found


_TRANSFERS: dict["Halo", tuple[Transfer, ...]] = {}


def plan(dim: int, size: int, tiles: int, rows: WindowRows, zero_padding: bool,
         active: Sequence[bool] | None = None, reads_outside: bool = True) -> Halo:
    """The exchange for a dim of `size` rows in `tiles` tiles; `zero_padding`: the op pads with
    zero (what the collective-permute delivers where there is no neighbour); `active`: the tiles
    whose results are not all padding (default: every tile) — only they need their rows;
    `reads_outside`: whether a result inside the output can read a row outside [0, size) (a
    slice's cannot: its row j reads one input row, inside the input whenever j is inside the
    output, so the rows it reads outside only reach the output's don't-care padding and are
    never masked)."""
    local = -(-size // tiles)
    used = [(t, lo) for t, lo in enumerate(rows.starts) if active is None or active[t]]
    left = max([0] + [t * local - lo for t, lo in used])
    right = max([0] + [lo + rows.width - (t + 1) * local for t, lo in used])
    outside = [t for t, lo in used if lo < 0 or lo + rows.width > size]
    beyond_end = [t for t, lo in used if lo + rows.width > size]
    uneven = size % tiles != 0
    mask = reads_outside and (bool(outside) and not zero_padding or bool(beyond_end) and uneven)
    return Halo(dim, tiles, size, local, rows, left, right, mask,
                tuple(active) if active is not None and not all(active) else None)


def exchange(em: Emitter, x: Instruction, tm: TileMap, halo: Halo, fill: Instruction | None) -> Instruction:
    """This device's window rows of `x` (tiled along `halo.dim` by `tm`); rows outside the array
    read `fill` (a scalar; None: zero).  Neighbours' edge rows concatenated around the own tile,
    or — when that would move more — only the rows each window needs (`interval_transfers`)."""
    if halo.interval_rows < halo.left + halo.right:
        return _masked(em, _exchange_intervals(em, x, tm, halo), tm, halo, fill, x.array_shape.element_type)
    k, local, tiles = halo.dim, halo.local, halo.tiles
    b = em.b()
    groups = _as_lists(groups_varying(tm, [k]))
    parts: list[Instruction] = []
    for m in range(-(-halo.left // local), 0, -1):  # farthest left neighbour first
        rows = min(local, halo.left - (m - 1) * local)
        parts.append(_from_neighbour(em, x, k, local - rows, rows, groups, -m, tiles))
    parts.append(x)
    for m in range(1, -(-halo.right // local) + 1):
        rows = min(local, halo.right - (m - 1) * local)
        parts.append(_from_neighbour(em, x, k, 0, rows, groups, m, tiles))
    ext = b.concatenate(parts, k) if len(parts) > 1 else x
    coord = tm.coords[:, k]  # every device's tile along k: per-tile tables index it
    dims = list(ext.array_shape.dims)
    dims[k] = halo.rows.width
    offsets = [np.zeros(em.n, np.int64) for _ in dims]
    offsets[k] = np.asarray(halo.offsets, np.int64)[coord]
    window = em.local_slice(ext, offsets, tuple(dims))
    return _masked(em, window, tm, halo, fill, x.array_shape.element_type)


def window_in_place(em: Emitter, x: Instruction, tm: TileMap, halo: Halo) -> Instruction:
    """This device's window rows of `x`, which holds all `halo.size` rows of `halo.dim` (the
    dim is untiled where `x` lives; `tm` tiles it as the op's tiling does, giving each device
    its tile coordinate): a zero pad for the rows outside the array and one slice at a
    per-device offset.  No rows travel: an input that is replicated along a convolution's
    spatial dim already holds every row a tile's window reads, where slicing the tiles and
    exchanging their halos would send the edge rows back to devices that had them."""
    k, width, starts = halo.dim, halo.rows.width, halo.rows.starts
    low = max(0, -min(starts))
    high = max(0, max(lo + width for lo in starts) - halo.size)
    shape = x.array_shape
    if low or high:
        zero = em.b().constant(0, shape.element_type)
        cfg = PaddingConfig(tuple((low, high, 0) if i == k else (0, 0, 0) for i in range(shape.rank)))
        x = em.b().pad(x, zero, cfg)
    offsets = [np.zeros(em.n, np.int64) for _ in range(shape.rank)]
    offsets[k] = (np.asarray(starts, np.int64) + low)[tm.coords[:, k]]
    sizes = tuple(width if i == k else d for i, d in enumerate(x.array_shape.dims))
    return em.local_slice(x, offsets, sizes)


def _exchange_intervals(em: Emitter, x: Instruction, tm: TileMap, halo: Halo) -> Instruction:
    """Each tile's window assembled from exactly the rows it needs: per step one dynamic-slice
    at a per-device offset, one collective-permute (none for a local step), one
    dynamic-update-slice at a per-device offset, each tile's pieces in increasing row order (a
    piece shorter than the message leaves don't-care rows that the next piece overwrites, or
    that lie outside the array or past the window)."""
    k, width = halo.dim, halo.rows.width
    b = em.b()
    groups = _as_lists(groups_varying(tm, [k]))
    coord = tm.coords[:, k]  # every device's tile along k: per-tile tables index it
    transfers = halo.transfers
    dims = list(x.array_shape.dims)
    if not transfers:  # no tile that matters reads a row of the array (only padding)
        return em.broadcast_scalar(0, x.array_shape.element_type,
                                   tuple(width if i == k else d for i, d in enumerate(dims)))
    # dynamic-slice and dynamic-update-slice clamp their offsets: the source is padded by what
    # the longest message reads past its end, the window by the scratch rows pieces land in
    overflow = max(0, max(t.src_start[src] + t.rows - dims[k] for t in transfers for src, _ in t.pairs))
    padded = em.pad_to(x, tuple(d + overflow if i == k else d for i, d in enumerate(dims)))
    spare = max(t.dst_start[c] + t.rows for t in transfers for c in range(halo.tiles)) - width
    buf_dims = tuple(width + max(0, spare) if i == k else d for i, d in enumerate(dims))
    buf = em.broadcast_scalar(0, x.array_shape.element_type, buf_dims)
    zero = b.constant(0)
    for t in transfers:
        piece_dims = tuple(t.rows if i == k else d for i, d in enumerate(dims))
        starts = [em.device_scalar(np.asarray(t.src_start, np.int64)[coord]) if i == k else zero for i in range(len(dims))]
        piece = b.dynamic_slice(padded, starts, piece_dims)
        if t.remote:
            piece = em.collective_permute(piece, [(g[src], g[dst]) for g in groups for src, dst in t.pairs])
        at = [em.device_scalar(np.asarray(t.dst_start, np.int64)[coord]) if i == k else zero for i in range(len(dims))]
        buf = b.dynamic_update_slice(buf, piece, at)
    return b.slice(buf, [0] * len(dims), [width if i == k else d for i, d in enumerate(dims)])


def _masked(em: Emitter, window: Instruction, tm: TileMap, halo: Halo, fill: Instruction | None,
            etype: PrimitiveType) -> Instruction:
    """Rows of the window outside the array [0, size) set to `fill` (None: zero) when they matter.
    Only the first and last rows of a window can lie outside: just those are masked (a select
    over the whole window would cost as much as the op it feeds)."""
    if not halo.mask:
        return window
    k, width = halo.dim, halo.rows.width
    starts = halo.rows.starts
    head = min(width, max([0] + [-lo for lo in starts]))
    tail = min(width, max([0] + [lo + width - halo.size for lo in starts]))
    b = em.b()
    if head + tail >= width:
        return _mask_rows(em, window, tm, halo, fill, etype, 0)
    dims = list(window.array_shape.dims)
    pieces: list[Instruction] = []
    for lo, hi, masked in ((0, head, True), (head, width - tail, False), (width - tail, width, True)):
        if hi <= lo:
            continue
        part = b.slice(window, [lo if i == k else 0 for i in range(len(dims))],
                       [hi if i == k else d for i, d in enumerate(dims)])
        pieces.append(_mask_rows(em, part, tm, halo, fill, etype, lo) if masked else part)
    return b.concatenate(pieces, k) if len(pieces) > 1 else pieces[0]


def _mask_rows(em: Emitter, part: Instruction, tm: TileMap, halo: Halo, fill: Instruction | None,
               etype: PrimitiveType, first: int) -> Instruction:
    """`part` (rows first.. of the window) with rows outside the array set to `fill`."""
    k = halo.dim
    b = em.b()
    coord = tm.coords[:, k]  # every device's tile along k: per-tile tables index it
    dims = list(part.array_shape.dims)
    rows = ArrayShape(PrimitiveType.S32, (dims[k],))
    pos = b.add(b.iota(rows, 0), b.broadcast(em.device_scalar(np.asarray(halo.rows.starts, np.int64)[coord] + first), rows))
    low = b.compare(pos, b.broadcast(b.constant(0), rows), "GE")
    high = b.compare(pos, b.broadcast(b.constant(halo.size), rows), "LT")
    inside = b.op(Opcode.AND, low.shape, [low, high])
    inside = b.broadcast(inside, ArrayShape(PrimitiveType.PRED, tuple(dims)), [k])
    pad = b.broadcast(fill if fill is not None else b.constant(0, etype), part.array_shape)
    return b.select(inside, part, pad)


def _from_neighbour(em: Emitter, x: Instruction, k: int, start: int, rows: int, groups: list[list[int]], shift: int,
                    tiles: int) -> Instruction:
    """Rows [start, start+rows) of the tile `shift` positions away along dim k (zeros where
    there is none)."""
    dims = list(x.array_shape.dims)
    dims[k] = rows
    pairs = [(g[t + shift], g[t]) for g in groups for t in range(tiles) if 0 <= t + shift < tiles]
    if not pairs:
        return em.broadcast_scalar(0, x.array_shape.element_type, tuple(dims))
    starts = [0] * len(dims)
    starts[k] = start
    piece = em.b().slice(x, starts, [s + d for s, d in zip(starts, dims)])
    return em.collective_permute(piece, pairs)


def row_bytes(local_dims: Sequence[int], dim: int, element_bytes: int) -> int:
    return math.prod(d for i, d in enumerate(local_dims) if i != dim) * element_bytes


__all__ = ["Halo", "WindowRows", "exchange", "plan", "row_bytes", "window_in_place", "window_rows"]


def _as_lists(groups: DeviceGroups) -> list[list[int]]:
    """Device groups as lists of ints: a halo's permute pairs are read off them per device."""
    return groups.tolist() if isinstance(groups, np.ndarray) else [list(g) for g in groups]
