"""Device arithmetic on the iota form, checked against the expanded device list.

`IotaDevices.position_of` / `device_at`, `ReplicaGroups.group_of` / `rank_of` and
`Sharding.tile_index` answer from the dims and the permutation alone, without building the list
of thousands of devices; these properties compare every answer with what the expanded list
says, over random (often transposed) iotas.  Equality of shardings and replica groups reads
their int64 device arrays: two spellings of one list are equal and hash alike."""

import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.sharding import IotaDevices, Sharding, SubgroupKind
from hlo_passes.parse.attribute_reader import reader_for

read_sharding = reader_for("sharding")


@st.composite
def iotas(draw, max_rank: int = 4):
    """An iota over 1..4 reshape dims of 1..6, transposed by a random permutation (or not)."""
    dims = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_rank)))
    perm = tuple(draw(st.permutations(range(len(dims)))))
    return IotaDevices(dims, () if perm == tuple(range(len(dims))) else perm)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------- IotaDevices --
@settings(max_examples=200, deadline=None)
@given(iotas())
def test_position_and_device_of_an_iota_match_its_expanded_list(iota):
    expanded = iota.expand().tolist()
    assert iota.num_devices == len(expanded)
    assert math.prod(iota.dims) == len(expanded)
    for position, device in enumerate(expanded):
        assert iota.device_at(position) == device
        assert iota.position_of(device) == position


def test_position_of_a_device_outside_the_iota_is_an_error():
    iota = IotaDevices((2, 4), (1, 0))
    with pytest.raises(KeyError):
        iota.position_of(8)
    with pytest.raises(IndexError):
        iota.device_at(-1)


@settings(max_examples=100, deadline=None)
@given(iotas())
def test_find_recovers_an_iota_spelling_of_the_same_list(iota):
    expanded = iota.expand()
    found = IotaDevices.find(expanded)
    assert found is not None and np.array_equal(found.expand(), expanded)


# -------------------------------------------------------------- ReplicaGroups --
@settings(max_examples=200, deadline=None)
@given(iotas(), st.data())
def test_group_rank_and_peers_from_iota_groups_match_the_lists(iota, data):
    n = iota.num_devices
    size = data.draw(st.sampled_from(_divisors(n)))
    compact = ReplicaGroups.from_iota((n // size, size), iota)
    rows = iota.expand().reshape(n // size, size).tolist()
    listed = ReplicaGroups.explicit(rows)
    assert compact == listed and hash(compact) == hash(listed)
    assert compact.groups == listed.groups == tuple(map(tuple, rows))
    assert compact.group_size == listed.group_size == size
    assert np.array_equal(compact.array, listed.array)
    for row in rows:
        for rank, device in enumerate(row):
            assert compact.group_of(device) == listed.group_of(device) == tuple(row)
            assert compact.rank_of(device) == listed.rank_of(device) == rank
    with pytest.raises(KeyError):
        compact.group_of(n)


@settings(max_examples=100, deadline=None)
@given(iotas(), st.data())
def test_groups_given_as_an_array_are_the_groups_given_as_lists(iota, data):
    n = iota.num_devices
    size = data.draw(st.sampled_from(_divisors(n)))
    arr = iota.expand().reshape(n // size, size)
    from_array, from_lists = ReplicaGroups.of(arr), ReplicaGroups.of(arr.tolist())
    assert from_array == from_lists and hash(from_array) == hash(from_lists)
    assert from_array.to_hlo() == from_lists.to_hlo()
    assert from_array.iota is not None and from_array.to_hlo().startswith("[")


def test_groups_of_unequal_size_stay_lists_and_differ_from_equal_ones():
    ragged = ReplicaGroups.of([(0, 1, 2), (3,)])
    assert ragged.to_hlo() == "{{0,1,2},{3}}" and ragged.group_size is None
    assert ragged != ReplicaGroups.of([(0, 1), (2, 3)])
    assert ReplicaGroups.of([(0, 1), (2, 3)]) != ReplicaGroups.of([(0, 2), (1, 3)])
    assert ReplicaGroups.explicit(()).is_empty and not ReplicaGroups.from_iota((1, 4), IotaDevices((4,))).is_empty


# ------------------------------------------------------------------- Sharding --
@settings(max_examples=150, deadline=None)
@given(iotas(), st.data())
def test_tile_index_of_an_iota_sharding_matches_its_device_array(iota, data):
    n = iota.num_devices
    replicas = data.draw(st.sampled_from(_divisors(n)))
    tiles = n // replicas
    first = data.draw(st.sampled_from(_divisors(tiles)))
    tile_dims = [first, tiles // first] + ([replicas] if replicas > 1 else [])
    flag = " last_tile_dim_replicate" if replicas > 1 else ""
    s = read_sharding("{devices=[" + ",".join(map(str, tile_dims)) + "]" + iota.to_hlo() + flag + "}")
    assert s.iota is not None
    listed = Sharding.tiled(s.tile_assignment, s.subgroups)
    assert s == listed and hash(s) == hash(listed)
    assert s.devices == tuple(iota.expand().tolist())
    grid = iota.expand().reshape(tile_dims)
    for index in np.ndindex(grid.shape):
        device = int(grid[index])
        assert s.tile_index(device) == listed.tile_index(device) == tuple(index[:2])


def test_device_arrays_are_values():
    """A sharding copies and freezes the array it is built from; equal lists with a different
    grid or order are different shardings."""
    arr = np.arange(8).reshape(2, 4)
    s = Sharding.tiled(arr)
    arr[0, 0] = 7
    assert s.devices == tuple(range(8)) and not s.tile_assignment.flags.writeable
    assert s != Sharding.tiled(np.arange(8).reshape(4, 2))
    assert s != Sharding.tiled(np.arange(8)[::-1].reshape(2, 4))
    assert s == read_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}") == read_sharding("{devices=[2,4]<=[8]}")
    partial = Sharding.tiled(np.arange(8).reshape(2, 1, 4), (SubgroupKind.REPLICATED,))
    assert partial == read_sharding("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}")
    assert partial != s
