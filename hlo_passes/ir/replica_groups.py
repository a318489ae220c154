"""Replica groups of a collective, as a value.

Three spellings exist in HLO text: explicit lists `{{0,1},{2,3}}`, the iota form
`[2,4]<=[4,2]T(1,0)` and the mesh form newer XLA prints,
`mesh['x'=4,'y'=2] {'x'}` (groups vary over the named axes).  All compare by
the groups they denote; the spelling is kept for printing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Hashable, Iterable, cast

from hlo_passes.ir.sdy import AxisRef, RefinedMesh, SdyMesh
from hlo_passes.ir.sharding import IotaDevices

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    from hlo_passes._deferred import numpy as np  # deferred: fmt never needs numpy


@dataclass(frozen=True, eq=False)
class ReplicaGroups:
    """The groups, spelled as lists (`listed`), as an iota (`iota`, expanded only when `groups`
    is read) or as a mesh.  Equal groups compare equal whatever their spelling; comparing and
    hashing read one int64 array of the groups, so collectives over thousands of devices cost
    what they cost over eight outside numpy."""

    listed: tuple[tuple[int, ...], ...] = ()
    iota: tuple[tuple[int, int], IotaDevices] | None = None  # ((num_groups, group_size), devices)
    mesh_spelling: str = ""  # verbatim mesh form, printed when set

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return (isinstance(other, ReplicaGroups) and self._hash == other._hash
                and self._meaning == other._meaning)

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash(self._meaning)

    @cached_property
    def _meaning(self) -> Hashable:
        """The groups as (num_groups, group_size, bytes of the int64 group array) when they
        have one size, else the lists themselves."""
        if self.iota is not None:
            (num, size), devices = self.iota
            return (num, size, devices.expand().tobytes())
        sizes = {len(g) for g in self.listed}
        if len(sizes) == 1:
            return (len(self.listed), sizes.pop(), np.asarray(self.listed, dtype=np.int64).tobytes())
        return self.listed

    @cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Every group as a tuple of device ids (the iota form expanded)."""
        if self.iota is None:
            return self.listed
        return tuple(map(tuple, self.array.tolist()))

    @cached_property
    def array(self) -> np.ndarray:
        """[num_groups, group_size] int64 (read-only); only for groups of one size."""
        if self.iota is not None:
            dims, devices = self.iota
            arr = devices.expand().reshape(dims)
        else:
            if self.group_size is None:
                raise ValueError(f"replica groups {self.to_hlo()} have unequal sizes")
            arr = np.asarray(self.listed, dtype=np.int64).reshape(len(self.listed), -1)
        arr.setflags(write=False)
        return arr

    @classmethod
    def explicit(cls, groups: Iterable[Iterable[int]]) -> "ReplicaGroups":
        return cls(tuple(tuple(int(d) for d in g) for g in groups))

    @classmethod
    def of(cls, groups: ArrayLike | Iterable[Iterable[int]]) -> "ReplicaGroups":
        """Groups made by a pass (a [num_groups, group_size] array or lists): printed in XLA's
        iota form `[G,S]<=[dims]T(perm)` when one fits (every mesh axis and sub-axis grouping
        does), else as lists — so a collective over 2048 devices prints in a few characters, as
        XLA prints it, and is never spelled out as Python tuples."""
        if not isinstance(groups, np.ndarray):
            listed = cls.explicit(cast("Iterable[Iterable[int]]", groups))
            if listed.group_size is None or not listed.listed:
                return listed
            arr = listed.array
        else:
            arr = groups.astype(np.int64, copy=False)
            if arr.ndim != 2:
                raise ValueError(f"replica groups need a [num_groups, group_size] array, got shape {arr.shape}")
            listed = None
        flat = arr.reshape(-1)
        if flat.size and np.array_equal(np.sort(flat), np.arange(flat.size)):
            devices = IotaDevices.find(flat)
            if devices is not None:
                return cls(iota=((int(arr.shape[0]), int(arr.shape[1])), devices))
        return listed if listed is not None else cls(tuple(map(tuple, arr.tolist())))

    @classmethod
    def from_iota(cls, group_dims: tuple[int, int], devices: IotaDevices) -> "ReplicaGroups":
        return cls(iota=(cast("tuple[int, int]", tuple(group_dims)), devices))

    @classmethod
    def from_mesh(cls, axes: list[tuple[str, int]], selected: list[tuple[str, int | None, int | None]],
                  spelling: str, device_ids: tuple[int, ...] = ()) -> "ReplicaGroups":
        """Groups of the devices of a row-major mesh that differ only along the `selected` axes.

        `selected` holds (axis, pre_size, size): a whole axis when pre_size is None, else the
        sub-axis of `size` devices inside it whose more-major factors multiply to pre_size.
        `device_ids`: the device at each mesh position, row-major (`device_ids=(...)` after the
        mesh); empty for the identity."""
        mesh = SdyMesh(tuple(axes), tuple(device_ids))
        if device_ids and (len(device_ids) != math.prod(size for _, size in axes)
                           or sorted(device_ids) != list(range(len(device_ids)))):
            raise ValueError(f"device_ids {list(device_ids)} are not a permutation of the mesh's devices")
        unknown = {name for name, _, _ in selected} - {name for name, _ in axes}
        if unknown:
            raise ValueError(f"replica groups select unknown mesh axes {sorted(unknown)}")
        refs = [AxisRef(name, pre or 1, size) for name, pre, size in selected]
        for ref in refs:
            if ref.size is not None and mesh.axis_size(ref.name) % (ref.pre_size * ref.size):
                raise ValueError(f"sub-axis '{ref.name}':({ref.pre_size}){ref.size} does not divide "
                                 f"axis of size {mesh.axis_size(ref.name)}")
        refined = RefinedMesh(mesh, refs)
        arr = refined.devices
        picked = [i for r in refs for i in refined.indices(r, mesh)]
        others = [i for i in range(arr.ndim) if i not in picked]
        group_size = math.prod(arr.shape[i] for i in picked)
        arr = arr.transpose(others + picked).reshape(-1, group_size)
        return cls(tuple(map(tuple, arr.tolist())), mesh_spelling=spelling)

    @property
    def is_empty(self) -> bool:
        """`{}`: one group of all participants."""
        return self.iota is None and not self.listed

    @property
    def group_size(self) -> int | None:
        if self.iota is not None:
            return self.iota[0][1]
        sizes = {len(g) for g in self.listed}
        return sizes.pop() if len(sizes) == 1 else None

    @cached_property
    def _group_by_device(self) -> dict[int, tuple[int, ...]]:
        return {d: g for g in self.groups for d in g}

    def group_of(self, device: int) -> tuple[int, ...]:
        """The group holding `device` (computed from the iota form when there is one)."""
        if self.iota is not None:
            (_, size), devices = self.iota
            first = self._position(device) // size * size
            return tuple(devices.device_at(first + i) for i in range(size))
        try:
            return self._group_by_device[device]
        except KeyError:
            raise KeyError(f"device {device} is in no replica group of {self.to_hlo()}") from None

    def rank_of(self, device: int) -> int:
        """`device`'s position inside its group (its rank in the collective)."""
        if self.iota is not None:
            return self._position(device) % self.iota[0][1]
        return self.group_of(device).index(device)

    def _position(self, device: int) -> int:
        assert self.iota is not None
        try:
            return self.iota[1].position_of(device)
        except KeyError:
            raise KeyError(f"device {device} is in no replica group of {self.to_hlo()}") from None

    def to_hlo(self) -> str:
        if self.mesh_spelling:
            return self.mesh_spelling
        if self.iota is not None:
            dims, devices = self.iota
            return f"[{dims[0]},{dims[1]}]" + devices.to_hlo()
        return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in self.groups) + "}"

    def __repr__(self) -> str:
        return f"ReplicaGroups({self.to_hlo()})"
