"""The sharding algebra on whole device arrays, checked against device-by-device walks.

`merge_if_compatible`, `is_subtiling`, `TileMap.from_sharding` and `groups_varying` work on
numpy arrays (a sort or two per sharding) so that their cost does not grow with the device
count in Python; the reference implementations below walk the expanded device lists one device
at a time, as these functions did before, and must agree with them on random shardings over
random (transposed or permuted) device orders, partially replicated and partially manual."""

import math

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.partition_context import groups_varying
from hlo_passes.passes.spmd.tile_map import TileMap

MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2), (2, 2, 4), (4, 4)]


@st.composite
def device_order(draw, n: int) -> np.ndarray:
    """The mesh's devices: an iota, a transposed iota or a random permutation."""
    how = draw(st.sampled_from(["iota", "transposed", "permuted"]))
    if how == "iota":
        return np.arange(n)
    if how == "permuted":
        return np.asarray(draw(st.permutations(range(n))))
    factors = [f for f in (2, 2, 2, 2) if n % f == 0][: int(math.log2(n))]
    perm = draw(st.permutations(range(len(factors))))
    return np.arange(n).reshape(factors).transpose(perm).reshape(-1)


@st.composite
def mesh_shardings(draw, rank: int = 2):
    """Two shardings of a rank-`rank` array over one mesh (each mesh axis used by at most one
    dim per sharding; unused axes replicate): what propagation merges."""
    mesh = draw(st.sampled_from(MESHES))
    ids = draw(device_order(math.prod(mesh)))

    def one():
        axes = list(draw(st.permutations(range(len(mesh)))))
        cut = sorted(draw(st.lists(st.integers(0, len(axes)), min_size=rank, max_size=rank)))
        used = axes[: cut[-1]]
        bounds = [0] + cut
        return Sharding.from_mesh(mesh, [tuple(used[bounds[i]:bounds[i + 1]]) for i in range(rank)], ids)

    return one(), one()


# ---------------------------------------------------------------- references --
def _coords(s: Sharding) -> dict[int, tuple[int, ...]]:
    a = s.tile_assignment
    return {int(a[idx]): idx for idx in np.ndindex(a.shape)}


def merge_reference(to_merge: Sharding, min_tiles: int, dst: Sharding) -> Sharding | None:
    """MergeShardingIfCompatible device by device (the walk the array version replaced)."""
    if to_merge.kind is not ShardingKind.TILED:
        return None
    if su.is_tile_maximal(dst):
        return to_merge
    if dst.kind is not ShardingKind.TILED or not su.has_partial_replication(dst) or dst.data_rank != to_merge.data_rank:
        return None
    mm, dm = su.manual_dim(to_merge), su.manual_dim(dst)
    if (mm >= 0) != (dm >= 0) or set(to_merge.devices) != set(dst.devices) or len(to_merge.devices) != len(dst.devices):
        return None
    r = dst.data_rank
    merged = []
    for i in range(r):
        a, b = to_merge.tile_dims[i], dst.tile_dims[i]
        if a == b or b == 1:
            merged.append(a)
        elif a == 1:
            merged.append(b)
        else:
            return None
    n = len(dst.devices)
    tiles = math.prod(merged)
    if n % tiles or tiles < min_tiles:
        return None
    man = 1
    if mm >= 0:
        man = to_merge.tile_dims[mm]
        if man != dst.tile_dims[dm] or n % (tiles * man):
            return None
    replication = n // (tiles * man)
    cm, cd = _coords(to_merge), _coords(dst)
    groups: dict[tuple, list[int]] = {}
    for dev in sorted(cm):
        a, b = cm[dev], cd[dev]
        key = []
        for i in range(r):
            if to_merge.tile_dims[i] > 1 and dst.tile_dims[i] > 1 and a[i] != b[i]:
                return None
            key.append(a[i] if to_merge.tile_dims[i] > 1 else b[i])
        if mm >= 0:
            if a[mm] != b[dm]:
                return None
            key.append(a[mm])
        groups.setdefault(tuple(key), []).append(dev)
    shape = merged + ([man] if mm >= 0 else [])
    out = np.zeros(shape + [replication], dtype=np.int64)
    for idx in np.ndindex(*shape):
        members = groups.get(tuple(idx), [])
        if len(members) != replication:
            return None
        out[idx] = members
    kinds = ([su.MAN] if mm >= 0 else []) + ([su.REP] if replication > 1 else [])
    if replication == 1:
        out = out.reshape(shape)
    return su.subgroup(out, kinds, su.merged_metadata(dst.metadata, to_merge.metadata))


def subtiling_reference(shape: ArrayShape, p: Sharding, s: Sharding) -> bool:
    if su.is_tile_maximal(s):
        return True
    if su.is_tile_maximal(p) or p.kind is not ShardingKind.TILED or s.kind is not ShardingKind.TILED:
        return False
    r = p.data_rank
    if r != s.data_rank or r != shape.rank:
        return False
    dims = shape.dims
    pb = [-(-dims[i] // p.tile_dims[i]) for i in range(r)]
    sb = [-(-dims[i] // s.tile_dims[i]) for i in range(r)]
    if any(p.tile_dims[i] < s.tile_dims[i] for i in range(r)):
        return False
    s_off = {dev: [sb[j] * idx[j] for j in range(r)] for dev, idx in _coords(s).items()}
    for dev, idx in _coords(p).items():
        off = s_off.get(dev)
        if off is None:
            return False
        for j in range(r):
            start = pb[j] * idx[j]
            if start < off[j] or (start + pb[j] <= dims[j] and start + pb[j] > off[j] + sb[j]):
                return False
    return True


def groups_reference(tm: TileMap, dims) -> list[tuple[int, ...]]:
    """Per group of devices agreeing outside `dims` (and in their manual group): the j-th holder
    of each combination of `dims` coordinates, by device id, forms the j-th group."""
    cells: dict[tuple, dict[tuple, list[int]]] = {}
    others = [k for k in range(tm.rank) if k not in dims]
    for d in range(tm.num_devices):
        key = (int(tm.manual[d]),) + tuple(int(tm.coords[d, k]) for k in others)
        combo = tuple(int(tm.coords[d, k]) for k in dims)
        cells.setdefault(key, {}).setdefault(combo, []).append(d)
    groups = []
    for combos in cells.values():
        holders = [combos[c] for c in sorted(combos)]
        groups.extend(tuple(h[j] for h in holders) for j in range(len(holders[0])))
    return sorted(groups)


# -------------------------------------------------------------------- checks --
@settings(max_examples=300, deadline=None)
@given(mesh_shardings(), st.integers(0, 9))
def test_merge_on_arrays_matches_the_device_walk(pair, min_tiles):
    a, b = (su.canon(s) for s in pair)
    for x, y in ((a, b), (b, a)):
        got, want = su.merge_if_compatible(x, min_tiles, y), merge_reference(x, min_tiles, y)
        assert got == want, (x, y, min_tiles)
        if got is not None:
            assert got.to_hlo() == want.to_hlo()


def test_merges_with_manual_subgroups_match_the_device_walk():
    ids = np.arange(16).reshape(2, 2, 4).transpose(1, 0, 2).reshape(-1)
    a = su.subgroup(ids.reshape(2, 1, 2, 4), (su.MAN, su.REP))
    b = su.subgroup(ids.reshape(2, 2, 4).transpose(1, 0, 2).reshape(1, 2, 2, 4), (su.MAN, su.REP))
    c = su.subgroup(np.arange(16).reshape(1, 2, 2, 4), (su.MAN, su.REP))
    for x, y in ((a, b), (b, a), (a, c), (c, b)):
        for min_tiles in (1, 2, 3):
            assert su.merge_if_compatible(x, min_tiles, y) == merge_reference(x, min_tiles, y)


@settings(max_examples=200, deadline=None)
@given(mesh_shardings(), st.lists(st.integers(1, 20), min_size=2, max_size=2))
def test_subtiling_on_arrays_matches_the_device_walk(pair, dims):
    shape = ArrayShape(PrimitiveType.F32, tuple(dims))
    a, b = (su.canon(s) for s in pair)
    for x, y in ((a, b), (b, a), (a, a)):
        assert su.is_subtiling(shape, x, y) == subtiling_reference(shape, x, y), (x, y, dims)


@settings(max_examples=200, deadline=None)
@given(mesh_shardings(rank=3), st.data())
def test_tile_maps_and_device_groups_match_the_device_walk(pair, data):
    s = pair[0]
    n = math.prod(pair[0].tile_dims) if s.kind is ShardingKind.TILED else 8
    tm = TileMap.from_sharding(s, n, 3) if s.kind is ShardingKind.TILED else TileMap.replicated(3, n)
    if s.kind is ShardingKind.TILED:
        for index in np.ndindex(s.tile_assignment.shape):
            assert tuple(tm.coords[int(s.tile_assignment[index])]) == index[: s.data_rank]
        assert tm.to_sharding() == su.canon(s)
    dims = data.draw(st.lists(st.sampled_from(range(3)), unique=True, max_size=3))
    got = groups_varying(tm, dims)
    assert isinstance(got, np.ndarray)
    assert [tuple(g) for g in got.tolist()] == groups_reference(tm, dims)


def test_device_groups_of_a_partially_manual_map_match_the_device_walk():
    ids = np.arange(16).reshape(4, 4).T.reshape(-1)
    s = su.subgroup(ids.reshape(2, 2, 2, 2), (su.MAN, su.REP))
    tm = TileMap.from_sharding(s, 16, 2)
    assert tm.manual_size == 2
    for dims in ([], [0], [1], [0, 1]):
        assert [tuple(g) for g in groups_varying(tm, dims).tolist()] == groups_reference(tm, dims)


def test_device_groups_of_a_map_with_unequal_cells_match_the_device_walk():
    """Maps no sharding spells (one tile held by more devices than another, a coordinate
    combination missing for some devices) keep the walk's answer, groups of different sizes
    included."""
    tm = TileMap((2,), np.array([[0], [1], [0], [1], [1]]), np.zeros(5, np.int64))
    assert np.asarray(groups_varying(tm, [0])).tolist() == [list(g) for g in groups_reference(tm, [0])]
    tm = TileMap((2, 2), np.array([[0, 0], [0, 1], [1, 0]]), np.zeros(3, np.int64))
    assert groups_varying(tm, [1]) == groups_reference(tm, [1]) == [(0, 1), (2,)]


def test_big_meshes_cost_what_small_ones_cost():
    """4096 devices: a merge, a subtiling check and the groups of one mesh axis are array work
    (checked here only for their answers; `make bench-speed` times them)."""
    ids = np.arange(4096).reshape(512, 8).T.reshape(-1)
    a = Sharding.from_mesh((8, 512), [(), (0,)], ids)
    b = Sharding.from_mesh((8, 512), [(1,), ()], ids)
    merged = su.merge_if_compatible(a, 2, b)
    assert merged is not None and merged.tile_dims == (512, 8)
    assert su.is_subtiling(ArrayShape(PrimitiveType.F32, (4096, 64)), merged, b)
    tm = TileMap.from_sharding(merged, 4096, 2)
    groups = groups_varying(tm, [1])
    assert groups.shape == (512, 8)
    assert sorted(groups.reshape(-1).tolist()) == list(range(4096))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 70_000), max_size=300), st.sampled_from([8, 1 << 16, 1 << 17]))
def test_stable_order_is_a_sort_with_ties_in_device_order(keys, bound):
    """Keys within the bound take numpy's 16-bit radix sort; keys past it (a map no sharding
    spells) still sort correctly."""
    from hlo_passes.passes.spmd.tile_map import stable_order

    key = np.asarray(keys, dtype=np.int64) % (bound if bound == 8 else 1 << 17)
    assert np.array_equal(stable_order(key, bound), np.lexsort((np.arange(key.size), key)))
