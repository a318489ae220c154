"""The default: compute the op on full (replicated) operands, then keep this device's tile.

Always correct, never cheap: every sharded operand is all-gathered.  A "missed"
remark names the op so the user can see what was not partitioned natively.
"""

from __future__ import annotations

from hlo_passes.passes.spmd.handlers import HandlerContext

from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.partition_context import (PValue, is_partially_manual, manual_only, tile_map,
                                                       to_sharding)


def replicated_like(shape) -> Sharding:
    if shape.is_tuple:
        return Sharding.tuple_of(replicated_like(e) for e in shape.elements)
    return Sharding.replicated()


def replicate(p: HandlerContext, instr, why: str | None = None) -> PValue:
    target = p.target(instr)
    sharded_in = [op for op in instr.operands if not p.value(op).sharding.is_replicated]
    operands = [p.operand_as(instr, i, replicated_like(op.shape)) for i, op in enumerate(instr.operands)]
    full = PValue(p.clone(instr, operands, instr.shape), replicated_like(instr.shape), instr.shape)
    if sharded_in or not target.is_replicated:
        reason = why or f"no partitioning rule for {instr.opcode.value}" + (
            f" ({instr.custom_call_target})" if instr.custom_call_target else "")
        p.remark(instr, f"replicated: {reason}", kind="missed")
    return p.reshard(full, target)


def whole_in_manual_groups(sharding: Sharding, shape, n: int) -> Sharding:
    """`sharding` with the automatic tiling of a partially manual value gathered: each device
    holds its manual group's whole value (other shardings unchanged)."""
    if sharding.is_tuple:
        return Sharding.tuple_of(whole_in_manual_groups(sharding.element(i), e, n)
                                 for i, e in enumerate(shape.elements))
    if not is_partially_manual(sharding):
        return sharding
    return to_sharding(manual_only(tile_map(sharding, shape.rank, n)))


def whole_per_manual_group(p: HandlerContext, instr, why: str) -> PValue:
    """The default inside a partially manual region: operands gathered over the region's
    automatic axes, the op computed on each manual group's whole value (its shape inside the
    region), its result left whole per group (users slice what they need).  A called
    computation of control flow is copied as manual code, every value in it whole per group."""
    operands = [p.operand_as(instr, i, whole_in_manual_groups(p.value(op).sharding, op.shape, p.n))
                for i, op in enumerate(instr.operands)]
    called = {}
    if instr.opcode in (Opcode.CALL, Opcode.WHILE, Opcode.CONDITIONAL):
        for key, comp in instr.called.items():
            comps = comp if isinstance(comp, tuple) else (comp,)
            new = tuple(p.partition_manual(c) for c in comps)
            called[key] = new if isinstance(comp, tuple) else new[0]
    p.remark(instr, f"replicated: computed whole per manual group (gathered over the automatic axes): {why}",
             kind="missed")
    out = whole_in_manual_groups(p.target(instr), instr.shape, p.n)
    return PValue(p.clone(instr, operands, instr.shape, **called), out, instr.shape)
