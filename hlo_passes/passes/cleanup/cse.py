"""cse: common-subexpression elimination within each computation.

    a = f32[8] multiply(p, q)
    b = f32[8] multiply(p, q)            # same opcode, shape, operands, attributes: uses of b use a
    r = f32[8] all-reduce(a), ...
    s = f32[8] all-reduce(a), ...        # a collective: never merged
    ROOT t = tuple(a, b, r, s)      →     ROOT t = tuple(a, a, r, s)

Two instructions merge when their opcode, shape (layouts included unless
`layout-sensitive=false`), operands, typed attribute values (metadata aside), called
computations and literal agree.  Side-effecting instructions (collectives, rng,
side-effecting custom-calls, control flow around them; the IR's per-opcode traits) and
instructions with control dependencies are never merged.  Called computations are
compared by identity, not structure.  XLA's pass of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass

# Attributes that do not change what an instruction computes.
_IGNORED_ATTRIBUTES = frozenset({"metadata", "control-predecessors"})


def _attribute_value(instr: Instruction, key: str) -> Hashable:
    """The typed value; its text when no reader understands it or it is not hashable."""
    try:
        value = instr.attr(key)
        hash(value)
    except (TypeError, ValueError):
        return instr.attributes[key].text(key)
    return value


def cse_key(instr: Instruction, layout_sensitive: bool) -> tuple | None:
    """What two instructions must share to be merged; None when it must never merge."""
    if (instr.has_side_effect or instr.opcode is Opcode.PARAMETER or instr.control_predecessors
            or instr.control_successors):
        return None
    shape = instr.shape if layout_sensitive else instr.shape.to_hlo(with_layout=False)
    attrs = tuple(sorted((k, _attribute_value(instr, k)) for k in instr.attributes
                         if k not in _IGNORED_ATTRIBUTES and k not in instr.called))
    called = tuple(sorted((k, tuple(map(id, v)) if isinstance(v, tuple) else id(v))
                          for k, v in instr.called.items()))
    return (instr.opcode, shape, tuple(map(id, instr.operands)), attrs, called, instr.literal)


@register_pass
class CommonSubexpressionElimination(ModulePass):
    name = "cse"
    summary = "Merge identical side-effect-free instructions within a computation"

    @dataclass(frozen=True)
    class Options:
        layout_sensitive: bool = option(True, "merge only instructions whose layouts agree too")

    def run(self, module: Module) -> bool:
        merged = sum(self._run_on(comp) for comp in module.computations)
        if merged:
            self.remark(None, f"merged {merged} instructions", kind="applied")
        return bool(merged)

    def _run_on(self, comp: Computation) -> int:
        seen: dict[tuple, Instruction] = {}
        merged = 0
        for instr in comp.post_order():  # operands first: their merges show in users' keys
            key = cse_key(instr, self.options.layout_sensitive)
            if key is None:
                continue
            first = seen.setdefault(key, instr)
            if first is not instr:
                comp.replace(instr, first)
                merged += 1
        return merged
