"""An op with a side effect placed on one device (`{maximal device=N}`): run it there only.

JAX places a host callback (`io_callback`, `jax.debug.callback`, `debug.print`) on one device
of a sharded program, and XLA's partitioner (HandleSingleDevice) runs such an op only on that
device: a conditional on `partition-id == N` whose other branch makes zeros, its result then
broadcast from N (a masked all-reduce) to the devices whose users read it.  Computing it on
every device, as the replicating default does for any op, ran the callback once per device:
eight prints, eight writes to a file, for one in the program.
"""

from __future__ import annotations

from typing import Callable

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import ShardingKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd.handlers import HandlerContext
from hlo_passes.passes.spmd.handlers.fallback import replicated_like
from hlo_passes.passes.spmd.partition_context import PValue


def runs_on_one_device(instr: Instruction) -> bool:
    """A side-effecting op (not a collective: those belong to manual code) sharded maximal (a
    tuple result: every element on the same device, as JAX's ordered callbacks are)."""
    return (_its_device(instr) is not None and not instr.opcode.is_collective and instr.has_side_effect)


def _its_device(instr: Instruction) -> int | None:
    s = instr.sharding if "sharding" in instr.attributes else None
    if s is None:
        return None
    leaves = s.elements if s.is_tuple else (s,)
    devices = {e.device if e.kind is ShardingKind.MAXIMAL else None for e in leaves}
    return devices.pop() if len(devices) == 1 else None


def on_its_device(p: HandlerContext, instr: Instruction) -> PValue:
    device = _its_device(instr)
    assert device is not None
    module = p.ctx.module
    operands = [p.operand_as(instr, i, replicated_like(op.shape)) for i, op in enumerate(instr.operands)]
    args = TupleShape(tuple(op.shape for op in operands))
    result = TupleShape((instr.shape,))
    anchor = p.em.comp

    def branch(suffix: str, body: Callable[[Builder, list[Instruction]], Instruction]) -> Computation:
        comp = Computation(f"{instr.name}.{suffix}")
        param = comp.add(Instruction(Opcode.PARAMETER, args, name="args", parameter_number=0))
        b = Builder(comp)
        comp.root = b.tuple([body(b, [b.get_tuple_element(param, i) for i in range(len(operands))])])
        module.add_computation(comp, before=anchor)
        return comp

    def run(b: Builder, values: list[Instruction]) -> Instruction:
        new = Instruction(instr.opcode, instr.shape, values, name=instr.name,
                          attributes=instr.shared_attributes_without("sharding"),
                          called=dict(instr.called) if instr.called else None, literal=instr.literal)
        return b.comp.add(new, name_hint=instr.name)

    here = branch("on_its_device", run)
    elsewhere = branch("elsewhere", lambda b, values: _zeros(b, instr.shape))
    b = p.em.b()
    packed = b.tuple(operands)
    cond = b.op(Opcode.CONDITIONAL, result, [p.em.is_device(device), packed, packed],
                called={"true_computation": here, "false_computation": elsewhere})
    value = _broadcast_from_owner(p, b, b.get_tuple_element(cond, 0))
    p.remark(instr, f"runs on device {device} only (its sharding), its result broadcast from there", kind="applied")
    return p.reshard(PValue(value, replicated_like(instr.shape), instr.shape), p.target(instr))


def _zeros(b: Builder, shape: Shape) -> Instruction:
    if isinstance(shape, TupleShape):
        return b.tuple([_zeros(b, e) for e in shape.elements])
    assert isinstance(shape, ArrayShape)
    if shape.element_type is PrimitiveType.TOKEN:
        return b.op(Opcode.AFTER_ALL, shape, [])
    zero = b.constant(False if shape.element_type is PrimitiveType.PRED else 0, shape.element_type)
    return b.broadcast(zero, shape) if shape.rank else zero


def _broadcast_from_owner(p: HandlerContext, b: Builder, x: Instruction) -> Instruction:
    """Every array of `x` as the owner holds it (the others hold zeros: an all-reduce adds
    them in); tokens stay each device's own."""
    shape = x.shape
    if isinstance(shape, TupleShape):
        return b.tuple([_broadcast_from_owner(p, b, b.get_tuple_element(x, i)) for i in range(len(shape.elements))])
    assert isinstance(shape, ArrayShape)
    if shape.element_type in (PrimitiveType.TOKEN, PrimitiveType.OPAQUE):
        return x
    return p.em.sum_of_parts(x, [tuple(range(p.n))])


__all__ = ["on_its_device", "runs_on_one_device"]
