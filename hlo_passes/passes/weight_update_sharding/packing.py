"""The paper's packing of small tensors: one reduce-scatter and one all-gather for many, and one
all-reduce for the scalars of many whole-tensor reductions (global norms, LAMB's ‖w‖ and ‖u‖).

Each component's reduce-scatter takes its formatted gradient `[N·c_t]` and its all-gathers
return `[N·c_t]` buffers.  Tensors of the same groups and element type share one collective:
each buffer is viewed as N rows of its chunk, the rows are concatenated
(`collectives.packing`), and device i's piece of the packed result holds chunk i of every
member, padded per tensor to the group size as before:

    rs_a = f32[4] reduce-scatter(f32[32] a)      packed = f32[8,7] concatenate(a [8,4], b [8,3])
    rs_b = f32[3] reduce-scatter(f32[24] b)  →   rs = f32[1,7] reduce-scatter(packed), dimensions={0}
                                                 rs_a = slice(rs) [1,4] → [4]; rs_b = [3]

All-gathers become one variadic all-gather along dimension 0 (no copies), the scalar all-reduces
one variadic all-reduce of the same reduction (XLA's all-reduce-combiner's form); reduce-scatters
are packed into one buffer, since XLA's CPU path runs no variadic reduce-scatter.  A scalar that
is computed from another (the second norm of `optax.safe_norm`) goes into a later pack.

The collectives are grouped the way XLA's combiners group theirs (`combine_by_key`: in order, up
to `threshold_bytes` each, never one member that depends on another), but only the pass's own:
a module's other collectives are left to the combiners.
"""

from __future__ import annotations

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, TupleShape
from hlo_passes.passes.collectives.common import combine_by_key, replace_members
from hlo_passes.passes.collectives.packing import pack, packed_width, unpack


def _key(instr: Instruction, module: Module) -> tuple:
    to_apply = instr.called.get("to_apply")
    return (instr.opcode, instr.shape.element_type, instr.channel_id is not None,
            instr.use_global_device_ids, instr.replica_groups.groups,
            to_apply.name if to_apply is not None else None)


def pack_collectives(module: Module, comp: Computation, collectives: list[Instruction], n: dict[Instruction, int],
                     threshold_bytes: int) -> list[Instruction]:
    """Pack the reduce-scatters and all-gathers in `collectives` (`n`: each one's group size);
    returns the packed collectives made."""
    made: list[Instruction] = []

    def combine(members: list[Instruction]) -> Instruction:
        first = members[0]
        parts = n[first]
        b = Builder(comp, before=members[-1], metadata=first.attributes.get("metadata"))
        added: list[Instruction] = []
        common = dict(channel_id=module.new_channel_id() if first.channel_id is not None else None,
                      replica_groups=first.replica_groups,
                      use_global_device_ids=True if first.use_global_device_ids else None)  # None: not printed
        etype = first.shape.element_type
        if first.opcode is Opcode.REDUCE_SCATTER:
            packed = pack(b, [m.operands[0] for m in members], [0] * len(members), parts, added)
            width = packed_width([m.shape for m in members], 1)
            combined = b.op(Opcode.REDUCE_SCATTER, ArrayShape(etype, (1, width)), [packed], dimensions=(0,),
                            called={"to_apply": first.called["to_apply"]}, **common)
            values = unpack(b, combined, [m.shape for m in members], [0] * len(members), 1, 1, added)
        elif first.opcode is Opcode.ALL_REDUCE:  # the scalars of whole-tensor reductions: variadic
            combined = b.op(Opcode.ALL_REDUCE, TupleShape(tuple(m.shape for m in members)),
                            [m.operands[0] for m in members], called={"to_apply": first.called["to_apply"]},
                            **common)
            values = [b.get_tuple_element(combined, k) for k in range(len(members))]
        else:  # variadic along dimension 0 (XLA CPU runs that form; not along other dimensions)
            combined = b.op(Opcode.ALL_GATHER, TupleShape(tuple(m.shape for m in members)),
                            [m.operands[0] for m in members], dimensions=(0,), **common)
            values = [b.get_tuple_element(combined, k) for k in range(len(members))]
        for m, v in zip(members, values):
            v.shape = m.shape
        replace_members(comp, members, combined, values)
        made.append(combined)
        return combined

    keys = {c: _key(c, module) for c in collectives if c.parent is comp}
    # Scalars of one level (how many of these all-reduces stand before them on a path) never
    # depend on each other: one pack each (in order alone, a dependent scalar would end a pack
    # early and leave the independent ones after it for a pack of their own).
    level = scalar_levels(comp, {c for c in keys if c.opcode is Opcode.ALL_REDUCE})
    keys = {c: (key, level.get(c)) for c, key in keys.items()}
    combine_by_key(comp, keys, threshold_bytes=threshold_bytes, threshold_count=1 << 30, combine=combine,
                   size=lambda i: max(i.shape.byte_size(), i.operands[0].shape.byte_size()))
    return made


def scalar_levels(comp: Computation, members: set[Instruction]) -> dict[Instruction, int]:
    """For each of `members`, how many members stand before it on the longest path to it."""
    if not members:
        return {}
    depth: dict[Instruction, int] = {}
    for instr in comp.post_order():
        depth[instr] = max((depth[o] + (o in members) for o in instr.operands), default=0)
    return {m: depth[m] for m in members}


def count_levels(members: list[Instruction], through: set[Instruction]) -> int:
    """How many packs `scalar_levels` would make of `members` alone, following dependencies only
    through `through` and scalars (a component's own ops and the scalar glue between its norms;
    cheap where the whole computation is large)."""
    depth: dict[Instruction, int] = {}
    member_set = set(members)

    def visit(root: Instruction) -> int:
        stack = [(root, False)]
        while stack:
            x, ready = stack.pop()
            if x in depth:
                continue
            inputs = [o for o in x.operands
                      if o in member_set or o in through or (o.shape.is_array and o.shape.element_count <= 1)]
            if not ready:
                stack.append((x, True))
                stack.extend((o, False) for o in inputs if o not in depth)
                continue
            depth[x] = max((depth[o] + (o in member_set) for o in inputs), default=0)
        return depth[root]

    return len({visit(m) for m in members})
