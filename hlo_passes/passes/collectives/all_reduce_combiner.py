"""all-reduce-combiner: merge independent all-reduces into one variadic all-reduce.

Many small all-reduces (one per gradient, as data-parallel and partitioned programs emit them)
cost one launch and one latency each; a single variadic all-reduce moves the same bytes once.

    a = f32[128] all-reduce(x), replica_groups={{0,1,2,3}}, to_apply=add
    b = f32[64,2] all-reduce(y), replica_groups={{0,1,2,3}}, to_apply=add
  becomes
    ab = (f32[128], f32[64,2]) all-reduce(x, y), replica_groups={{0,1,2,3}}, to_apply=add
    a = f32[128] get-tuple-element(ab), index=0
    b = f32[64,2] get-tuple-element(ab), index=1

Members must agree on what they compute and with whom: the reduction (compared by meaning, the
root opcode and type of `to_apply`, not by computation name), the element type, the replica
groups, whether they carry a channel and `use_global_device_ids`.  No member may depend on
another (checked on a reachability index, control edges included); the merged all-reduce takes
every member's control predecessors and successors and, when the members had channels, a new
unique channel id.  Layout-constrained all-reduces are left alone.  Element types are never
mixed: the reduction computation is typed, and XLA's StableHLO import rejects a mixed tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder, next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.collectives.common import (CombinerPass, combinable_sharding, group_mode, reduction_of,
                                                  replace_members, replica_groups)
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass

DEFAULT_THRESHOLD_BYTES = 30 * 1024 * 1024
DEFAULT_THRESHOLD_COUNT = 256


@register_pass
class AllReduceCombiner(CombinerPass):
    name = "all-reduce-combiner"
    summary = "Merge independent all-reduces with the same groups and reduction into one variadic all-reduce"

    @dataclass(frozen=True)
    class Options:
        threshold_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most all-reduces merged into one")

    def combine_key(self, instr: Instruction):
        if instr.opcode is not Opcode.ALL_REDUCE:
            return None
        reduction = reduction_of(instr)
        if reduction is None:
            self.remark(instr, "to_apply is not a plain binary reduction; not combined", "missed")
            return None
        if instr.attr("constrain_layout", False) or not combinable_sharding(instr):
            return None
        types = {leaf.element_type for leaf in instr.shape.leaves()}
        if types != {reduction.element_type}:
            return None
        if instr.shape.is_tuple and any(u.opcode is not Opcode.GET_TUPLE_ELEMENT for u in instr.users):
            return None
        return (reduction, replica_groups(instr), group_mode(instr), instr.sharding is not None)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]):
        first = members[0]
        operands = [op for m in members for op in m.operands]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        mode = group_mode(first)
        combined = b.all_reduce(operands, replica_groups(first), first.called["to_apply"],
                                channel_id=next_channel_id(module) if mode.has_channel else None,
                                use_global_device_ids=True if mode.use_global_device_ids else None)
        if len(operands) == 1:  # cannot happen with two members, kept for clarity
            raise AssertionError("a combined all-reduce has at least two operands")
        manual = first.sharding is not None
        if manual:
            combined.sharding = Sharding.tuple_of(Sharding.manual() for _ in operands)
        results, added, k = [], [], 0
        for m in members:
            values = []
            for _ in m.operands:
                gte = b.get_tuple_element(combined, k)
                if manual:
                    gte.sharding = Sharding.manual()
                values.append(gte)
                k += 1
            results.append(values)
            added.extend(values)
        self.remark(combined, f"combined {len(members)} all-reduces: " + ", ".join(m.name for m in members),
                    "applied")
        added += replace_members(comp, members, combined, results)
        return combined, added
