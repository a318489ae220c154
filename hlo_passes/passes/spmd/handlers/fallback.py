"""The default: compute the op on full (replicated) operands, then keep this device's tile.

Always correct, never cheap: every sharded operand is all-gathered.  A "missed"
remark names the op so the user can see what was not partitioned natively.
"""

from __future__ import annotations

from hlo_passes.passes.spmd.handlers import HandlerContext

from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.partition_context import PValue


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
