"""The sharding algebra of GSPMD's propagation, on our `Sharding` values.

`sharding-propagation` moves shardings across ops the way XLA's ShardingPropagation does, and
XLA builds every moved sharding with a small set of operations on *tile assignments* (the
device array whose leading dims tile the data and whose trailing "subgroup" dims enumerate
replicas or manual groups).  Reproducing XLA's result instruction by instruction needs the
same operations with the same device order, so this module implements them on numpy device
arrays:

    replicate_dims(s, dims)        dims stop being tiled; their devices become replicas
    transpose(s, perm)             the tile grid permuted like the data
    remove_dims / insert_dims      untiled dims dropped / added
    reshape(src, dst, s)           tiles carried across a reshape (split and merged dims)
    merge_if_compatible(a, m, b)   two partial shardings combined into one with more tiles
    merge(a, b)                    XLA's MergeSharding: combine, else keep the more specific
    is_subtiling(shape, p, s)      every device's tile under p lies inside its tile under s
    is_more_specific(a, b)         more tiles, or tiled over replicated, or manual over maximal

Canonical form.  Two spellings of one device layout compare equal (`Sharding.__eq__`), but a
partially replicated sharding is only canonical once the devices of each replica group are
sorted, which XLA's `PartialTile` does and which makes "the same devices hold the same tile"
an equality test.  Every sharding built here goes through `subgroup()` (XLA's
`HloSharding::Subgroup` normalisation: size-1 subgroup dims dropped, equal kinds merged,
MANUAL before REPLICATED, replica groups sorted, all-replicated → `{replicated}`).

Sharding metadata (`metadata={op_name=...}` inside a sharding) travels with the sharding it
describes, as XLA keeps it; merging two shardings keeps both lists.
"""

from __future__ import annotations

import enum
import functools
import math
from typing import Callable, Final, Iterable, Sequence, TypeAlias, TypeVar, overload

import numpy as np
import numpy.typing as npt

from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import IotaDevices, Sharding, ShardingKind, SubgroupKind
from hlo_passes.passes.spmd.tile_map import Int64Array

REP = SubgroupKind.REPLICATED
MAN = SubgroupKind.MANUAL
_KIND_ORDER = [SubgroupKind.MAXIMAL, SubgroupKind.OTHER, SubgroupKind.MANUAL, SubgroupKind.UNREDUCED,
               SubgroupKind.REPLICATED]


# ------------------------------------------------------------------- metadata --
def metadata_entries(text: str) -> list[str]:
    """`{op_name="a"}` -> ['op_name="a"']; `{{op_name="a"}, {op_name="b"}}` -> two entries."""
    text = text.strip()
    if not text:
        return []
    body = text[1:-1].strip() if text.startswith("{") and text.endswith("}") else text
    if not body.startswith("{"):
        return [body] if body else []
    entries, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(body):
        if ch == '"' and (i == 0 or body[i - 1] != "\\"):
            quoted = not quoted
        if quoted:
            continue
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                entries.append(body[start:i].strip())
    return entries


def metadata_text(entries: Sequence[str]) -> str:
    if not entries:
        return ""
    if len(entries) == 1:
        return "{" + entries[0] + "}"
    return "{" + ", ".join("{" + e + "}" for e in entries) + "}"


def with_metadata(s: Sharding, text: str) -> Sharding:
    from dataclasses import replace
    if s.kind is ShardingKind.TUPLE:
        return replace(s, elements=tuple(with_metadata(e, text) for e in s.elements))
    return replace(s, metadata=text)


def merged_metadata(dst: str, src: str) -> str:
    """dst's entries, then src's entries that dst does not have (XLA's merge order)."""
    a = metadata_entries(dst)
    return metadata_text(a + [e for e in metadata_entries(src) if e not in a])


# ---------------------------------------------------------------- predicates --
def is_replicated(s: Sharding) -> bool:
    return s.kind is ShardingKind.REPLICATED


def is_manual(s: Sharding) -> bool:
    if s.kind is ShardingKind.TUPLE:
        return bool(s.elements) and all(is_manual(e) for e in s.elements)
    return s.kind is ShardingKind.MANUAL


def is_tile_maximal(s: Sharding) -> bool:
    """Replicated or on one device (XLA's IsTileMaximal; a tuple when every leaf is)."""
    if s.kind is ShardingKind.TUPLE:
        return all(is_tile_maximal(e) for e in s.elements)
    return s.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL)


def is_tiled(s: Sharding) -> bool:
    return s.kind is ShardingKind.TILED


def is_spatially_partitioned(s: Sharding | None) -> bool:
    """Tiled or replicated (not maximal, manual or unknown): what propagation moves."""
    if s is None:
        return False
    if s.kind is ShardingKind.TUPLE:
        return any(is_spatially_partitioned(e) for e in s.elements)
    return s.kind in (ShardingKind.TILED, ShardingKind.REPLICATED)


def xla_subgroups(s: Sharding) -> tuple[SubgroupKind, ...]:
    """XLA's `subgroup_types()`: empty for `last_tile_dim_replicate`, which XLA keeps as a flag."""
    return () if s.subgroups == (REP,) else s.subgroups


def replicate_on_last_tile_dim(s: Sharding) -> bool:
    return s.kind is ShardingKind.TILED and s.subgroups == (REP,)


def has_partial_replication(s: Sharding) -> bool:
    return s.kind is ShardingKind.TILED and REP in s.subgroups


def is_manual_subgroup(s: Sharding) -> bool:
    return s.kind is ShardingKind.TILED and MAN in s.subgroups


def data_rank(s: Sharding) -> int:
    return s.data_rank if s.kind is ShardingKind.TILED else 0


def num_tiles(s: Sharding) -> int:
    """Tiles of the data (replicas and manual groups not counted); 1 when not tiled."""
    if s.kind is not ShardingKind.TILED:
        return 1
    return s.data_tile_count


def tile_dim(s: Sharding, i: int) -> int:
    return s.tile_dims[i] if s.kind is ShardingKind.TILED else 1


def arr(s: Sharding) -> Int64Array:
    """The tile assignment (read-only: operations build new arrays from it)."""
    assert s.tile_assignment is not None, s
    return s.tile_assignment


def replication_dim(s: Sharding) -> int:
    """Index of the REPLICATED subgroup dim in the tile array, -1 if none."""
    if s.kind is not ShardingKind.TILED or REP not in s.subgroups:
        return -1
    return s.data_rank + s.subgroups.index(REP)


def manual_dim(s: Sharding) -> int:
    if s.kind is not ShardingKind.TILED or MAN not in s.subgroups:
        return -1
    return s.data_rank + s.subgroups.index(MAN)


# ------------------------------------------------------------ construction --
@overload
def canon(s: Sharding) -> Sharding: ...
@overload
def canon(s: None) -> None: ...
def canon(s: Sharding | None) -> Sharding | None:
    """The canonical form of a parsed sharding (see the module docstring)."""
    if s is None:
        return None
    if s.kind is ShardingKind.TUPLE:
        from dataclasses import replace
        return replace(s, elements=tuple(canon(e) for e in s.elements))
    if s.kind is not ShardingKind.TILED:
        return s
    out = subgroup(arr(s), s.subgroups, s.metadata)
    if s.shard_group is not None:
        from dataclasses import replace
        out = replace(out, shard_group=s.shard_group)
    return out


def replicated(metadata: str = "") -> Sharding:
    return Sharding(ShardingKind.REPLICATED, metadata=metadata)


def manual(metadata: str = "") -> Sharding:
    return Sharding(ShardingKind.MANUAL, metadata=metadata)


def tile(a: Int64Array, metadata: str = "") -> Sharding:
    return Sharding.tiled(np.asarray(a), (), metadata=metadata)


def partial_tile(a: Int64Array, metadata: str = "") -> Sharding:
    """XLA's PartialTile: the last dim enumerates replicas, each replica group sorted."""
    a = np.asarray(a)
    if a.ndim == 1 or a.shape[-1] == a.size:
        return replicated(metadata)
    if a.shape[-1] == 1:
        return tile(a.reshape(a.shape[:-1]), metadata)
    return Sharding.tiled(np.sort(a, axis=-1), (REP,), metadata=metadata)


def subgroup(a: Int64Array, kinds: Sequence[SubgroupKind], metadata: str = "") -> Sharding:
    """XLA's HloSharding::Subgroup, normalised (see the module docstring)."""
    a = np.asarray(a)
    kinds = list(kinds)
    if not kinds:
        return tile(a, metadata)
    d = a.ndim - len(kinds)
    if all(k is kinds[0] for k in kinds) and math.prod(a.shape[:d]) == 1:
        if kinds[0] is MAN:
            return manual(metadata)
        if kinds[0] is REP:
            return replicated(metadata)
    by_kind: dict[SubgroupKind, list[int]] = {}
    removed = []
    for i, k in enumerate(kinds):
        if a.shape[d + i] == 1:
            removed.append(d + i)
            continue
        by_kind.setdefault(k, []).append(d + i)
    perm = list(range(d))
    merged_shape = list(a.shape[:d])
    merged_kinds = []
    for k in _KIND_ORDER:
        dims = by_kind.get(k)
        if not dims:
            continue
        perm += dims
        merged_shape.append(math.prod(a.shape[x] for x in dims))
        merged_kinds.append(k)
    a = a.transpose(perm + removed).reshape(merged_shape)
    if merged_kinds == [REP]:
        return partial_tile(a, metadata)
    if merged_kinds == [MAN] and a.size == a.shape[-1]:
        return manual(metadata)
    if not merged_kinds:
        return tile(a, metadata)
    if merged_kinds[-1] is REP:
        a = np.sort(a, axis=-1)
    return Sharding.tiled(a, tuple(merged_kinds), metadata=metadata)


def same_kind_subgroup(s: Sharding, a: Int64Array) -> Sharding:
    """A sharding like `s` (same subgroup kinds) over the tile array `a`."""
    if replicate_on_last_tile_dim(s):
        return partial_tile(a, s.metadata)
    return subgroup(a, s.subgroups, s.metadata)


_RETILED: dict[tuple[ExactKey, tuple[int, ...]], Sharding] = {}


def retile(s: Sharding, tiles: Sequence[int]) -> Sharding:
    """`same_kind_subgroup(s, arr(s).reshape(tiles))`: the same devices in the same order over
    other tile dims (size-1 dims added or dropped).  Cached by `exact` input: propagation asks
    it of the same few shardings at every layer (reduces, broadcasts)."""
    key = (exact(s), tuple(tiles))
    found = _RETILED.get(key)
    if found is None:
        found = same_kind_subgroup(s, arr(s).reshape(tiles))
        if len(_RETILED) > 10_000:  # a module asks for a few hundred
            _RETILED.clear()
        _RETILED[key] = found
    return found


def tuple_sharding(leaves: Iterable[Sharding]) -> Sharding:
    return Sharding.tuple_of(list(leaves))


def leaves_of(s: Sharding, shape: Shape) -> list[Sharding]:
    """The per-leaf shardings of a value of `shape` (a single sharding applies to every leaf)."""
    n = len(shape.leaves()) if shape.is_tuple else 1
    if s.kind is ShardingKind.TUPLE:
        return list(s.elements) if len(s.elements) == n else [s.elements[0] if s.elements else replicated()] * n
    return [s] * n


def single(shape: Shape, s: Sharding) -> Sharding:
    """`s` on every leaf of `shape` (XLA's HloSharding::Single)."""
    return tuple_sharding([s] * len(shape.leaves())) if shape.is_tuple else s


def sub_sharding(shape: Shape, s: Sharding, index: int) -> Sharding:
    """The sharding of tuple element `index` (XLA's GetSubSharding with a one-element index); a
    single sharding is every leaf's."""
    if s.kind is not ShardingKind.TUPLE:
        return single(tuple_elements(shape)[index], s)
    return s.subsharding(shape, index)


def tuple_elements(shape: Shape) -> tuple[Shape, ...]:
    """The elements of `shape`, which the caller knows to be a tuple."""
    if not isinstance(shape, TupleShape):
        raise TypeError(f"expected a tuple shape, got {shape.to_hlo()}")
    return shape.elements


# --------------------------------------------------------------- operations --
_Op = TypeVar("_Op", bound=Callable[..., "Sharding | None"])


class _Missing(enum.Enum):
    MISSING = enum.auto()


_MISSING: Final = _Missing.MISSING  # "not cached yet" (None is a cached answer)
# What a sharding carries besides its meaning (`_spelling`).
_Spelling = tuple[str, IotaDevices | None, bool, bool, bool, tuple[int, ...], bool]
_RESULTS: dict[tuple[str, Sharding, _Spelling, tuple[int | tuple[int, ...], ...]], "Sharding | None"] = {}


def _spelling(s: Sharding) -> _Spelling:
    """What a sharding carries besides its meaning (an operation may hand its input back)."""
    return (s.metadata, s.iota, s.replicate_spelled_as_flag, s.devices_spelled_explicitly, s.named_mesh,
            s.open_dims, s.single_device_spelling)


# A cache key for a sharding down to its form and spelling (see `exact`).
ExactKey: TypeAlias = tuple[object, ...]


def exact(s: Sharding) -> ExactKey:
    """A cache key for `s` down to its form and spelling: two shardings with one key have the
    same kind, tile dims, subgroup kinds, device array (equal meaning over the same dims and
    kinds leaves no freedom in the array) and spelling, so any computation on them answers the
    same.  Meaning alone would also match a non-normalised form of the same layout."""
    if s.kind is ShardingKind.TUPLE:
        return (s.kind, tuple(exact(e) for e in s.elements), s.metadata)
    return (s, s.kind, s.tile_dims, s.subgroups, _spelling(s))


def _by_value(op: _Op) -> _Op:
    """Cache a pure operation on a tiled sharding by value: propagation moves the same few
    shardings across every layer of a model, and each move costs numpy work on the whole
    device array."""
    @functools.wraps(op)
    def cached(s: Sharding, *args: int | Iterable[int]) -> Sharding | None:
        if s.kind is not ShardingKind.TILED:
            return op(s, *args)
        values = tuple(a if isinstance(a, int) else tuple(a) for a in args)
        key = (op.__name__, s, _spelling(s), values)
        found = _RESULTS.get(key, _MISSING)
        if found is _MISSING:
            found = op(s, *values)
            if len(_RESULTS) > 10_000:  # a module asks for tens; each entry holds device arrays
                _RESULTS.clear()
            _RESULTS[key] = found
        return found
    # `cached` takes and returns what `op` does; a TypeVar bound to a callable type cannot say so.
    return cached  # type: ignore[return-value]


@_by_value
def transpose(s: Sharding, dims: Sequence[int]) -> Sharding:
    """Data dim i of the result is data dim dims[i] of `s` (XLA's TransposeSharding)."""
    if s.kind is not ShardingKind.TILED:
        return s
    perm = list(dims)
    if len(perm) == s.data_rank:
        perm += list(range(s.data_rank, len(s.tile_dims)))
    a = arr(s).transpose(perm)
    if replicate_on_last_tile_dim(s):
        return partial_tile(a, s.metadata)
    kinds = [s.subgroups[p - s.data_rank] for p in perm[s.data_rank:]]
    return subgroup(a, kinds, s.metadata)


@_by_value
def replicate_dims(s: Sharding, dims: Iterable[int]) -> Sharding:
    """XLA's PartiallyReplicateTiledShardingOnDims: `dims` become untiled, their devices replicas
    (the new replica index is the old tile index of those dims, then the old replica index)."""
    if s.kind is not ShardingKind.TILED:
        return s
    r = s.data_rank
    valid = list(dict.fromkeys(d for d in dims if d < r))
    group = math.prod(s.tile_dims[d] for d in valid)
    if group == 1:
        return s
    if group == num_tiles(s) and not xla_subgroups(s):
        return replicated(s.metadata)
    perm = sorted(range(r), key=lambda d: d in valid)  # stable: kept dims first
    a = arr(s).transpose(perm + list(range(r, len(s.tile_dims))))
    shape = list(s.tile_dims)
    for d in valid:
        shape[d] = 1
    if replicate_on_last_tile_dim(s):
        shape[-1] *= group
        return partial_tile(a.reshape(shape), s.metadata)
    shape.insert(r, group)
    return subgroup(a.reshape(shape), (REP,) + tuple(s.subgroups), s.metadata)


def replicate_all_except(s: Sharding, keep: Iterable[int]) -> Sharding:
    keep = set(keep)
    if s.kind is not ShardingKind.TILED:
        return s
    return replicate_dims(s, [d for d in range(s.data_rank) if d not in keep])


def replicate_all_data_dims(s: Sharding, rank: int = -1) -> Sharding:
    """Every data dim untiled; manual subgroups survive (XLA's ReplicateAllDataDims)."""
    if s.kind is ShardingKind.MANUAL:
        return s
    if s.kind is not ShardingKind.TILED or not xla_subgroups(s):
        return replicated(s.metadata)
    out = replicate_all_except(s, ())
    if rank >= 0 and out.kind is ShardingKind.TILED and rank != out.data_rank:
        shape = [1] * rank + list(out.tile_dims[out.data_rank:])
        out = subgroup(arr(out).reshape(shape), out.subgroups, out.metadata)
    return out


def remove_dims(s: Sharding, dims: Iterable[int]) -> Sharding:
    """Drop untiled data dims (XLA's RemoveShapeDimensions)."""
    dims = set(dims)
    if s.kind is not ShardingKind.TILED or not dims:
        return s
    shape = [t for i, t in enumerate(s.tile_dims) if i not in dims]
    return retile(s, shape)


@_by_value
def transpose_collapsed(s: Sharding, src_to_tgt: Sequence[int], tgt_to_src: Sequence[int]) -> Sharding | None:
    """XLA's TransposeShardingWithCollapsedDims: data dims move by `src_to_tgt` (-1: dropped,
    must be untiled, else None), target dims with -1 are new and untiled."""
    if s.kind is not ShardingKind.TILED:
        return s
    src_to_tgt, tgt_to_src = list(src_to_tgt), list(tgt_to_src)
    extra = len(s.tile_dims) - len(src_to_tgt)
    if extra > 0:
        n_src, n_tgt = len(src_to_tgt), len(tgt_to_src)
        for i in range(extra):
            src_to_tgt.append(n_tgt + i)
            tgt_to_src.append(n_src + i)
    nsub = len(s.tile_dims) - s.data_rank
    src_data, tgt_data = len(src_to_tgt) - nsub, len(tgt_to_src) - nsub
    tgt_skip = [-1] * len(tgt_to_src)
    skipped_tgt = 0
    for i, src in enumerate(tgt_to_src):
        if src < 0:
            skipped_tgt += 1
        else:
            tgt_skip[i] = i - skipped_tgt
    skipped_src = src_to_tgt.count(-1)
    perm = [0] * len(src_to_tgt)
    for i in range(src_data):
        if src_to_tgt[i] < 0:
            if s.tile_dims[i] > 1:
                return None
            perm[src_data - skipped_src] = i
            skipped_src -= 1
        else:
            perm[tgt_skip[src_to_tgt[i]]] = i
    skipped_src = src_to_tgt.count(-1)
    for i in range(src_data, len(src_to_tgt)):
        perm[src_to_tgt[i] - skipped_tgt + skipped_src] = i
    t = arr(s).transpose(perm)
    tiles = [1] * len(tgt_to_src)
    for i, src in enumerate(tgt_to_src):
        if src >= 0:
            d = tgt_skip[i]
            if i >= tgt_data:
                d += skipped_src
            tiles[i] = t.shape[d]
    return same_kind_subgroup(s, t.reshape(tiles))


def reverse(s: Sharding, dims: Sequence[int]) -> Sharding:
    """Tiles of reversed dims in reverse order (XLA's ReverseSharding)."""
    if s.kind is not ShardingKind.TILED or not dims:
        return s
    a = arr(s)
    for d in dims:
        a = np.flip(a, axis=d)
    return same_kind_subgroup(s, a)


def along_dims(s: Sharding, src_dims: Sequence[int], tgt_dims: Sequence[int], tgt_rank: int) -> Sharding:
    """The tiling of `src_dims` moved onto `tgt_dims` of a rank-`tgt_rank` value, every other dim
    replicated (XLA's PropagateShardingAlongDimsAndReplicateOthers)."""
    if s.kind is not ShardingKind.TILED:
        return s
    rep = replicate_all_except(s, src_dims)
    if rep.kind is not ShardingKind.TILED:
        return rep
    arg_src, arg_tgt = list(np.argsort(src_dims, kind="stable")), list(np.argsort(tgt_dims, kind="stable"))
    if arg_src != arg_tgt:
        perm = [src_dims[arg_tgt[i]] for i in range(len(src_dims))]
        other = 0
        for _ in range(len(src_dims), rep.data_rank):
            while other in src_dims:
                other += 1
            perm.append(other)
            other += 1
        rep = transpose(rep, perm)
    dims = [1] * tgt_rank
    for sd, td in zip(src_dims, tgt_dims):
        dims[td] = s.tile_dims[sd]
    dims += list(rep.tile_dims[rep.data_rank:])
    return same_kind_subgroup(rep, arr(rep).reshape(dims))


# --------------------------------------------------------------------- reshape --
def _reshape_dims(src: Sequence[int], dst: Sequence[int],
                  tiles: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """XLA's ReshapeSharding on tile counts: (target tile dims, source dims to replicate), or None."""
    target: list[int] = []
    src_stack = list(reversed(src))
    dst_stack = list(reversed(dst))
    tile_stack = list(reversed(tiles))
    src_index = -1
    replicate: list[int] = []
    inplace = False

    def push(size: int, parts: int) -> None:
        nonlocal src_index
        src_stack.append(size)
        tile_stack.append(parts)
        src_index -= 1

    def pop() -> None:
        nonlocal src_index
        src_stack.pop()
        tile_stack.pop()
        src_index += 1

    def append(size: int) -> None:
        nonlocal inplace
        if inplace:
            target[-1] *= size
        else:
            target.append(size)
        inplace = False

    while src_stack and dst_stack and math.prod(tile_stack) != 1:
        prod = 1
        while tile_stack and tile_stack[-1] == 1:
            prod *= src_stack[-1]
            pop()
        while dst_stack and dst_stack[-1] > 1 and prod % dst_stack[-1] == 0:
            prod //= dst_stack[-1]
            dst_stack.pop()
            append(1)
        if prod != 1:
            push(prod, 1)
        if not src_stack or not dst_stack:
            break
        s_size, s_parts = src_stack[-1], tile_stack[-1]
        pop()
        t_size = dst_stack.pop()
        if s_size == t_size:
            append(s_parts)
        elif t_size == 1:
            append(1)
            push(s_size, s_parts)
        elif s_size == 1:
            dst_stack.append(t_size)
            if s_parts > 1:
                replicate.append(src_index)
        elif s_parts == 1:
            if src_stack and tile_stack[-1] == 1:
                src_stack[-1] *= s_size
            else:
                break
        elif s_size % s_parts:
            return None
        else:
            g = math.gcd(s_parts, t_size)
            if g == 1:
                break
            push(s_size // g, s_parts // g)
            dst_stack.append(t_size // g)
            append(g)
            inplace = True
    if math.prod(target) == 1:
        return None
    while len(target) < len(dst):
        target.append(1)
    return target, replicate


def reshape_sharding(src: Sequence[int], dst: Sequence[int], s: Sharding) -> Sharding | None:
    """XLA's ReshapeSharding: `s` (of an array of dims `src`) on the reshaped array, or None."""
    if s.kind is not ShardingKind.TILED:
        return s
    found = _reshape_dims(src, dst, s.tile_dims[:len(src)])
    if found is None:
        return None
    target, rep = found
    sh = replicate_dims(s, rep) if rep else s
    if sh.kind is not ShardingKind.TILED:
        return sh
    rdim = replication_dim(sh)
    for i in range(sh.data_rank, len(sh.tile_dims)):
        target.append(1 if i == rdim else sh.tile_dims[i])
    kinds = list(xla_subgroups(sh))
    total = sh.num_devices
    quot = total // math.prod(target)
    if quot > 1:
        if replicate_on_last_tile_dim(sh):
            target[-1] = quot
            kinds.append(REP)
        elif REP in kinds:
            target[rdim - sh.data_rank + len(dst)] = quot
        else:
            target.append(quot)
            kinds.append(REP)
    elif replicate_on_last_tile_dim(sh):
        kinds.append(REP)
    return subgroup(arr(sh).reshape(target), kinds, sh.metadata)


_THROUGH_RESHAPE: dict[tuple[tuple[int, ...], tuple[int, ...], ExactKey], Sharding] = {}


def propagate_through_reshape(src_shape: ArrayShape, dst_shape: ArrayShape, s: Sharding) -> Sharding:
    """XLA's PropagateShardingThroughReshape: the longest runs of source dims whose tiling carries
    over, merged; dims that cannot carry become replicated.

    Cached by `exact` input: a model reshapes the same few shardings between the same few
    shapes in every layer, both ways, and each answer costs a search over runs of dims with
    numpy work per candidate."""
    if s.kind is not ShardingKind.TILED:
        return s
    src, dst = tuple(src_shape.dims), tuple(dst_shape.dims)
    key = (src, dst, exact(s))
    found = _THROUGH_RESHAPE.get(key)
    if found is None:
        found = _propagate_through_reshape(src_shape, dst_shape, s)
        if len(_THROUGH_RESHAPE) > 10_000:  # a module asks for a few hundred
            _THROUGH_RESHAPE.clear()
        _THROUGH_RESHAPE[key] = found
    return found


def _propagate_through_reshape(src_shape: ArrayShape, dst_shape: ArrayShape, s: Sharding) -> Sharding:
    src, dst = tuple(src_shape.dims), tuple(dst_shape.dims)
    if is_manual_subgroup(s):
        return _reshape_manual_subgroup(src_shape, dst_shape, s)
    result = replicated()
    rank = len(src)
    start = 0
    while start < rank:
        found = False
        for end in range(rank, start, -1):
            grouped = [1] * rank
            for i in range(start, end):
                grouped[i] = s.tile_dims[i]
            reshaped = reshape_sharding(src, dst, tile(np.arange(math.prod(grouped)).reshape(grouped)))
            if reshaped is None or reshaped.kind is not ShardingKind.TILED:
                continue
            perm = list(range(start, end)) + list(range(0, start)) + list(range(end, len(s.tile_dims)))
            dims = list(reshaped.tile_dims)
            reps = s.num_devices // math.prod(dims)
            if len(dims) == len(dst):
                dims.append(reps)
            else:
                dims[-1] *= reps
            ungrouped = partial_tile(arr(s).transpose(perm).reshape(dims))
            merged = merge_if_compatible(ungrouped, num_tiles(result) + 1, result)
            if merged is not None:
                result = merged
                start = end
                found = True
                break
        if not found:
            start += 1
    from dataclasses import replace
    return replace(result, metadata=s.metadata) if result.metadata != s.metadata else result


def _reshape_manual_subgroup(src_shape: ArrayShape, dst_shape: ArrayShape, s: Sharding) -> Sharding:
    """A sharding with a manual subgroup reshapes each manual group's tiling alike."""
    md = manual_dim(s)
    a = arr(s)
    groups = np.moveaxis(a, md, 0)
    rest_kinds = [k for k in s.subgroups if k is not MAN]
    outs = []
    for g in groups:
        inner = subgroup(g, rest_kinds) if rest_kinds else tile(g)
        outs.append(propagate_through_reshape(src_shape, dst_shape, inner))
    first = outs[0]
    if first.kind is ShardingKind.REPLICATED:
        tiles_ = [1] * len(dst_shape.dims)
        stacked = np.stack([np.sort(g.reshape(-1)) for g in groups])  # [manual, replicas]
        return subgroup(stacked.reshape(tiles_ + [stacked.shape[0], stacked.shape[1]]), (MAN, REP), s.metadata)
    if any(o.tile_dims != first.tile_dims or o.subgroups != first.subgroups for o in outs):
        return replicate_all_data_dims(s, len(dst_shape.dims))
    stacked = np.stack([arr(o) for o in outs], axis=first.data_rank)
    return subgroup(stacked, (MAN,) + first.subgroups, s.metadata)


# ------------------------------------------------------------------- merging --
def _positions(s: Sharding) -> tuple[Int64Array, tuple[npt.NDArray[np.intp], ...]]:
    """(device ids ascending, their tile-array coordinates, one array per tile dim): where each
    device sits, computed with one argsort instead of a walk over the devices."""
    flat = arr(s).reshape(-1)
    order = np.argsort(flat, kind="stable")
    return flat[order], np.unravel_index(order, s.tile_dims)


_MERGED: dict[tuple[Sharding, str, int, Sharding, str], Sharding | None] = {}


def merge_if_compatible(to_merge: Sharding, min_tiles: int, dst: Sharding) -> Sharding | None:
    """XLA's MergeShardingIfCompatible: `dst` (partially replicated) refined by `to_merge`'s
    tiling when every device can hold both tiles at once and the result has at least
    `min_tiles` tiles; None otherwise.  Answers are cached by value (metadata included, which
    the result carries): propagation asks the same merges layer after layer."""
    key = (to_merge, to_merge.metadata, min_tiles, dst, dst.metadata)
    found = _MERGED.get(key, _MISSING)
    if found is _MISSING:
        found = _merge_if_compatible(to_merge, min_tiles, dst)
        if len(_MERGED) > 10_000:  # a module asks for tens; each entry holds device arrays
            _MERGED.clear()
        _MERGED[key] = found
    return found


def _merge_if_compatible(to_merge: Sharding, min_tiles: int, dst: Sharding) -> Sharding | None:
    if to_merge.kind is not ShardingKind.TILED:
        return None
    if is_tile_maximal(dst):
        return to_merge
    if dst.kind is not ShardingKind.TILED or to_merge.kind is not ShardingKind.TILED:
        return None
    if not has_partial_replication(dst) or dst.data_rank != to_merge.data_rank:
        return None
    mm, dm = manual_dim(to_merge), manual_dim(dst)
    if (mm >= 0) != (dm >= 0):
        return None
    if to_merge.num_devices != dst.num_devices:
        return None
    devices, a = _positions(to_merge)
    dst_devices, b = _positions(dst)
    if not np.array_equal(devices, dst_devices):
        return None
    r = dst.data_rank
    merged = []
    for i in range(r):
        ta, tb = to_merge.tile_dims[i], dst.tile_dims[i]
        if ta == tb or tb == 1:
            merged.append(ta)
        elif ta == 1:
            merged.append(tb)
        else:
            return None
    n = dst.num_devices
    tiles = math.prod(merged)
    if n % tiles or tiles < min_tiles:
        return None
    man = 1
    if mm >= 0:
        man = to_merge.tile_dims[mm]
        if man != dst.tile_dims[dm] or n % (tiles * man):
            return None
    replication = n // (tiles * man)
    # Each device's tile in the merge: to_merge's coordinate where it tiles, else dst's; where
    # both tile a dim they must agree, as must the manual groups.
    key = []
    for i in range(r):
        if to_merge.tile_dims[i] > 1 and dst.tile_dims[i] > 1 and not np.array_equal(a[i], b[i]):
            return None
        key.append(a[i] if to_merge.tile_dims[i] > 1 else b[i])
    if mm >= 0:
        if not np.array_equal(a[mm], b[dm]):
            return None
        key.append(a[mm])
    shape = merged + ([man] if mm >= 0 else [])
    linear = np.ravel_multi_index(key, shape) if shape else np.zeros(n, np.int64)
    if np.any(np.bincount(linear, minlength=math.prod(shape)) != replication):
        return None
    # the holders of each tile in ascending device order (devices are sorted; the sort is stable)
    out = devices[np.argsort(linear, kind="stable")].reshape(shape + [replication])
    kinds = ([MAN] if mm >= 0 else []) + ([REP] if replication > 1 else [])
    if replication == 1:
        out = out.reshape(shape)
    return subgroup(out, kinds, merged_metadata(dst.metadata, to_merge.metadata))


def is_more_specific(lhs: Sharding, rhs: Sharding) -> bool:
    """XLA's IsShardingMoreSpecific: more tiles; tiled or maximal over replicated; manual over
    maximal; for tuples no leaf worse and one better."""
    if lhs.kind is ShardingKind.TUPLE or rhs.kind is ShardingKind.TUPLE:
        le, re_ = list(lhs.elements), list(rhs.elements)
        if len(le) != len(re_):
            return False
        better = False
        for a, b in zip(le, re_):
            if is_more_specific(b, a):
                return False
            if is_more_specific(a, b):
                better = True
        return better
    if lhs.kind is ShardingKind.MANUAL and is_tile_maximal(rhs):
        return True
    if lhs.kind is ShardingKind.MANUAL or rhs.kind is ShardingKind.MANUAL:
        return False
    if not is_tile_maximal(rhs):
        return num_tiles(lhs) > num_tiles(rhs)
    if is_replicated(rhs):
        return not is_replicated(lhs)
    return not is_tile_maximal(lhs)


def merge(to_merge: Sharding, dst: Sharding, may_combine: bool) -> tuple[bool, Sharding]:
    """XLA's MergeSharding(to_merge=old, dst=new): (is dst an improvement, dst possibly refined by
    to_merge when both are partially replicated and compatible)."""
    if to_merge.kind is ShardingKind.TUPLE and dst.kind is ShardingKind.TUPLE:
        changed = False
        out = []
        for a, b in zip(to_merge.elements, dst.elements):
            c, m = merge(a, b, may_combine)
            changed |= c
            out.append(m)
        return changed, tuple_sharding(out)
    if (may_combine and has_partial_replication(to_merge) and has_partial_replication(dst)
            and to_merge.num_devices == dst.num_devices):
        merged = merge_if_compatible(to_merge, max(num_tiles(to_merge), num_tiles(dst)) + 1, dst)
        if merged is not None:
            return True, merged
    return is_more_specific(dst, to_merge), dst


_SUBTILING: dict[tuple[tuple[int, ...], ExactKey, ExactKey], bool] = {}


def is_subtiling(shape: ArrayShape, p: Sharding, s: Sharding) -> bool:
    """XLA's IsSubTilingOrEqualSharding: every device's tile under `p` lies inside its tile
    under `s` (the last tile of a dim may run past the end, as padding).  Cached by dims and
    `exact` shardings: propagation asks it of the same pairs at every layer."""
    key = (tuple(shape.dims), exact(p), exact(s))
    found = _SUBTILING.get(key)
    if found is None:
        found = _is_subtiling(shape, p, s)
        if len(_SUBTILING) > 10_000:  # a module asks for tens
            _SUBTILING.clear()
        _SUBTILING[key] = found
    return found


def _is_subtiling(shape: ArrayShape, p: Sharding, s: Sharding) -> bool:
    if p.kind is ShardingKind.MANUAL or s.kind is ShardingKind.MANUAL:
        return False
    if is_tile_maximal(s):
        return True
    if is_tile_maximal(p):
        return False
    if p.kind is not ShardingKind.TILED or s.kind is not ShardingKind.TILED:
        return False
    r = p.data_rank
    if r != s.data_rank or r != shape.rank:
        return False
    dims = shape.dims
    pb = [-(-dims[i] // p.tile_dims[i]) for i in range(r)]
    sb = [-(-dims[i] // s.tile_dims[i]) for i in range(r)]
    for i in range(r):
        if p.tile_dims[i] < s.tile_dims[i]:
            return False
    # every device's tile start under p and under s, side by side (sorted by device)
    p_devices, p_idx = _positions(p)
    s_devices, s_idx = _positions(s)
    if not np.array_equal(p_devices, s_devices):
        if not np.isin(p_devices, s_devices).all():
            return False
        keep = np.isin(s_devices, p_devices)  # s may hold devices p does not use
        s_devices, s_idx = s_devices[keep], tuple(x[keep] for x in s_idx)
        if not np.array_equal(p_devices, s_devices):  # pragma: no cover - duplicate device ids
            return False
    for j in range(r):
        start = pb[j] * p_idx[j]
        off = sb[j] * s_idx[j]
        if np.any(start < off):
            return False
        end = start + pb[j]
        if np.any((end <= dims[j]) & (end > off + sb[j])):
            return False
    return True


def find_common(shardings: Sequence[Sharding], default: Sharding | None = None) -> Sharding:
    """XLA's FindCommonSharding: all merged when compatible, else `default` (or the first)."""
    common = shardings[0]
    for s in shardings[1:]:
        if common == s:
            continue
        merged = merge_if_compatible(s, num_tiles(common), common) if not is_manual(s) and not is_manual(common) else None
        if merged is None:
            return default if default is not None else shardings[0]
        common = merged
    return common


def evenly_partitions(shape: Shape, s: Sharding) -> bool:
    """Every tiled dim of `shape` divides by its tile count (XLA's divisibility rule)."""
    if s.kind is ShardingKind.TUPLE:
        return all(evenly_partitions(sh, e) for sh, e in zip(shape.leaves(), leaves_of(s, shape)))
    if s.kind is not ShardingKind.TILED:
        return True
    assert isinstance(shape, ArrayShape), f"a tiled sharding on {shape.to_hlo()}"
    return all(d % t == 0 for d, t in zip(shape.dims, s.data_tile_dims))
