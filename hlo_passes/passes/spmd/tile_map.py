"""TileMap: a tiled sharding as "which tile does each device hold", for propagation rules.

A propagation rule moves a sharding across an op by moving tile *coordinates*:
a transpose permutes them, a reduce drops the reduced dimension's coordinate (its
devices then hold the same data: replication), a broadcast inserts a 0, a dot
takes the batch and free coordinates from one operand and the other's free ones.
Working per device makes all of these one-liners and makes merging two partial
shardings exact: the merge is valid iff every device still holds exactly one
tile and every tile has the same number of holders.

    tm = TileMap.from_sharding(Sharding({devices=[4,1,2]<=[8] last_tile_dim_replicate}), 8)
    tm.remap(2, {1: 0}).to_sharding()  ->  {devices=[1,4,2]<=[8] last_tile_dim_replicate}

MANUAL subgroups (partially manual regions of shard_map) are carried as a
per-device group number that rules never touch; two maps merge only when their
manual groups agree.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final, Iterable, Iterator, Sequence, TypeAlias

import numpy as np
import numpy.typing as npt

from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind

# Tile coordinates, manual groups, per-device tables: int64, one row per device.
Int64Array: TypeAlias = npt.NDArray[np.int64]


class _Missing(enum.Enum):
    MISSING = enum.auto()


_MISSING: Final = _Missing.MISSING  # "not cached yet" (None is a cached answer)
_FROM_SHARDING: dict[tuple[Sharding, int, int | None], "TileMap | None"] = {}


@dataclass(frozen=True, eq=False)
class TileMap:
    dims: tuple[int, ...]          # tile counts per data dimension
    coords: Int64Array             # [num_devices, rank]: tile coordinate of device d
    manual: Int64Array             # [num_devices]: manual group of device d (all 0 when none)
    manual_size: int = 1           # number of manual groups
    # maps derived from this one (remap, merge), by their arguments: a handler asks for the same
    # few derivations of the same (cached) maps at every layer of a model
    _derived: dict[tuple[str, int, tuple[tuple[int, int], ...]], "TileMap"] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _merged: dict[int, tuple["TileMap", "TileMap | None"]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def num_devices(self) -> int:
        return int(self.coords.shape[0])

    @property
    def num_tiles(self) -> int:
        return math.prod(self.dims)

    # ---------------------------------------------------------- converting --
    @classmethod
    def replicated(cls, rank: int, num_devices: int) -> "TileMap":
        return cls((1,) * rank, np.zeros((num_devices, rank), np.int64), np.zeros(num_devices, np.int64))

    @classmethod
    def from_sharding(cls, sharding: Sharding, num_devices: int, rank: int | None = None) -> "TileMap | None":
        """None for shardings that are not tiles of an array (maximal, fully manual, tuple, unknown).
        Answers are cached by value (a big module asks for the same few shardings millions of
        times); the maps are immutable (their arrays read-only)."""
        key = (sharding, num_devices, rank)
        found = _FROM_SHARDING.get(key, _MISSING)
        if found is _MISSING:
            found = cls._from_sharding(sharding, num_devices, rank)
            if found is not None:
                found.coords.setflags(write=False)
                found.manual.setflags(write=False)
            if len(_FROM_SHARDING) > 200_000:
                _FROM_SHARDING.clear()
            _FROM_SHARDING[key] = found
        return found

    @classmethod
    def _from_sharding(cls, sharding: Sharding, num_devices: int, rank: int | None) -> "TileMap | None":
        kind = sharding.kind
        if kind is ShardingKind.REPLICATED:
            return None if rank is None else cls.replicated(rank, num_devices)
        if kind is not ShardingKind.TILED:
            return None
        if rank is not None and sharding.data_rank != rank:
            return None
        arr = sharding.tile_assignment
        assert arr is not None, "a TILED sharding has a tile assignment"
        n = arr.size
        flat = arr.reshape(-1)
        if n != num_devices or not np.array_equal(np.sort(flat), np.arange(n)):
            return None
        data_rank = sharding.data_rank
        manual_axes = [data_rank + i for i, k in enumerate(sharding.subgroups) if k is SubgroupKind.MANUAL]
        if any(k not in (SubgroupKind.MANUAL, SubgroupKind.REPLICATED) for k in sharding.subgroups):
            return None
        manual_dims = [arr.shape[a] for a in manual_axes]
        # position of every tile-array entry, scattered to the device it names
        index = np.unravel_index(np.arange(n), arr.shape)
        coords = np.zeros((n, data_rank), np.int64)
        if data_rank:
            coords[flat] = np.stack(index[:data_rank], axis=1)
        manual = np.zeros(n, np.int64)
        if manual_axes:
            manual[flat] = np.ravel_multi_index([index[a] for a in manual_axes], manual_dims)
        return cls(tuple(arr.shape[:data_rank]), coords, manual, math.prod(manual_dims))

    def to_sharding(self) -> Sharding | None:
        """The sharding, or None when tiles have unequal numbers of holders (not expressible);
        computed once per map."""
        return self._sharding

    @cached_property
    def _sharding(self) -> Sharding | None:
        n = self.num_devices
        groups = math.prod(self.dims) * self.manual_size
        if n % groups:
            return None
        per = n // groups
        key = self.manual.copy() if self.rank == 0 else (
            np.ravel_multi_index(self.coords.T, self.dims) * self.manual_size + self.manual)
        order = stable_order(key, groups)  # by tile, then by device id
        counts = np.bincount(key, minlength=groups)
        if np.any(counts != per):
            return None
        tile_dims = list(self.dims)
        subgroups: list[SubgroupKind] = []
        if self.manual_size > 1:
            tile_dims.append(self.manual_size)
            subgroups.append(SubgroupKind.MANUAL)
        if per > 1:
            tile_dims.append(per)
            subgroups.append(SubgroupKind.REPLICATED)
        if not subgroups and all(t == 1 for t in self.dims):
            return Sharding.replicated()
        if subgroups == [SubgroupKind.REPLICATED] and all(t == 1 for t in self.dims):
            return Sharding.replicated()
        return Sharding.tiled(order.reshape(tile_dims), tuple(subgroups))

    # ---------------------------------------------------------- operations --
    def remap(self, rank: int, source: dict[int, int]) -> "TileMap":
        """A map of rank `rank` whose dim i takes the tiling of this map's dim `source[i]`;
        dims not in `source` are untiled and dims never used are dropped (replicated).
        Computed once per map and arguments."""
        key = ("remap", rank, tuple(sorted(source.items())))
        found = self._derived.get(key)
        if found is None:
            found = self._derived[key] = self._remap(rank, source)
        return found

    def _remap(self, rank: int, source: dict[int, int]) -> "TileMap":
        coords = np.zeros((self.num_devices, rank), np.int64)
        dims = [1] * rank
        for out, src in source.items():
            coords[:, out] = self.coords[:, src]
            dims[out] = self.dims[src]
        coords.setflags(write=False)
        return TileMap(tuple(dims), coords, self.manual, self.manual_size)

    def coarsenings(self) -> Iterator["TileMap"]:
        """This map, then it with tiled dims cut into fewer, larger tiles (c -> c // g: the major
        part of each dim's tiling kept), every combination of divisors."""
        divisors = [[g for g in range(1, t + 1) if t % g == 0] for t in self.dims]
        for gs in itertools.product(*divisors):
            coords = self.coords // np.asarray(gs, np.int64) if self.rank else self.coords
            yield TileMap(tuple(t // g for t, g in zip(self.dims, gs)), coords, self.manual, self.manual_size)

    def keep_dims(self, keep: Iterable[int]) -> "TileMap":
        """Same rank; dims not in `keep` become untiled."""
        return self.remap(self.rank, {d: d for d in keep})

    def transpose(self, perm: Sequence[int]) -> "TileMap":
        """Output dim i is input dim perm[i]."""
        return self.remap(len(perm), {i: p for i, p in enumerate(perm)})

    def fold(self, into: int, moved: int) -> "TileMap":
        """Dim `moved`'s tiling folded into dim `into` as its minor part: dim `into` gets
        dims[into] * dims[moved] tiles (device coordinate c[into] * dims[moved] + c[moved]) and
        dim `moved` none.  Where an op needs `moved` whole and `into` is already partly tiled
        (a sort along one axis of a 2-D mesh), its devices keep working on distinct rows: one
        all-to-all within each group of the moved axis, as XLA moves a sort's sharding.
        Computed once per map and arguments."""
        key = ("fold", self.rank, ((into, moved),))
        found = self._derived.get(key)
        if found is None:
            coords = self.coords.copy()
            coords[:, into] = self.coords[:, into] * self.dims[moved] + self.coords[:, moved]
            coords[:, moved] = 0
            coords.setflags(write=False)
            dims = list(self.dims)
            dims[into], dims[moved] = self.dims[into] * self.dims[moved], 1
            found = self._derived[key] = TileMap(tuple(dims), coords, self.manual, self.manual_size)
        return found

    def with_manual(self, other: "TileMap") -> "TileMap":
        """This tiling within `other`'s manual groups."""
        return TileMap(self.dims, self.coords, other.manual, other.manual_size)

    def same_manual(self, other: "TileMap") -> bool:
        return self.manual_size == other.manual_size and np.array_equal(self.manual, other.manual)

    def merge(self, other: "TileMap") -> "TileMap | None":
        """Both maps' tilings at once (dims tiled in both must agree), or None if impossible.
        Computed once per pair of maps (the other map is held by the cache)."""
        key = id(other)
        found = self._merged.get(key)
        if found is None or found[0] is not other:
            found = self._merged[key] = (other, self._merge(other))
        return found[1]

    def _merge(self, other: "TileMap") -> "TileMap | None":
        if self.rank != other.rank or self.num_devices != other.num_devices or not self.same_manual(other):
            return None
        coords = self.coords.copy()
        dims = list(self.dims)
        for i in range(self.rank):
            if other.dims[i] == 1:
                continue
            if self.dims[i] == 1:
                coords[:, i] = other.coords[:, i]
                dims[i] = other.dims[i]
            elif self.dims[i] != other.dims[i] or not np.array_equal(self.coords[:, i], other.coords[:, i]):
                return None
        coords.setflags(write=False)
        merged = TileMap(tuple(dims), coords, self.manual, self.manual_size)
        return merged if merged.to_sharding() is not None else None


def stable_order(key: Int64Array, bound: int) -> Int64Array:
    """The permutation sorting `key` (integers in [0, bound)) with ties in index order: a
    counting (radix) sort when the keys fit 16 bits, which numpy's stable sort does in linear
    time."""
    if bound <= 1 << 16 and (not key.size or (key.min() >= 0 and key.max() < bound)):
        key = key.astype(np.uint16)
    return np.argsort(key, kind="stable")


def reshape_tile_map(tm: TileMap, in_dims: tuple[int, ...], out_dims: tuple[int, ...]) -> TileMap:
    """Carry tiles across a reshape from `in_dims` to `out_dims`.

    Dimensions are grouped where their products agree ([a,b,c] -> [a*b,c] groups {a,b}->{ab}
    and {c}->{c}).  A group's tiles carry over when they cut the group's row-major element
    order into equal contiguous chunks, and those chunks cut the output dims the same way, or
    when the group is one dim of the same size on both sides beside size-1 dims (uneven tiles
    too); other groups lose their tiling (their devices become replicas)."""
    out_coords = np.zeros((tm.num_devices, len(out_dims)), np.int64)
    out_tiles = [1] * len(out_dims)
    for ins, outs in reshape_groups(in_dims, out_dims):
        big_in = [i for i in ins if in_dims[i] != 1]
        big_out = [o for o in outs if out_dims[o] != 1]
        if len(big_in) == 1 and len(big_out) == 1 and all(tm.dims[i] == 1 for i in ins if i != big_in[0]):
            # One dim of the same size on both sides, only size-1 dims added or removed: its
            # tiles carry over as they are, uneven ones too (both sides pad the same way).
            out_coords[:, big_out[0]] = tm.coords[:, big_in[0]]
            out_tiles[big_out[0]] = tm.dims[big_in[0]]
            continue
        chunk = _group_chunks(tm, ins, in_dims)
        if chunk is None:
            continue
        count, index = chunk
        split = _split_chunks(count, [out_dims[o] for o in outs])
        if split is None:
            continue
        rest = index.copy()
        for o, t in reversed(list(zip(outs, split))):
            out_coords[:, o] = rest % t
            rest //= t
            out_tiles[o] = t
    return TileMap(tuple(out_tiles), out_coords, tm.manual, tm.manual_size)


def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Minimal runs of dims of `a` and `b` with equal products; trailing 1s join the last run."""
    if 0 in a or 0 in b or not a or not b:
        return [(list(range(len(a))), list(range(len(b))))]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                gi.append(i)
                i += 1
            else:
                pb *= b[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    groups[-1][0].extend(range(i, len(a)))
    groups[-1][1].extend(range(j, len(b)))
    return groups


def _group_chunks(tm: TileMap, ins: list[int], dims: tuple[int, ...]) -> tuple[int, Int64Array]:
    """(chunk count, per-device chunk index) if the group's tiles cut its row-major order into
    contiguous chunks; when they don't, the tiling of the most minor tiled dims is dropped until
    they do (XLA keeps the major part of the sharding the same way)."""
    tiled = [i for i in ins if tm.dims[i] > 1]
    for keep in range(len(tiled), 0, -1):
        found = _chunks_of(tm, ins, dims, tiled[:keep])
        if found is not None:
            return found
    return 1, np.zeros(tm.num_devices, np.int64)


def _chunks_of(tm: TileMap, ins: list[int], dims: tuple[int, ...],
               tiled: list[int]) -> tuple[int, Int64Array] | None:
    first, last = ins.index(tiled[0]), ins.index(tiled[-1])
    if any(dims[i] != 1 for i in ins[:first]):  # an untiled major dim interleaves the chunks
        return None
    for i in ins[first:last]:
        if tm.dims[i] != dims[i]:  # major dims of a chunk must be cut into single rows
            return None
    if len(ins) > 1 and dims[ins[last]] % tm.dims[ins[last]]:
        return None
    span = ins[first:last + 1]
    counts = [tm.dims[i] for i in span]
    return math.prod(counts), np.asarray(np.ravel_multi_index(tm.coords[:, span].T, counts), np.int64)


def _split_chunks(count: int, sizes: list[int]) -> list[int] | None:
    """Tile counts per output dim that cut it into `count` row-major contiguous chunks."""
    tiles = []
    remaining = count
    real = [s for s in sizes if s != 1]
    for size in sizes:
        if remaining == 1 or size == 1:
            tiles.append(1)
        elif size % remaining == 0:
            tiles.append(remaining)
            remaining = 1
        elif remaining % size == 0:
            tiles.append(size)
            remaining //= size
        elif len(real) == 1:
            tiles.append(remaining)  # one dim to one dim: uneven tiles are fine
            remaining = 1
        else:
            return None
    return tiles if remaining == 1 else None
