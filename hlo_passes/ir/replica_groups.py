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
from typing import Iterable, cast

from hlo_passes.ir.sdy import AxisRef, RefinedMesh, SdyMesh
from hlo_passes.ir.sharding import IotaDevices


@dataclass(frozen=True, eq=False)
class ReplicaGroups:
    groups: tuple[tuple[int, ...], ...]
    iota: tuple[tuple[int, int], IotaDevices] | None = None  # ((num_groups, group_size), devices)
    mesh_spelling: str = ""  # verbatim mesh form, printed when set

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplicaGroups) and self.groups == other.groups

    def __hash__(self) -> int:
        return hash(self.groups)

    @classmethod
    def explicit(cls, groups: Iterable[Iterable[int]]) -> "ReplicaGroups":
        return cls(tuple(tuple(int(d) for d in g) for g in groups))

    @classmethod
    def of(cls, groups: Iterable[Iterable[int]]) -> "ReplicaGroups":
        """Groups made by a pass: printed in XLA's iota form `[G,S]<=[dims]T(perm)` when one
        fits (every mesh axis and sub-axis grouping does), else as lists — so a collective over
        2048 devices prints in a few characters, as XLA prints it."""
        found = cls.explicit(groups)
        sizes = {len(g) for g in found.groups}
        if len(sizes) == 1:
            flat = [d for g in found.groups for d in g]
            devices = IotaDevices.find(flat) if sorted(flat) == list(range(len(flat))) else None
            if devices is not None:
                return cls(found.groups, iota=((len(found.groups), sizes.pop()), devices))
        return found

    @classmethod
    def from_iota(cls, group_dims: tuple[int, int], devices: IotaDevices) -> "ReplicaGroups":
        arr = devices.expand().reshape(group_dims)
        return cls(tuple(tuple(int(d) for d in row) for row in arr),
                   iota=(cast("tuple[int, int]", tuple(group_dims)), devices))

    @classmethod
    def from_mesh(cls, axes: list[tuple[str, int]], selected: list[tuple[str, int | None, int | None]],
                  spelling: str) -> "ReplicaGroups":
        """Groups of the devices of a row-major mesh that differ only along the `selected` axes.

        `selected` holds (axis, pre_size, size): a whole axis when pre_size is None, else the
        sub-axis of `size` devices inside it whose more-major factors multiply to pre_size."""
        mesh = SdyMesh(tuple(axes))
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
        return cls(tuple(tuple(int(d) for d in row) for row in arr), mesh_spelling=spelling)

    @property
    def is_empty(self) -> bool:
        """`{}`: one group of all participants."""
        return not self.groups

    @property
    def group_size(self) -> int | None:
        sizes = {len(g) for g in self.groups}
        return sizes.pop() if len(sizes) == 1 else None

    @cached_property
    def _group_by_device(self) -> dict[int, tuple[int, ...]]:
        return {d: g for g in self.groups for d in g}

    def group_of(self, device: int) -> tuple[int, ...]:
        try:
            return self._group_by_device[device]
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
