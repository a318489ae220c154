"""reduce-scatter-combiner: merge independent reduce-scatters into one (XLA's
ReduceScatterCombiner).

What is merged is XLA's choice; how the merged reduce-scatter is written has two forms
(option `form`):

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

* `variadic`: one tuple-shaped reduce-scatter, XLA's own form: over the dimension most
  members scatter (the smallest on a tie; 0 when a member lacks it), a member over another
  dimension swapping the two before and after.  XLA's CPU pipeline reached through StableHLO
  rejects it ("requires a single operand"), so it is checked structurally only.

The key, as XLA's: the reduction (root opcode and element type of `to_apply`), the sharding
domain's metadata, whether there is a channel, `use_global_device_ids`, the replica groups as
written and, with `combine-by-dim` (the default), the scatter dimension.  Grouping, the
thresholds (which count result bytes) and dependence are common.py's `combine_by_key`;
bodies and conditions of while loops are skipped with `combine-while-loops=false`; a module
holding a layout-constrained reduce-scatter is left alone.  The merged reduce-scatter keeps
the first member's channel id and sharding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT)
from hlo_passes.ir.collective_groups import group_mode
from hlo_passes.passes.collectives.common import (CombinerPass, combinable_reduction, most_frequent_dimension,
                                                  replace_members, replica_groups, shape_free,
                                                  uniform_group_size)
from hlo_passes.passes.collectives.packing import pack, packed_width, unpack
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass


def scatter_dimension(instr: Instruction) -> int:
    return instr.dimensions[0]


@register_pass
class ReduceScatterCombiner(CombinerPass):
    name = "reduce-scatter-combiner"
    summary = "Merge independent reduce-scatters with the same groups and reduction into one"
    opcode = Opcode.REDUCE_SCATTER

    @dataclass(frozen=True)
    class Options:
        combine_threshold_in_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        combine_threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most reduce-scatters merged into one")
        combine_by_dim: bool = option(True, "merge only reduce-scatters over the same dimension")
        combine_while_loops: bool = option(True, "also merge inside while loop bodies")
        form: Literal["packed", "variadic"] = option(
            "packed", "packed: one reduce-scatter of a concatenation; variadic: XLA's tuple form")

    def __init__(self, options=None, **kwargs):
        super().__init__(options, **kwargs)
        if self.options.form not in ("packed", "variadic"):
            raise ValueError(f"{self.name}: form must be packed or variadic, got {self.options.form!r}")

    def combine_key(self, instr: Instruction, domain: int):
        reduction = combinable_reduction(instr)
        if reduction is None or not instr.shape.is_array:
            return None
        mode = group_mode(instr)
        return (reduction.opcode, reduction.element_type, domain, mode.has_channel, mode.use_global_device_ids,
                replica_groups(instr).groups, scatter_dimension(instr) if self.options.combine_by_dim else None)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]) -> Instruction:
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        mode = group_mode(first)
        common = dict(channel_id=first.channel_id, replica_groups=replica_groups(first),
                      use_global_device_ids=True if mode.use_global_device_ids else None,
                      called={"to_apply": first.called["to_apply"]})
        dims = [scatter_dimension(m) for m in members]
        added: list[Instruction] = []
        if self.options.form == "variadic":
            combined, values = self._variadic(b, members, dims, common, added)
        else:
            parts = uniform_group_size(first, module) or (
                first.operands[0].shape.dims[dims[0]] // max(first.shape.dims[dims[0]], 1))
            packed = pack(b, [m.operands[0] for m in members], dims, parts, added)
            width = packed_width([m.shape for m in members], 1)
            combined = b.op(Opcode.REDUCE_SCATTER, ArrayShape(first.shape.element_type, (1, width)), [packed],
                            dimensions=(0,), **common)
            values = unpack(b, combined, [m.shape for m in members], dims, 1, 1, added)
        if first.sharding is not None and (combined.shape.is_array or module.num_partitions > 1):
            combined.sharding = first.sharding  # XLA's choice; see common.tuple_sharding for the tuple case
            for x in added:
                x.sharding = shape_free(first.sharding)
        for m, v in zip(members, values):
            v.sharding = m.sharding
        self.remark(combined, f"combined {len(members)} reduce-scatters ({self.options.form}): "
                    + ", ".join(m.name for m in members), "applied")
        replace_members(comp, members, combined, values)
        return combined

    @staticmethod
    def _variadic(b: Builder, members: list[Instruction], dims: list[int], common: dict,
                  added: list[Instruction]) -> tuple[Instruction, list[Instruction]]:
        dim = most_frequent_dimension(dims, [m.shape.rank for m in members])
        operands, shapes, perms = [], [], []
        for m, d in zip(members, dims):
            if d == dim:
                operands.append(m.operands[0])
                shapes.append(m.shape)
                perms.append(None)
                continue
            perm = list(range(m.shape.rank))
            perm[d], perm[dim] = perm[dim], perm[d]
            t = b.transpose(m.operands[0], perm)
            added.append(t)
            operands.append(t)
            shapes.append(m.shape.with_dims(tuple(m.shape.dims[p] for p in perm)))
            perms.append(perm)
        combined = b.op(Opcode.REDUCE_SCATTER, TupleShape(tuple(shapes)), operands, dimensions=(dim,), **common)
        values = []
        for k, perm in enumerate(perms):
            value = b.get_tuple_element(combined, k)
            if perm is not None:
                added.append(value)
                value = b.transpose(value, perm)
            values.append(value)
        return combined, values
