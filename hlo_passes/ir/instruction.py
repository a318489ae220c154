"""Instruction: one HLO op, with its operands, users and called computations.

Instructions are mutable and compared by identity.  The use-def graph is kept
by the IR itself: every change of an operand goes through `set_operand`,
`replace_operand` or `replace_all_uses_with`, which update the users on both
sides, so `users` is always exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from hlo_passes.ir.attributes import Attr, OpMetadata
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import Shape
from hlo_passes.ir.sharding import Sharding

if TYPE_CHECKING:
    from hlo_passes.ir.computation import Computation

# Custom-call targets that have effects even without the side-effect flag.
SIDE_EFFECTING_CUSTOM_CALLS = frozenset({
    "xla.sdy.FuncResultSharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
})

# Attribute keys whose values are computations; printed from the Computation objects.
CALLED_COMPUTATION_KEYS = (
    "to_apply", "calls", "condition", "body", "branch_computations", "true_computation",
    "false_computation", "called_computations", "select", "scatter", "comparator",
)


class Instruction:
    __slots__ = (
        "name", "opcode", "shape", "operands", "users", "attributes", "called", "parent",
        "control_predecessors", "control_successors", "literal", "parameter_number", "__weakref__",
    )

    def __init__(self, opcode: Opcode, shape: Shape, operands: Iterable["Instruction"] = (),
                 *, name: str = "", attributes: dict[str, Attr] | None = None,
                 called: dict[str, "Computation | tuple[Computation, ...]"] | None = None,
                 literal: str | None = None, parameter_number: int | None = None):
        self.name = name or opcode.value
        self.opcode = opcode
        self.shape = shape
        self.operands: list[Instruction] = []
        self.users: dict[Instruction, None] = {}  # ordered set
        self.attributes: dict[str, Attr] = dict(attributes or {})
        self.called: dict[str, Computation | tuple[Computation, ...]] = dict(called or {})
        self.parent: Computation | None = None
        self.control_predecessors: list[Instruction] = []
        self.control_successors: list[Instruction] = []
        self.literal = literal
        self.parameter_number = parameter_number
        for op in operands:
            self.append_operand(op)

    # ------------------------------------------------------------ operands --
    def append_operand(self, operand: "Instruction") -> None:
        self.operands.append(operand)
        operand.users[self] = None

    def set_operand(self, index: int, new: "Instruction") -> None:
        old = self.operands[index]
        self.operands[index] = new
        new.users[self] = None
        if old not in self.operands:
            old.users.pop(self, None)

    def replace_operand(self, old: "Instruction", new: "Instruction") -> None:
        """Every use of `old` among this instruction's operands becomes `new`."""
        for i, op in enumerate(self.operands):
            if op is old:
                self.operands[i] = new
        if old is not new:
            old.users.pop(self, None)
            new.users[self] = None

    def drop_operands(self) -> None:
        for op in self.operands:
            op.users.pop(self, None)
        self.operands = []
        for pred in self.control_predecessors:
            pred.control_successors.remove(self)
        self.control_predecessors = []

    def replace_all_uses_with(self, new: "Instruction") -> None:
        """Users of `self` use `new` instead; the computation's root moves too."""
        if new is self:
            return
        for user in list(self.users):
            if user is not new:
                user.replace_operand(self, new)
        if self.parent is not None and self.parent.root is self:
            self.parent.root = new

    def add_control_predecessor(self, pred: "Instruction") -> None:
        if pred not in self.control_predecessors:
            self.control_predecessors.append(pred)
            pred.control_successors.append(self)

    # ---------------------------------------------------------- attributes --
    def attr(self, key: str, default: Any = None) -> Any:
        """Typed value of attribute `key` (read from its text on first use)."""
        slot = self.attributes.get(key)
        if slot is None:
            return default
        from hlo_passes.parse.attribute_reader import reader_for

        return slot.value(reader_for(key))

    def set_attr(self, key: str, value: Any) -> None:
        self.attributes[key] = Attr(value=value)

    def remove_attr(self, key: str) -> None:
        self.attributes.pop(key, None)

    def has_attr(self, key: str) -> bool:
        return key in self.attributes

    @property
    def sharding(self) -> Sharding | None:
        return self.attr("sharding")

    @sharding.setter
    def sharding(self, value: Sharding | None) -> None:
        if value is None:
            self.remove_attr("sharding")
        else:
            self.set_attr("sharding", value)

    @property
    def metadata(self) -> OpMetadata | None:
        return self.attr("metadata")

    def called_computations(self) -> list["Computation"]:
        result = []
        for value in self.called.values():
            result.extend(value if isinstance(value, tuple) else (value,))
        return result

    def literal_value(self):
        """The constant's values as a numpy array (constants only)."""
        from hlo_passes.ir.literal import literal_array

        if self.opcode is not Opcode.CONSTANT:
            raise ValueError(f"{self.name} is a {self.opcode.value}, not a constant")
        return literal_array(self.literal, self.shape)

    # -------------------------------------------------------------- traits --
    @property
    def custom_call_target(self) -> str | None:
        return self.attr("custom_call_target") if self.opcode is Opcode.CUSTOM_CALL else None

    @property
    def has_side_effect(self) -> bool:
        if self.opcode.has_side_effect:
            return True
        if self.opcode is Opcode.CUSTOM_CALL:
            return bool(self.attr("custom_call_has_side_effect", False)) or (
                self.custom_call_target in SIDE_EFFECTING_CUSTOM_CALLS)
        if self.opcode in (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL, Opcode.FUSION):
            return any(i.has_side_effect for c in self.called_computations() for i in c.instructions)
        return False

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    @property
    def channel_id(self) -> int | None:
        return self.attr("channel_id")

    def __repr__(self) -> str:
        return f"<{self.opcode.value} %{self.name}: {self.shape.to_hlo(False)}>"
