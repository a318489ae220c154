"""Instruction: one HLO op, with its operands, users and called computations.

Instructions are mutable and compared by identity.  The use-def graph is kept
by the IR itself: every change of an operand goes through `set_operand`,
`replace_operand` or `replace_all_uses_with`, which update the users on both
sides, so `users` is always exact.

A big module holds hundreds of thousands of instructions, most of them with one
user, no called computation and no control edges, so those are stored compactly:
`operands` is a tuple, replaced whole when an operand changes (a list, its items held apart,
took 16 bytes more, and 56 for none where the empty tuple is shared: 1.2 MiB of the
partitioner's peak on the 24-layer GPT step; operands seldom change once an instruction is
made); `users` is a read-only view over a single user, a tuple of a few (an ordered set
costs four times as much) or, past `FEW_USERS`, an ordered set (a dict); an instruction
without attributes holds no dict (`attributes` reads as an empty mapping that makes one on
the first write); and `called`, `control_predecessors` and `control_successors` are shared
empty immutables until something is put in them (`called` is replaced by assigning a new
dict; control edges change through `add_control_predecessor`).  The source span the parser gives
each instruction is kept packed in one int (ir/source.py) until it is first read (`span`).

Attribute dicts are shared where they can be: a copy of an instruction (a clone of a module or
computation, the partitioner's per-device instruction, a rollback snapshot) and instructions
given the same attribute slots (`intern_attributes`) hold one `SharedAttributes`, which nobody
writes; an instruction about to change its attributes takes a dict of its own first (copy on
write).  Most attribute sets of a big module are few (`index=0`, `dimensions={0}`, the same few
hundred shardings), and a dict per instruction per copy was the largest part of a copy after
the instruction itself.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Mapping, MutableMapping, cast
from weakref import WeakValueDictionary

from hlo_passes.ir.attributes import (Attr, ConvDimensionLabels, DotDimensions, FrontendAttributes, GatherDimensions,
                                      OpMetadata, ScatterDimensions, ShapeList, SliceSpec, Window, WindowDimension,
                                      reader_for)
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import ArrayShape, Shape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.source import SourceSpan, SpanFields, unpack_span

if TYPE_CHECKING:
    import numpy as np

    from hlo_passes.ir.computation import Computation  # cycle: computation imports this module

# Custom-call targets that have effects even without the side-effect flag.
SIDE_EFFECTING_CUSTOM_CALLS = frozenset({
    "xla.sdy.FuncResultSharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
})

# Attribute keys whose values are computations; printed from the Computation objects.
CALLED_COMPUTATION_KEYS = (
    "to_apply", "calls", "condition", "body", "branch_computations", "true_computation",
    "false_computation", "called_computations", "select", "scatter", "comparator",
)

# Users are kept in a tuple up to this many (adding or removing one copies it), in an
# ordered set (dict) beyond: most instructions have a few users, a constant or a parameter
# may have thousands.
FEW_USERS = 8

# What an instruction holds where it calls nothing / has no control edges; never mutated.
NO_CALLS: Mapping[str, Any] = MappingProxyType({})
NO_CONTROL_EDGES: tuple[()] = ()


class SharedAttributes(dict[str, Attr]):
    """An attribute dict that several instructions (may) hold: read-only.  An instruction that
    is to change its attributes copies it first (`Instruction._own_attributes`); a write to the
    shared dict itself is a bug, and raises."""

    __slots__ = ("__weakref__",)  # (held weakly by the intern table)

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a SharedAttributes is read-only: write through Instruction.attributes")

    __setitem__ = __delitem__ = pop = popitem = setdefault = update = clear = __ior__ = _read_only


# Shared attribute dicts by their (key, slot) items; an entry lives as long as an instruction
# holds its dict.  Slots compare by identity, so only the very same slots make one set.
_INTERNED: "WeakValueDictionary[tuple[tuple[str, Attr], ...], SharedAttributes]" = WeakValueDictionary()


def intern_attributes(items: Iterable[tuple[str, Attr]]) -> SharedAttributes | None:
    """The shared dict of these (key, slot) items, in this order (None for none): one object
    for every instruction given the same slots."""
    key = tuple(items)
    if not key:
        return None
    found = _INTERNED.get(key)
    if found is None:
        found = _INTERNED[key] = SharedAttributes(key)
    return found


class _Rare:
    """The fields few instructions set (a constant's literal, a parameter's number, control
    edges), held together apart from the instruction: see `Instruction._rare`."""

    __slots__ = ("literal", "parameter_number", "control_predecessors", "control_successors")

    def __init__(self) -> None:
        self.literal: str | None = None
        self.parameter_number: int | None = None
        self.control_predecessors: list[Instruction] | tuple[()] = NO_CONTROL_EDGES
        self.control_successors: list[Instruction] | tuple[()] = NO_CONTROL_EDGES


class Instruction:
    # `literal`, `parameter_number` and the control edges are properties over `_rare`, None for
    # the instructions that have none of them (most: all but the constants, the parameters and
    # the few with control edges).  Four slots of their own made every instruction 32 bytes
    # larger (144 bytes where it is now 112, the garbage collector's header included), and a
    # big step holds several hundred thousand instructions while it is partitioned.
    __slots__ = (
        "name", "opcode", "shape", "operands", "_users", "_attributes", "called", "parent", "_rare", "_span",
    )

    def __init__(self, opcode: Opcode, shape: Shape, operands: Iterable["Instruction"] = (),
                 *, name: str = "", attributes: Mapping[str, Attr] | None = None,
                 called: Mapping[str, "Computation | tuple[Computation, ...]"] | None = None,
                 literal: str | None = None, parameter_number: int | None = None,
                 span: SpanFields | SourceSpan | None = None):
        self.name = name or opcode.value
        self.opcode = opcode
        self.shape = shape
        # None, the only user, a tuple of a few, or an ordered set (dict) of users: see `users`.
        self._users: Instruction | tuple[Instruction, ...] | dict[Instruction, None] | None = None
        # See `attributes`: a dict of its own, a shared one (kept as given), or None.
        self._attributes: dict[str, Attr] | None = (
            attributes if type(attributes) is SharedAttributes else dict(attributes) if attributes else None)
        self.called: Mapping[str, Computation | tuple[Computation, ...]] = dict(called) if called else NO_CALLS
        self.parent: Computation | None = None
        self._rare: _Rare | None = None
        if literal is not None or parameter_number is not None:
            rare = self._rare = _Rare()
            rare.literal = literal
            rare.parameter_number = parameter_number
        self._span = span  # see `span`
        self.operands: tuple[Instruction, ...]
        self._init_operands(tuple(operands))

    # ---------------------------------------------------------- rare fields --
    def _rare_fields(self) -> _Rare:
        rare = self._rare
        if rare is None:
            rare = self._rare = _Rare()
        return rare

    @property
    def literal(self) -> str | None:
        """A constant's literal text (None for other ops)."""
        rare = self._rare
        return rare.literal if rare is not None else None

    @literal.setter
    def literal(self, value: str | None) -> None:
        if value is not None or self._rare is not None:
            self._rare_fields().literal = value

    @property
    def parameter_number(self) -> int | None:
        """A parameter's number (None for other ops)."""
        rare = self._rare
        return rare.parameter_number if rare is not None else None

    @parameter_number.setter
    def parameter_number(self, value: int | None) -> None:
        if value is not None or self._rare is not None:
            self._rare_fields().parameter_number = value

    @property
    def control_predecessors(self) -> list["Instruction"] | tuple[()]:
        """The instructions that must run before this one (`control-predecessors={...}`): a list
        once there are any (changed through `add_control_predecessor`)."""
        rare = self._rare
        return rare.control_predecessors if rare is not None else NO_CONTROL_EDGES

    @control_predecessors.setter
    def control_predecessors(self, value: list["Instruction"] | tuple[()]) -> None:
        if value or self._rare is not None:
            self._rare_fields().control_predecessors = value

    @property
    def control_successors(self) -> list["Instruction"] | tuple[()]:
        """The instructions that must run after this one (both ends hold each edge)."""
        rare = self._rare
        return rare.control_successors if rare is not None else NO_CONTROL_EDGES

    @control_successors.setter
    def control_successors(self, value: list["Instruction"] | tuple[()]) -> None:
        if value or self._rare is not None:
            self._rare_fields().control_successors = value

    # ------------------------------------------------------------ operands --
    @property
    def users(self) -> Collection["Instruction"]:
        """The instructions that use this one, each once, in the order they became users (read-only)."""
        users = self._users
        if users is None:
            return ()
        if type(users) is tuple:
            return users
        if type(users) is dict:
            return users.keys()
        return (cast(Instruction, users),)

    def _add_user(self, user: "Instruction") -> None:
        users = self._users
        if users is None:
            self._users = user
        elif type(users) is tuple:
            if user not in users:  # (instructions compare by identity)
                self._users = _with_user(users, user)
        elif type(users) is dict:
            users[user] = None
        elif users is not user:
            self._users = (cast(Instruction, users), user)

    def _remove_user(self, user: "Instruction") -> None:
        users = self._users
        if users is user:
            self._users = None
        elif type(users) is tuple:
            if user in users:
                rest = tuple(u for u in users if u is not user)
                self._users = rest if len(rest) > 1 else rest[0]
        elif type(users) is dict:
            users.pop(user, None)

    def _init_operands(self, operands: tuple["Instruction", ...]) -> None:
        """Take `operands` as this instruction's operands (it has none yet)."""
        self.operands = operands
        for op in operands:  # `_add_user`, inlined: the parser calls this once per instruction
            users = op._users
            if users is None:
                op._users = self
            elif type(users) is tuple:
                if self not in users:
                    op._users = _with_user(users, self)
            elif type(users) is dict:
                users[self] = None
            elif users is not self:
                op._users = (cast(Instruction, users), self)

    def append_operand(self, operand: "Instruction") -> None:
        self.operands = (*self.operands, operand)
        operand._add_user(self)

    def set_operand(self, index: int, new: "Instruction") -> None:
        operands = list(self.operands)
        old = operands[index]
        operands[index] = new
        self.operands = tuple(operands)
        new._add_user(self)
        if old not in self.operands:
            old._remove_user(self)

    def replace_operand(self, old: "Instruction", new: "Instruction") -> None:
        """Every use of `old` among this instruction's operands becomes `new`."""
        self.operands = tuple(new if op is old else op for op in self.operands)
        if old is not new:
            old._remove_user(self)
            new._add_user(self)

    def drop_operands(self) -> None:
        for op in self.operands:
            op._remove_user(self)
        self.operands = ()
        for pred in self.control_predecessors:
            cast("list[Instruction]", pred.control_successors).remove(self)  # holds self: a list
        self.control_predecessors = NO_CONTROL_EDGES

    def replace_all_uses_with(self, new: "Instruction") -> None:
        """Users of `self` use `new` instead; the computation's root moves too, and with it the
        root's sharding when `new` has none (as XLA's ReplaceInstruction copies it: the ENTRY
        root's is the program's result sharding, which a cleanup must not drop)."""
        if new is self:
            return
        for user in list(self.users):
            if user is not new:
                user.replace_operand(self, new)
        if self.parent is not None and self.parent.root is self:
            self.parent.root = new
            slot = self._attributes.get("sharding") if self._attributes is not None else None
            if slot is not None and new.shape == self.shape and "sharding" not in new.attributes:
                new.attributes["sharding"] = slot

    def add_control_predecessor(self, pred: "Instruction") -> None:
        if pred not in self.control_predecessors:
            mine, theirs = self._rare_fields(), pred._rare_fields()
            if not mine.control_predecessors:
                mine.control_predecessors = []
            mine.control_predecessors.append(pred)
            if not theirs.control_successors:
                theirs.control_successors = []
            theirs.control_successors.append(self)

    def move_control_successors_to(self, new: "Instruction") -> None:
        """What had to run after `self` runs after `new` instead (a rewrite that replaces `self`
        by `new`, or by a value computed from `new`).  Both ends hold each edge, so both move."""
        for succ in list(self.control_successors):
            cast("list[Instruction]", succ.control_predecessors).remove(self)
            cast("list[Instruction]", self.control_successors).remove(succ)
            if succ is not new:
                succ.add_control_predecessor(new)

    def move_control_predecessors_to(self, new: "Instruction") -> None:
        """What had to run before `self` runs before `new` instead (see above)."""
        for pred in list(self.control_predecessors):
            cast("list[Instruction]", pred.control_successors).remove(self)
            cast("list[Instruction]", self.control_predecessors).remove(pred)
            if pred is not new:
                new.add_control_predecessor(pred)

    def drop_control_edges(self) -> None:
        """Detach every control edge this instruction has, at both ends (before erasing it
        together with what it was ordered against)."""
        for pred in list(self.control_predecessors):
            cast("list[Instruction]", pred.control_successors).remove(self)
        for succ in list(self.control_successors):
            cast("list[Instruction]", succ.control_predecessors).remove(self)
        if self._rare is not None:
            self._rare.control_predecessors = NO_CONTROL_EDGES
            self._rare.control_successors = NO_CONTROL_EDGES

    # -------------------------------------------------------------- source --
    @property
    def span(self) -> SourceSpan | None:
        """Where the text defined this instruction (see ir/source.py); None when a pass made it."""
        where = self._span
        if where is not None and type(where) is not SourceSpan:  # as the parser stored it
            where = self._span = unpack_span(where)
        return where

    @span.setter
    def span(self, value: SourceSpan | None) -> None:
        self._span = value

    # --------------------------------------------------------------- shape --
    @property
    def array_shape(self) -> ArrayShape:
        """`shape`, where the code reading it needs an array (its dims, rank, element type):
        every op but the tuple-shaped ones.  A TypeError names the instruction otherwise."""
        shape = self.shape
        if not isinstance(shape, ArrayShape):
            raise TypeError(f"{self.name}: expected an array shape, got {shape.to_hlo()}")
        return shape

    # ---------------------------------------------------------- attributes --
    @property
    def attributes(self) -> MutableMapping[str, Attr]:
        """The attribute slots by key, in source order.  Most instructions of a big module have
        none and hold no dict for them (64 bytes each), and many share theirs (see the module
        docstring): for those this is a mapping that reads what the instruction holds and makes
        it a dict of its own on the first write (reads and writes behave as on a dict)."""
        attributes = self._attributes
        return attributes if type(attributes) is dict else _NoAttributes(self)

    @attributes.setter
    def attributes(self, value: dict[str, Attr]) -> None:
        self._attributes = value

    def _own_attributes(self) -> dict[str, Attr]:
        """The instruction's own dict of attributes, made (or copied from a shared one) if it
        has none yet."""
        attributes = self._attributes
        if type(attributes) is not dict:
            attributes = self._attributes = dict(attributes) if attributes else {}
        return attributes

    def shared_attributes(self) -> SharedAttributes | None:
        """The attributes as a shared dict, for a copy of this instruction to hold too (the
        instruction holds it from now on as well; None when it has none).  Not interned: a
        set a pass made is mostly the only one of its kind, and an entry in the intern table
        costs as much as the dict."""
        attributes = self._attributes
        if not attributes:
            return None
        if type(attributes) is not SharedAttributes:
            attributes = self._attributes = SharedAttributes(attributes)
        return attributes

    def attr(self, key: str, default: Any = None) -> Any:
        """Typed value of attribute `key` (read from its text on first use).  Prefer the typed
        views below, which know each opcode's defaults."""
        attributes = self._attributes
        slot = attributes.get(key) if attributes is not None else None
        if slot is None:
            return default
        return slot.value(reader_for(key))

    # --------------------------------------------------------- typed views --
    # What XLA means when an attribute is left out, per opcode, so that passes never read an
    # absent attribute as None.

    @property
    def dimensions(self) -> tuple[int, ...]:
        """`dimensions={...}` (broadcast, transpose, reduce, reverse, sort, concatenate,
        all-gather ...); () when absent."""
        return tuple(self.attr("dimensions") or ())

    @property
    def dot_dimensions(self) -> DotDimensions:
        return DotDimensions(tuple(self.attr("lhs_batch_dims") or ()), tuple(self.attr("rhs_batch_dims") or ()),
                             tuple(self.attr("lhs_contracting_dims") or ()),
                             tuple(self.attr("rhs_contracting_dims") or ()))

    @property
    def window(self) -> Window | None:
        """`window={...}`.  A convolution written without one has a size-1 window per spatial
        dimension (XLA's default: a convolution used as a dot)."""
        w = self.attr("window")
        if w is None and self.opcode is Opcode.CONVOLUTION:
            labels = self.attr("dim_labels")
            spatial = len(labels.input_spatial) if labels is not None else 0
            return Window(tuple(WindowDimension(1) for _ in range(spatial)))
        return cast("Window | None", w)

    @property
    def conv_labels(self) -> ConvDimensionLabels | None:
        return cast("ConvDimensionLabels | None", self.attr("dim_labels"))

    @property
    def feature_group_count(self) -> int:
        return cast(int, self.attr("feature_group_count") or 1)

    @property
    def batch_group_count(self) -> int:
        return cast(int, self.attr("batch_group_count") or 1)

    @property
    def gather_dimensions(self) -> GatherDimensions:
        a = self.attr
        return GatherDimensions(tuple(a("offset_dims") or ()), tuple(a("collapsed_slice_dims") or ()),
                                tuple(a("start_index_map") or ()), a("index_vector_dim", 0) or 0,
                                tuple(a("slice_sizes") or ()), tuple(a("operand_batching_dims") or ()),
                                tuple(a("start_indices_batching_dims") or ()))

    @property
    def scatter_dimensions(self) -> ScatterDimensions:
        a = self.attr
        return ScatterDimensions(tuple(a("update_window_dims") or ()), tuple(a("inserted_window_dims") or ()),
                                 tuple(a("scatter_dims_to_operand_dims") or ()), a("index_vector_dim", 0) or 0,
                                 tuple(a("input_batching_dims") or ()),
                                 tuple(a("scatter_indices_batching_dims") or ()))

    @property
    def replica_groups(self) -> "ReplicaGroups":
        """`replica_groups={...}`; absent or `{}`: one group of every device (read with the
        module's replica and partition counts, see collectives' participant groups)."""
        groups = self.attr("replica_groups")
        return cast(ReplicaGroups, groups) if groups is not None else ReplicaGroups.explicit(())

    @property
    def tuple_index(self) -> int:
        """A get-tuple-element's `index=`."""
        return cast(int, self.attr("index", 0))

    @property
    def use_global_device_ids(self) -> bool:
        """A collective's `use_global_device_ids=true`; false when absent."""
        return bool(self.attr("use_global_device_ids", False))

    @property
    def constrain_layout(self) -> bool:
        """A collective's `constrain_layout=true`; false when absent."""
        return bool(self.attr("constrain_layout", False))

    @property
    def source_target_pairs(self) -> tuple[tuple[int, int], ...]:
        """A collective-permute's `source_target_pairs={{s,t},...}`; () when absent."""
        return cast("tuple[tuple[int, int], ...]", self.attr("source_target_pairs") or ())

    @property
    def fusion_kind(self) -> str | None:
        """A fusion's `kind=` (kLoop, kInput, kOutput, kCustom); None for other opcodes."""
        return cast("str | None", self.attr("kind")) if self.opcode is Opcode.FUSION else None

    @property
    def iota_dimension(self) -> int:
        return cast(int, self.attr("iota_dimension", 0))

    @property
    def comparison_direction(self) -> str | None:
        """A compare's `direction=` (EQ, NE, LT, LE, GT, GE)."""
        return cast("str | None", self.attr("direction"))

    @property
    def slice_spec(self) -> SliceSpec | None:
        """A slice's `slice={[start:limit:stride], ...}`."""
        return cast("SliceSpec | None", self.attr("slice"))

    @property
    def dynamic_slice_sizes(self) -> tuple[int, ...]:
        return tuple(self.attr("dynamic_slice_sizes") or ())

    @property
    def parameter_replication(self) -> tuple[bool, ...] | None:
        """A parameter's `parameter_replication={...}`: one flag per leaf; None when absent."""
        return cast("tuple[bool, ...] | None", self.attr("parameter_replication"))

    @property
    def frontend_attributes(self) -> FrontendAttributes:
        """`frontend_attributes={...}`; empty when absent."""
        return cast(FrontendAttributes, self.attr("frontend_attributes") or FrontendAttributes())

    @property
    def operand_layout_constraints(self) -> tuple[Shape, ...] | None:
        """A custom-call's `operand_layout_constraints={...}`: one shape per operand; None when absent."""
        found = self.attr("operand_layout_constraints")
        return None if found is None else cast(ShapeList, found).shapes

    def set_attr(self, key: str, value: Any) -> None:
        self._own_attributes()[key] = Attr(value=value)

    def shared_attributes_without(self, key: str) -> SharedAttributes | None:
        """`shared_attributes()` less attribute `key`, interned: for a copy that drops it."""
        attributes = self._attributes
        if not attributes:
            return None
        if key not in attributes:
            return self.shared_attributes()
        return intern_attributes((k, v) for k, v in attributes.items() if k != key)

    def set_attr_slot(self, key: str, slot: Attr) -> None:
        """Attribute `key` is `slot`, the result held as an interned shared dict (see the module
        docstring): for a pass giving many instructions the same few slots."""
        attributes = dict(self._attributes or ())
        attributes[key] = slot
        self._attributes = intern_attributes(attributes.items())

    def remove_attr(self, key: str) -> None:
        attributes = self._attributes
        if attributes is not None and key in attributes:
            self._own_attributes().pop(key)

    def has_attr(self, key: str) -> bool:
        attributes = self._attributes
        return attributes is not None and key in attributes

    @property
    def sharding(self) -> Sharding | None:
        return cast("Sharding | None", self.attr("sharding"))

    @sharding.setter
    def sharding(self, value: Sharding | None) -> None:
        if value is None:
            self.remove_attr("sharding")
        else:  # XLA's form: one entry per array leaf, however the value was built
            self.set_attr("sharding", value.flattened())

    @property
    def metadata(self) -> OpMetadata | None:
        return cast("OpMetadata | None", self.attr("metadata"))

    def called_computations(self) -> list["Computation"]:
        if not self.called:  # most instructions; walks over whole modules ask every one
            return []
        result: list[Computation] = []
        for value in self.called.values():
            result.extend(value if isinstance(value, tuple) else (value,))
        return result

    def called_computation(self, key: str) -> "Computation":
        """The one computation called under `key` (`to_apply`, `body`, `condition`, ...)."""
        comp = self.called[key]
        if isinstance(comp, tuple):
            raise TypeError(f"{self.name}: {key} names {len(comp)} computations, expected one")
        return comp

    @property
    def branch_computations(self) -> tuple["Computation", ...]:
        """A conditional's branches: `branch_computations={...}`, or (true, false) for the
        predicated form."""
        if "branch_computations" in self.called:
            comps = self.called["branch_computations"]
            return comps if isinstance(comps, tuple) else (comps,)
        return self.called_computation("true_computation"), self.called_computation("false_computation")

    def literal_value(self) -> "np.ndarray":
        """The constant's values as a numpy array (constants only)."""
        from hlo_passes.ir.literal import literal_array  # deferred: imports numpy, which fmt never needs

        if self.opcode is not Opcode.CONSTANT:
            raise ValueError(f"{self.name} is a {self.opcode.value}, not a constant")
        return literal_array(cast(str, self.literal), cast(ArrayShape, self.shape))

    # -------------------------------------------------------------- traits --
    @property
    def custom_call_target(self) -> str | None:
        return cast("str | None", self.attr("custom_call_target")) if self.opcode is Opcode.CUSTOM_CALL else None

    def _has_own_side_effect(self) -> bool:
        """A side effect of the instruction itself, not of what it calls."""
        if self.opcode.has_side_effect:
            return True
        if self.opcode is Opcode.CUSTOM_CALL:
            return bool(self.attr("custom_call_has_side_effect", False)) or (
                self.custom_call_target in SIDE_EFFECTING_CUSTOM_CALLS)
        return False

    @property
    def has_side_effect(self) -> bool:
        if self._has_own_side_effect():
            return True
        if self.opcode not in _RUNS_ITS_CALLEES:
            return False
        # each called computation once: a body reached along many paths of calls (one calling
        # its callee twice, thirty deep) is 2^30 paths but thirty computations
        seen: set[int] = set()
        work = list(self.called_computations())
        while work:
            comp = work.pop()
            if id(comp) in seen:
                continue
            seen.add(id(comp))
            for instr in comp.instructions:
                if instr._has_own_side_effect():
                    return True
                if instr.opcode in _RUNS_ITS_CALLEES:
                    work.extend(instr.called_computations())
        return False

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    @property
    def channel_id(self) -> int | None:
        return cast("int | None", self.attr("channel_id"))

    def __repr__(self) -> str:
        return f"<{self.opcode.value} %{self.name}: {self.shape.to_hlo(False)}>"


# Opcodes whose called computations' side effects are their own (a reducer's or comparator's
# are not looked into).
_RUNS_ITS_CALLEES = (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL, Opcode.FUSION)


class _NoAttributes(MutableMapping[str, Attr]):
    """`Instruction.attributes` of an instruction that holds no dict of its own (none, or a
    shared one): reads see its attributes (those it holds, or those a write has since given it),
    a write makes its own dict.  Made when asked for, not kept."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Instruction):
        self._owner = owner

    def __getitem__(self, key: str) -> Attr:
        attributes = self._owner._attributes
        if attributes is None:
            raise KeyError(key)
        return attributes[key]

    def __contains__(self, key: object) -> bool:
        attributes = self._owner._attributes
        return attributes is not None and key in attributes

    def get(self, key: str, default: Any = None) -> Any:
        attributes = self._owner._attributes
        return attributes.get(key, default) if attributes is not None else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner._attributes or ())

    def __len__(self) -> int:
        attributes = self._owner._attributes
        return len(attributes) if attributes is not None else 0

    def __setitem__(self, key: str, value: Attr) -> None:
        self._owner._own_attributes()[key] = value

    def __delitem__(self, key: str) -> None:
        attributes = self._owner._attributes
        if attributes is None or key not in attributes:
            raise KeyError(key)
        del self._owner._own_attributes()[key]

    def __repr__(self) -> str:
        return repr(self._owner._attributes or {})


def _with_user(users: tuple[Instruction, ...], user: Instruction) -> "tuple[Instruction, ...] | dict[Instruction, None]":
    """`users` and then `user`: a tuple while they are few, an ordered set past FEW_USERS."""
    if len(users) < FEW_USERS:
        return (*users, user)
    return dict.fromkeys((*users, user))
