"""A reduction as a value: what `to_apply = {a OP b}` means, its identity, its computation.

Three pass families used to recognise reduction computations, name them and spell their
identities ("zero", "lowest") each in their own way.  `Reduction.of(comp)` is the one
recogniser, `reduction.identity` the one identity (the value padding must hold so that it
never changes a result: 0 for add, -inf / the type's minimum for maximum, ...), and
`reduction.computation(module)` the one way to get a module's scalar reducer for it
(shared by name, so a pass that needs `add` over f32 twice adds one computation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType

if TYPE_CHECKING:
    from hlo_passes.ir.module import Module

REDUCTION_OPCODES = frozenset({Opcode.ADD, Opcode.MULTIPLY, Opcode.MAXIMUM, Opcode.MINIMUM,
                               Opcode.AND, Opcode.OR, Opcode.XOR})


@dataclass(frozen=True)
class Reduction:
    """`add` over f32, `maximum` over s32, ...: a scalar binary reduction's meaning."""

    opcode: Opcode
    element_type: PrimitiveType

    @classmethod
    def of(cls, comp: Computation | None) -> "Reduction | None":
        """The meaning of a computation `f(a, b) = a OP b` over scalars of one type, or None
        when it is anything else (extra instructions are allowed: a dead one changes nothing)."""
        if comp is None or len(comp.parameters) != 2 or comp.root is None:
            return None
        root = comp.root
        shape = root.shape
        if root.opcode not in REDUCTION_OPCODES or not isinstance(shape, ArrayShape) or shape.rank != 0:
            return None
        if len(root.operands) != 2 or set(map(id, root.operands)) != set(map(id, comp.parameters)):
            return None
        if any(p.shape != root.shape for p in comp.parameters):
            return None
        return cls(root.opcode, shape.element_type)

    @classmethod
    def of_instruction(cls, instr: Instruction, key: str = "to_apply") -> "Reduction | None":
        """The reduction an instruction applies (its `to_apply`, or another called computation)."""
        called = instr.called.get(key)
        return cls.of(called) if isinstance(called, Computation) else None

    @property
    def name(self) -> str:
        """XLA's opcode name: `add`, `maximum`, ..."""
        return self.opcode.value

    @property
    def identity(self) -> bool | int | float:
        """x OP identity == x for every x of the element type."""
        opcode, etype = self.opcode, self.element_type
        if etype is PrimitiveType.PRED:
            return opcode in (Opcode.MULTIPLY, Opcode.AND, Opcode.MINIMUM)
        if opcode in (Opcode.ADD, Opcode.OR, Opcode.XOR):
            return 0
        if opcode in (Opcode.MULTIPLY,):
            return 1
        if opcode is Opcode.AND:  # all bits set
            if etype.is_float:
                raise ValueError(f"and over {etype.value} is not a reduction")
            return -1 if etype.numpy_dtype().kind == "i" else int(np.iinfo(etype.numpy_dtype()).max)
        if etype.is_float:
            return float("-inf") if opcode is Opcode.MAXIMUM else float("inf")
        info = np.iinfo(etype.numpy_dtype())
        return int(info.min) if opcode is Opcode.MAXIMUM else int(info.max)

    def computation(self, module: Module) -> Computation:
        """The module's scalar computation for this reduction, added before the entry when it is
        not there yet; named `{op}.{type}.reduction` and shared by every user."""
        name = f"{self.name}.{self.element_type.value}.reduction"
        for comp in module.computations:
            if comp.name == name:
                return comp
        comp = Computation(name)
        scalar = ArrayShape(self.element_type, ())
        a = comp.add(Instruction(Opcode.PARAMETER, scalar, name="lhs", parameter_number=0))
        b = comp.add(Instruction(Opcode.PARAMETER, scalar, name="rhs", parameter_number=1))
        comp.root = comp.add(Instruction(self.opcode, scalar, [a, b], name=self.name))
        module.add_computation(comp, before=module.entry)
        return comp
