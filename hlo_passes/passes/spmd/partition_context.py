"""What every SPMD handler works with: per-device values, device tables and collectives.

A partitioned value (`PValue`) is the per-device instruction plus the sharding
that says which part of the global array each device holds.  Uneven dimensions
are padded at the end (ceil division, like XLA); padded elements hold arbitrary
values ("don't care") and are masked with the reduction's identity before any
reduction or dot over a sharded dimension (`mask_padding`).

Per-device quantities (tile offsets, masks) are tables of N entries indexed by
`partition-id`:

    %t = s32[8] constant({0, 4, 8, ...})
    %o = s32[1] dynamic-slice(%t, %partition-id), dynamic_slice_sizes={1}
    %offset = s32[] reshape(%o)

Collectives use global device ids (`use_global_device_ids=true`, one channel id
each) with groups read off a `TileMap`: the devices that differ only in the
tile coordinates of some dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence, TypeAlias, overload

import numpy as np
import numpy.typing as npt

from hlo_passes.passes.spmd.cost_model import DEFAULT, CostModel
from hlo_passes.ir.attributes import Attr, PaddingConfig
from hlo_passes.ir.builder import Builder
from hlo_passes.ir.reduction import REDUCTION_OPCODES, Reduction
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.tile_map import Int64Array, TileMap, stable_order

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module
    from hlo_passes.passes.pass_base import ModulePass
    from hlo_passes.passes.spmd.handlers.shape_ops import HaloReshape
    from hlo_passes.passes.spmd.reshard import Step
    from hlo_passes.passes.spmd.sharding_util import ExactKey

S32 = PrimitiveType.S32
PRED = PrimitiveType.PRED

# Collective groups as `groups_varying` makes them: a [num_groups, group_size] array, or lists
# where the groups differ in size.
DeviceGroups: TypeAlias = npt.NDArray[np.int64] | Sequence[Sequence[int]]


@dataclass(frozen=True, slots=True)
class PValue:
    """A per-device value `instr` holding the part of a global array (of `global_shape`) that
    `sharding` assigns to each device.

    `stand_in`: `instr` holds no such part: it stands for a value its only user partitions
    without reading it (a slice a rotation reads through, a pad merged into its slice), so
    nothing may read it, reshard it or recompute from it."""

    instr: Instruction
    sharding: Sharding
    global_shape: Shape
    stand_in: bool = False


# ------------------------------------------------------------ shardings --
def is_manual(sharding: Sharding | None) -> bool:
    """Fully or partially manual (a shard_map region)."""
    if sharding is None:
        return False
    if sharding.kind is ShardingKind.TUPLE:
        return any(is_manual(e) for e in sharding.elements)
    if sharding.kind is ShardingKind.MANUAL:
        return True
    return is_partially_manual(sharding)


def is_fully_manual(sharding: Sharding | None) -> bool:
    """`{manual}` (or a tuple with such an element): per-device code the partitioner copies."""
    if sharding is None:
        return False
    if sharding.kind is ShardingKind.TUPLE:
        return any(is_fully_manual(e) for e in sharding.elements)
    return sharding.kind is ShardingKind.MANUAL


def is_partially_manual(sharding: Sharding | None) -> bool:
    """An array sharding with MANUAL subgroups (`last_tile_dims={manual, ...}`): the value lies
    inside a partially manual region.  Its manual groups are fixed device groups; its tile dims
    are automatic and partitioned like any tiling, within each manual group."""
    return (sharding is not None and sharding.kind is ShardingKind.TILED
            and SubgroupKind.MANUAL in sharding.subgroups)


def root_of(comp: Computation) -> Instruction:
    """`comp.root`: every computation the partitioner reads or writes has one."""
    root = comp.root
    assert root is not None, f"{comp.name} has no root"
    return root


def collective_pairs(instr: Instruction, n: int) -> list[tuple[int, int]]:
    """The device pairs a collective connects: each group member with the group's first, or a
    collective-permute's (source, target) pairs (one replica: groups name partitions)."""
    if instr.opcode is Opcode.COLLECTIVE_PERMUTE:
        return [(int(a), int(b)) for a, b in instr.attr("source_target_pairs") or ()]
    groups = instr.replica_groups.groups or (tuple(range(n)),)
    return [(g[0], d) for g in groups for d in g[1:]]


def pair_on_other_tiles(instr: Instruction, tm: TileMap) -> tuple[int, int] | None:
    """Two devices the collective `instr` connects that hold different tiles of `tm` (None when
    every pair holds the same tile: the collective then runs on tiles as on whole values)."""
    n = tm.num_devices
    for a, b in collective_pairs(instr, n):
        if a >= n or b >= n or not np.array_equal(tm.coords[a], tm.coords[b]):
            return a, b
    return None


class ManualGroupsMismatch(Exception):
    """A value inside a partially manual region was asked for a sharding that does not keep its
    manual groups (a tiling over all devices, other manual groups): there is no resharding
    between the two.  The partitioner catches it and computes the op whole per manual group."""


def manual_only(tm: TileMap) -> TileMap:
    """`tm` with its automatic tiling gathered: every device holds its manual group's whole value."""
    return TileMap.replicated(tm.rank, tm.num_devices).with_manual(tm)


def tile_map(sharding: Sharding, rank: int, n: int) -> TileMap:
    """The TileMap of an array sharding; replicated, maximal and unknown read as replicated."""
    if sharding.kind is ShardingKind.TILED:
        tm = TileMap.from_sharding(sharding, n, rank)
        if tm is not None:
            return tm
        raise ValueError(f"sharding {sharding.to_hlo()} does not tile a rank-{rank} array over {n} devices")
    return TileMap.replicated(rank, n)


def to_sharding(tm: TileMap) -> Sharding:
    s = tm.to_sharding()
    if s is None:
        raise ValueError("tiles have unequal numbers of holders")
    return s


@overload
def local_shape(shape: ArrayShape, sharding: Sharding) -> ArrayShape: ...
@overload
def local_shape(shape: Shape, sharding: Sharding) -> Shape: ...
def local_shape(shape: Shape, sharding: Sharding) -> Shape:
    """Per-device shape: ceil(dim / tiles) on tiled dims."""
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(local_shape(e, sharding.subsharding(shape, i)) for i, e in enumerate(shape.elements)))
    if not isinstance(shape, ArrayShape) or sharding.kind is not ShardingKind.TILED or shape.rank == 0:
        return shape
    # Kept per shape object and tile counts: a model's instructions share a few dozen shape
    # objects, and every handler asks for its result's local shape.
    key = (id(shape), sharding.data_tile_dims)
    found = _LOCAL_SHAPES.get(key)
    if found is None or found[0] is not shape:
        if len(_LOCAL_SHAPES) > 10_000:
            _LOCAL_SHAPES.clear()
        found = _LOCAL_SHAPES[key] = (shape, shape.with_dims(sharding.tile_shape(shape.dims)))
    return found[1]


_LOCAL_SHAPES: dict[tuple[int, tuple[int, ...]], tuple[ArrayShape, ArrayShape]] = {}  # see local_shape


def tm_local_dims(tm: TileMap, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(-(-d // t) for d, t in zip(dims, tm.dims))


def same_placement(a: TileMap, b: TileMap) -> bool:
    return a.dims == b.dims and np.array_equal(a.coords, b.coords)


def groups_varying(tm: TileMap, dims: Iterable[int]) -> Int64Array | list[tuple[int, ...]]:
    """Device groups that differ only in the tile coordinates of `dims`: one holder of each
    coordinate combination per group, ordered row-major by those coordinates (the j-th holder
    of each combination, by device id, forms the j-th group); the groups sorted.  A
    [num_groups, group_size] int64 array (what `ReplicaGroups.of` turns into XLA's iota form),
    computed with array sorts, so 2048 devices cost what 8 do; a list of tuples only for a map
    no sharding spells whose groups differ in size."""
    dims = list(dims)
    others = [k for k in range(tm.rank) if k not in dims]
    n = tm.num_devices
    key = tm.manual.astype(np.int64)
    num_keys = tm.manual_size
    for k in others:
        key = key * tm.dims[k] + tm.coords[:, k]
        num_keys *= tm.dims[k]
    sub = np.zeros(n, np.int64)
    num_subs = 1
    for k in dims:
        sub = sub * tm.dims[k] + tm.coords[:, k]
        num_subs *= tm.dims[k]
    cell = key * num_subs + sub
    order = stable_order(cell, num_keys * num_subs)  # by key, then coordinates, then device id
    counts = np.bincount(cell, minlength=num_keys * num_subs)
    replicas = int(counts[0]) if counts.size else 0
    groups: Int64Array | list[tuple[int, ...]]
    if replicas and counts.size == num_keys * num_subs and np.all(counts == replicas):
        # every (key, combination) cell has the same holders: group j of a key takes the j-th
        # holder of each combination
        groups = order.reshape(num_keys, num_subs, replicas).transpose(0, 2, 1).reshape(-1, num_subs)
    else:
        groups = _groups_of_unequal_cells(order, key[order], sub[order])
        if isinstance(groups, list):
            return sorted(groups)
    # groups are disjoint, so their first devices order them as tuples would be ordered
    return groups[np.argsort(groups[:, 0], kind="stable")] if groups.size else groups


def _groups_of_unequal_cells(order: Int64Array, key_sorted: Int64Array,
                             sub_sorted: Int64Array) -> Int64Array | list[tuple[int, ...]]:
    """groups_varying where some coordinate combinations have more holders than others (a map
    no sharding spells): per key, the j-th holder of each combination present."""
    groups: list[tuple[int, ...]] = []
    bounds = np.flatnonzero(np.diff(key_sorted)) + 1
    for members, subs in zip(np.split(order, bounds), np.split(sub_sorted, bounds)):
        combos, counts = np.unique(subs, return_counts=True)
        by_combo = np.split(members, np.cumsum(counts)[:-1])
        groups.extend(tuple(int(c[j]) for c in by_combo) for j in range(int(counts[0])))
    if len({len(g) for g in groups}) > 1:
        return groups
    return np.asarray(groups, dtype=np.int64).reshape(len(groups), -1)


# Reductions the partitioner completes with an all-reduce of partial results: those XLA's
# collectives implement (sum, product, min, max; and/or only over pred, where they are min/max).
# Bitwise and/or/xor over integers are not all-reduce kinds (XLA's CPU runtime rejects them),
# so those reductions gather their operand instead.
ALL_REDUCIBLE = frozenset({Opcode.ADD, Opcode.MULTIPLY, Opcode.MAXIMUM, Opcode.MINIMUM})
ALL_REDUCIBLE_OVER_PRED = ALL_REDUCIBLE | {Opcode.AND, Opcode.OR}


def reducer_opcode(comp: Computation) -> Opcode | None:
    """The opcode of the reduction `comp` computes when partial results of it can be
    all-reduced (`Reduction.of` recognises it), else None."""
    reduction = Reduction.of(comp)
    if reduction is None:
        return None
    allowed = ALL_REDUCIBLE_OVER_PRED if reduction.element_type is PRED else ALL_REDUCIBLE
    return reduction.opcode if reduction.opcode in allowed else None


def reducer_opcodes(comp: Computation, n: int) -> list[Opcode] | None:
    """Per output, the all-reducible opcode of a scatter's (or reduce's) `to_apply` over `n`
    operands, when the computation is `n` independent scalar reductions: output i is
    `OP_i(param i, param n + i)` over one type (a variadic sum-and-max, a sum of values and of
    counts).  Then a variadic op is `n` single ones sharing its indices or window, and each
    output's partial results can be all-reduced on their own.  None for anything else (an
    argmax's select pairs the outputs: it has no per-output reduction and no identity)."""
    if n == 1:
        opcode = reducer_opcode(comp)
        return None if opcode is None else [opcode]
    params, root = comp.parameters, comp.root
    if len(params) != 2 * n or root is None or root.opcode is not Opcode.TUPLE or len(root.operands) != n:
        return None
    opcodes: list[Opcode] = []
    for i, out in enumerate(root.operands):
        lhs, rhs = params[i], params[n + i]
        shape = out.shape
        if (out.opcode not in REDUCTION_OPCODES or not isinstance(shape, ArrayShape) or shape.rank != 0
                or len(out.operands) != 2 or lhs.shape != shape or rhs.shape != shape
                or {id(o) for o in out.operands} != {id(lhs), id(rhs)}):
            return None
        allowed = ALL_REDUCIBLE_OVER_PRED if shape.element_type is PRED else ALL_REDUCIBLE
        if out.opcode not in allowed:
            return None
        opcodes.append(out.opcode)
    return opcodes


# ------------------------------------------------------- the emitter --
class PartitionContext:
    """Module-wide state of one partitioner run."""

    def __init__(self, module: "Module", num_partitions: int, owner: "ModulePass",
                 cost_model: CostModel = DEFAULT):
        self.module = module
        self.n = num_partitions
        self.owner = owner
        self.cost_model = cost_model
        # Answers worked out from shardings and shapes alone, which a run meets again at every
        # layer of a model, kept per run; keyed by the shardings' exact forms (sharding_util.exact).
        self.reducers: dict[tuple[Opcode, PrimitiveType], Computation] = {}  # Emitter._reducer
        self.reshard_plans: dict[tuple[ExactKey, ExactKey, ArrayShape], list[Step]] = {}  # reshard._plan_of
        # handlers/shape_ops.reshape: (target, operand sharding, operand shape, result shape) ->
        # (operand map, result map, replicated because a sharded dim splits unevenly, the halo
        # exchange when the tiles do not line up: shape_ops.HaloReshape)
        self.reshape_plans: dict[tuple[ExactKey, ExactKey, ArrayShape, ArrayShape],
                                 tuple[TileMap, TileMap, bool, "HaloReshape | None"]] = {}
        # handlers/dot.partition_dot_like: everything the choice depends on -> the iteration-space
        # tiling (None: none is consistent)
        self.dot_tilings: dict[tuple[object, ...], TileMap | None] = {}

    def channel_id(self) -> int:
        return self.module.new_channel_id()

    def remark(self, instr: Instruction, message: str, kind: str = "note") -> None:
        self.owner.remark(instr, message, kind)


class Emitter:
    """Builds one partitioned computation; caches partition-id and per-device tables."""

    def __init__(self, ctx: PartitionContext, comp: Computation):
        self.ctx = ctx
        self.comp = comp
        self._pid: Instruction | None = None
        self._tables: dict[tuple[bytes, PrimitiveType], Instruction] = {}
        self.metadata: Attr | None = None  # metadata of the op being partitioned, copied onto what we emit

    @property
    def n(self) -> int:
        return self.ctx.n

    def b(self) -> Builder:
        return Builder(self.comp, metadata=self.metadata)

    def checkpoint(self) -> tuple[int, int, Instruction | None]:
        """Where the computation and the emitter's caches stand (see `rollback`)."""
        return len(self.comp), len(self._tables), self._pid

    def rollback(self, checkpoint: tuple[int, int, Instruction | None]) -> None:
        """Erase what was emitted since `checkpoint` (the emitter only appends) and forget the
        tables and partition-id made since."""
        emitted, tables, pid = checkpoint
        for instr in reversed(self.comp.instructions[emitted:]):  # users before their operands
            self.comp.remove(instr)
        for key in list(self._tables)[tables:]:
            del self._tables[key]
        self._pid = pid

    def partition_id(self) -> Instruction:
        if self._pid is None:
            self._pid = self.b().partition_id()
        return self._pid

    def device_scalar(self, values: npt.ArrayLike, element_type: PrimitiveType = S32) -> Instruction:
        """A scalar holding values[partition-id] (a constant when all devices agree).  `values`
        is a table of one integer per device, best a numpy array computed from a TileMap's
        coordinates (`tm.coords[:, k] * size`); one table instruction per distinct table."""
        table_values = np.asarray(values, dtype=np.int64).reshape(-1)
        key = (table_values.tobytes(), element_type)
        if key in self._tables:
            return self._tables[key]
        b = self.b()
        if _uniform(table_values):
            out = b.constant(int(table_values[0]), element_type)
        else:
            table = b.constant_array(table_values.tolist(), element_type)
            pid = self.partition_id()
            one = b.dynamic_slice(table, [pid], (1,))
            out = b.reshape(one, ArrayShape(element_type, ()))
        self._tables[key] = out
        return out

    def constant(self, value: float, element_type: PrimitiveType) -> Instruction:
        return self.b().constant(value, element_type)

    def broadcast_scalar(self, value: float, element_type: PrimitiveType, dims: tuple[int, ...]) -> Instruction:
        b = self.b()
        return b.broadcast(b.constant(value, element_type), ArrayShape(element_type, dims))

    # ------------------------------------------------------------ slicing --
    def local_slice(self, x: Instruction, offsets: Sequence[npt.ArrayLike], sizes: tuple[int, ...]) -> Instruction:
        """Per device d, x[offsets[k][d] : +sizes[k]] along every dim k (`offsets[k]` a table of
        one offset per device)."""
        tables = [np.asarray(o, dtype=np.int64).reshape(-1) for o in offsets]
        if all(_uniform(t) for t in tables):
            starts = [int(t[0]) for t in tables]
            if tuple(sizes) == tuple(x.array_shape.dims) and not any(starts):
                return x
            return self.b().slice(x, starts, [s + z for s, z in zip(starts, sizes)])
        idx = [self.device_scalar(t) for t in tables]
        return self.b().dynamic_slice(x, idx, sizes)

    def slice_to(self, x: Instruction, dims: tuple[int, ...]) -> Instruction:
        """Static prefix slice to `dims` (drops padding)."""
        if tuple(x.array_shape.dims) == tuple(dims):
            return x
        return self.b().slice(x, [0] * len(dims), list(dims))

    def pad_to(self, x: Instruction, dims: tuple[int, ...]) -> Instruction:
        """Zero-pad at the high end up to `dims`."""
        shape = x.array_shape
        if tuple(shape.dims) == tuple(dims):
            return x
        zero = self.b().constant(0 if shape.element_type is not PRED else False, shape.element_type)
        cfg = PaddingConfig(tuple((0, t - s, 0) for s, t in zip(shape.dims, dims)))
        return self.b().pad(x, zero, cfg)

    # ---------------------------------------------------------- masking --
    def valid_mask(self, tm: TileMap, global_dims: tuple[int, ...], dims: Iterable[int]) -> Instruction | None:
        """pred[local shape]: true where the element lies inside the global array, for `dims`."""
        local = tm_local_dims(tm, global_dims)
        mask: Instruction | None = None
        b = self.b()
        for k in dims:
            if tm.dims[k] == 1 or global_dims[k] % tm.dims[k] == 0:
                continue
            offsets = tm.coords[:, k] * local[k]
            shape = ArrayShape(S32, local)
            pos = b.add(b.iota(shape, k), b.broadcast(self.device_scalar(offsets), shape))
            limit = b.broadcast(b.constant(global_dims[k], S32), shape)
            m = b.compare(pos, limit, "LT")
            mask = m if mask is None else b.op(Opcode.AND, m.shape, [mask, m])
        return mask

    def mask_padding(self, x: Instruction, tm: TileMap, global_dims: tuple[int, ...], dims: Iterable[int],
                     fill: float) -> Instruction:
        """`x` with padded elements along `dims` set to `fill`."""
        mask = self.valid_mask(tm, global_dims, dims)
        if mask is None:
            return x
        etype = x.array_shape.element_type
        return self.b().select(mask, x, self.broadcast_scalar(fill, etype, tuple(x.array_shape.dims)))

    # ------------------------------------------------------- collectives --
    def _reducer(self, opcode: Opcode, element_type: PrimitiveType) -> Computation:
        """Reduction.computation, kept per run: finding it scans the module's computations by
        name, and the partitioned step has hundreds of all-reduces and over a thousand
        computations."""
        key = (opcode, element_type)
        module = self.ctx.module
        comp = self.ctx.reducers.get(key)
        if comp is None or comp not in module.computations:
            comp = self.ctx.reducers[key] = Reduction(opcode, element_type).computation(module)
        return comp

    def all_reduce(self, x: Instruction, groups: DeviceGroups, opcode: Opcode) -> Instruction:
        if _singletons(groups):
            return x
        red = self._reducer(opcode, x.array_shape.element_type)
        return self.b().all_reduce([x], ReplicaGroups.of(groups), red, channel_id=self.ctx.channel_id(),
                                   use_global_device_ids=True)

    def sum_of_parts(self, x: Instruction, groups: DeviceGroups) -> Instruction:
        """The all-reduce that assembles a value every device of a group holds a part of, zeros
        elsewhere: an add (a pred's parts or-ed).  Adding zeros keeps every value but a zero's
        sign (-0.0 comes back 0.0)."""
        etype = x.array_shape.element_type
        return self.all_reduce(x, groups, Opcode.OR if etype is PRED else Opcode.ADD)

    def is_device(self, device: int) -> Instruction:
        """pred[]: is this device `device` (partition-id == device)?"""
        b = self.b()
        return b.compare(self.partition_id(), b.constant(device, PrimitiveType.U32), "EQ")

    def reduce_scatter(self, x: Instruction, dim: int, groups: DeviceGroups, opcode: Opcode) -> Instruction:
        red = self._reducer(opcode, x.array_shape.element_type)
        return self.b().reduce_scatter(x, dim, ReplicaGroups.of(groups), red,
                                       channel_id=self.ctx.channel_id(), use_global_device_ids=True)

    def all_gather(self, x: Instruction, dim: int, groups: DeviceGroups) -> Instruction:
        if _singletons(groups):
            return x
        return self.b().all_gather(x, dim, ReplicaGroups.of(groups), channel_id=self.ctx.channel_id(),
                                   use_global_device_ids=True)

    def all_to_all(self, x: Instruction, dim: int, groups: DeviceGroups) -> Instruction:
        return self.b().all_to_all(x, dim, ReplicaGroups.of(groups), channel_id=self.ctx.channel_id())

    def collective_permute(self, x: Instruction, pairs: Sequence[tuple[int, int]]) -> Instruction:
        return self.b().collective_permute(x, pairs, channel_id=self.ctx.channel_id())


def _uniform(table: Int64Array) -> bool:
    """Every device has the same entry (a table of none is not uniform)."""
    return bool(table.size) and bool(np.all(table == table[0]))


def _singletons(groups: DeviceGroups) -> bool:
    """Every group one device: the collective would move nothing."""
    if isinstance(groups, np.ndarray):
        return bool(groups.shape[1] == 1)
    return all(len(g) == 1 for g in groups)
