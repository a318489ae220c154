"""all-gather-combiner: merge independent all-gathers into one variadic all-gather (XLA's
AllGatherCombiner).

    a = f32[32,4] all-gather(x), replica_groups={{0,1,2,3}}, dimensions={0}
    b = s32[16] all-gather(y), replica_groups={{0,1,2,3}}, dimensions={0}
  becomes
    ab = (f32[32,4], s32[16]) all-gather(x, y), replica_groups={{0,1,2,3}}, dimensions={0}
    a = f32[32,4] get-tuple-element(ab), index=0
    b = s32[16] get-tuple-element(ab), index=1

The key, as XLA's: the gathered dimension (only with `combine-by-dim`, the default), the
sharding domain's metadata, whether there is a channel, `use_global_device_ids`, the element
type (only with `combine-different-dtypes=false`) and the replica groups as written.
Grouping, thresholds and dependence are common.py's `combine_by_key`; bodies and conditions
of while loops are skipped with `combine-while-loops=false`; a module holding a
layout-constrained all-gather is left alone.  The merged gather keeps the first member's
channel id and, in a partitioned module, a tuple of the members' shardings.

Members of one group may gather different dimensions (`combine-by-dim=false`) and have
different ranks.  As XLA, the group gathers the dimension most members gather (the smallest
on a tie) when every member has it, else dimension 0; a member over another dimension swaps
the two dimensions before and after (a transpose; each all-gather equals its transposed twin).

One departure in form, not in what is combined: XLA CPU gathers by concatenating each
device's buffer.  Its layout assignment makes the gathered dimension major for a single
all-gather but not for a variadic one, whose layout it may take from the values around it
(seen in jax 0.12: once an operand has other users its elements stay row-major, and the
devices' pieces of a gather over dimension 1 of f32[4,4] land as whole blocks one after
another).  So the merged gather is built in the form least exposed to that.  "Leading" is
read in memory order: the member's own layout when the module carries layouts (a dump after
XLA's optimizations gathers dimension 2 of f32[1,16,12]{1,0,2}, major there), row-major when
it does not.  When the chosen dimension is not leading for every member (some dimension more
major than it larger than 1), the merged gather runs over dimension 0 instead, every member
swapping its own dimension into 0 and back through row-major transposes; the group and the
count of all-gathers are XLA's.  A member whose own layout puts its gathered dimension behind
a larger one (no XLA backend writes that) goes through an identity transpose to row-major.
Even so, XLA CPU may give the merged gather a transposed layout of its own choosing (JAX
fuzz seed 2014: a transpose after it invites one), so the runtime runs variadic all-gathers
split (`runtime/partitioned.py`) and the README says what that means on XLA CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Layout, Shape, TupleShape
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT)
from hlo_passes.ir.collective_groups import group_mode
from hlo_passes.passes.collectives.common import (CombinerPass, most_frequent_dimension, replace_members,
                                                  replica_groups, shape_free, tuple_sharding)
from hlo_passes.passes.pass_base import option
from hlo_passes.passes.registry import register_pass


def gather_dimension(instr: Instruction) -> int:
    return instr.dimensions[0]


def major_to_minor(shape: Shape) -> list[int]:
    """The dimensions of `shape` in memory order, most major first (row-major without a layout)."""
    if shape.layout is None or len(shape.layout.minor_to_major) != shape.rank:
        return list(range(shape.rank))
    return list(reversed(shape.layout.minor_to_major))


def leading(shape: Shape, dim: int) -> bool:
    """Is every dimension more major than `dim` in `shape`'s layout (row-major without one) of
    size 1, so that each device's piece of a gather over `dim` is one contiguous run?"""
    order = major_to_minor(shape)
    return all(shape.dims[d] == 1 for d in order[:order.index(dim)])


def swapped(shape: Shape, own: int, dim: int) -> Shape:
    """`shape` with dimensions `own` and `dim` swapped, row-major when `shape` has a layout (a
    transpose that kept the layout would leave the memory order, and the gather, as they were)."""
    dims = list(shape.dims)
    dims[own], dims[dim] = dims[dim], dims[own]
    moved = shape.with_dims(dims)
    return moved if shape.layout is None else moved.with_layout(Layout.default_for_rank(shape.rank))


def joins_as_it_is(m: Instruction, own: int, dim: int) -> bool:
    """Does member `m`, gathering `own`, take part in a merged gather over `dim` with its own
    operand and shape (`own == dim` and its layouts keep that dimension leading)?  Otherwise it
    goes through a transpose: a swap, or an identity one that only makes the layout row-major."""
    return own == dim and leading(m.shape, dim) and leading(m.operands[0].shape, dim)


def leading_at(m: Instruction, own: int, dim: int) -> bool:
    """Is the gathered dimension leading in memory once member `m` gathers over `dim`, as it is
    or through the row-major swap of `own` into `dim`?"""
    return joins_as_it_is(m, own, dim) or leading(swapped(m.shape, own, dim), dim)


def swap(rank: int, a: int, b: int) -> list[int]:
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


@register_pass
class AllGatherCombiner(CombinerPass):
    name = "all-gather-combiner"
    summary = "Merge independent all-gathers with the same groups into one variadic all-gather"
    opcode = Opcode.ALL_GATHER

    @dataclass(frozen=True)
    class Options:
        combine_threshold_in_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined result, in bytes")
        combine_threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most all-gathers merged into one")
        combine_by_dim: bool = option(True, "merge only all-gathers over the same dimension")
        combine_different_dtypes: bool = option(True, "merge all-gathers of different element types")
        combine_while_loops: bool = option(True, "also merge inside while loop bodies")

    def combine_key(self, instr: Instruction, domain: int):
        if not instr.shape.is_array:
            return None
        o = self.options
        mode = group_mode(instr)
        return (gather_dimension(instr) if o.combine_by_dim else None, domain, mode.has_channel,
                mode.use_global_device_ids, None if o.combine_different_dtypes else instr.shape.element_type,
                replica_groups(instr).groups)

    def combine(self, module: Module, comp: Computation, members: list[Instruction]) -> Instruction:
        first = members[0]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        own = [gather_dimension(m) for m in members]
        dim = most_frequent_dimension(own, [m.shape.rank for m in members])
        if not all(leading_at(m, d, dim) for m, d in zip(members, own)):
            self.remark(first, f"gathers dimension {dim} behind dimensions larger than 1 in memory: merged over "
                        "dimension 0 through transposes (XLA CPU may keep a variadic all-gather's "
                        "elements row-major, which would misplace the devices' pieces)", "note")
            dim = 0
        operands, shapes, perms = [], [], []
        for m, d in zip(members, own):
            if joins_as_it_is(m, d, dim):
                operands.append(m.operands[0])
                shapes.append(m.shape)
                perms.append(None)
                continue
            perm = swap(m.shape.rank, d, dim)
            operand = m.operands[0]
            operands.append(b.op(Opcode.TRANSPOSE, swapped(operand.shape, d, dim), [operand], dimensions=tuple(perm)))
            shapes.append(swapped(m.shape, d, dim))
            perms.append(perm)
        mode = group_mode(first)
        combined = b.op(Opcode.ALL_GATHER, TupleShape(tuple(shapes)), operands,
                        channel_id=first.channel_id, replica_groups=replica_groups(first),
                        dimensions=(dim,), use_global_device_ids=True if mode.use_global_device_ids else None)
        combined.sharding = tuple_sharding(module, members)
        values = []
        for k, (m, perm) in enumerate(zip(members, perms)):
            value = b.get_tuple_element(combined, k)
            if perm is not None:
                value.sharding = shape_free(m.sharding)
                value = b.op(Opcode.TRANSPOSE, m.shape, [value], dimensions=tuple(perm))
            value.sharding = m.sharding
            values.append(value)
        for operand, m in zip(operands, members):
            if operand.opcode is Opcode.TRANSPOSE and operand is not m.operands[0]:
                operand.sharding = shape_free(m.operands[0].sharding)
        self.remark(combined, f"combined {len(members)} all-gathers over dimension {dim}: "
                    + ", ".join(m.name for m in members), "applied")
        replace_members(comp, members, combined, values)
        return combined
