"""collective-permute-combiner: merge independent collective-permutes with the same
source-target pairs into one.

The merged permute moves one packed buffer: each member is flattened into a row of a
`[1, total]` array, the rows are concatenated, permuted once, and sliced back out.  (A
variadic collective-permute is valid HLO, but XLA's CPU path through StableHLO accepts only
one operand.)  Devices that receive nothing get zeros either way.

    a = f32[4,2] collective-permute(x), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
    b = f32[3] collective-permute(y), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  becomes
    xy = f32[1,11] concatenate(reshape(x) f32[1,8], reshape(y) f32[1,3]), dimensions={1}
    cp = f32[1,11] collective-permute(xy), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
    a = f32[4,2] reshape(slice(cp) [0:1, 0:8]);  b = f32[3] reshape(slice(cp) [0:1, 8:11])

Members agree on the pairs, element type, channel presence and sharding domain; grouping,
thresholds and dependence are common.py's `combine_by_key`, as for the other combiners.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT)
from hlo_passes.passes.collectives.common import (CombinerPass, replace_members)
from hlo_passes.passes.collectives.packing import pack, packed_width, unpack
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass


@register_pass
class CollectivePermuteCombiner(CombinerPass):
    name = "collective-permute-combiner"
    summary = "Merge independent collective-permutes with the same pairs into one packed permute"
    opcode = Opcode.COLLECTIVE_PERMUTE
    checks_constrained_layout = False

    @dataclass(frozen=True)
    class Options:
        combine_threshold_in_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        combine_threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most collective-permutes merged into one")

    def combine_key(self, instr: Instruction, domain: int):
        if len(instr.operands) != 1 or not instr.shape.is_array or instr.sharding is not None:
            return None
        return (instr.source_target_pairs, instr.channel_id is not None,
                instr.shape.element_type, domain)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]) -> Instruction:
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        added: list[Instruction] = []
        dims = [0] * len(members)
        packed = pack(b, [m.operands[0] for m in members], dims, 1, added)
        width = packed_width([m.shape for m in members], 1)
        combined = b.op(Opcode.COLLECTIVE_PERMUTE, ArrayShape(first.shape.element_type, (1, width)), [packed],
                        channel_id=first.channel_id,
                        source_target_pairs=first.source_target_pairs)
        values = unpack(b, combined, [m.shape for m in members], dims, 1, 1, added)
        self.remark(combined, f"combined {len(members)} collective-permutes: "
                    + ", ".join(m.name for m in members), "applied")
        replace_members(comp, members, combined, values)
        return combined
