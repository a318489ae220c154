"""call-inliner: replace each `call` by a copy of the computation it calls.

    f { x = f32[4] parameter(0)  ROOT n = f32[4] negate(x) }
    ENTRY e { p = f32[4] parameter(0)  c = f32[4] call(p), to_apply=f  ROOT r = add(c, p) }
      →
    ENTRY e { p = f32[4] parameter(0)  n = f32[4] negate(p)  ROOT r = add(n, p) }

Callees are inlined bottom-up, so calls nested in a callee are flat by the time it is
copied.  Copies are named after the originals (the module's namer adds a suffix: `n.1`)
and keep their metadata.  Calls with control dependencies are left alone.
The callee stays in the module for `dce` to drop once nothing calls it.  XLA's pass of
the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass


def inline_call(call: Instruction) -> Instruction:
    """Copy the callee of `call` into its computation before it; returns the copied root."""
    comp, callee = call.parent, call.called["to_apply"]
    mapping: dict[Instruction, Instruction] = {}
    for instr in callee.post_order():
        if instr.opcode is Opcode.PARAMETER:
            mapping[instr] = call.operands[instr.parameter_number]
            continue
        copy = Instruction(instr.opcode, instr.shape, [mapping[o] for o in instr.operands],
                           name=instr.name, attributes=dict(instr.attributes), called=dict(instr.called),
                           literal=instr.literal)
        mapping[instr] = comp.add(copy, name_hint=instr.name, before=call)
    for instr in callee.instructions:
        for pred in instr.control_predecessors:
            mapping[instr].add_control_predecessor(mapping[pred])
    root = mapping[callee.root]
    call.replace_all_uses_with(root)
    comp.remove(call)
    return root


def inline_calls(module: Module, inlinable: Callable[[Instruction], bool]) -> bool:
    """Inline every call `inlinable` accepts, callees first (so calls nested in a callee are
    flat by the time it is copied); returns whether any was.  (spmd-partition's cleanup passes
    its own choice: all but manual regions' bodies.)"""
    changed = False
    for comp in module.computation_post_order():
        for call in comp.instructions:
            if call.opcode is Opcode.CALL and inlinable(call):
                inline_call(call)
                changed = True
    return changed


@register_pass
class CallInliner(ModulePass):
    name = "call-inliner"
    summary = "Inline every call instruction"

    @dataclass(frozen=True)
    class Options:
        single_call_site: bool = option(False, "only inline computations called from one place")

    def run(self, module: Module) -> bool:
        call_sites: dict[int, int] = {}
        for instr in module.all_instructions():
            for callee in instr.called_computations():
                call_sites[id(callee)] = call_sites.get(id(callee), 0) + 1
        return inline_calls(module, lambda call: self._inlinable(call, call_sites))

    def _inlinable(self, call: Instruction, call_sites: dict[int, int]) -> bool:
        callee = call.called.get("to_apply")
        if not isinstance(callee, Computation):
            return False
        if call.control_predecessors or call.control_successors:
            self.remark(call, "not inlined: the call has control dependencies", kind="missed")
            return False
        if self.options.single_call_site and call_sites.get(id(callee), 0) > 1:
            return False
        return True
