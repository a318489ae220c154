"""Shardings and replica groups as data the page draws: which device holds which tile.

A tiled sharding `{devices=[2,1,4]<=[8]}` of f32[8,32,64] becomes

    {"kind": "tiled", "tiles": [2, 1, 4], "replicas": 1, "manual": 1,
     "grid": [[0], [1], [2], [3], [4], [5], [6], [7]], ...}

`grid[t]` lists the devices holding data tile t (tiles in row-major order of `tiles`): more than
one device per tile is partial replication (`last_tile_dim_replicate`), devices of a manual
subgroup run a shard_map body on their own.  The page draws the tile grid with the devices of
each tile written in it, and the device mesh with each device coloured by its tile.
"""

from __future__ import annotations

import math

from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind


def mesh_shape(num_devices: int) -> list[int]:
    """Rows × columns to draw `num_devices` devices: the most square factorisation with no more
    rows than columns (8 → 2×4, 16 → 4×4, 6 → 2×3).  Device d sits at (d // cols, d % cols).
    HLO does not record the mesh axes a sharding came from, so this is a drawing choice."""
    n = max(1, num_devices)
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return [rows, n // rows]


def sharding_data(sharding: Sharding, table: dict[str, int], out: list[dict]) -> int:
    """Index of `sharding`'s record in `out` (added once per distinct printed form)."""
    text = sharding.to_hlo()
    found = table.get(text)
    if found is not None:
        return found
    record: dict = {"text": text, "kind": sharding.kind.value}
    if sharding.kind is ShardingKind.TUPLE:
        record["elements"] = [sharding_data(e, table, out) for e in sharding.elements]
    elif sharding.kind is ShardingKind.MAXIMAL:
        record["device"] = sharding.device
    elif sharding.kind is ShardingKind.TILED:
        record.update(_tiled(sharding))
    table[text] = len(out)
    out.append(record)
    return table[text]


def _tiled(s: Sharding) -> dict:
    arr = s.tile_assignment
    data_rank = s.data_rank
    tiles = list(s.tile_dims[:data_rank])
    manual = math.prod(d for d, k in zip(s.tile_dims[data_rank:], s.subgroups) if k is SubgroupKind.MANUAL)
    replicas = math.prod(d for d, k in zip(s.tile_dims[data_rank:], s.subgroups) if k is not SubgroupKind.MANUAL)
    per_tile = arr.reshape(math.prod(tiles) if tiles else 1, -1)
    return {"tiles": tiles, "replicas": replicas, "manual": manual,
            "grid": [[int(d) for d in row] for row in per_tile],
            "subgroups": [k.value for k in s.subgroups]}


def tile_shape_text(shape: Shape, sharding: Sharding | None) -> str | None:
    """The per-device shape of a global array under `sharding` (`f32[4,32,16]`); None when it is
    the whole array (replicated, maximal, manual, no sharding) or not an array."""
    if sharding is None or not shape.is_array or sharding.kind is not ShardingKind.TILED:
        return None
    if sharding.data_rank != len(shape.dims) or all(t == 1 for t in sharding.data_tile_dims):
        return None
    return shape.with_dims(sharding.tile_shape(shape.dims)).to_hlo(False)


def bytes_on_device(shape: Shape, sharding: Sharding | None, device: int) -> int:
    """Bytes of a global value that `device` holds under `sharding` (padded tiles, as XLA pads)."""
    if shape.is_tuple:
        return sum(bytes_on_device(e, sharding.subsharding(shape, k) if sharding is not None else None, device)
                   for k, e in enumerate(shape.elements))
    if sharding is None or sharding.kind in (ShardingKind.REPLICATED, ShardingKind.MANUAL, ShardingKind.UNKNOWN):
        return shape.byte_size()
    if sharding.kind is ShardingKind.MAXIMAL:
        return shape.byte_size() if sharding.device == device else 0
    if sharding.kind is ShardingKind.TILED:
        if device not in sharding.devices or sharding.data_rank != len(shape.dims):
            return 0 if device not in sharding.devices else shape.byte_size()
        return shape.with_dims(sharding.tile_shape(shape.dims)).byte_size()
    return shape.byte_size()


def replica_groups_data(groups: ReplicaGroups | None, num_devices: int) -> list[list[int]]:
    """The groups as lists of device ids; `{}` (or none given) is one group of every device."""
    if groups is None or groups.is_empty:
        return [list(range(num_devices))]
    return [list(g) for g in groups.groups]
