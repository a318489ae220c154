"""Optimizer state kept sharded between steps (`keep-state-sharded`).

After the rewrite each device of a group updates its chunk of the optimizer state.  When the
chunk is a tile of the state array (`formatting`), the state need not be gathered at all: the
ENTRY parameter takes the device's tile and the output returns it, and both say so with a
sharding, so `hlo-passes verify` still compares the program with the original.

The new sharding refines the state's old one by the gradient's groups.  On a data=2 x model=4
mesh, a moment tiled over `model` on dimension 1 and replicated over `data`

    f32[256,64] parameter(7), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}

whose gradient is reduced over the `data` groups {0,4},{1,5},... and tiled on dimension 0
becomes tile (i, j) on device (data=i, model=j):

    f32[128,64] parameter(7), sharding={devices=[2,4]<=[2,4]}

Device d's new tile index along the tiled dimension k is `old_index_k(d) * N + position(d)`,
where position is d's place in its group.  That holds only when the old tiles along k split
evenly into N pieces (the old tile's extent on k divisible by N), when the groups partition
every device, and when the devices sharing a new tile are equally many (they become the new
replication subgroup); otherwise the state is gathered as before, with a remark.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind

Groups = tuple[tuple[int, ...], ...]


def refined_sharding(old: Sharding | None, rank: int, tile_dim: int, local_dim: int, groups: Groups,
                     num_devices: int) -> Sharding | None:
    """`old` (None: replicated) further tiled on `tile_dim` by each device's position in its
    group, or None when that is not a sharding (see the module docstring)."""
    n = len(groups[0])
    position: dict[int, int] = {}
    for g in groups:
        for pos, d in enumerate(g):
            position[d] = pos
    if sorted(position) != list(range(num_devices)):
        return None
    old = (old or Sharding.replicated()).normalized()
    if old.kind is ShardingKind.REPLICATED:
        old_dims, old_index = (1,) * rank, {d: (0,) * rank for d in range(num_devices)}
    elif old.kind is ShardingKind.TILED and old.data_rank == rank and old.num_devices == num_devices \
            and all(k is SubgroupKind.REPLICATED for k in old.subgroups):
        old_dims = old.data_tile_dims
        old_index = {d: old.tile_index(d) for d in range(num_devices)}
    else:
        return None
    if old_dims[tile_dim] > 1 and local_dim % n:
        return None  # an old tile does not split into N equal rows
    new_dims = tuple(t * n if i == tile_dim else t for i, t in enumerate(old_dims))
    by_tile: dict[tuple[int, ...], list[int]] = {}
    for d in range(num_devices):
        idx = list(old_index[d])
        idx[tile_dim] = idx[tile_dim] * n + position[d]
        by_tile.setdefault(tuple(idx), []).append(d)
    sizes = {len(v) for v in by_tile.values()}
    if len(by_tile) != int(np.prod(new_dims)) or len(sizes) != 1:
        return None
    replicas = sizes.pop()
    grid = np.zeros(new_dims + ((replicas,) if replicas > 1 else ()), dtype=np.int64)
    for idx, devices in by_tile.items():
        if replicas > 1:
            grid[idx] = devices
        else:
            grid[idx] = devices[0]
    subgroups = (SubgroupKind.REPLICATED,) if replicas > 1 else ()
    return Sharding.tiled(grid, subgroups)
