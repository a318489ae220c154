"""A global module's fully manual regions run as written, on each device, without an SPMD
partitioner: a second oracle for what such a module computes.

XLA runs a global module that holds manual regions (shard_map, `SPMDFullToShardShape` ...
`SPMDShardToFullShape`) by partitioning it, and `verify` takes that partition as the oracle.
XLA's partitioner has been wrong there (verify.py: `_outputs_of_one_device`).  The outputs that
need the regions can be computed another way, which shares nothing with any partitioner: every
device computes everything outside the regions whole (the values are global; each device holds
all of them), cuts its own tile out where a region starts, runs the region's per-device code as
written, and rebuilds the global value where the region ends from every device's tile:

    r = f32[16,2] custom-call(custom-call(x){Sharding S}), custom_call_target="SPMDFullToShardShape"
      -> r = f32[16,2] dynamic-slice(x, row offset of this device's tile in S, column offset ...)
    y = f32[16,4] custom-call(custom-call(l){Sharding manual}), custom_call_target="SPMDShardToFullShape", sharding=S
      -> every device's l all-gathered, one holder's tile per tile of S, placed as S places it

A partially manual region (manual over some mesh axes, still partitioned over the others) is
run the same way, its inside whole along the other axes: a device holds its manual group's part
(what the manual axes cut), computed whole, the same on every device of the group.  Which part
that is follows from the region's edge shardings: the outside sharding S tiles a dim over both
kinds of axes, the inside one R over the partitioned axes only, so the manual axes cut that dim
S/R ways, and a device's place among them is read from S beside R.

A whole value (`{replicated}` outside, as JAX writes a `P()` operand or result) enters as itself
and leaves as any device's value.  Shardy's form (`xla.sdy.GlobalToLocalShape`, the body a call,
shardings in frontend attributes) is read as this GSPMD form first (parse/shardy_import.py).

The result is a per-device program whose every device ends with the same global values; device
0's are the answer.  Modules this does not express are declined (None): regions whose edges
are tuples, edge shardings whose manual part cannot be read
(a dim cut by the manual axes in an order neither major nor minor to the others), and device
ids (`partition-id`) beside partially manual regions.
"""

from __future__ import annotations

import math

import numpy as np

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.attributes import PaddingConfig
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.parse.shardy_import import import_shardy

_ENTER, _LEAVE = "SPMDFullToShardShape", "SPMDShardToFullShape"
_SHARDY_EDGES = ("xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape")


def direct_program(module: Module, num_devices: int) -> Module | None:
    """The per-device program described in the module docstring, or None when `module` holds
    what it does not express.  `module` is not changed."""
    program = module.clone()
    import_shardy(program)  # Shardy's region edges and shardings as the GSPMD form below
    edges = [i for i in program.all_instructions()
             if i.opcode is Opcode.CUSTOM_CALL and i.custom_call_target in (_ENTER, _LEAVE, *_SHARDY_EDGES)]
    if not edges or any(e.custom_call_target in _SHARDY_EDGES for e in edges):
        return None
    partial = any(e.has_attr("sharding") and e.sharding.kind is ShardingKind.TILED for e in edges
                  if e.custom_call_target == _ENTER)
    if partial and any(i.opcode in (Opcode.PARTITION_ID, Opcode.REPLICA_ID) for i in program.all_instructions()):
        return None  # a device id inside a partially manual region means what XLA's partitioner makes of it
    for edge in edges:
        made = _enter(edge, num_devices) if edge.custom_call_target == _ENTER else _leave(edge, num_devices)
        if made is None:
            return None
        edge.parent.replace(edge, made)
    for comp in program.computations:
        for instr in comp.post_order():
            if instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target == "Sharding":
                comp.replace(instr, instr.operands[0])
            else:
                instr.remove_attr("sharding")
    for key in ("allow_spmd_sharding_propagation_to_parameters", "allow_spmd_sharding_propagation_to_output"):
        program.attributes.pop(key, None)
    program.num_partitions = num_devices
    return program


def _tiles(s: Sharding | None, n: int, rank: int) -> Sharding | None:
    """`s` when it tiles a rank-`rank` array over all `n` devices (replicas allowed, nothing
    manual); `{replicated}` (Shardy writes it where a shard_map's operand or result is
    whole on every device) as the one tile held by all `n`."""
    if s is not None and s.kind is ShardingKind.REPLICATED:
        return Sharding.tiled(np.arange(n).reshape((1,) * rank + (n,)), (SubgroupKind.REPLICATED,))
    if s is None or s.kind is not ShardingKind.TILED or s.num_devices != n:
        return None
    return s if all(k is SubgroupKind.REPLICATED for k in s.subgroups) else None


def _manual_parts(outside: Sharding, inside: Sharding, rank: int, n: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
    """How the manual axes cut a region's value: per dim the number of parts, and per device
    the part it holds; None when that cannot be read from the edge shardings (module
    docstring).  `outside` tiles the global value; `inside` is the region's sharding, `{manual}`
    or partially manual (tiled over the other axes, with a manual subgroup)."""
    if inside.kind is ShardingKind.MANUAL:
        return tuple(outside.data_tile_dims), [tuple(outside.tile_index(d)) for d in range(n)]
    if inside.kind is not ShardingKind.TILED or SubgroupKind.MANUAL not in inside.subgroups or inside.data_rank != rank:
        return None
    auto = inside.data_tile_dims
    if any(o % a for o, a in zip(outside.data_tile_dims, auto)):
        return None
    cuts = tuple(o // a for o, a in zip(outside.data_tile_dims, auto))
    if all(c == 1 for c in cuts):  # the manual axes cut nothing: every group holds the whole value
        return cuts, [(0,) * rank for _ in range(n)]
    # the manual group of each device: its place along the inside sharding's manual subgroup axis
    axis = inside.data_rank + inside.subgroups.index(SubgroupKind.MANUAL)
    where = {int(dev): pos for pos, dev in np.ndenumerate(inside.tile_assignment)}
    if len(where) != n:
        return None
    group = [where[d][axis] for d in range(n)]
    for minor in (True, False):  # the manual axes minor (then major) to the others within a dim
        parts = []
        for d in range(n):
            s_index = outside.tile_index(d)
            parts.append(tuple(i % c if minor else i // a for i, c, a in zip(s_index, cuts, auto)))
        same_group = {(group[x] == group[y], parts[x] == parts[y]) for x in range(n) for y in range(n)}
        if same_group <= {(True, True), (False, False)}:
            return cuts, parts
    return None


def _enter(edge: Instruction, n: int) -> Instruction | None:
    """This device's part of the global value, where a region starts."""
    annotated = edge.operands[0]
    if not (annotated.opcode is Opcode.CUSTOM_CALL and annotated.custom_call_target == "Sharding"):
        return None
    inside = edge.sharding if edge.has_attr("sharding") else None
    if inside is None or not isinstance(edge.shape, ArrayShape) or not isinstance(annotated.shape, ArrayShape):
        return None
    s = _tiles(annotated.sharding if annotated.has_attr("sharding") else None, n, annotated.shape.rank)
    if s is None:
        return None
    x = annotated.operands[0]
    dims, local = x.array_shape.dims, edge.array_shape.dims
    found = _manual_parts(s, inside, len(dims), n)
    if found is None:
        return None
    cuts, parts = found
    if tuple(-(-d // c) for d, c in zip(dims, cuts)) != tuple(local):
        return None
    b = Builder(edge.parent, before=edge)
    padded = tuple(c * size for c, size in zip(cuts, local))
    if padded != tuple(dims):  # uneven parts: XLA pads the last ones
        zero = b.constant(0, x.array_shape.element_type)
        x = b.pad(x, zero, PaddingConfig(tuple((0, p - d, 0) for p, d in zip(padded, dims))))
    device = b.partition_id()
    offsets = []
    for axis in range(len(dims)):
        table = b.constant_array([parts[d][axis] * local[axis] for d in range(n)])
        picked = b.dynamic_slice(table, [device], [1])
        offsets.append(b.reshape(picked, ArrayShape(PrimitiveType.S32, ())))
    return b.dynamic_slice(x, offsets, local)


def _leave(edge: Instruction, n: int) -> Instruction | None:
    """The global value rebuilt from every device's part, where a region ends."""
    annotated = edge.operands[0]
    inside = annotated.sharding if annotated.has_attr("sharding") else None
    if inside is None or not isinstance(edge.shape, ArrayShape) or not isinstance(annotated.shape, ArrayShape):
        return None
    s = _tiles(edge.sharding if edge.has_attr("sharding") else None, n, edge.shape.rank)
    if s is None:
        return None
    local = annotated.array_shape.dims
    dims = edge.array_shape.dims
    found = _manual_parts(s, inside, len(dims), n)
    if found is None:
        return None
    grid, parts = found
    if tuple(-(-d // c) for d, c in zip(dims, grid)) != tuple(local):
        return None
    b = Builder(edge.parent, before=edge)
    etype = annotated.array_shape.element_type
    one = b.reshape(annotated, ArrayShape(etype, (1, *local)))
    gathered = b.all_gather(one, 0, ReplicaGroups.explicit([range(n)]), channel_id=edge.parent.module.new_channel_id(),
                            use_global_device_ids=True)
    holder: dict[tuple[int, ...], int] = {}
    for d in range(n):
        holder.setdefault(parts[d], d)
    pieces = []
    for index in np.ndindex(*grid) if grid else [()]:
        d = holder[tuple(int(i) for i in index)]
        pieces.append(b.slice(gathered, [d] + [0] * len(local), [d + 1] + list(local)))
    stacked = b.concatenate(pieces, 0) if len(pieces) > 1 else pieces[0]
    rank = len(local)
    x = b.reshape(stacked, ArrayShape(etype, (*grid, *local)))
    x = b.transpose(x, [k for axis in range(rank) for k in (axis, rank + axis)])
    x = b.reshape(x, ArrayShape(etype, tuple(t * size for t, size in zip(grid, local))))
    if tuple(x.array_shape.dims) != tuple(dims):
        x = b.slice(x, [0] * rank, list(dims))
    assert math.prod(x.array_shape.dims) == math.prod(dims)
    return x


def run_direct(module: Module, inputs: list[np.ndarray], num_devices: int,
               platform: str | None = None) -> list[np.ndarray] | None:
    """`module`'s outputs (one per leaf) computed by `direct_program` on `num_devices` devices,
    every device given every global input; None when the module is declined or the devices end
    with different values (then this is no oracle)."""
    from hlo_passes.runtime.partitioned import run_per_device_program  # (it imports the backend)

    program = direct_program(module, num_devices)
    if program is None:
        return None
    run = run_per_device_program(program, [[x] * num_devices for x in inputs], num_devices, platform)
    first = run.outputs[0]
    for other in run.outputs[1:]:
        if any(a.shape != b.shape or not np.array_equal(a, b, equal_nan=True) for a, b in zip(first, other)):
            return None
    return list(first)
