"""all-reduce-combiner: merge independent all-reduces into one variadic all-reduce (XLA's
AllReduceCombiner).

Many small all-reduces (one per gradient, as data-parallel and partitioned programs emit them)
cost one launch and one latency each; a single variadic all-reduce moves the same bytes once.

    a = f32[128] all-reduce(x), replica_groups={{0,1,2,3}}, to_apply=add
    b = f32[64,2] all-reduce(y), replica_groups={{0,1,2,3}}, to_apply=add
  becomes
    ab = (f32[128], f32[64,2]) all-reduce(x, y), replica_groups={{0,1,2,3}}, to_apply=add
    a = f32[128] get-tuple-element(ab), index=0
    b = f32[64,2] get-tuple-element(ab), index=1

The key, as XLA's GetAllReduceKey: the reduction (the root opcode and element type of
`to_apply`, so two computations that both add f32 match), the sharding domain's metadata
(domains.py), whether there is a channel, `use_global_device_ids`, and the replica groups as
written (`{}` and `{{0,1,2,3}}` differ).  Only single-operand, array-shaped all-reduces are
merged; grouping, thresholds and dependence (operands, control edges, shared channel ids) are
common.py's `combine_by_key`.  The merged all-reduce keeps the first member's channel id and
every member's control edges, and takes a tuple of the members' shardings in a partitioned
module (common.tuple_sharding says why not in a replica program).  A module holding a
layout-constrained all-reduce is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.collective_groups import group_mode
from hlo_passes.passes.collectives.common import (CombinerPass, combinable_reduction, replace_members,
                                                  replica_groups, tuple_sharding)
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass

DEFAULT_THRESHOLD_BYTES = 30 * 1024 * 1024
DEFAULT_THRESHOLD_COUNT = 256


@register_pass
class AllReduceCombiner(CombinerPass):
    name = "all-reduce-combiner"
    summary = "Merge independent all-reduces with the same groups and reduction into one variadic all-reduce"
    opcode = Opcode.ALL_REDUCE

    @dataclass(frozen=True)
    class Options:
        combine_threshold_in_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        combine_threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most all-reduces merged into one")

    def combine_key(self, instr: Instruction, domain: int):
        reduction = combinable_reduction(instr)
        if reduction is None:
            self.remark(instr, "to_apply is not two parameters and one binary reduction; not combined", "missed")
            return None
        mode = group_mode(instr)
        return (reduction.opcode, reduction.element_type, domain, mode.has_channel, mode.use_global_device_ids,
                replica_groups(instr).groups)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]) -> Instruction:
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        mode = group_mode(first)
        combined = b.all_reduce([m.operands[0] for m in members], replica_groups(first), first.called["to_apply"],
                                channel_id=first.channel_id,
                                use_global_device_ids=True if mode.use_global_device_ids else None)
        combined.sharding = tuple_sharding(module, members)
        values = []
        for k, m in enumerate(members):
            gte = b.get_tuple_element(combined, k)
            gte.sharding = m.sharding
            values.append(gte)
        self.remark(combined, f"combined {len(members)} all-reduces: " + ", ".join(m.name for m in members),
                    "applied")
        replace_members(comp, members, combined, values)
        return combined
