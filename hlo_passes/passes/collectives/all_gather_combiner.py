"""all-gather-combiner: merge independent all-gathers into one variadic all-gather.

    a = f32[32,4] all-gather(x), replica_groups={{0,1,2,3}}, dimensions={0}
    b = s32[16] all-gather(y), replica_groups={{0,1,2,3}}, dimensions={0}
  becomes
    ab = (f32[32,4], s32[16]) all-gather(x, y), replica_groups={{0,1,2,3}}, dimensions={0}
    a = f32[32,4] get-tuple-element(ab), index=0
    b = s32[16] get-tuple-element(ab), index=1

Members agree on replica groups, channel presence and `use_global_device_ids`, and by default
on the gathered dimension.  With `combine_by_dim=false` all-gathers of equal rank over
different dimensions are merged too: the dimension most members gather stays, and the others
gather through a transpose that swaps their dimension into it and back (each all-gather is
the same as its transposed twin).  Element types may differ (`combine_different_dtypes`):
an all-gather moves bytes and computes nothing.  Cycles, control edges and channel ids are
handled as in all-reduce-combiner.

Only gathers over a *leading* dimension (every dimension before it has size 1) are merged
as they are.  XLA CPU gathers by concatenating each device's buffer, so its layout
assignment makes the gathered dimension major; for a variadic all-gather it does not always
do so (XLA in jax 0.12: once an operand has other users, elements keep row-major layouts),
and the devices' pieces of a gather over dimension 1 of f32[4,4] then land as whole [4,4]
blocks one after the other instead of side by side (rows permuted).  So with
`combine_by_dim=true` such all-gathers are left alone (a remark says why), and with
`combine_by_dim=false` they go through transposes into a dimension that is leading for every
member (dimension 0 when nothing better is shared).
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder, next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT)
from hlo_passes.passes.collectives.common import (CombinerPass, combinable_sharding, group_mode, most_common,
                                                  replace_members, replica_groups)
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass


def gather_dimension(instr: Instruction) -> int:
    return instr.attr("dimensions")[0]


def leading_at(shape: Shape, own: int, dim: int) -> bool:
    """After swapping dimension `own` of `shape` into position `dim`, is every dimension before
    `dim` of size 1 (each device's piece one contiguous run of a row-major buffer)?"""
    dims = list(shape.dims)
    dims[own], dims[dim] = dims[dim], dims[own]
    return all(d == 1 for d in dims[:dim])


def gathers_leading_dimension(instr: Instruction) -> bool:
    dim = gather_dimension(instr)
    return all(leading_at(leaf, dim, dim) for leaf in instr.shape.leaves())


@register_pass
class AllGatherCombiner(CombinerPass):
    name = "all-gather-combiner"
    summary = "Merge independent all-gathers with the same groups into one variadic all-gather"

    @dataclass(frozen=True)
    class Options:
        threshold_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most all-gathers merged into one")
        combine_different_dtypes: bool = option(True, "merge all-gathers of different element types")
        combine_by_dim: bool = option(True, "merge only all-gathers over the same dimension")

    def combine_key(self, instr: Instruction):
        if instr.opcode is not Opcode.ALL_GATHER:
            return None
        if instr.attr("constrain_layout", False) or not combinable_sharding(instr):
            return None
        if instr.shape.is_tuple:
            if not self.options.combine_by_dim or any(
                    u.opcode is not Opcode.GET_TUPLE_ELEMENT for u in instr.users):
                return None
        if self.options.combine_by_dim:
            if not gathers_leading_dimension(instr):
                self.remark(instr, f"gathers dimension {gather_dimension(instr)} behind dimensions larger "
                            "than 1; not combined: XLA CPU may keep a variadic all-gather's elements "
                            "row-major, which misplaces the devices' pieces", "missed")
                return None
            where = ("dim", gather_dimension(instr))
        else:
            where = ("rank", instr.shape.rank)
        types = None if self.options.combine_different_dtypes else tuple(
            sorted({leaf.element_type.value for leaf in instr.shape.leaves()}))
        return (replica_groups(instr), group_mode(instr), where, types, instr.sharding is not None)

    @staticmethod
    def _target_dimension(members: list[Instruction]) -> int:
        """The dimension the combined all-gather gathers: the most common one among the members
        that is leading for all of them once swapped in (0 always is)."""
        def fits(dim: int) -> bool:
            return all(leading_at(m.shape, gather_dimension(m), dim) for m in members
                       if not m.shape.is_tuple)
        own = [gather_dimension(m) for m in members]
        usable = [d for d in own if fits(d)]
        return most_common(usable) if usable else 0

    def combine(self, module: Module, comp: Computation, members: list[Instruction]):
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        dim = self._target_dimension(members)
        operands, shapes, swaps = [], [], []
        for m in members:
            own = gather_dimension(m)
            if own == dim:
                operands.extend(m.operands)
                shapes.extend(m.shape.elements if m.shape.is_tuple else (m.shape,))
                swaps.append(None)
                continue
            perm = list(range(m.shape.rank))
            perm[own], perm[dim] = dim, own
            operands.append(b.transpose(m.operands[0], perm))
            shapes.append(m.shape.with_dims(tuple(m.shape.dims[p] for p in perm)))
            swaps.append(perm)
        mode = group_mode(first)
        combined = b.op(Opcode.ALL_GATHER, TupleShape(tuple(shapes)), operands,
                        channel_id=next_channel_id(module) if mode.has_channel else None,
                        replica_groups=replica_groups(first), dimensions=(dim,),
                        use_global_device_ids=True if mode.use_global_device_ids else None)
        manual = first.sharding is not None
        if manual:
            combined.sharding = Sharding.tuple_of(Sharding.manual() for _ in operands)
        results, added, k = [], [], 0
        for m, perm in zip(members, swaps):
            values = []
            for _ in range(len(m.operands)):
                value = b.get_tuple_element(combined, k)
                added.append(value)
                if perm is not None:
                    value = b.transpose(value, perm)
                    added.append(value)
                if manual:
                    value.sharding = Sharding.manual()
                values.append(value)
                k += 1
            results.append(values)
        self.remark(combined, f"combined {len(members)} all-gathers: " + ", ".join(m.name for m in members),
                    "applied")
        added += replace_members(comp, members, combined, results)
        added += [op for op in operands if op.opcode is Opcode.TRANSPOSE and op not in added]
        return combined, added
