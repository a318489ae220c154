"""cse: common-subexpression elimination within each computation.

    add0 { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
    add1 { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT z = f32[] add(x, y) }
    ENTRY e {
      a = f32[8] multiply(p, q)
      b = f32[8] multiply(p, q)            # same opcode, shape, operands, attributes: uses of b use a
      r = f32[8] all-reduce(a), channel_id=1, replica_groups={{0,1}}, to_apply=add0
      s = f32[8] all-reduce(a), channel_id=2, replica_groups={{0,1}}, to_apply=add1
      ROOT t = tuple(a, b, r, s)      →     ROOT t = tuple(a, a, r, r)
    }

Two instructions merge when their opcode, shape (layouts included unless
`layout-sensitive=false`), operands, typed attribute values (metadata aside), literal and
called computations agree.  The operands of a commutative op (add, multiply, maximum,
minimum, and, or, xor) may come in either order, as in XLA's CSE.  Called computations are
compared by structure (`hlo_passes.ir.structural`), so two reducers that differ only in
names are equal, while a reducer written add(y, x) differs from one written add(x, y).

Collectives.  all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute
are deterministic functions of their operands and their groups, and in an SPMD module
every device runs this same program.  Two such collectives with the same operand and
the same groups therefore produce the same value on every device, and since every device
applies the same merge, every device drops the same second collective: the collectives
that remain still pair up across devices in the same order, so the merge cannot make one
device wait for a collective another device no longer issues.  That is why `channel_id`
values are ignored (only whether there is one counts: it decides whether groups name
replicas, partitions or global devices).  Everything else must agree: shape, operands,
replica_groups, use_global_device_ids, dimensions, source_target_pairs, every other
attribute, and the reducer's structure.  Never merged: send/recv and their dones
(point-to-point, paired by channel), async start/done pairs, collective-broadcast and
ragged-all-to-all, collectives with `constrain_layout=true`, rng, infeed/outfeed,
side-effecting custom-calls and control flow that contains any of them (the IR's
per-opcode traits).  The argument needs one program for all devices; an MPMD set of
programs, each compiled on its own, could merge differently per program.

Order and cycles.  An instruction with control predecessors or successors is never
merged, in either role.  Computations are walked in post order and a later instruction
is merged into the first equal one: the kept instruction precedes the dropped one in the
post order, so it cannot depend on the dropped one or on any of its users, no merge can
close a cycle, and the users of the dropped one only see their value earlier.
Computations are visited callees first, so a callee's own merges are done before a
caller takes its fingerprint.  XLA's pass of the same name.

Buffers.  In a module XLA's copy insertion has already seen (`Module.copies_inserted`: the
jax.jit hook's stages) a value whose buffer is written in place (a loop's state, an updated
array, an output), and any `copy`, is never merged in either role (ir/buffers.py): merged, two
loops would count with one counter, two scatters write one array.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.buffers import shares_in_place_buffer
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.structural import StructuralFingerprints, compared_attributes
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass

# Collectives that are pure functions of operands and groups when every device runs one program.
MERGEABLE_COLLECTIVES = frozenset({
    Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
    Opcode.COLLECTIVE_PERMUTE,
})


def is_mergeable_collective(instr: Instruction) -> bool:
    return instr.opcode in MERGEABLE_COLLECTIVES and not instr.constrain_layout


def cse_key(instr: Instruction, fingerprints: StructuralFingerprints) -> tuple | None:
    """What two instructions must share to be merged; None when it must never merge."""
    if instr.opcode is Opcode.PARAMETER or instr.control_predecessors or instr.control_successors:
        return None
    if is_mergeable_collective(instr):
        attrs = compared_attributes(instr, ignore=frozenset({"channel_id"}))
        attrs += (("has_channel_id", "channel_id" in instr.attributes),)
    elif instr.has_side_effect:
        return None
    else:
        attrs = compared_attributes(instr)
    operands = tuple(map(id, instr.operands))
    if instr.opcode.is_commutative:  # add(x, y) and add(y, x) are one value
        operands = tuple(sorted(operands))
    return (instr.opcode, fingerprints.shape_key(instr), operands, attrs,
            fingerprints.called(instr), instr.literal)


@register_pass
class CommonSubexpressionElimination(ModulePass):
    name = "cse"
    summary = "Merge identical side-effect-free instructions and identical SPMD collectives within a computation"

    @dataclass(frozen=True)
    class Options:
        layout_sensitive: bool = option(True, "merge only instructions whose layouts agree too")

    def run(self, module: Module) -> bool:
        fingerprints = StructuralFingerprints(layout_sensitive=self.options.layout_sensitive)
        merged = sum(self._run_on(comp, fingerprints) for comp in module.computation_post_order())
        if merged:
            self.remark(None, f"merged {merged} instructions", kind="applied")
        return bool(merged)

    def _run_on(self, comp: Computation, fingerprints: StructuralFingerprints) -> int:
        seen: dict[tuple, Instruction] = {}
        merged = 0
        buffers_fixed = comp.module is not None and comp.module.copies_inserted
        for instr in comp.post_order():  # operands first: their merges show in users' keys
            key = cse_key(instr, fingerprints)
            if key is None or (buffers_fixed and shares_in_place_buffer(instr)):
                continue
            first = seen.setdefault(key, instr)
            if first is not instr:
                comp.replace(instr, first)
                merged += 1
        return merged
