"""HloSharding as a value: which device holds which tile of an array.

XLA spells the same device layout in several ways (an explicit device list or an
iota `<=[4,2]T(1,0)`; `last_tile_dims={replicated}` or `last_tile_dim_replicate`).
A Sharding keeps the spelling it was parsed from so unchanged text prints back
exactly, but compares and hashes by meaning: the tile-dimension sizes, the device
at each tile position, and the subgroup kinds of the trailing dimensions.

The device array is kept as a read-only int64 numpy array shaped like the tile grid
(`tile_assignment`, dimensions `tile_dims`); `devices` is the same list flattened in
row-major order, as a tuple, built only when asked for.  Comparing and hashing read the
array's bytes, so a sharding over thousands of devices costs what one over eight does
outside numpy.  The last `len(subgroups)` tile dimensions are
not data dimensions: they enumerate devices that hold the same data (REPLICATED)
or that run a manual (MANUAL) region.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Hashable, Iterable

from hlo_passes.ir.shape import Shape, leaf_range

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    from hlo_passes._deferred import numpy as np  # deferred: fmt never needs numpy


class ShardingKind(enum.Enum):
    REPLICATED = "replicated"
    MAXIMAL = "maximal"
    MANUAL = "manual"
    UNKNOWN = "unknown"
    TILED = "tiled"
    TUPLE = "tuple"

    __hash__ = object.__hash__  # by identity, in C: see Opcode


class SubgroupKind(enum.Enum):
    """What a trailing tile dimension means (XLA's OpSharding::Type for last_tile_dims)."""

    REPLICATED = "replicated"
    MANUAL = "manual"
    MAXIMAL = "maximal"
    OTHER = "other"
    # Devices that each hold a partial sum of the tile (JAX's `unreduced=`, Shardy's unreduced
    # axes): read, printed and carried by every pass; sharding-propagation and spmd-partition
    # refuse it (their rules have no partial sums).
    UNREDUCED = "unreduced"

    __hash__ = object.__hash__  # by identity, in C: see Opcode


@dataclass(frozen=True, slots=True)
class IotaDevices:
    """`<=[reshape_dims]T(transpose)`: iota(prod).reshape(reshape_dims).transpose(perm)."""

    reshape_dims: tuple[int, ...]
    transpose: tuple[int, ...] = ()

    def expand(self) -> np.ndarray:
        arr = np.arange(math.prod(self.reshape_dims)).reshape(self.reshape_dims)
        if self.transpose:
            arr = arr.transpose(self.transpose)
        return arr.reshape(-1)

    @property
    def num_devices(self) -> int:
        return math.prod(self.reshape_dims)

    @property
    def dims(self) -> tuple[int, ...]:
        """The dims after the transpose: the list is iota(n) laid out over them, row-major."""
        return tuple(self.reshape_dims[p] for p in self._perm)

    @property
    def _perm(self) -> tuple[int, ...]:
        return self.transpose or tuple(range(len(self.reshape_dims)))

    def position_of(self, device: int) -> int:
        """Where `device` sits in the expanded list, from the dims alone (no expansion): its
        coordinates over `reshape_dims`, permuted, read row-major over `dims`."""
        if not 0 <= device < self.num_devices:
            raise KeyError(f"device {device} is not in {self.to_hlo()}")
        coords = _unravel(device, self.reshape_dims)
        return _ravel([coords[p] for p in self._perm], self.dims)

    def device_at(self, position: int) -> int:
        """The device at `position` of the expanded list (the inverse of `position_of`)."""
        if not 0 <= position < self.num_devices:
            raise IndexError(f"position {position} is outside {self.to_hlo()}")
        coords = [0] * len(self.reshape_dims)
        for axis, c in zip(self._perm, _unravel(position, self.dims)):
            coords[axis] = c
        return _ravel(coords, self.reshape_dims)

    def to_hlo(self) -> str:
        if not self.transpose or tuple(self.transpose) == tuple(range(len(self.transpose))):
            # untransposed: the same list as one dimension, which is how XLA writes it (it
            # rejects `<=[a,b]` without a `T(...)`)
            return f"<=[{math.prod(self.reshape_dims)}]"
        return ("<=[" + ",".join(map(str, self.reshape_dims)) + "]T(" + ",".join(map(str, self.transpose)) + ")")

    @staticmethod
    def find(devices: ArrayLike, tile_dims: tuple[int, ...] = ()) -> "IotaDevices | None":
        """The iota spelling of a device list, if it has one: `devices` (row-major over any tile
        grid or group layout; the grid does not matter) equals iota(n).reshape(dims).transpose(perm)
        for some dims and perm exactly when walking it from its fastest-varying end finds
        arithmetic runs whose strides are a mixed radix.  This is how XLA's meshes, their
        transposes and sub-axes look, so big device lists print in a few characters, as XLA does."""
        arr = np.asarray(devices, dtype=np.int64).reshape(-1)
        n = arr.size
        if n == 0 or arr[0] != 0:
            return None
        if n == 1:
            return IotaDevices((1,))
        axes: list[tuple[int, int]] = []  # (size, stride), fastest-varying first
        block = 1
        while block < n:
            stride = int(arr[block] - arr[0])
            if stride <= 0:
                return None
            steps = arr[::block]
            off = np.flatnonzero(steps != np.arange(steps.size) * stride)
            run = int(off[0]) if off.size else steps.size
            size = next(k for k in range(min(run, n // block), 0, -1) if (n // block) % k == 0)
            if size == 1:
                return None
            axes.append((size, stride))
            block *= size
        by_stride = sorted(range(len(axes)), key=lambda i: axes[i][1])
        expected = 1
        for i in by_stride:
            if axes[i][1] != expected:
                return None
            expected *= axes[i][0]
        # reshape dims major-first (largest stride first); output axes major-first too
        major_first = list(reversed(by_stride))
        reshape_dims = tuple(axes[i][0] for i in major_first)
        output = list(reversed(range(len(axes))))
        perm = tuple(major_first.index(i) for i in output)
        found = IotaDevices(reshape_dims, () if perm == tuple(range(len(perm))) else perm)
        return found if np.array_equal(found.expand(), arr) else None


def _unravel(index: int, dims: tuple[int, ...]) -> list[int]:
    coords = [0] * len(dims)
    for i in range(len(dims) - 1, -1, -1):
        index, coords[i] = divmod(index, dims[i])
    return coords


def _ravel(coords: Iterable[int], dims: tuple[int, ...]) -> int:
    index = 0
    for c, d in zip(coords, dims):
        index = index * d + c
    return index


@dataclass(frozen=True, eq=False)
class Sharding:
    """One HLO sharding (see module docstring).  Build with the class methods."""

    kind: ShardingKind
    tile_dims: tuple[int, ...] = ()
    # TILED: the device at each tile position (int64, read-only, shape `tile_dims`); build with
    # `Sharding.tiled`, which copies and freezes the array it is given.
    tile_assignment: np.ndarray | None = None
    subgroups: tuple[SubgroupKind, ...] = ()
    device: int | None = None  # MAXIMAL
    elements: tuple["Sharding", ...] = ()  # TUPLE
    shard_group: tuple[str, int] | None = None  # ("shard_as"|"shard_like", id)
    # Spelling, not meaning:
    iota: IotaDevices | None = None
    replicate_spelled_as_flag: bool = True  # last_tile_dim_replicate vs last_tile_dims={replicated}
    devices_spelled_explicitly: bool = False  # `devices=[2]0,1` rather than an iota
    named_mesh: bool = False  # `{mesh['x'=4], [{'x'}]}`: XLA prints this form for Shardy-lowered modules
    single_device_spelling: bool = False  # MAXIMAL spelled `single_device[device_id=N]` (Shardy's callbacks)
    # Dimensions left open to propagation (`{?}`, `{'x', ?}` in the named form): a partitioner may
    # shard them further (GSPMD's `unspecified_dims`).
    open_dims: tuple[int, ...] = ()
    metadata: str = ""  # raw `metadata={...}` group text

    # ------------------------------------------------------------ builders --
    @classmethod
    def replicated(cls) -> "Sharding":
        return cls(ShardingKind.REPLICATED)

    @classmethod
    def manual(cls) -> "Sharding":
        return cls(ShardingKind.MANUAL)

    @classmethod
    def unknown(cls) -> "Sharding":
        return cls(ShardingKind.UNKNOWN)

    @classmethod
    def maximal(cls, device: int) -> "Sharding":
        return cls(ShardingKind.MAXIMAL, device=device)

    @classmethod
    def tuple_of(cls, elements: Iterable[Sharding]) -> "Sharding":
        return cls(ShardingKind.TUPLE, elements=tuple(elements))

    @classmethod
    def tiled(cls, tile_assignment: ArrayLike, subgroups: Iterable[SubgroupKind] = (), *,
              iota: IotaDevices | None = None,
              replicate_spelled_as_flag: bool = True, metadata: str = "",
              devices_spelled_explicitly: bool = False) -> "Sharding":
        """A tiled sharding from an integer device array whose shape is the tile grid."""
        arr = _frozen(tile_assignment)
        return cls(ShardingKind.TILED, tuple(int(d) for d in arr.shape), arr, tuple(subgroups), iota=iota,
                   replicate_spelled_as_flag=replicate_spelled_as_flag, metadata=metadata,
                   devices_spelled_explicitly=devices_spelled_explicitly)

    @classmethod
    def from_mesh(cls, mesh_shape: tuple[int, ...], dim_to_axes: list[tuple[int, ...]],
                  device_ids: ArrayLike | None = None) -> "Sharding":
        """Tile a rank-r array over a logical mesh: `dim_to_axes[i]` lists the mesh axes
        (major to minor) that split data dim i; mesh axes used by no dim replicate."""
        n = math.prod(mesh_shape)
        mesh = np.arange(n).reshape(mesh_shape) if device_ids is None else np.asarray(device_ids).reshape(mesh_shape)
        used = [a for axes in dim_to_axes for a in axes]
        unused = [a for a in range(len(mesh_shape)) if a not in used]
        arr = mesh.transpose(used + unused)
        tile_dims = [math.prod(mesh_shape[a] for a in axes) for axes in dim_to_axes]
        replicate = math.prod(mesh_shape[a] for a in unused)
        if replicate == 1 and all(t == 1 for t in tile_dims):
            return cls.replicated()
        if replicate > 1:
            return cls.tiled(arr.reshape(tile_dims + [replicate]), (SubgroupKind.REPLICATED,))
        return cls.tiled(arr.reshape(tile_dims))

    # ----------------------------------------------------------- meaning --
    def _key(self) -> Hashable:
        return self._meaning

    @cached_property
    def _meaning(self) -> Hashable:
        """What equality and hashing compare (computed once: shardings are hashed a lot)."""
        if self.kind is ShardingKind.TILED:
            norm = self.normalized()
            if norm is not self:
                return norm._key()
            return (self.kind, self.tile_dims, self._assignment.tobytes(), self.subgroups, self.shard_group)
        if self.kind is ShardingKind.TUPLE:
            return (self.kind, tuple(e._key() for e in self.elements))
        return (self.kind, self.device, self.shard_group)

    def __eq__(self, other: object) -> bool:
        # The cached hashes settle most comparisons before the keys (with the device bytes)
        # are compared.
        if self is other:
            return True
        return (isinstance(other, Sharding) and self._hash == other._hash
                and self._key() == other._key())

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash(self._key())

    def normalized(self) -> "Sharding":
        """Same meaning, canonical form: size-1 subgroup dims dropped, all-replicated → REPLICATED."""
        if self.kind is not ShardingKind.TILED:
            return self
        dims, subgroups = list(self.tile_dims), list(self.subgroups)
        data_rank = len(dims) - len(subgroups)
        keep = [i for i in range(len(dims)) if i < data_rank or dims[i] != 1]
        new_dims = [dims[i] for i in keep]
        new_subgroups = [subgroups[i - data_rank] for i in keep if i >= data_rank]
        # Merge several REPLICATED subgroup dims into one, sorted like XLA (manual before replicated).
        if new_subgroups.count(SubgroupKind.REPLICATED) > 1 or (
                new_subgroups and new_subgroups != sorted(new_subgroups, key=_SUBGROUP_ORDER.index)):
            arr = self._assignment.reshape(new_dims)
            d_rank = data_rank
            order = sorted(range(len(new_subgroups)), key=lambda i: _SUBGROUP_ORDER.index(new_subgroups[i]))
            arr = arr.transpose(list(range(d_rank)) + [d_rank + i for i in order])
            kinds = [new_subgroups[i] for i in order]
            merged_dims = list(arr.shape[:d_rank])
            merged_kinds: list[SubgroupKind] = []
            for k, size in zip(kinds, arr.shape[d_rank:]):
                if merged_kinds and merged_kinds[-1] is k:
                    merged_dims[-1] *= size
                else:
                    merged_dims.append(size)
                    merged_kinds.append(k)
            arr = arr.reshape(merged_dims)
            new_dims, new_subgroups = list(arr.shape), merged_kinds
            devices = arr
        else:
            devices = self._assignment.reshape(new_dims)
        data_dims = new_dims[:data_rank]
        if all(d == 1 for d in data_dims) and all(k is SubgroupKind.REPLICATED for k in new_subgroups):
            return Sharding(ShardingKind.REPLICATED, shard_group=self.shard_group)
        if all(k is SubgroupKind.MANUAL for k in new_subgroups) and new_subgroups and all(d == 1 for d in data_dims):
            return Sharding(ShardingKind.MANUAL, shard_group=self.shard_group)
        if new_dims == dims and new_subgroups == subgroups:
            return self  # the device order only changes when subgroup dims move
        return Sharding(ShardingKind.TILED, tuple(new_dims), _frozen(devices), tuple(new_subgroups),
                        shard_group=self.shard_group)

    @property
    def is_replicated(self) -> bool:
        if self.kind is ShardingKind.TUPLE:
            return all(e.is_replicated for e in self.elements)
        return self.normalized().kind is ShardingKind.REPLICATED

    @property
    def is_manual(self) -> bool:
        if self.kind is ShardingKind.TUPLE:
            return all(e.is_manual for e in self.elements)
        return self.normalized().kind is ShardingKind.MANUAL

    @property
    def is_tiled(self) -> bool:
        return self.kind is ShardingKind.TILED

    @property
    def is_tuple(self) -> bool:
        return self.kind is ShardingKind.TUPLE

    # The next three are cached (a sharding is a frozen value): propagation reads them for the
    # same few shardings hundreds of thousands of times on a big module.
    @cached_property
    def data_rank(self) -> int:
        """Number of tile dimensions that split the array (the rest enumerate replicas)."""
        return len(self.tile_dims) - len(self.subgroups)

    @cached_property
    def data_tile_dims(self) -> tuple[int, ...]:
        return self.tile_dims[: self.data_rank]

    @cached_property
    def data_tile_count(self) -> int:
        """Tiles the data is cut into (the product of `data_tile_dims`; replicas and manual
        groups not counted)."""
        return math.prod(self.data_tile_dims)

    @property
    def replication_factor(self) -> int:
        return math.prod(self.tile_dims[self.data_rank:])

    @property
    def num_devices(self) -> int:
        return self.tile_assignment.size if self.tile_assignment is not None else 0

    @property
    def _assignment(self) -> np.ndarray:
        if self.tile_assignment is None:
            raise ValueError(f"a {self.kind.value} sharding has no tile assignment")
        return self.tile_assignment

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """The device list in row-major tile order (empty unless TILED)."""
        return tuple(self.tile_assignment.reshape(-1).tolist()) if self.tile_assignment is not None else ()

    @cached_property
    def _tile_index_by_device(self) -> dict[int, tuple[int, ...]]:
        arr = self._assignment
        coords = np.stack(np.unravel_index(np.arange(arr.size), arr.shape), axis=1) if arr.ndim else (
            np.zeros((arr.size, 0), np.int64))
        return {d: tuple(c) for d, c in zip(arr.reshape(-1).tolist(), coords.tolist())}

    def tile_index(self, device: int) -> tuple[int, ...]:
        """Position of `device` in the data dimensions of the tile grid (for TILED), else all zeros."""
        if self.kind is not ShardingKind.TILED:
            raise ValueError(f"tile_index on a {self.kind.value} sharding")
        if self.iota is not None and self._iota_spelling is self.iota:  # arithmetic, no table
            return tuple(_unravel(self.iota.position_of(device), self.tile_dims)[: self.data_rank])
        return self._tile_index_by_device[device][: self.data_rank]

    def tile_shape(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """Per-device dimensions of an array of `dims`: ceil(dim / tiles), the way XLA pads uneven shards."""
        if self.kind is not ShardingKind.TILED:
            return tuple(dims)
        if len(dims) != self.data_rank:
            raise ValueError(f"sharding of rank {self.data_rank} applied to rank {len(dims)}")
        return tuple(-(-d // t) for d, t in zip(dims, self.data_tile_dims))

    def tile_offset(self, device: int, dims: tuple[int, ...]) -> tuple[int, ...]:
        """Start of `device`'s tile in the global array (may exceed the dim for padding-only tiles)."""
        if self.kind is not ShardingKind.TILED:
            return tuple(0 for _ in dims)
        shape = self.tile_shape(dims)
        return tuple(i * s for i, s in zip(self.tile_index(device), shape))

    def element(self, index: int) -> "Sharding":
        """Sharding of tuple element `index` (the sharding itself when not a tuple), for a
        tuple whose elements are all arrays (XLA's flat form and the nested one coincide);
        `subsharding` knows the shape and takes nested tuples too."""
        return self.elements[index] if self.kind is ShardingKind.TUPLE else self

    # A tuple sharding in XLA's form (HLO text, HloSharding) has one entry per array leaf of
    # the shape, depth first: `((a, b), c)` takes three, an empty tuple inside none.  The
    # partitioner builds tuples element by element, so its values may be nested (one entry per
    # tuple element, itself a tuple for a tuple element); `leaves` and `subsharding` read both
    # forms, and an instruction's sharding is always stored flat (`Instruction.sharding`).
    @cached_property
    def is_nested(self) -> bool:
        """(Kept: propagation asks it of a step's 500-element parameter tuple thousands of times.)"""
        return self.kind is ShardingKind.TUPLE and any(e.kind is ShardingKind.TUPLE for e in self.elements)

    def leaves(self) -> tuple["Sharding", ...]:
        """One sharding per array leaf, depth first (XLA's tuple_elements)."""
        if self.kind is not ShardingKind.TUPLE:
            return (self,)
        if not self.is_nested:
            return self.elements
        return tuple(leaf for e in self.elements for leaf in e.leaves())

    def flattened(self) -> "Sharding":
        """This sharding in XLA's flat form."""
        return Sharding.tuple_of(self.leaves()) if self.is_nested else self

    def subsharding(self, shape: "Shape", index: int) -> "Sharding":
        """Sharding of tuple element `index` of a value of `shape` (XLA's GetSubSharding with a
        one-element index), from either form; a tuple element's is a flat tuple sharding."""
        if self.kind is not ShardingKind.TUPLE:
            return self
        if self.is_nested:
            return self.elements[index]
        start, count = leaf_range(shape, index)
        if shape.elements[index].is_tuple:  # type: ignore[attr-defined]  # a tuple shape (leaf_range checks)
            return Sharding.tuple_of(self.elements[start:start + count])
        if start >= len(self.elements):
            raise ValueError(f"tuple sharding {self.to_hlo()} has no entry for element {index} of "
                             f"{shape.to_hlo()}")
        return self.elements[start]

    def problem_with(self, shape: "Shape") -> str | None:
        """Why this sharding cannot apply to a value of `shape` (XLA's HloSharding::Validate,
        which its verifier runs on every instruction), or None.  A single sharding on a tuple
        applies to every leaf (XLA's parser normalises it so)."""
        if self.kind is ShardingKind.TUPLE:
            leaves = self.leaves()
            if not shape.is_tuple:
                return (None if len(leaves) == 1 and leaves[0].problem_with(shape) is None else
                        f"a tuple sharding of {len(leaves)} entries on the array shape {shape.to_hlo()}")
            shape_leaves = shape.leaves()
            if len(leaves) != max(1, len(shape_leaves)):
                return (f"tuple sharding has {len(leaves)} entries, the shape {shape.to_hlo()} has "
                        f"{len(shape_leaves)} array leaves")
            for k, (leaf, leaf_shape) in enumerate(zip(leaves, shape_leaves)):
                problem = leaf.problem_with(leaf_shape)
                if problem is not None:
                    return f"tuple sharding entry {k}: {problem}"
            return None
        if shape.is_tuple or shape.element_type.name == "TOKEN":  # type: ignore[attr-defined]
            return None  # (a token takes any sharding, as in XLA)
        rank = len(shape.dims)  # type: ignore[attr-defined]  # an array shape
        if self.kind is ShardingKind.TILED and self.data_rank != rank:
            return (f"{self.to_hlo()} tiles {self.data_rank} dimension(s) (excluding subgroups), the shape "
                    f"{shape.to_hlo()} has {rank}")
        return None

    def without_metadata(self) -> "Sharding":
        from dataclasses import replace
        if self.kind is ShardingKind.TUPLE:
            return replace(self, metadata="", elements=tuple(e.without_metadata() for e in self.elements))
        return replace(self, metadata="")

    # ------------------------------------------------------------ printing --
    @cached_property
    def _iota_spelling(self) -> IotaDevices | None:
        """The iota form the device list prints in: as parsed, else found (unless the text
        spelled the list out, which printing keeps)."""
        flat = self._assignment.reshape(-1)
        iota = self.iota or (None if self.devices_spelled_explicitly else IotaDevices.find(flat))
        return iota if iota is not None and np.array_equal(iota.expand(), flat) else None

    def to_hlo(self) -> str:
        if self.kind is ShardingKind.TUPLE:
            return "{" + ", ".join(e.to_hlo() for e in self.leaves()) + "}"
        return "{" + self._body() + "}"

    def _body(self) -> str:
        parts: list[str]
        if self.kind is ShardingKind.TILED:
            dims = "[" + ",".join(map(str, self.tile_dims)) + "]"
            iota = self._iota_spelling
            if iota is not None:
                parts = ["devices=" + dims + iota.to_hlo()]
            else:
                parts = ["devices=" + dims + ",".join(map(str, self._assignment.reshape(-1).tolist()))]
            if self.subgroups == (SubgroupKind.REPLICATED,) and self.replicate_spelled_as_flag:
                parts.append("last_tile_dim_replicate")
            elif self.subgroups:
                parts.append("last_tile_dims={" + ", ".join(k.value for k in self.subgroups) + "}")
        elif self.kind is ShardingKind.MAXIMAL:
            parts = [f"single_device[device_id={self.device}]" if self.single_device_spelling
                     else f"maximal device={self.device}"]
        else:
            parts = [self.kind.value]
        if self.shard_group is not None:
            parts.append(f"{self.shard_group[0]} {self.shard_group[1]}")
        if self.metadata:
            parts.append("metadata=" + self.metadata)
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Sharding({self.to_hlo()})"

    __str__ = to_hlo


def _frozen(devices: ArrayLike) -> np.ndarray:
    """A read-only int64 copy of a device array: a Sharding's array never changes under it."""
    arr = np.array(devices, dtype=np.int64)
    arr.setflags(write=False)
    return arr


_SUBGROUP_ORDER = [SubgroupKind.MANUAL, SubgroupKind.UNREDUCED, SubgroupKind.REPLICATED, SubgroupKind.MAXIMAL,
                   SubgroupKind.OTHER]  # XLA's order (it prints `last_tile_dims={manual, unreduced, replicated}`)
