"""Builder: the one way passes create new instructions.

    b = Builder(comp, before=user, metadata=user.attributes.get("metadata"))
    pid = b.partition_id()
    off = b.multiply(b.convert(pid, S32), b.constant(4, S32))
    part = b.dynamic_slice(x, [off, b.constant(0, S32)], sizes=(4, 16))

New instructions get unique names from the module's name table (a hint such as
the opcode), are inserted before `before` (or appended), and copy the metadata
slot given, so collectives a pass inserts point back at the user op that caused
them.  Shapes are given by the caller or inferred for the simple cases here.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from hlo_passes.ir.attributes import Attr, PaddingConfig, SliceSpec, quote
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.types import PrimitiveType

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from hlo_passes.ir.module import Module

S32 = PrimitiveType.S32
U32 = PrimitiveType.U32
PRED = PrimitiveType.PRED


class Builder:
    def __init__(self, computation: Computation, *, before: Instruction | None = None,
                 metadata: Attr | None = None):
        self.comp = computation
        self.before = before
        self.metadata = metadata

    # ---------------------------------------------------------------- core --
    def op(self, opcode: Opcode, shape: Shape, operands: Sequence[Instruction] = (), *,
           name: str | None = None,
           called: Mapping[str, Computation | builtins.tuple[Computation, ...]] | None = None,
           literal: str | None = None,
           parameter_number: int | None = None, **attrs: Any) -> Instruction:
        instr = Instruction(opcode, shape, operands, name=name or opcode.value, called=called,
                            literal=literal, parameter_number=parameter_number)
        for key, value in attrs.items():
            if value is not None:
                instr.set_attr(key.replace("control_predecessors", "control-predecessors"), value)
        if self.metadata is not None:
            instr.attributes["metadata"] = self.metadata
        return self.comp.add(instr, name_hint=instr.name, before=self.before)

    # ----------------------------------------------------------- constants --
    def constant(self, value: float, element_type: PrimitiveType = S32) -> Instruction:
        """A scalar constant."""
        if element_type is PRED:
            text = "true" if value else "false"
        elif element_type.is_complex:  # written (real, imag)
            c = complex(value)
            text = f"({float(c.real)!r}, {float(c.imag)!r})"
        elif element_type.is_float:
            text = repr(float(value)).replace("inf", "inf")
        else:
            text = str(int(value))
        return self.op(Opcode.CONSTANT, ArrayShape(element_type, ()), literal=text, name="constant")

    def constant_array(self, values: Sequence[int], element_type: PrimitiveType = S32) -> Instruction:
        """A rank-1 constant, e.g. an offset table indexed by partition id."""
        text = "{" + ", ".join(str(int(v)) for v in values) + "}"
        return self.op(Opcode.CONSTANT, ArrayShape(element_type, (len(values),)), literal=text, name="constant")

    def constant_from_array(self, values: ArrayLike, element_type: PrimitiveType) -> Instruction:
        """A constant of any rank holding `values` (a numpy array)."""
        import numpy as np

        from hlo_passes.ir.literal import format_literal  # deferred: imports numpy

        arr = np.asarray(values)
        return self.op(Opcode.CONSTANT, ArrayShape(element_type, tuple(arr.shape)),
                       literal=format_literal(arr), name="constant")

    # --------------------------------------------------------- elementwise --
    def _binary(self, opcode: Opcode, a: Instruction, b: Instruction, **attrs: Any) -> Instruction:
        return self.op(opcode, _strip_layout_like(a.shape), [a, b], **attrs)

    def add(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.ADD, a, b)

    def subtract(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.SUBTRACT, a, b)

    def multiply(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.MULTIPLY, a, b)

    def divide(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.DIVIDE, a, b)

    def maximum(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.MAXIMUM, a, b)

    def minimum(self, a: Instruction, b: Instruction) -> Instruction:
        return self._binary(Opcode.MINIMUM, a, b)

    def compare(self, a: Instruction, b: Instruction, direction: str) -> Instruction:
        a_shape = _array(a)
        shape = ArrayShape(PRED, a_shape.dims, a_shape.dynamic, a_shape.layout)
        return self.op(Opcode.COMPARE, shape, [a, b], direction=direction)

    def select(self, pred: Instruction, on_true: Instruction, on_false: Instruction) -> Instruction:
        return self.op(Opcode.SELECT, on_true.shape, [pred, on_true, on_false])

    def convert(self, a: Instruction, element_type: PrimitiveType) -> Instruction:
        return self.op(Opcode.CONVERT, _array(a).with_element_type(element_type), [a])

    # --------------------------------------------------------------- shape --
    def broadcast(self, a: Instruction, shape: ArrayShape, dimensions: Sequence[int] = ()) -> Instruction:
        return self.op(Opcode.BROADCAST, shape, [a], dimensions=tuple(dimensions))

    def reshape(self, a: Instruction, shape: ArrayShape) -> Instruction:
        return self.op(Opcode.RESHAPE, shape, [a])

    def transpose(self, a: Instruction, permutation: Sequence[int]) -> Instruction:
        dims = tuple(_array(a).dims[p] for p in permutation)
        return self.op(Opcode.TRANSPOSE, _array(a).with_dims(dims), [a], dimensions=tuple(permutation))

    def slice(self, a: Instruction, starts: Sequence[int], limits: Sequence[int],
              strides: Sequence[int] | None = None) -> Instruction:
        strides = tuple(strides or (1,) * len(starts))
        dims = tuple(-(-(l - s) // st) for s, l, st in zip(starts, limits, strides))
        return self.op(Opcode.SLICE, _array(a).with_dims(dims), [a],
                       slice=SliceSpec(tuple(starts), tuple(limits), strides))

    def dynamic_slice(self, a: Instruction, offsets: Sequence[Instruction], sizes: Sequence[int]) -> Instruction:
        return self.op(Opcode.DYNAMIC_SLICE, _array(a).with_dims(tuple(sizes)), [a, *offsets],
                       dynamic_slice_sizes=tuple(sizes))

    def dynamic_update_slice(self, a: Instruction, update: Instruction, offsets: Sequence[Instruction]) -> Instruction:
        return self.op(Opcode.DYNAMIC_UPDATE_SLICE, a.shape, [a, update, *offsets])

    def pad(self, a: Instruction, value: Instruction, config: PaddingConfig) -> Instruction:
        dims = tuple(d + lo + hi + max(d - 1, 0) * it for d, (lo, hi, it) in zip(_array(a).dims, config.dimensions))
        return self.op(Opcode.PAD, _array(a).with_dims(dims), [a, value], padding=config)

    def concatenate(self, parts: Sequence[Instruction], dimension: int) -> Instruction:
        dims = list(_array(parts[0]).dims)
        dims[dimension] = sum(_array(p).dims[dimension] for p in parts)
        return self.op(Opcode.CONCATENATE, _array(parts[0]).with_dims(dims), parts, dimensions=(dimension,))

    def iota(self, shape: ArrayShape, dimension: int) -> Instruction:
        return self.op(Opcode.IOTA, shape, iota_dimension=dimension)

    def tuple(self, elements: Sequence[Instruction]) -> Instruction:
        return self.op(Opcode.TUPLE, TupleShape(tuple(e.shape for e in elements)), elements)

    def get_tuple_element(self, t: Instruction, index: int) -> Instruction:
        return self.op(Opcode.GET_TUPLE_ELEMENT, cast(TupleShape, t.shape).elements[index], [t], index=index)

    def reduce(self, a: Instruction, init: Instruction, dimensions: Sequence[int],
               to_apply: Computation) -> Instruction:
        dims = tuple(d for i, d in enumerate(_array(a).dims) if i not in dimensions)
        return self.op(Opcode.REDUCE, _array(a).with_dims(dims), [a, init], dimensions=tuple(dimensions),
                       called={"to_apply": to_apply})

    # --------------------------------------------------------- collectives --
    def partition_id(self) -> Instruction:
        return self.op(Opcode.PARTITION_ID, ArrayShape(U32, ()))

    def replica_id(self) -> Instruction:
        return self.op(Opcode.REPLICA_ID, ArrayShape(U32, ()))

    def all_reduce(self, operands: Sequence[Instruction], groups: ReplicaGroups, reduction: Computation,
                   *, channel_id: int | None = None, use_global_device_ids: bool | None = None,
                   shape: Shape | None = None) -> Instruction:
        if shape is None:
            shape = operands[0].shape if len(operands) == 1 else TupleShape(tuple(o.shape for o in operands))
        return self.op(Opcode.ALL_REDUCE, shape, operands, channel_id=channel_id, replica_groups=groups,
                       use_global_device_ids=use_global_device_ids, called={"to_apply": reduction})

    def all_gather(self, operand: Instruction, dimension: int, groups: ReplicaGroups, *,
                   channel_id: int | None = None, use_global_device_ids: bool | None = None) -> Instruction:
        n = len(groups.groups[0])
        dims = list(_array(operand).dims)
        dims[dimension] *= n
        return self.op(Opcode.ALL_GATHER, _array(operand).with_dims(dims), [operand], channel_id=channel_id,
                       replica_groups=groups, dimensions=(dimension,),
                       use_global_device_ids=use_global_device_ids)

    def reduce_scatter(self, operand: Instruction, dimension: int, groups: ReplicaGroups,
                       reduction: Computation, *, channel_id: int | None = None,
                       use_global_device_ids: bool | None = None) -> Instruction:
        n = len(groups.groups[0])
        dims = list(_array(operand).dims)
        dims[dimension] //= n
        return self.op(Opcode.REDUCE_SCATTER, _array(operand).with_dims(dims), [operand],
                       channel_id=channel_id, replica_groups=groups, dimensions=(dimension,),
                       use_global_device_ids=use_global_device_ids, called={"to_apply": reduction})

    def all_to_all(self, operand: Instruction, split_dimension: int, groups: ReplicaGroups, *,
                   channel_id: int | None = None) -> Instruction:
        return self.op(Opcode.ALL_TO_ALL, operand.shape, [operand], channel_id=channel_id,
                       replica_groups=groups, dimensions=(split_dimension,))

    def collective_permute(self, operand: Instruction, pairs: Sequence[builtins.tuple[int, int]], *,
                           channel_id: int | None = None) -> Instruction:
        return self.op(Opcode.COLLECTIVE_PERMUTE, operand.shape, [operand], channel_id=channel_id,
                       source_target_pairs=tuple(tuple(p) for p in pairs))


def _strip_layout_like(shape: Shape) -> Shape:
    return shape


def _array(instr: Instruction) -> ArrayShape:
    """`instr`'s shape, where the op being built takes an array."""
    return cast(ArrayShape, instr.shape)


def next_channel_id(module: Module) -> int:
    """A fresh channel id (Module.new_channel_id, the module's allocator)."""
    return module.new_channel_id()


def reduction_computation(module: Module, kind: str, element_type: PrimitiveType) -> Computation:
    """The module's scalar reducer `kind` (`add`, `maximum`, ...) over `element_type`:
    `Reduction(...).computation(module)` for callers that hold the name."""
    from hlo_passes.ir.reduction import Reduction  # deferred: imports numpy

    return Reduction(Opcode(kind), element_type).computation(module)


__all__ = ["Builder", "next_channel_id", "quote", "reduction_computation"]
