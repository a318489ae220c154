"""Evaluate small integer expressions of replica-id / partition-id for one device.

Partitioned programs compute "which shard is mine" from the device's id: arithmetic
(`partition-id * 4`), a constant table indexed by the id (`dynamic-slice(constant, id)` and a
reshape), clamps and selects.  Passes that must know the value on every device (does this
dynamic-slice pick exactly this device's shard?) evaluate the expression for each device
instead of matching its spelling.  Anything else (parameters, loops, big arrays) is
`NotDeviceConstant`.
"""

from __future__ import annotations

from typing import cast

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


_LEAVES = (Opcode.REPLICA_ID, Opcode.PARTITION_ID, Opcode.CONSTANT, Opcode.IOTA)
_EVALUATED = frozenset({*_LEAVES, *_BINARY, Opcode.CONVERT, Opcode.COPY, Opcode.RESHAPE, Opcode.BITCAST,
                        Opcode.BROADCAST, Opcode.DIVIDE, Opcode.REMAINDER, Opcode.COMPARE, Opcode.SELECT,
                        Opcode.CLAMP, Opcode.SLICE, Opcode.DYNAMIC_SLICE})


class DeviceEvaluator:
    """Values of expressions on the device (replica, partition); memoized per instruction.

    Operands are evaluated first with an explicit stack, not by recursion: the small values of a
    deep model chain through every layer (the dropout RNG's key), deeper than Python's stack.
    Failures are remembered too (without a traceback): asked about many values that all depend
    on one parameter, the evaluator would otherwise walk down to it again for each."""

    def __init__(self, replica: int, partition: int):
        self.replica = replica
        self.partition = partition
        self._memo: dict[Instruction, np.ndarray | NotDeviceConstant] = {}

    def __call__(self, instr: Instruction) -> np.ndarray:
        memo = self._memo
        stack = [instr]
        while stack:
            top = stack[-1]
            if top in memo:
                stack.pop()
                continue
            why = self._not_evaluated(top)
            if why is None and top.opcode not in _LEAVES:
                pending = [o for o in top.operands if o not in memo]
                if pending:
                    stack.extend(pending)
                    continue
                why = next((v for v in (memo[o] for o in top.operands) if isinstance(v, NotDeviceConstant)), None)
            stack.pop()
            if why is not None:
                memo[top] = why
                continue
            try:
                memo[top] = self._eval(top, [cast(np.ndarray, memo[o]) for o in top.operands])
            except NotDeviceConstant as e:
                memo[top] = e.with_traceback(None)
        value = memo[instr]
        if isinstance(value, NotDeviceConstant):
            # A new exception each time: raising the remembered one would grow its traceback
            # by this call's frames on every raise, and those frames (which hold the memo,
            # which holds it) would keep each other, and every instruction they name, alive
            # until the cyclic collector ran: 24,000 tracebacks from one run of
            # weight-update-sharding on the partitioned 24-layer step.
            raise NotDeviceConstant(*value.args)
        return value

    @staticmethod
    def _not_evaluated(instr: Instruction) -> NotDeviceConstant | None:
        """Why `instr` is never evaluated, whatever its operands hold (None: it may be)."""
        shape = instr.shape
        if not shape.is_array or shape.element_count > MAX_ELEMENTS:
            return NotDeviceConstant(f"{instr.name}: not a small array")
        if instr.opcode not in _EVALUATED:
            return NotDeviceConstant(f"{instr.name}: {instr.opcode.value} is not evaluated per device")
        return None

    def _eval(self, instr: Instruction, args: list[np.ndarray]) -> np.ndarray:
        """`instr`'s value from its operands' values `args` (an opcode of `_EVALUATED`)."""
        shape = instr.shape
        dtype = shape.element_type.numpy_dtype()
        op = instr.opcode
        if op is Opcode.REPLICA_ID:
            return np.asarray(self.replica, dtype)
        if op is Opcode.PARTITION_ID:
            return np.asarray(self.partition, dtype)
        if op is Opcode.CONSTANT:
            return np.asarray(instr.literal_value(), dtype)
        if op is Opcode.IOTA:
            dim = instr.iota_dimension
            idx = np.arange(shape.dims[dim], dtype=dtype)
            view = [1] * shape.rank
            view[dim] = shape.dims[dim]
            return np.broadcast_to(idx.reshape(view), shape.dims).astype(dtype)
        with np.errstate(over="ignore"):
            if op in _BINARY:
                return np.asarray(_BINARY[op](args[0], args[1]), dtype)
        if op is Opcode.COPY:
            return args[0].astype(dtype)
        if op is Opcode.CONVERT:
            return xla_convert(args[0], dtype)
        if op in (Opcode.RESHAPE, Opcode.BITCAST):
            return args[0].reshape(shape.dims)
        if op is Opcode.BROADCAST:
            dims = instr.dimensions
            view = [1] * shape.rank
            for i, d in enumerate(dims):
                view[d] = args[0].shape[i]
            return np.broadcast_to(args[0].reshape(view), shape.dims).astype(dtype)
        if op in (Opcode.DIVIDE, Opcode.REMAINDER):
            if np.any(args[1] == 0):
                raise NotDeviceConstant(f"{instr.name}: division by zero")
            if np.issubdtype(dtype, np.integer):
                return _integer_division(args[0], args[1], dtype, remainder=op is Opcode.REMAINDER)
            return np.asarray(np.divide(args[0], args[1]) if op is Opcode.DIVIDE else np.fmod(*args), dtype)
        if op is Opcode.COMPARE:
            return _COMPARE[instr.comparison_direction](args[0], args[1])
        if op is Opcode.SELECT:
            return np.where(args[0], args[1], args[2]).astype(dtype)
        if op is Opcode.CLAMP:
            return np.clip(args[1], args[0], args[2]).astype(dtype)
        if op is Opcode.SLICE:
            spec = instr.slice_spec
            index = tuple(slice(s, l, st) for s, l, st in zip(spec.starts, spec.limits, spec.strides))
            return args[0][index]
        assert op is Opcode.DYNAMIC_SLICE
        return dynamic_slice(args[0], [int(a) for a in args[1:]], instr.dynamic_slice_sizes)


def xla_convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """XLA's convert: a float to an integer truncates toward zero, saturates at the type's
    ends and makes NaN 0 (numpy's cast wraps or gives INT_MIN there: 256.0 → u8 0, where XLA
    gives 255); everything else as numpy (and ml_dtypes) casts, which matches XLA: integers
    wrap, floats round to nearest even."""
    target = np.dtype(dtype)
    if target.kind not in "iu" or np.asarray(x).dtype.kind in "biu":
        return np.asarray(x).astype(target)
    info = np.iinfo(target)
    v = np.asarray(x).astype(np.float64)
    high = v >= float(info.max)   # (float(2^63 - 1) is 2^63: compared, never cast)
    low = v <= float(info.min)
    inside = np.where(np.isnan(v) | high | low, 0.0, np.trunc(v)).astype(target)
    return np.where(high, info.max, np.where(low, info.min, inside)).astype(target)


def _integer_division(a: np.ndarray, b: np.ndarray, dtype: np.dtype, *, remainder: bool) -> np.ndarray:
    """XLA's integer divide (truncating) or remainder (the dividend's sign), exact at any width
    (through Python integers: a float64 quotient loses the low bits past 2^53) and wrapping as
    the type does (INT_MIN / -1 is INT_MIN, INT_MIN % -1 is 0)."""
    target = np.dtype(dtype)
    bits = target.itemsize * 8
    low = -(1 << (bits - 1)) if target.kind == "i" else 0

    def one(x: int, y: int) -> int:
        q = abs(x) // abs(y)
        q = q if (x >= 0) == (y > 0) else -q
        v = x - q * y if remainder else q
        return ((v - low) % (1 << bits)) + low

    xs, ys = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    values = [one(int(x), int(y)) for x, y in zip(xs.reshape(-1).tolist(), ys.reshape(-1).tolist())]
    return np.array(values, dtype=target).reshape(xs.shape)


def clamp_start(start: int, dim: int, size: int) -> int:
    """XLA clamps dynamic-slice starts into [0, dim - size]."""
    return max(0, min(start, dim - size))


def dynamic_slice(array: np.ndarray, starts: list[int], sizes) -> np.ndarray:
    starts = [clamp_start(s, d, n) for s, d, n in zip(starts, array.shape, sizes)]
    return array[tuple(slice(s, s + n) for s, n in zip(starts, sizes))]
