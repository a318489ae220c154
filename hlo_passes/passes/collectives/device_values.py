"""Evaluate small integer expressions of replica-id / partition-id for one device.

Partitioned programs compute "which shard is mine" from the device's id: arithmetic
(`partition-id * 4`), a constant table indexed by the id (`dynamic-slice(constant, id)` and a
reshape), clamps and selects.  Passes that must know the value on every device (does this
dynamic-slice pick exactly this device's shard?) evaluate the expression for each device
instead of matching its spelling.  Anything else (parameters, loops, big arrays) is
`NotDeviceConstant`.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode

MAX_ELEMENTS = 1 << 16


class NotDeviceConstant(Exception):
    """The expression depends on more than the device's ids (or is too big to evaluate)."""


_BINARY = {
    Opcode.ADD: np.add, Opcode.SUBTRACT: np.subtract, Opcode.MULTIPLY: np.multiply,
    Opcode.MAXIMUM: np.maximum, Opcode.MINIMUM: np.minimum, Opcode.AND: np.bitwise_and,
    Opcode.OR: np.bitwise_or, Opcode.XOR: np.bitwise_xor,
}
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}


class DeviceEvaluator:
    """Values of expressions on the device (replica, partition); memoized per instruction."""

    def __init__(self, replica: int, partition: int):
        self.replica = replica
        self.partition = partition
        # Failures are remembered too: asked about many values that all depend on one
        # parameter, the evaluator would otherwise walk down to it again for each.
        self._memo: dict[Instruction, np.ndarray | NotDeviceConstant] = {}

    def __call__(self, instr: Instruction) -> np.ndarray:
        value = self._memo.get(instr)
        if value is None:
            try:
                value = self._eval(instr)
            except NotDeviceConstant as why:
                value = why
            self._memo[instr] = value
        if isinstance(value, NotDeviceConstant):
            raise value
        return value

    def _eval(self, instr: Instruction) -> np.ndarray:
        shape = instr.shape
        if not shape.is_array or shape.element_count > MAX_ELEMENTS:
            raise NotDeviceConstant(f"{instr.name}: not a small array")
        dtype = shape.element_type.numpy_dtype()
        op = instr.opcode
        if op is Opcode.REPLICA_ID:
            return np.asarray(self.replica, dtype)
        if op is Opcode.PARTITION_ID:
            return np.asarray(self.partition, dtype)
        if op is Opcode.CONSTANT:
            return np.asarray(instr.literal_value(), dtype)
        if op is Opcode.IOTA:
            dim = instr.attr("iota_dimension")
            idx = np.arange(shape.dims[dim], dtype=dtype)
            view = [1] * shape.rank
            view[dim] = shape.dims[dim]
            return np.broadcast_to(idx.reshape(view), shape.dims).astype(dtype)
        args = [self(o) for o in instr.operands]
        with np.errstate(over="ignore"):
            if op in _BINARY:
                return np.asarray(_BINARY[op](args[0], args[1]), dtype)
        if op in (Opcode.CONVERT, Opcode.COPY):
            return args[0].astype(dtype)
        if op in (Opcode.RESHAPE, Opcode.BITCAST):
            return args[0].reshape(shape.dims)
        if op is Opcode.BROADCAST:
            dims = instr.attr("dimensions") or ()
            view = [1] * shape.rank
            for i, d in enumerate(dims):
                view[d] = args[0].shape[i]
            return np.broadcast_to(args[0].reshape(view), shape.dims).astype(dtype)
        if op in (Opcode.DIVIDE, Opcode.REMAINDER):
            if np.any(args[1] == 0):
                raise NotDeviceConstant(f"{instr.name}: division by zero")
            if np.issubdtype(dtype, np.integer):
                q = np.trunc(args[0].astype(np.float64) / args[1]).astype(dtype)
                return q if op is Opcode.DIVIDE else np.asarray(args[0] - q * args[1], dtype)
            return np.asarray(np.divide(args[0], args[1]) if op is Opcode.DIVIDE else np.fmod(*args), dtype)
        if op is Opcode.COMPARE:
            return _COMPARE[instr.attr("direction")](args[0], args[1])
        if op is Opcode.SELECT:
            return np.where(args[0], args[1], args[2]).astype(dtype)
        if op is Opcode.CLAMP:
            return np.clip(args[1], args[0], args[2]).astype(dtype)
        if op is Opcode.SLICE:
            spec = instr.attr("slice")
            index = tuple(slice(s, l, st) for s, l, st in zip(spec.starts, spec.limits, spec.strides))
            return args[0][index]
        if op is Opcode.DYNAMIC_SLICE:
            return dynamic_slice(args[0], [int(a) for a in args[1:]], instr.attr("dynamic_slice_sizes"))
        raise NotDeviceConstant(f"{instr.name}: {op.value} is not evaluated per device")


def clamp_start(start: int, dim: int, size: int) -> int:
    """XLA clamps dynamic-slice starts into [0, dim - size]."""
    return max(0, min(start, dim - size))


def dynamic_slice(array: np.ndarray, starts: list[int], sizes) -> np.ndarray:
    starts = [clamp_start(s, d, n) for s, d, n in zip(starts, array.shape, sizes)]
    return array[tuple(slice(s, s + n) for s, n in zip(starts, sizes))]
