"""The default: compute the op on full (replicated) operands, then keep this device's tile.

Always correct, never cheap: every sharded operand is all-gathered.  A "missed"
remark names the op so the user can see what was not partitioned natively.
"""

from __future__ import annotations

from typing import Iterable

from hlo_passes.passes.spmd.handlers import HandlerContext

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd.partition_context import (PValue, is_fully_manual, is_partially_manual, manual_only,
                                                       tile_map, to_sharding)
from hlo_passes.passes.spmd.tile_map import TileMap


def replicated_like(shape: Shape) -> Sharding:
    if isinstance(shape, TupleShape):
        return Sharding.tuple_of(replicated_like(e) for e in shape.elements)
    return Sharding.replicated()


def replicate(p: HandlerContext, instr: Instruction, why: str | None = None) -> PValue:
    target = p.target(instr)
    sharded_in = [op for op in instr.operands if not p.value(op).sharding.is_replicated]
    operands = [p.operand_as(instr, i, replicated_like(op.shape)) for i, op in enumerate(instr.operands)]
    full = PValue(p.clone(instr, operands, instr.shape), replicated_like(instr.shape), instr.shape)
    if sharded_in or not target.is_replicated:
        reason = why or f"no partitioning rule for {instr.opcode.value}" + (
            f" ({instr.custom_call_target})" if instr.custom_call_target else "")
        p.remark(instr, f"replicated: {reason}", kind="missed")
    return p.reshard(full, target)


def whole_in_manual_groups(sharding: Sharding, shape: Shape, n: int, groups: TileMap | None = None) -> Sharding:
    """What a device holds once a value of a partially manual region is gathered over the
    region's automatic axes: its manual group's whole value.  Partially manual leaves keep their
    manual groups; other array leaves take `groups`' (the region's), or read as replicated
    (which inside a region means the same: whole per group)."""
    if sharding.is_tuple:
        assert isinstance(shape, TupleShape)
        return Sharding.tuple_of(whole_in_manual_groups(sharding.subsharding(shape, i), e, n, groups)
                                 for i, e in enumerate(shape.elements))
    if is_fully_manual(sharding) or not isinstance(shape, ArrayShape):
        return sharding
    if is_partially_manual(sharding):
        return to_sharding(manual_only(tile_map(sharding, shape.rank, n)))
    if groups is None:
        return Sharding.replicated()
    return to_sharding(manual_only(TileMap.replicated(shape.rank, n).with_manual(groups)))


def _region_groups(shardings: Iterable[Sharding], n: int) -> TileMap | None:
    """The manual groups of the first partially manual leaf among `shardings`."""
    for s in shardings:
        for leaf in (s.elements if s.is_tuple else (s,)):
            if is_partially_manual(leaf):
                return tile_map(leaf, leaf.data_rank, n)
    return None


def whole_per_manual_group(p: HandlerContext, instr: Instruction, why: str) -> PValue:
    """The default inside a partially manual region: operands gathered over the region's
    automatic axes (an operand tiled over all devices, which only a region's replicated values
    can be, is gathered whole), the op computed on each manual group's whole value (its shape
    inside the region), its result left whole per group (users slice what they need).  A called
    computation of control flow is copied as manual code, every value in it whole per group."""
    if instr.custom_call_target in ("SPMDFullToShardShape", "SPMDShardToFullShape"):
        # the shardings on the two sides of the border do not describe one layout (a shard_map
        # nested in another's body, as Shardy's export writes it, names only its own manual
        # axes): nothing to partition it into, and an input error, not a crash
        from hlo_passes.passes.spmd.sharding_propagation import PropagationError

        raise PropagationError(f"{instr.name}: the shardings on the two sides of this manual region's border do "
                               f"not fit together, so it is not partitioned ({why})")
    values = [p.value(op) for op in instr.operands]
    target = p.target(instr)
    groups = _region_groups([target] + [v.sharding for v in values], p.n)
    operands = [p.operand_as(instr, i, whole_in_manual_groups(v.sharding, op.shape, p.n))
                for i, (op, v) in enumerate(zip(instr.operands, values))]
    out = whole_in_manual_groups(target, instr.shape, p.n, groups)
    p.remark(instr, f"replicated: computed whole per manual group (gathered over the automatic axes): {why}",
             kind="missed")
    if instr.custom_call_target == "Sharding":  # an annotation computes nothing
        return PValue(operands[0], out, instr.shape)
    called: dict[str, Computation | tuple[Computation, ...]] = {}
    if instr.opcode in (Opcode.CALL, Opcode.WHILE, Opcode.CONDITIONAL):
        for key, comp in instr.called.items():
            comps = comp if isinstance(comp, tuple) else (comp,)
            new = tuple(p.partition_manual(c) for c in comps)
            called[key] = new if isinstance(comp, tuple) else new[0]
    return PValue(p.clone(instr, operands, instr.shape, **called), out, instr.shape)
