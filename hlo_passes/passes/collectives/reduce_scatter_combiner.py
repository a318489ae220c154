"""reduce-scatter-combiner: merge independent reduce-scatters into one.

Two forms (option `form`):

* `packed` (default): every member's operand is laid out as `[parts, chunk]` rows
  (its scatter dimension moved first and flattened, see packing.py), the rows are
  concatenated, one reduce-scatter over dimension 0 reduces them, and each member's shard is
  sliced back out.  This runs everywhere, including XLA's CPU path, whose StableHLO import
  accepts only single-operand reduce-scatters.

      a = f32[2,4] reduce-scatter(x f32[8,4]), dimensions={0}, replica_groups={{0,1,2,3}}
      b = f32[3] reduce-scatter(y f32[12]), dimensions={0}, replica_groups={{0,1,2,3}}
    becomes
      xy = f32[4,11] concatenate(reshape(x) f32[4,8], reshape(y) f32[4,3]), dimensions={1}
      rs = f32[1,11] reduce-scatter(xy), dimensions={0}
      a = f32[2,4] reshape(slice(rs) [0:1, 0:8]);  b = f32[3] reshape(slice(rs) [0:1, 8:11])

* `variadic`: one tuple-shaped reduce-scatter, XLA's own form (ReduceScatterCombiner).  XLA's
  CPU pipeline reached through StableHLO rejects it ("requires a single operand").

Members agree on the reduction (by meaning), element type, replica groups, channel presence,
`use_global_device_ids` and, for the variadic form, the scatter dimension.  Cycles, control
edges and channel ids are handled as in all-reduce-combiner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlo_passes.ir.builder import Builder, next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT)
from hlo_passes.passes.collectives.common import (CombinerPass, group_mode, reduction_of, replace_members,
                                                  replica_groups)
from hlo_passes.passes.collectives.packing import pack, packed_width, unpack
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass

FORMS = ("packed", "variadic")


@register_pass
class ReduceScatterCombiner(CombinerPass):
    name = "reduce-scatter-combiner"
    summary = "Merge independent reduce-scatters with the same groups and reduction into one"

    @dataclass(frozen=True)
    class Options:
        threshold_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined operand, in bytes")
        threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most reduce-scatters merged into one")
        form: Literal["packed", "variadic"] = option("packed", "packed: one reduce-scatter of a concatenation; variadic: a tuple")

    def __init__(self, options=None, **kwargs):
        super().__init__(options, **kwargs)
        if self.options.form not in FORMS:
            raise ValueError(f"{self.name}: form must be one of {', '.join(FORMS)}, got {self.options.form!r}")

    def member_bytes(self, instr: Instruction) -> int:
        return instr.operands[0].shape.byte_size()  # the threshold counts what is reduced

    def combine_key(self, instr: Instruction):
        if instr.opcode is not Opcode.REDUCE_SCATTER or instr.shape.is_tuple or len(instr.operands) != 1:
            return None
        reduction = reduction_of(instr)
        if reduction is None or instr.shape.element_type is not reduction.element_type:
            return None
        if instr.attr("constrain_layout", False) or instr.sharding is not None:
            return None
        dim = instr.attr("dimensions")[0]
        parts = instr.operands[0].shape.dims[dim] // instr.shape.dims[dim]
        where = dim if self.options.form == "variadic" else None
        return (reduction, replica_groups(instr), group_mode(instr), parts, where)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]):
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        mode = group_mode(first)
        common = dict(channel_id=next_channel_id(module) if mode.has_channel else None,
                      replica_groups=replica_groups(first),
                      use_global_device_ids=True if mode.use_global_device_ids else None,
                      called={"to_apply": first.called["to_apply"]})
        dims = [m.attr("dimensions")[0] for m in members]
        added: list[Instruction] = []
        if self.options.form == "variadic":
            combined = b.op(Opcode.REDUCE_SCATTER, TupleShape(tuple(m.shape for m in members)),
                            [m.operands[0] for m in members], dimensions=(dims[0],), **common)
            values = [b.get_tuple_element(combined, k) for k in range(len(members))]
            added += values
        else:
            parts = first.operands[0].shape.dims[dims[0]] // first.shape.dims[dims[0]]
            packed = pack(b, [m.operands[0] for m in members], dims, parts, added)
            width = packed_width([m.shape for m in members], 1)
            combined = b.op(Opcode.REDUCE_SCATTER, ArrayShape(first.shape.element_type, (1, width)), [packed],
                            dimensions=(0,), **common)
            values = unpack(b, combined, [m.shape for m in members], dims, 1, 1, added)
        self.remark(combined, f"combined {len(members)} reduce-scatters ({self.options.form}): "
                    + ", ".join(m.name for m in members), "applied")
        added += replace_members(comp, members, combined, [[v] for v in values])
        return combined, added
