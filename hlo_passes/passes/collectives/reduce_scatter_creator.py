"""reduce-scatter-creator: an all-reduce whose every use keeps only this device's shard
becomes a reduce-scatter.

    ar = f32[16,4] all-reduce(x), replica_groups={{0,1,2,3}}, to_apply=add
    off = s32[] multiply(convert(replica-id()), constant(4))       (or a table lookup)
    ROOT ds = f32[4,4] dynamic-slice(ar, off, constant(0)), dynamic_slice_sizes={4,4}
  becomes
    ROOT ds = f32[4,4] reduce-scatter(x), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add

Every user must be a dynamic-slice that cuts one dimension into group-size equal pieces and
keeps the rest whole.  Rather than matching how the offset is spelled, the pass evaluates it
(device_values.py) on every device: with replica-id and partition-id bound to the device's
ids, the clamped start must be `position in its group * shard size` (and 0 elsewhere).  That
covers arithmetic on the ids, constant tables indexed by them, and both the replica form
(no channel, groups of replica ids) and the partition form (channel + use_global_device_ids,
groups of global ids).  Otherwise the pass declines with a remark saying which device
disagrees.  Cross-replica-and-partition all-reduces over several partitions are declined.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.collectives.common import (erase_if_dead, group_mode, participant_groups,
                                                   reduction_of, replica_groups)
from hlo_passes.passes.collectives.device_values import DeviceEvaluator, NotDeviceConstant, clamp_start
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass


@dataclass(frozen=True)
class _Shard:
    dimension: int
    size: int


@register_pass
class ReduceScatterCreator(ModulePass):
    name = "reduce-scatter-creator"
    summary = "Turn all-reduce + dynamic-slice of this device's shard into a reduce-scatter"

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            for instr in comp.post_order():
                if instr.opcode is Opcode.ALL_REDUCE and instr.parent is comp:
                    changed |= self._try(module, comp, instr)
        return changed

    def _try(self, module: Module, comp: Computation, ar: Instruction) -> bool:
        if not ar.shape.is_array or len(ar.operands) != 1 or not ar.users or ar.is_root:
            return False
        if any(u.opcode is not Opcode.DYNAMIC_SLICE or u.operands[0] is not ar for u in ar.users):
            return False
        if reduction_of(ar) is None or ar.attr("constrain_layout", False) or ar.sharding is not None:
            return False
        mode = group_mode(ar)
        if mode.name == "cross-replica-and-partition" and module.num_partitions > 1:
            self.remark(ar, "cross-replica-and-partition groups are not rewritten", "missed")
            return False
        groups = participant_groups(ar, module)
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            self.remark(ar, "replica groups of different sizes", "missed")
            return False
        n = sizes.pop()
        shards = set()
        for ds in ar.users:
            shard = self._shard_of(ds, n)
            if shard is None:
                return False
            reason = self._check_offsets(module, ds, shard, groups)
            if reason:
                self.remark(ds, f"not this device's shard of {ar.name}: {reason}", "missed")
                return False
            shards.add(shard)
        if len(shards) != 1:
            self.remark(ar, "users slice different dimensions", "missed")
            return False
        shard = shards.pop()
        users = list(ar.users)
        b = Builder(comp, before=users[0], metadata=ar.attributes.get("metadata"))
        rs = b.reduce_scatter(ar.operands[0], shard.dimension, replica_groups(ar), ar.called["to_apply"],
                              channel_id=ar.attr("channel_id"),
                              use_global_device_ids=True if mode.use_global_device_ids else None)
        rs.shape = users[0].shape
        for pred in ar.control_predecessors:
            rs.add_control_predecessor(pred)
        for ds in users:
            offsets = ds.operands[1:]
            comp.replace(ds, rs)
            for off in offsets:
                erase_if_dead(off)
        for succ in list(ar.control_successors):
            succ.control_predecessors.remove(ar)
            ar.control_successors.remove(succ)
            succ.add_control_predecessor(rs)
        comp.remove(ar)
        self.remark(rs, f"all-reduce {ar.name} + dynamic-slice became a reduce-scatter over dimension "
                        f"{shard.dimension}", "applied")
        return True

    def _shard_of(self, ds: Instruction, n: int) -> _Shard | None:
        full = ds.operands[0].shape.dims
        sizes = ds.attr("dynamic_slice_sizes")
        cut = [d for d, (f, s) in enumerate(zip(full, sizes)) if f != s]
        if len(cut) != 1:
            self.remark(ds, "slices more or less than one dimension", "missed")
            return None
        d = cut[0]
        if full[d] % n or sizes[d] != full[d] // n:
            self.remark(ds, f"dimension {d}: {sizes[d]} of {full[d]} is not a 1/{n} shard", "missed")
            return None
        return _Shard(d, sizes[d])

    def _check_offsets(self, module: Module, ds: Instruction, shard: _Shard, groups) -> str:
        full = ds.operands[0].shape.dims
        sizes = ds.attr("dynamic_slice_sizes")
        partitions = module.num_partitions
        for group in groups:
            for position, device in enumerate(group):
                evaluate = DeviceEvaluator(device // partitions, device % partitions)
                for dim, off in enumerate(ds.operands[1:]):
                    try:
                        start = clamp_start(int(evaluate(off)), full[dim], sizes[dim])
                    except NotDeviceConstant as e:
                        return f"offset {off.name} is not a function of the device ids ({e})"
                    want = position * shard.size if dim == shard.dimension else 0
                    if start != want:
                        return (f"on device {device} (position {position} in its group) dimension {dim} "
                                f"starts at {start}, expected {want}")
        return ""
