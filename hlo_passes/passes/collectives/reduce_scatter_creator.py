"""reduce-scatter-creator: an all-reduce whose only use keeps this device's shard becomes a
reduce-scatter (XLA's ReduceScatterCreator, with MatchReduceScatter's rules).

    ar = f32[16,4] all-reduce(x), replica_groups={{0,1,2,3}}, to_apply=add
    off = s32[] multiply(convert(replica-id()), constant(4))       (or a table lookup)
    ROOT ds = f32[4,4] dynamic-slice(ar, off, constant(0)), dynamic_slice_sizes={4,4}
  becomes
    ROOT ds = f32[4,4] reduce-scatter(x), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add

What must hold (XLA's rules):

* the all-reduce is array-shaped, not layout-constrained, has at least one dimension larger
  than 1, uniform replica groups, and exactly one user: a dynamic-slice of it, or a reshape
  (with one user, a dynamic-slice of it) that leaves the sliced dimension unmodified (same
  size, same number of elements before it);
* the slice cuts exactly one dimension, and `size // slice size` is the group size: a slice
  of 3 of 7 over 2 devices is a split of the first 6 (the reduce-scatter reduces a slice of
  the input);
* the groups, by mode: no channel: groups of replicas (`{}`: all replicas of the module);
  channel + `use_global_device_ids`: groups of global device ids; channel alone
  (cross-replica-and-partition): one group per replica, each `{r}`, across all partitions
  (XLA's only supported case; `{}` is declined); a channel in a module of one partition is
  declined;
* on every device of every group, the slice's start on the split dimension is exactly
  `position in the group * slice size`.

Rather than matching how the offset is spelled, the pass evaluates it (device_values.py) on
every device, with replica-id and partition-id bound to the device's ids: arithmetic on the
ids, constant tables indexed by them (through reshapes, converts, clamps) all reduce to
numbers.  The start must be exact before the dynamic-slice clamps it: a table whose last
entry is out of range and only clamped into place is declined, as XLA declines it.  Offsets
of the dimensions that are not cut are not evaluated (the slice keeps them whole).

The reduce-scatter gets a new channel id when the all-reduce had one, and keeps the groups
as written; a reshape between them is redone on the reduce-scatter's result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes.ir.builder import Builder, next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.collective_groups import group_mode, participant_groups
from hlo_passes.passes.collectives.common import (callers_of, erase_if_dead, replica_groups, shape_free,
                                                  unique_caller)
from hlo_passes.passes.collectives.device_values import DeviceEvaluator, NotDeviceConstant
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass


@dataclass(frozen=True)
class ScatterMatch:
    """A matched all-reduce: its dynamic-slice (and the reshape before it), the dimension of
    the all-reduce's shape that is scattered, the shard size and the group size."""

    dynamic_slice: Instruction
    reshape: Instruction | None
    dimension: int
    shard: int
    group_size: int


def unmodified_dimension(before: tuple[int, ...], after: tuple[int, ...], dim: int) -> int | None:
    """The dimension of `before` that a reshape to `after` leaves as dimension `dim` (same
    size, same number of elements before it), or None when the reshape changes it."""
    prefix = math.prod(after[:dim])
    for d, size in enumerate(before):
        if size == after[dim] and math.prod(before[:d]) == prefix:
            return d
    return None


@register_pass
class ReduceScatterCreator(ModulePass):
    name = "reduce-scatter-creator"
    summary = "Turn all-reduce + dynamic-slice of this device's shard into a reduce-scatter"

    def run(self, module: Module) -> bool:
        changed = False
        channel = next_channel_id(module)
        callers = callers_of(module)
        for comp in list(module.computations):
            if unique_caller(comp, callers, Opcode.FUSION) is not None:
                continue
            for instr in comp.post_order():
                if instr.opcode is not Opcode.ALL_REDUCE or instr.parent is not comp:
                    continue
                found = self.match(module, instr)
                if found is None:
                    continue
                if instr.channel_id is not None:
                    self._rewrite(comp, instr, found, channel)
                    channel += 1
                else:
                    self._rewrite(comp, instr, found, None)
                changed = True
        return changed

    # ------------------------------------------------------------- matching --
    def match(self, module: Module, ar: Instruction) -> ScatterMatch | None:
        if not ar.shape.is_array or len(ar.operands) != 1 or ar.constrain_layout:
            return None
        if len(ar.users) != 1 or ar.is_root:
            return None
        (user,), reshape = ar.users, None
        if user.opcode is Opcode.RESHAPE:
            if len(user.users) != 1 or user.is_root:
                return None
            reshape, (user,) = user, user.users
        if user.opcode is not Opcode.DYNAMIC_SLICE or user.operands[0] is not (reshape or ar):
            return None
        ds = user
        if all(d == 1 for d in ar.shape.dims):
            return None
        mode = group_mode(ar)
        if mode.has_channel and module.num_partitions <= 1:
            self.remark(ar, "has a channel but the module has one partition (XLA declines it)", "missed")
            return None
        groups = replica_groups(ar).groups
        if len({len(g) for g in groups}) > 1:
            self.remark(ar, "replica groups of different sizes", "missed")
            return None
        if not mode.has_channel:
            n = len(groups[0]) if groups else module.replica_count
        elif mode.use_global_device_ids:
            if not groups:
                return None
            n = len(groups[0])
        else:
            if len(groups) != module.replica_count or any(len(g) != 1 for g in groups):
                self.remark(ar, "cross-replica-and-partition groups other than one {r} per replica "
                                "(XLA declines them)", "missed")
                return None
            n = module.num_partitions
        if n < 2:
            return None
        full, sizes = ds.operands[0].shape.dims, ds.dynamic_slice_sizes
        cut = [d for d, (f, s) in enumerate(zip(full, sizes)) if f != s]
        if len(cut) != 1:
            self.remark(ds, f"slices {len(cut)} dimensions of {ar.name}, not one", "missed")
            return None
        d = cut[0]
        if sizes[d] == 0 or full[d] // sizes[d] != n:
            self.remark(ds, f"dimension {d}: {sizes[d]} of {full[d]} is not one of {n} shards", "missed")
            return None
        reason = self._check_offsets(module, ar, ds.operands[1 + d], sizes[d])
        if reason:
            self.remark(ds, f"not this device's shard of {ar.name}: {reason}", "missed")
            return None
        dim = d
        if reshape is not None:
            dim = unmodified_dimension(ar.shape.dims, reshape.shape.dims, d)
            if dim is None:
                self.remark(reshape, f"reshape of {ar.name} changes the sliced dimension {d}", "missed")
                return None
        return ScatterMatch(ds, reshape, dim, sizes[d], n)

    @staticmethod
    def _check_offsets(module: Module, ar: Instruction, offset: Instruction, shard: int) -> str:
        partitions = module.num_partitions
        for group in participant_groups(ar, module):
            for position, device in enumerate(group):
                evaluate = DeviceEvaluator(device // partitions, device % partitions)
                try:
                    start = int(evaluate(offset))
                except NotDeviceConstant as e:
                    return f"offset {offset.name} is not a function of the device ids ({e})"
                if start != position * shard:
                    return (f"on device {device} (position {position} in its group) the offset is {start}, "
                            f"expected {position * shard}")
        return ""

    # ------------------------------------------------------------ rewriting --
    def _rewrite(self, comp: Computation, ar: Instruction, found: ScatterMatch, channel: int | None) -> None:
        ds = found.dynamic_slice
        b = Builder(comp, before=ds, metadata=ar.attributes.get("metadata"))
        source = ar.operands[0]
        dims = list(ar.shape.dims)
        used = found.shard * found.group_size
        if used != dims[found.dimension]:  # a non-uniform split reduces the leading shards only
            limits = list(dims)
            limits[found.dimension] = used
            source = b.slice(source, [0] * len(dims), limits)
        dims[found.dimension] = found.shard
        mode = group_mode(ar)
        rs = b.op(Opcode.REDUCE_SCATTER, ar.shape.with_dims(dims), [source], channel_id=channel,
                  replica_groups=replica_groups(ar), dimensions=(found.dimension,),
                  use_global_device_ids=True if mode.use_global_device_ids else None,
                  called={"to_apply": ar.called["to_apply"]})
        rs.sharding = shape_free(ar.sharding)
        for pred in ar.control_predecessors:
            rs.add_control_predecessor(pred)
        result = rs if found.reshape is None else b.reshape(rs, ds.shape)
        offsets = ds.operands[1:]
        comp.replace(ds, result)
        for off in offsets:
            erase_if_dead(off)
        if found.reshape is not None:
            comp.replace(found.reshape, rs)  # moves its control successors; it has no users left
        ar.move_control_successors_to(rs)
        comp.remove(ar)
        self.remark(rs, f"all-reduce {ar.name} + dynamic-slice became a reduce-scatter over dimension "
                        f"{found.dimension}", "applied")
