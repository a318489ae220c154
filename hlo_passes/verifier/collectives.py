"""Collectives: replica groups well formed, and shapes that depend on the group size.

Follows XLA's verifier (hlo_verifier.cc, CheckReplicaGroups and the collective
handlers): every id appears at most once and ids are 0..n-1 with n the
participants of the group mode; groups are of equal size except for all-reduce;
all-gather multiplies and reduce-scatter divides the named dimension by the
group size.

    ag = f32[6,3] all-gather(f32[2,3] p), replica_groups={{0,1},{2,3}}, dimensions={0}
    # -> "all-gather over groups of 2 makes dimension 0 of size 4, got f32[6,3]"
"""

from __future__ import annotations

import enum
from typing import Callable

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.verifier.shape_rules import ShapeProblem, check_reducer, text


class GroupMode(enum.Enum):
    CROSS_REPLICA = "cross-replica"
    CROSS_PARTITION = "cross-partition"
    CROSS_REPLICA_AND_PARTITION = "cross-replica-and-partition"
    FLATTENED_ID = "flattened-id"


def group_mode(instr: Instruction) -> GroupMode:
    has_channel = instr.channel_id is not None
    if instr.opcode in (Opcode.ALL_TO_ALL, Opcode.RAGGED_ALL_TO_ALL, Opcode.COLLECTIVE_PERMUTE):
        return GroupMode.CROSS_PARTITION if has_channel else GroupMode.CROSS_REPLICA
    global_ids = instr.use_global_device_ids
    if not has_channel:
        if global_ids:
            raise ShapeProblem("use_global_device_ids=true needs a channel_id")
        return GroupMode.CROSS_REPLICA
    return GroupMode.FLATTENED_ID if global_ids else GroupMode.CROSS_REPLICA_AND_PARTITION


def _config(instr: Instruction) -> tuple[int, int]:
    module = instr.parent.module if instr.parent is not None else None
    if module is None:
        return 1, 1
    return module.replica_count or 1, module.num_partitions or 1


def check_replica_groups(instr: Instruction, *, uniform: bool = True) -> GroupMode:
    mode = group_mode(instr)
    groups = instr.attr("replica_groups")
    if groups is None or groups.is_empty:
        if mode is GroupMode.FLATTENED_ID:
            raise ShapeProblem("replica groups must be given with use_global_device_ids=true")
        return mode
    seen: set[int] = set()
    for g in groups.groups:
        if not g:
            raise ShapeProblem("a replica group is empty")
        for device in g:
            if device in seen:
                raise ShapeProblem(f"replica {device} appears in more than one replica group "
                                   f"({groups.to_hlo()})")
            seen.add(device)
    missing = next((i for i in range(len(seen)) if i not in seen), None)
    if missing is not None:
        raise ShapeProblem(f"replica {missing} is not named in replica_groups={groups.to_hlo()}")
    replicas, partitions = _config(instr)
    expected = {GroupMode.CROSS_REPLICA: replicas, GroupMode.CROSS_REPLICA_AND_PARTITION: replicas,
                GroupMode.CROSS_PARTITION: partitions, GroupMode.FLATTENED_ID: replicas * partitions}[mode]
    if expected != 1 and len(seen) != expected:
        raise ShapeProblem(f"in {mode.value} mode the replica groups must name {expected} ids, "
                           f"they name {len(seen)}")
    if uniform and groups.group_size is None:
        raise ShapeProblem(f"replica groups must all have the same size ({groups.to_hlo()})")
    return mode


def subgroup_size(instr: Instruction, mode: GroupMode) -> int:
    groups = instr.attr("replica_groups")
    first = len(groups.groups[0]) if groups is not None and not groups.is_empty else None
    replicas, partitions = _config(instr)
    if mode is GroupMode.CROSS_PARTITION:
        return first or partitions
    if mode is GroupMode.FLATTENED_ID:
        return first or 1
    size = first or replicas
    return size * partitions if mode is GroupMode.CROSS_REPLICA_AND_PARTITION else size


def _pairs(instr: Instruction, shapes_in, shapes_out):
    if len(shapes_in) == 1:
        return [(shapes_in[0], shapes_out)]
    if type(shapes_out) is not TupleShape or len(shapes_out.elements) != len(shapes_in):
        raise ShapeProblem(f"{len(shapes_in)} operands need a tuple of {len(shapes_in)} results, "
                           f"got {text(shapes_out)}")
    return list(zip(shapes_in, shapes_out.elements))


def _scaled(instr: Instruction, dim_key: str, gather: bool) -> Shape | None:
    mode = check_replica_groups(instr)
    dims = instr.attr(dim_key, ())
    if len(dims) != 1:
        raise ShapeProblem(f"needs {dim_key}={{d}} naming one dimension")
    d = dims[0]
    operands = [o.shape for o in instr.operands]
    pairs = _pairs(instr, operands, instr.shape)
    for x, y in pairs:
        if type(x) is not ArrayShape or type(y) is not ArrayShape:
            raise ShapeProblem("operands and results must be arrays")
        if not (0 <= d < x.rank and d < y.rank):
            raise ShapeProblem(f"dimension {d} is out of range for {text(x)}")
    x0, y0 = pairs[0]
    big, small = (y0, x0) if gather else (x0, y0)
    shard_count = -(-big.dims[d] // small.dims[d]) if small.dims[d] else 0
    size = subgroup_size(instr, mode)
    verb = "multiplies" if gather else "divides"
    if size != 1 and shard_count != size:
        raise ShapeProblem(f"{instr.opcode.value} over groups of {size} {verb} dimension {d} by {size}: "
                           f"{text(x0)} -> {text(y0)} is a factor of {shard_count}")
    results = []
    for x, _ in pairs:
        new = list(x.dims)
        if gather:
            new[d] = x.dims[d] * shard_count
        else:
            if shard_count and x.dims[d] % shard_count:
                raise ShapeProblem(f"dimension {d} of {text(x)} does not divide into {shard_count} shards")
            new[d] = x.dims[d] // shard_count if shard_count else 0
        results.append(x.with_dims(new))
    return results[0] if len(results) == 1 else TupleShape(tuple(results))


def _all_gather(instr: Instruction) -> Shape | None:
    return _scaled(instr, "dimensions", gather=True)


def _element_types(instr: Instruction) -> list:
    return [o.shape.element_type for o in instr.operands if type(o.shape) is ArrayShape]


def _reduce_scatter(instr: Instruction) -> Shape | None:
    result = _scaled(instr, "dimensions", gather=False)
    for t in _element_types(instr):  # each operand is reduced on its own: one scalar pair
        check_reducer(instr, "to_apply", [t])
    return result


def _all_reduce(instr: Instruction) -> Shape | None:
    check_replica_groups(instr, uniform=False)
    channel = instr.channel_id
    if channel is not None and channel <= 0:
        raise ShapeProblem(f"channel_id must be positive, got {channel}")
    for t in _element_types(instr):
        check_reducer(instr, "to_apply", [t])
    shapes = tuple(o.shape for o in instr.operands)
    return shapes[0] if len(shapes) == 1 else TupleShape(shapes)


def _all_to_all(instr: Instruction) -> Shape | None:
    mode = check_replica_groups(instr)
    split_count = subgroup_size(instr, mode)
    split = instr.dimensions
    if split:
        if len(instr.operands) != 1:
            raise ShapeProblem("an all-to-all with dimensions= takes one operand")
        x = instr.operands[0].shape
        if type(x) is not ArrayShape or not 0 <= split[0] < x.rank:
            raise ShapeProblem(f"split dimension {split[0]} is out of range for {text(x)}")
        if split_count and x.dims[split[0]] % split_count:
            raise ShapeProblem(f"dimension {split[0]} of {text(x)} does not split into {split_count}")
        return x
    if split_count != 1 and len(instr.operands) != split_count:
        raise ShapeProblem(f"a tuple all-to-all over groups of {split_count} takes {split_count} operands, "
                           f"has {len(instr.operands)}")
    return TupleShape(tuple(o.shape for o in instr.operands))


def _collective_permute(instr: Instruction) -> Shape | None:
    pairs = instr.source_target_pairs
    replicas, partitions = _config(instr)
    limit = partitions if group_mode(instr) is GroupMode.CROSS_PARTITION else replicas
    # A count of 1 is also what a module without the header attribute reads as (JAX's
    # lowered text leaves the counts to the compile options): only larger counts are checked.
    for pair in pairs if limit > 1 else ():
        for role, device in zip(("source", "target"), pair):
            if not 0 <= device < limit:
                what = "partitions" if limit == partitions and instr.channel_id is not None else "replicas"
                raise ShapeProblem(f"{role} {device} in source_target_pairs is out of range for {limit} {what}")
    if len(instr.operands) == 1:
        sources, targets = set(), set()
        for s, t in pairs:
            if s in sources:
                raise ShapeProblem(f"source {s} appears twice in source_target_pairs")
            if t in targets:
                raise ShapeProblem(f"target {t} appears twice in source_target_pairs")
            sources.add(s)
            targets.add(t)
        return instr.operands[0].shape
    return None


COLLECTIVE_RULES: dict[Opcode, Callable[[Instruction], Shape | None]] = {
    Opcode.ALL_GATHER: _all_gather,
    Opcode.REDUCE_SCATTER: _reduce_scatter,
    Opcode.ALL_REDUCE: _all_reduce,
    Opcode.ALL_TO_ALL: _all_to_all,
    Opcode.COLLECTIVE_PERMUTE: _collective_permute,
}
