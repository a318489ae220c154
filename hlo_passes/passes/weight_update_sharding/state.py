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

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import TupleShape
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


class Signature:
    """Where the state of an update computation enters and leaves the program.

    In the entry computation its parameters and ROOT tuple are the program's.  In the body of a
    manual region (shard_map, pmap: a computation the entry `call`s once) a body parameter
    stands for the ENTRY parameter the call passes it, when only that call reads it, and a body
    output for the program output the call's result reaches directly (the entry's ROOT is the
    call, or a tuple of its get-tuple-elements).  `why` says what else stops state from staying
    sharded (None: it can)."""

    def __init__(self, module: Module, comp: Computation):
        self.module, self.comp = module, comp
        self.call: Instruction | None = None
        self.why: str | None = None
        entry = module.entry
        if module.replica_count != 1:
            self.why = "the program is replica-style (state tiles are shardings of partitions)"
        elif comp.root.opcode is not Opcode.TUPLE:
            self.why = "the update's result is not a tuple"
        elif comp is not entry:
            calls = [i for c in module.computations for i in c.instructions if comp in i.called_computations()]
            if len(calls) != 1 or calls[0].opcode is not Opcode.CALL or calls[0].parent is not entry:
                self.why = "the update is in a computation the entry does not call exactly once"
            else:
                self.call = calls[0]
                root = entry.root
                if root is not self.call and not (root.opcode is Opcode.TUPLE and all(
                        o.opcode is not Opcode.GET_TUPLE_ELEMENT or o.operands[0] is self.call
                        for o in root.operands)):
                    self.why = "the manual region's results reach the program's outputs through other ops"

    @property
    def holder(self) -> Instruction:
        """The instruction whose sharding describes the program's outputs."""
        return self.module.entry.root

    def entry_parameter(self, param: Instruction) -> Instruction | None:
        """The ENTRY parameter `param` stands for, or None."""
        if self.call is None:
            return param if param.parent is self.module.entry else None
        outer = self.call.operands[param.parameter_number]
        if outer.opcode is not Opcode.PARAMETER or any(u is not self.call for u in outer.users) \
                or sum(o is outer for o in self.call.operands) != 1:
            return None
        return outer

    def output_positions(self, index: int) -> list[int]:
        """Positions of the program's outputs that are the update's result element `index`."""
        if self.call is None:
            return [index]
        root = self.module.entry.root
        if root is self.call:
            return [index]
        return [i for i, o in enumerate(root.operands)
                if o.opcode is Opcode.GET_TUPLE_ELEMENT and o.tuple_index == index]

    def output_count(self) -> int:
        root = self.module.entry.root
        return len(root.shape.elements) if root.shape.is_tuple else 1

    def update_shapes(self) -> None:
        """After the update's result changed shape: the call, its get-tuple-elements and the
        entry's ROOT follow."""
        if self.call is None:
            return
        self.call.shape = self.comp.root.shape
        for user in self.call.users:
            if user.opcode is Opcode.GET_TUPLE_ELEMENT:
                user.shape = self.call.shape.elements[user.tuple_index]
        root = self.module.entry.root
        if root is not self.call and root.opcode is Opcode.TUPLE:
            root.shape = TupleShape(tuple(o.shape for o in root.operands))
