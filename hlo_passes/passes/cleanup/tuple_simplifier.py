"""tuple-simplifier: take tuples apart where they were just built, and rebuild nothing.

    t = (f32[2], s32[]) tuple(a, b)
    x = f32[2] get-tuple-element(t), index=0        →   uses of x use a

    e0 = f32[2] get-tuple-element(w), index=0
    e1 = s32[] get-tuple-element(w), index=1
    u = (f32[2], s32[]) tuple(e0, e1)               →   uses of u use w

The second form needs every element, in order, of one tuple of exactly that shape
(layouts included).  Instructions left unused stay for `dce`.  XLA's pass of the same name.
"""

from __future__ import annotations

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import TupleShape
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass


def element_source(gte: Instruction) -> Instruction | None:
    """`a` for get-tuple-element(tuple(..., a, ...)) at a's index."""
    t = gte.operands[0]
    if t.opcode is not Opcode.TUPLE:
        return None
    return t.operands[gte.tuple_index]


def rebuilt_tuple(tup: Instruction) -> Instruction | None:
    """`w` for tuple(gte(w, 0), ..., gte(w, n-1)) over all of w's n elements."""
    ops = tup.operands
    if not ops or any(o.opcode is not Opcode.GET_TUPLE_ELEMENT for o in ops):
        return None
    source = ops[0].operands[0]
    if not isinstance(source.shape, TupleShape) or len(source.shape.elements) != len(ops):
        return None
    if any(o.operands[0] is not source or o.tuple_index != i for i, o in enumerate(ops)):
        return None
    return source if source.shape == tup.shape else None


@register_pass
class TupleSimplifier(ModulePass):
    name = "tuple-simplifier"
    summary = "Fold get-tuple-element of tuple, and tuples rebuilt from all elements of one tuple"

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            for instr in comp.post_order():
                if instr.opcode is Opcode.GET_TUPLE_ELEMENT:
                    replacement = element_source(instr)
                elif instr.opcode is Opcode.TUPLE:
                    replacement = rebuilt_tuple(instr)
                else:
                    continue
                if replacement is None or replacement is instr or replacement.shape != instr.shape:
                    continue
                instr.replace_all_uses_with(replacement)
                changed = True
                if not instr.users and not instr.is_root and not instr.control_successors:
                    comp.remove(instr)
        return changed
