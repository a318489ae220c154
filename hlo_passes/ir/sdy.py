"""Shardy (sdy) shardings as values, and their meaning as HLO shardings.

JAX's default (Shardy) lowering writes shardings twice: as HLO `sharding=` and
as Shardy attribute strings in frontend attributes.  Some values (a function
result's sharding, the in/out shardings of a `shard_map`) exist only in the
Shardy form, so `sharding-propagation` reads them (see `hlo_passes.parse.sdy`)
and converts them here:

    mesh  #sdy.mesh<["x"=4, "y"=2]>
    value #sdy.sharding<@mesh, [{"x"}, {}]>   ->  {devices=[4,1,2]<=[8] last_tile_dim_replicate}

A sub-axis `"x":(p)s` is the middle factor of axis x reshaped to [p, s, n/(p*s)]
(major to minor), as in Shardy's AxisRefAttr.

Newer XLA prints the same meshes in HLO itself, in mesh-form replica groups
(`mesh['x'=4,'y'=2] {'x'}`) and named shardings (`{mesh['x'=4,'y'=2], [{'x'}, {}]}`);
those are read into these values too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import numpy as np
else:
    from hlo_passes._deferred import numpy as np  # deferred: fmt never needs numpy

from hlo_passes.ir.sharding import Sharding, SubgroupKind


@dataclass(frozen=True, slots=True)
class SdyMesh:
    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    def axis_size(self, name: str) -> int:
        for n, size in self.axes:
            if n == name:
                return size
        raise KeyError(f"mesh has no axis {name!r} (axes: {', '.join(n for n, _ in self.axes)})")


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis, or the sub-axis `name:(pre_size)size` of it."""

    name: str
    pre_size: int = 1
    size: int | None = None  # None: the whole axis


@dataclass(frozen=True, slots=True)
class DimSharding:
    axes: tuple[AxisRef, ...] = ()
    is_open: bool = False  # `?`: propagation may shard this dimension further
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class SdySharding:
    """`<@mesh, [{"x"}, {}], replicated={"y"}>`; `mesh` is the mesh's name, or an inline mesh."""

    mesh: str | SdyMesh
    dims: tuple[DimSharding, ...]
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()

    def resolve_mesh(self, meshes: Mapping[str, SdyMesh]) -> SdyMesh:
        if isinstance(self.mesh, SdyMesh):
            return self.mesh
        if self.mesh not in meshes:
            raise KeyError(f"unknown Shardy mesh @{self.mesh}")
        return meshes[self.mesh]


class RefinedMesh:
    """The mesh with each axis split at every sub-axis boundary that `refs` use."""

    def __init__(self, mesh: SdyMesh, refs: list[AxisRef]):
        cuts: dict[str, set[int]] = {name: {1, size} for name, size in mesh.axes}
        for r in refs:
            if r.size is not None:
                cuts[r.name] |= {r.pre_size, r.pre_size * r.size}
        self.pieces: list[tuple[str, int, int]] = []  # (axis, pre_size, size), major to minor
        for name, size in mesh.axes:
            points = sorted(cuts[name])
            for lo, hi in zip(points, points[1:]):
                self.pieces.append((name, lo, hi // lo))
        self.shape = tuple(p[2] for p in self.pieces)
        n = math.prod(mesh.shape)
        ids = np.asarray(mesh.device_ids) if mesh.device_ids else np.arange(n)
        self.devices = ids.reshape(self.shape) if self.shape else ids.reshape(())

    def indices(self, ref: AxisRef, mesh: SdyMesh) -> list[int]:
        size = ref.size if ref.size is not None else mesh.axis_size(ref.name) // ref.pre_size
        lo, hi = ref.pre_size, ref.pre_size * size
        return [i for i, (name, pre, s) in enumerate(self.pieces)
                if name == ref.name and pre >= lo and pre * s <= hi and s > 1]


def mesh_sharding(mesh: SdyMesh, dim_axes: list[tuple[AxisRef, ...]],
                  manual_axes: tuple[AxisRef, ...] = (), unreduced_axes: tuple[AxisRef, ...] = ()) -> Sharding:
    """The HLO sharding that splits dim i over `dim_axes[i]` (major to minor); `manual_axes`
    become a MANUAL subgroup, `unreduced_axes` (devices holding partial sums) an UNREDUCED
    one, and the remaining axes a REPLICATED one, in XLA's order."""
    if not mesh.axes:
        return Sharding.maximal(mesh.device_ids[0]) if mesh.device_ids else Sharding.replicated()
    all_refs = [r for axes in dim_axes for r in axes] + list(manual_axes) + list(unreduced_axes)
    refined = RefinedMesh(mesh, all_refs)
    dim_pieces = [[i for r in axes for i in refined.indices(r, mesh)] for axes in dim_axes]
    manual = [i for r in manual_axes for i in refined.indices(r, mesh)]
    unreduced = [i for r in unreduced_axes for i in refined.indices(r, mesh)]
    used = {i for ps in dim_pieces for i in ps} | set(manual) | set(unreduced)
    rest = [i for i in range(len(refined.shape)) if i not in used and refined.shape[i] > 1]
    order = [i for ps in dim_pieces for i in ps] + manual + unreduced + rest
    order += [i for i in range(len(refined.shape)) if i not in order]
    arr = refined.devices.transpose(order)
    tile_dims = [math.prod(refined.shape[i] for i in ps) for ps in dim_pieces]
    subgroups: list[SubgroupKind] = []
    if manual:
        tile_dims.append(math.prod(refined.shape[i] for i in manual))
        subgroups.append(SubgroupKind.MANUAL)
    if unreduced:
        tile_dims.append(math.prod(refined.shape[i] for i in unreduced))
        subgroups.append(SubgroupKind.UNREDUCED)
    replicate = arr.size // math.prod(tile_dims)
    if replicate > 1:
        tile_dims.append(replicate)
        subgroups.append(SubgroupKind.REPLICATED)
    if not subgroups and all(t == 1 for t in tile_dims):
        return Sharding.replicated()
    if subgroups == [SubgroupKind.REPLICATED] and all(t == 1 for t in tile_dims[:-1]):
        return Sharding.replicated()
    if subgroups == [SubgroupKind.MANUAL] and all(t == 1 for t in tile_dims[:-1]):
        return Sharding.manual()
    return Sharding.tiled(arr.reshape(tile_dims), tuple(subgroups))


def to_hlo_sharding(sharding: SdySharding, meshes: Mapping[str, SdyMesh],
                    manual_axes: tuple[AxisRef, ...] = ()) -> Sharding:
    """The HLO sharding with the meaning of `sharding`; open dimensions keep their listed axes.

    Inside a manual computation, `manual_axes` are implicit in every value's sharding."""
    mesh = sharding.resolve_mesh(meshes)
    return mesh_sharding(mesh, [d.axes for d in sharding.dims], manual_axes)
