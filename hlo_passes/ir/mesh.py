"""Named device meshes, as newer XLA prints them in mesh-form replica groups and shardings.

    mesh['x'=4,'y'=2]                                   iota device order
    mesh['x'=4,'y'=2], device_ids=(0,2,4,6,1,3,5,7)     explicit device order
    'x'        a whole axis
    'x':(2)2   the sub-axis of size 2 of 'x' whose more-major factors multiply to 2

Both replica groups (`mesh[...] {'x'}`) and named shardings (`{mesh[...], [{'x'}, {}]}`)
select axes and sub-axes of a mesh; `DeviceMesh.factored` splits every axis into the
factors those references need so each reference is a run of consecutive factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A whole mesh axis (`pre_size` None) or the sub-axis `name:(pre_size)size`."""

    name: str
    pre_size: int | None = None
    size: int | None = None

    def to_hlo(self) -> str:
        text = f"'{self.name}'"
        return text if self.pre_size is None else f"{text}:({self.pre_size}){self.size}"


@dataclass(frozen=True, slots=True)
class DeviceMesh:
    axes: tuple[tuple[str, int], ...]  # (name, size), major to minor
    device_ids: tuple[int, ...] | None = None  # None: iota

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    def axis_size(self, name: str) -> int:
        for axis, size in self.axes:
            if axis == name:
                return size
        raise ValueError(f"mesh {self.to_hlo()} has no axis '{name}'")

    def factored(self, refs: list[AxisRef]) -> tuple[np.ndarray, dict[AxisRef, list[int]]]:
        """The device array with each axis split into the factors `refs` need (major to minor),
        and for each reference the indices of its factors in that array."""
        breaks: dict[str, set[int]] = {name: {1, size} for name, size in self.axes}
        for ref in refs:
            size = self.axis_size(ref.name)
            if ref.pre_size is not None:
                end = ref.pre_size * ref.size
                if size % end:
                    raise ValueError(f"sub-axis {ref.to_hlo()} does not divide axis of size {size}")
                breaks[ref.name] |= {ref.pre_size, end}
        factor_sizes: list[int] = []
        factor_of: dict[tuple[str, int], int] = {}  # (axis, pre-size) -> factor index
        for name, _ in self.axes:
            points = sorted(breaks[name])
            for lo, hi in zip(points, points[1:]):
                if hi % lo:
                    raise ValueError(f"sub-axes of '{name}' overlap inconsistently")
                factor_of[(name, lo)] = len(factor_sizes)
                factor_sizes.append(hi // lo)
        devices = np.arange(self.num_devices) if self.device_ids is None else np.asarray(self.device_ids)
        if devices.size != self.num_devices:
            raise ValueError(f"{devices.size} device ids for a mesh of {self.num_devices} devices")
        array = devices.reshape(factor_sizes) if factor_sizes else devices.reshape(())
        index: dict[AxisRef, list[int]] = {}
        for ref in refs:
            size = self.axis_size(ref.name)
            lo, hi = (1, size) if ref.pre_size is None else (ref.pre_size, ref.pre_size * ref.size)
            points = sorted(p for p in breaks[ref.name] if lo <= p < hi)
            index[ref] = [factor_of[(ref.name, p)] for p in points]
        return array, index

    def to_hlo(self) -> str:
        text = "mesh[" + ",".join(f"'{name}'={size}" for name, size in self.axes) + "]"
        if self.device_ids is not None:
            text += ", device_ids=(" + ",".join(map(str, self.device_ids)) + ")"
        return text
