"""Per-opcode operand counts and shape inference, as a rule table with a default.

A rule takes an instruction and returns the shape its operands imply (compared
with the declared shape on dimensions and element types, never layouts), or
None when only operand constraints were checked; it raises `ShapeProblem` when
the operands themselves do not fit the opcode.  Opcodes without a rule (custom
calls, async wrappers, ...) pass: XLA accepts modules this table does not
understand, and so must we.

The same rules infer the shape of an instruction written without one
(`ROOT v = abs(a)`): the parser builds the instruction with `shape=None` and
calls `infer_shape`, for the opcodes XLA infers (`INFERABLE`).  A rule reads the
declared shape only where XLA lets it differ from the operands' (a dot's result
type), through `_declared`, which is None while inferring.

    p = f32[2,3] parameter(0)
    q = f32[3,4] parameter(1)
    d = f32[2,5] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    # -> "d: expected f32[2,4] from the operands, got f32[2,5]"
"""

from __future__ import annotations

from typing import Callable

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_TERNARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.ir.shape import TOKEN_SHAPE as TOKEN
from hlo_passes.ir.shape import ArrayShape, Layout, Shape, TupleShape
from hlo_passes.ir.types import PrimitiveType

PRED = PrimitiveType.PRED


class ShapeProblem(Exception):
    """The operands of an instruction do not fit its opcode (message says what was expected)."""


# ----------------------------------------------------------- comparisons --
def same_shape(a: Shape, b: Shape, *, element_types: bool = True) -> bool:
    """Equal dimensions (and element types), ignoring layouts and dynamic-ness."""
    if a is b:
        return True
    if type(a) is ArrayShape:
        return (type(b) is ArrayShape and a.dims == b.dims
                and (not element_types or a.element_type is b.element_type))
    if type(b) is not TupleShape or len(a.elements) != len(b.elements):  # type: ignore[union-attr]
        return False
    return all(same_shape(x, y, element_types=element_types)
               for x, y in zip(a.elements, b.elements))  # type: ignore[union-attr]


def text(shape: Shape) -> str:
    return shape.to_hlo(with_layout=False)


# -------------------------------------------------------- operand counts --
# (minimum, maximum or None for unbounded); checked like XLA's parser does.
_UNARY, _BINARY, _TERNARY = (1, 1), (2, 2), (3, 3)
OPERAND_COUNTS: dict[Opcode, tuple[int, int | None]] = {
    **{op: _UNARY for op in ELEMENTWISE_UNARY},
    **{op: _BINARY for op in ELEMENTWISE_BINARY},
    **{op: _TERNARY for op in ELEMENTWISE_TERNARY},
    Opcode.BROADCAST: _UNARY, Opcode.RESHAPE: _UNARY, Opcode.TRANSPOSE: _UNARY,
    Opcode.SLICE: _UNARY, Opcode.REVERSE: _UNARY, Opcode.BITCAST: _UNARY,
    Opcode.GET_TUPLE_ELEMENT: _UNARY, Opcode.GET_DIMENSION_SIZE: _UNARY, Opcode.WHILE: _UNARY,
    Opcode.OPTIMIZATION_BARRIER: _UNARY, Opcode.CHOLESKY: _UNARY, Opcode.FFT: _UNARY,
    Opcode.DOT: (2, 4), Opcode.PAD: _BINARY, Opcode.RNG: _BINARY, Opcode.TRIANGULAR_SOLVE: _BINARY,
    Opcode.SET_DIMENSION_SIZE: _BINARY, Opcode.CONVOLUTION: _BINARY, Opcode.GATHER: _BINARY,
    Opcode.REDUCE_WINDOW: (2, None), Opcode.SELECT_AND_SCATTER: _TERNARY,
    Opcode.IOTA: (0, 0), Opcode.REPLICA_ID: (0, 0), Opcode.PARTITION_ID: (0, 0),
    Opcode.REDUCE: (2, None), Opcode.CONCATENATE: (1, None), Opcode.SORT: (1, None),
    Opcode.DYNAMIC_SLICE: (2, None), Opcode.DYNAMIC_UPDATE_SLICE: (3, None),
    Opcode.CONDITIONAL: (1, None), Opcode.ALL_REDUCE: (1, None), Opcode.ALL_GATHER: (1, None),
    Opcode.REDUCE_SCATTER: (1, None), Opcode.ALL_TO_ALL: (1, None),
    Opcode.COLLECTIVE_PERMUTE: (1, None), Opcode.MAP: (1, None), Opcode.SCATTER: (3, None),
    Opcode.ADD_DEPENDENCY: _BINARY, Opcode.DOMAIN: _UNARY, Opcode.TOPK: _UNARY,
    Opcode.BATCH_NORM_TRAINING: _TERNARY, Opcode.BATCH_NORM_INFERENCE: (5, 5), Opcode.BATCH_NORM_GRAD: (5, 5),
    Opcode.RAGGED_DOT: (3, 3), Opcode.SCALED_DOT: (4, 4), Opcode.INFEED: _UNARY, Opcode.OUTFEED: _BINARY,
    Opcode.SEND: _BINARY, Opcode.RECV: _UNARY, Opcode.SEND_DONE: _UNARY, Opcode.RECV_DONE: _UNARY,
    Opcode.COPY_START: _UNARY, Opcode.COPY_DONE: _UNARY, Opcode.ALL_GATHER_DONE: _UNARY,
    Opcode.ALL_REDUCE_DONE: _UNARY, Opcode.COLLECTIVE_PERMUTE_DONE: _UNARY, Opcode.REDUCE_PRECISION: _UNARY,
    Opcode.RNG_GET_AND_UPDATE_STATE: (0, 0), Opcode.ASYNC_DONE: _UNARY,
}


def operand_count_problem(instr: Instruction) -> str | None:
    bounds = OPERAND_COUNTS.get(instr.opcode)
    if bounds is None:
        return None
    n = len(instr.operands)
    low, high = bounds
    if low <= n and (high is None or n <= high):
        if instr.opcode in (Opcode.REDUCE, Opcode.REDUCE_WINDOW) and n % 2:
            return f"expects an even number of operands (inputs, then init values), but has {n}"
        if instr.opcode is Opcode.SCATTER and n % 2 == 0:
            return f"expects an odd number of operands (inputs, indices, updates), but has {n}"
        return None
    if low == high:
        want = f"{low} operand" + ("" if low == 1 else "s")
    elif high is None:
        want = f"at least {low} operands"
    else:
        want = f"{low} to {high} operands"
    return f"expects {want}, but has {n}"


# ------------------------------------------------------------- helpers --
def _array(instr: Instruction, what: str = "operand") -> ArrayShape:
    if type(instr.shape) is not ArrayShape:
        raise ShapeProblem(f"{what} {instr.name} must be an array, got {text(instr.shape)}")
    return instr.shape  # type: ignore[return-value]


def _ints(instr: Instruction, key: str) -> tuple[int, ...]:
    value = instr.attr(key, ())
    return tuple(value)


def _declared(instr: Instruction) -> Shape | None:
    """The written result shape, or None while the parser infers it."""
    return instr.shape


def _need(instr: Instruction, key: str):
    value = instr.attr(key)
    if value is None:
        raise ShapeProblem(f"needs the attribute {key}")
    return value


def _check_dims(dims, rank: int, what: str) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise ShapeProblem(f"{what} {d} is out of range for rank {rank}")
    if len(set(dims)) != len(dims):
        raise ShapeProblem(f"{what} {list(dims)} repeat a dimension")


def check_reducer(instr: Instruction, key: str, accumulators) -> None:
    """The computation under `key` (reduce, all-reduce, reduce-scatter) combines scalars of the
    accumulator types: 2·n scalar parameters, a scalar root (a tuple of n for a variadic reduce),
    all of the accumulators' element types exactly (XLA rejects an f32 computation reducing
    bf16 values, and the other way round)."""
    comp = _called(instr, key)
    if comp is None or isinstance(comp, tuple):
        return
    n = len(accumulators)
    params = comp.parameters
    if len(params) != 2 * n:
        raise ShapeProblem(f"{key}={comp.name} takes {len(params)} parameters; combining {n} value"
                           f"{'s' if n > 1 else ''} needs {2 * n}")
    root = comp.root.shape if comp.root is not None else None
    results = root.elements if type(root) is TupleShape and n > 1 else (root,)
    for i, t in enumerate(accumulators):
        for what, shape in ((f"parameter {i}", params[i].shape if params[i] else None),
                            (f"parameter {n + i}", params[n + i].shape if params[n + i] else None),
                            ("result" if n == 1 else f"result {i}", results[i] if i < len(results) else None)):
            if shape is None:
                continue
            if type(shape) is not ArrayShape or shape.dims:
                raise ShapeProblem(f"{key}={comp.name}: {what} must be a scalar, got {text(shape)}")
            if shape.element_type is not t:
                raise ShapeProblem(f"{key}={comp.name}: {what} is {text(shape)}, but it combines "
                                   f"{t.value} values")


# ----------------------------------------------------------- elementwise --
# Unary ops whose result has the operand's element type.
_SAME_TYPE_UNARY = frozenset({
    Opcode.ACOS, Opcode.ACOSH, Opcode.ASIN, Opcode.ASINH, Opcode.ATANH, Opcode.COSH, Opcode.SINH,
    Opcode.CBRT, Opcode.CEIL, Opcode.CLZ, Opcode.COPY, Opcode.COS, Opcode.ERF, Opcode.EXP,
    Opcode.EXPM1, Opcode.FLOOR, Opcode.LOG, Opcode.LOG1P, Opcode.LOGISTIC, Opcode.NEGATE,
    Opcode.NOT, Opcode.POPCNT, Opcode.REDUCE_PRECISION, Opcode.ROUND_NEAREST_AFZ,
    Opcode.ROUND_NEAREST_EVEN, Opcode.RSQRT, Opcode.SIGN, Opcode.SIN, Opcode.SQRT, Opcode.TAN,
    Opcode.TANH,
})
_COMPLEX_PART = {PrimitiveType.C64: PrimitiveType.F32, PrimitiveType.C128: PrimitiveType.F64}
_REAL_TO_COMPLEX = {PrimitiveType.F32: PrimitiveType.C64, PrimitiveType.F64: PrimitiveType.C128}
_NOT_SAME_TYPE_BINARY = frozenset({Opcode.COMPARE, Opcode.COMPLEX, Opcode.STOCHASTIC_CONVERT})


def _same_type_unary(instr: Instruction) -> Shape | None:
    x = instr.operands[0].shape
    if instr.opcode is Opcode.COPY:
        return x  # copies tuples too (XLA's verifier allows it; its propagation tests use it)
    if type(x) is not ArrayShape:
        _array(instr.operands[0])
    return x


def _unary(instr: Instruction) -> Shape | None:
    x = instr.operands[0].shape
    op = instr.opcode
    if op is Opcode.COPY:
        return x  # copies tuples too
    if type(x) is not ArrayShape:
        _array(instr.operands[0])
    if op is Opcode.IS_FINITE:
        return _retyped(x, PRED)
    if op is Opcode.ABS or op is Opcode.REAL or op is Opcode.IMAG:
        return _retyped(x, _COMPLEX_PART.get(x.element_type, x.element_type))
    result = _array(instr, "result")
    if op is Opcode.BITCAST_CONVERT and result.element_type.bit_width != x.element_type.bit_width:
        return None  # the dimensions gain or lose a minor dimension; not checked
    # convert, bitcast-convert: same dimensions, any element type
    return ArrayShape(result.element_type, x.dims)


def _retyped(x: ArrayShape, element_type: PrimitiveType) -> ArrayShape:
    """`x` with another element type, its layout kept (as XLA's inference keeps it)."""
    return ArrayShape(element_type, x.dims, x.dynamic, x.layout, x.unbounded)


def _default_layout(x: ArrayShape) -> ArrayShape:
    """`x` without a layout: XLA infers these results with the default one."""
    return ArrayShape(x.element_type, x.dims, x.dynamic, None, x.unbounded)


def _binary_operands(instr: Instruction) -> tuple[ArrayShape, ArrayShape]:
    a, b = instr.operands[0].shape, instr.operands[1].shape
    if type(a) is not ArrayShape or type(b) is not ArrayShape:
        _array(instr.operands[0]), _array(instr.operands[1])
    if a.dims != b.dims:
        raise ShapeProblem(f"operands must have the same dimensions, got {text(a)} and {text(b)} "
                           "(HLO has no implicit broadcasting)")
    return a, b  # type: ignore[return-value]


def _same_type_binary(instr: Instruction) -> Shape | None:
    a, b = _binary_operands(instr)
    if a.element_type is not b.element_type:
        raise ShapeProblem(f"operands must have the same element type, got {text(a)} and {text(b)}")
    return a


def _binary(instr: Instruction) -> Shape | None:
    """compare, complex, stochastic-convert: the result type differs from the operands'."""
    a, b = _binary_operands(instr)
    op = instr.opcode
    if op is Opcode.STOCHASTIC_CONVERT:
        return ArrayShape(_array(instr, "result").element_type, a.dims)
    if a.element_type is not b.element_type:
        raise ShapeProblem(f"operands must have the same element type, got {text(a)} and {text(b)}")
    if op is Opcode.COMPARE:
        return _retyped(a, PRED)
    return _retyped(a, _REAL_TO_COMPLEX.get(a.element_type, a.element_type))


def _ternary(instr: Instruction) -> Shape | None:
    shapes = [o.shape for o in instr.operands]
    if instr.opcode is Opcode.SELECT:
        pred, on_true, on_false = shapes
        if not same_shape(on_true, on_false):
            raise ShapeProblem(f"select branches differ: {text(on_true)} and {text(on_false)}")
        if type(pred) is not ArrayShape or pred.element_type is not PRED:
            raise ShapeProblem(f"select predicate must be pred, got {text(pred)}")
        if pred.dims and (type(on_true) is not ArrayShape or pred.dims != on_true.dims):
            raise ShapeProblem(f"select predicate {text(pred)} does not match {text(on_true)}")
        return _retyped(pred, on_true.element_type) if pred.dims else on_true  # XLA: the predicate's layout
    low, x, high = (_array(o) for o in instr.operands)
    for bound in (low, high):
        if bound.dims and bound.dims != x.dims:
            raise ShapeProblem(f"clamp bound {text(bound)} must be a scalar or match {text(x)}")
    return x


# ------------------------------------------------------------ data movement --
def _broadcast(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    dims = _ints(instr, "dimensions")
    if _declared(instr) is None:
        # XLA infers a broadcast by reading `dimensions` as new major sizes (its old
        # Broadcast(operand, sizes) form): f32[3] with dimensions={2} gives f32[2,3].
        if any(d < 0 for d in dims):
            raise ShapeProblem(f"broadcast sizes {list(dims)} must not be negative")
        return ArrayShape(x.element_type, tuple(dims) + x.dims)
    result = _array(instr, "result")
    if len(dims) != x.rank:
        raise ShapeProblem(f"dimensions={{{','.join(map(str, dims))}}} must name one result dimension "
                           f"per operand dimension of {text(x)}")
    _check_dims(dims, result.rank, "broadcast dimension")
    for i, d in enumerate(dims):
        if x.dims[i] not in (1, result.dims[d]):
            raise ShapeProblem(f"operand dimension {i} (size {x.dims[i]}) cannot broadcast into "
                               f"result dimension {d} (size {result.dims[d]})")
    return ArrayShape(x.element_type, result.dims)


def _reshape(instr: Instruction) -> Shape | None:
    x, result = _array(instr.operands[0]), _array(instr, "result")
    if x.element_count != result.element_count:
        raise ShapeProblem(f"expects the same number of elements in the result {text(result)} "
                           f"and the operand {text(x)}")
    return ArrayShape(x.element_type, result.dims)


def _transpose(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    perm = _ints(instr, "dimensions")
    if sorted(perm) != list(range(x.rank)):
        raise ShapeProblem(f"dimensions={{{','.join(map(str, perm))}}} is not a permutation of "
                           f"rank {x.rank}")
    dims = tuple(x.dims[p] for p in perm)
    # XLA infers the layout that makes the transpose a bitcast: the operand's, permuted.
    m2m = x.layout.minor_to_major if x.layout is not None else tuple(range(x.rank - 1, -1, -1))
    inverse = {p: i for i, p in enumerate(perm)}
    layout = Layout(tuple(inverse[m] for m in m2m)) if x.rank else None
    return ArrayShape(x.element_type, dims, tuple(x.dynamic[p] for p in perm) if x.dynamic else (), layout)


def _dot(instr: Instruction) -> Shape | None:
    if len(instr.operands) != 2:
        return None  # sparse dot: metadata operands
    lhs, rhs = _array(instr.operands[0]), _array(instr.operands[1])
    lb, rb = _ints(instr, "lhs_batch_dims"), _ints(instr, "rhs_batch_dims")
    lc, rc = _ints(instr, "lhs_contracting_dims"), _ints(instr, "rhs_contracting_dims")
    _check_dims(lb + lc, lhs.rank, "lhs batch/contracting dimension")
    _check_dims(rb + rc, rhs.rank, "rhs batch/contracting dimension")
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise ShapeProblem("lhs and rhs must have as many batch and contracting dimensions")
    for what, ld, rd in (("batch", lb, rb), ("contracting", lc, rc)):
        for i, j in zip(ld, rd):
            if lhs.dims[i] != rhs.dims[j]:
                raise ShapeProblem(f"{what} dimension sizes differ: lhs {text(lhs)} dimension {i}, "
                                   f"rhs {text(rhs)} dimension {j}")
    dims = [lhs.dims[i] for i in lb]
    dims += [d for i, d in enumerate(lhs.dims) if i not in lb and i not in lc]
    dims += [d for i, d in enumerate(rhs.dims) if i not in rb and i not in rc]
    declared = _declared(instr)
    if declared is not None:  # mixed precision allowed
        return ArrayShape(_array(instr, "result").element_type, tuple(dims))
    return ArrayShape(higher_precision(lhs, rhs), tuple(dims))


def higher_precision(a: ArrayShape, b: ArrayShape) -> PrimitiveType:
    """The result type XLA gives a dot or convolution of `a` and `b` without a declared one:
    their common type, or the more precise of two floating-point types."""
    x, y = a.element_type, b.element_type
    if x is y:
        return x
    if x.is_float and y.is_float:
        return max(x, y, key=lambda t: (_MANTISSA_BITS.get(t, 0), t.bit_width))
    raise ShapeProblem(f"operands {text(a)} and {text(b)} have different element types")


_MANTISSA_BITS = {
    PrimitiveType.F64: 52, PrimitiveType.F32: 23, PrimitiveType.F16: 10, PrimitiveType.BF16: 7,
    PrimitiveType.F8E3M4: 4, PrimitiveType.F8E4M3: 3, PrimitiveType.F8E4M3FN: 3,
    PrimitiveType.F8E4M3FNUZ: 3, PrimitiveType.F8E4M3B11FNUZ: 3, PrimitiveType.F8E5M2: 2,
    PrimitiveType.F8E5M2FNUZ: 2, PrimitiveType.F4E2M1FN: 1, PrimitiveType.F8E8M0FNU: 0,
}


def _reduce(instr: Instruction) -> Shape | None:
    n = len(instr.operands) // 2
    inputs, inits = instr.operands[:n], instr.operands[n:]
    dims = _ints(instr, "dimensions")
    first = _array(inputs[0])
    _check_dims(dims, first.rank, "reduce dimension")
    results = []
    for x, init in zip(inputs, inits):
        xs, init_shape = _array(x), _array(init, "init value")
        if xs.dims != first.dims:
            raise ShapeProblem(f"reduce inputs differ in dimensions: {text(first)} and {text(xs)}")
        if init_shape.dims:
            raise ShapeProblem(f"init value {init.name} must be a scalar, got {text(init_shape)}")
        kept = tuple(d for i, d in enumerate(xs.dims) if i not in dims)
        results.append(ArrayShape(init_shape.element_type, kept))
    check_reducer(instr, "to_apply", [r.element_type for r in results])
    return results[0] if n == 1 else TupleShape(tuple(results))


def _slice(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    spec = _need(instr, "slice")
    if len(spec.starts) != x.rank:
        raise ShapeProblem(f"slice names {len(spec.starts)} dimensions for rank {x.rank}")
    dims = []
    for i, (s, l, st) in enumerate(zip(spec.starts, spec.limits, spec.strides)):
        if not (0 <= s <= l <= x.dims[i]) or st < 1:
            raise ShapeProblem(f"slice [{s}:{l}:{st}] is out of bounds for dimension {i} of {text(x)}")
        dims.append(-(-(l - s) // st))
    return x.with_dims(dims)


def _dynamic_slice(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    sizes = _ints(instr, "dynamic_slice_sizes")
    _check_start_indices(instr, instr.operands[1:], x)
    if len(sizes) != x.rank or any(not 0 <= s <= d for s, d in zip(sizes, x.dims)):
        raise ShapeProblem(f"dynamic_slice_sizes={{{','.join(map(str, sizes))}}} do not fit {text(x)}")
    return x.with_dims(sizes)


def _check_start_indices(instr: Instruction, indices, x: ArrayShape) -> None:
    shapes = [_array(i, "start index") for i in indices]
    if len(shapes) == 1 and shapes[0].rank == 1:  # the older single-vector form
        if shapes[0].dims[0] != x.rank:
            raise ShapeProblem(f"start index vector {text(shapes[0])} must have {x.rank} elements")
        return
    if len(shapes) != x.rank or any(s.rank != 0 for s in shapes):
        raise ShapeProblem(f"expects {x.rank} scalar start indices, one per dimension of {text(x)}")
    if any(not s.element_type.is_integer for s in shapes):
        raise ShapeProblem("start indices must be integers")


def _dynamic_update_slice(instr: Instruction) -> Shape | None:
    x, update = _array(instr.operands[0]), _array(instr.operands[1], "update")
    _check_start_indices(instr, instr.operands[2:], x)
    if update.rank != x.rank or any(u > d for u, d in zip(update.dims, x.dims)):
        raise ShapeProblem(f"update {text(update)} does not fit in {text(x)}")
    if update.element_type is not x.element_type:
        raise ShapeProblem(f"update {text(update)} and operand {text(x)} differ in element type")
    return x


def _pad(instr: Instruction) -> Shape | None:
    x, value = _array(instr.operands[0]), _array(instr.operands[1], "padding value")
    if value.dims:
        raise ShapeProblem(f"padding value must be a scalar, got {text(value)}")
    config = _need(instr, "padding")
    if len(config.dimensions) != x.rank:
        raise ShapeProblem(f"padding names {len(config.dimensions)} dimensions for rank {x.rank}")
    dims = []
    for d, (lo, hi, interior) in zip(x.dims, config.dimensions):
        size = lo + hi + d + max(d - 1, 0) * interior
        if size < 0 or interior < 0:
            raise ShapeProblem(f"padding {lo}_{hi}_{interior} leaves a negative size")
        dims.append(size)
    return _default_layout(x.with_dims(dims))


def _concatenate(instr: Instruction) -> Shape | None:
    parts = [_array(o) for o in instr.operands]
    dims = _ints(instr, "dimensions")
    if len(dims) != 1:
        raise ShapeProblem("needs dimensions={d} naming one dimension")
    d, first = dims[0], parts[0]
    _check_dims(dims, first.rank, "concatenate dimension")
    total = 0
    for p in parts:
        if p.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(p.dims, first.dims)) if i != d):
            raise ShapeProblem(f"operands {text(first)} and {text(p)} differ outside dimension {d}")
        if p.element_type is not first.element_type:
            raise ShapeProblem(f"operands {text(first)} and {text(p)} differ in element type")
        total += p.dims[d]
    return _default_layout(first.with_dims(first.dims[:d] + (total,) + first.dims[d + 1:]))


def _get_tuple_element(instr: Instruction) -> Shape | None:
    t = instr.operands[0].shape
    index = _need(instr, "index")
    if type(t) is not TupleShape:
        raise ShapeProblem(f"operand {instr.operands[0].name} is not a tuple: {text(t)}")
    if not 0 <= index < len(t.elements):
        raise ShapeProblem(f"index {index} is out of range for {text(t)}")
    return t.elements[index]


def _tuple(instr: Instruction) -> Shape | None:
    return TupleShape(tuple(o.shape for o in instr.operands))


def _iota(instr: Instruction) -> Shape | None:
    result = _array(instr, "result")
    d = _need(instr, "iota_dimension")
    if not 0 <= d < max(result.rank, 1):
        raise ShapeProblem(f"iota_dimension={d} is out of range for {text(result)}")
    return None


def _u32_scalar(instr: Instruction) -> Shape | None:
    return ArrayShape(PrimitiveType.U32, ())


def _same_as_operand(instr: Instruction) -> Shape | None:
    return instr.operands[0].shape


def _operand_shapes(instr: Instruction) -> Shape | None:
    """sort: the operands' shapes (a tuple when more than one)."""
    shapes = tuple(o.shape for o in instr.operands)
    return shapes[0] if len(shapes) == 1 else TupleShape(shapes)


def _get_dimension_size(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    d = _ints(instr, "dimensions")
    if len(d) != 1 or not 0 <= d[0] < x.rank:
        raise ShapeProblem(f"dimension {list(d)} is out of bounds for {text(x)}")
    return ArrayShape(PrimitiveType.S32, ())


def _set_dimension_size(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    d = _ints(instr, "dimensions")
    if len(d) != 1 or not 0 <= d[0] < x.rank:
        raise ShapeProblem(f"dimension {list(d)} is out of bounds for {text(x)}")
    size = _array(instr.operands[1], "size")
    if size.dims or size.element_type is not PrimitiveType.S32:
        raise ShapeProblem(f"the size must be an s32 scalar, got {text(size)}")
    return x


# --------------------------------------------------------------- control flow --
def _check_call_signature(instr: Instruction, callee, operands) -> None:
    if callee is None:
        return
    params = callee.parameters
    if len(params) != len(operands):
        raise ShapeProblem(f"passes {len(operands)} operands to {callee.name}, which takes {len(params)}")
    for i, (p, o) in enumerate(zip(params, operands)):
        if p is not None and not same_shape(p.shape, o.shape):
            raise ShapeProblem(f"operand {i} ({text(o.shape)}) does not match parameter {i} of "
                               f"{callee.name} ({text(p.shape)})")


def _called(instr: Instruction, key: str):
    callee = instr.called.get(key)
    return callee[0] if isinstance(callee, tuple) and len(callee) == 1 else callee


def _call_like(key: str) -> Callable[[Instruction], Shape | None]:
    def rule(instr: Instruction) -> Shape | None:
        callee = _called(instr, key)
        if callee is None or isinstance(callee, tuple) or callee.root is None:
            return None
        _check_call_signature(instr, callee, instr.operands)
        return callee.root.shape

    return rule


def _while(instr: Instruction) -> Shape | None:
    state = instr.operands[0].shape
    body, cond = _called(instr, "body"), _called(instr, "condition")
    for comp in (body, cond):
        if comp is not None and not isinstance(comp, tuple):
            _check_call_signature(instr, comp, instr.operands)
    if body is not None and body.root is not None and not same_shape(body.root.shape, state):
        raise ShapeProblem(f"body {body.name} returns {text(body.root.shape)}, the loop state is {text(state)}")
    if cond is not None and cond.root is not None and not same_shape(cond.root.shape, ArrayShape(PRED, ())):
        raise ShapeProblem(f"condition {cond.name} must return pred[], returns {text(cond.root.shape)}")
    return state


def _conditional(instr: Instruction) -> Shape | None:
    if "branch_computations" in instr.called:
        branches = instr.called["branch_computations"]
        branches = branches if isinstance(branches, tuple) else (branches,)
    else:
        branches = tuple(instr.called[k] for k in ("true_computation", "false_computation")
                         if k in instr.called)
    selector = _array(instr.operands[0], "branch selector")
    if selector.dims or selector.element_type not in (PRED, PrimitiveType.S32):
        raise ShapeProblem(f"branch selector must be pred[] or s32[], got {text(selector)}")
    if len(instr.operands) != len(branches) + 1:
        raise ShapeProblem(f"expects one operand per branch after the selector ({len(branches) + 1} "
                           f"operands), but has {len(instr.operands)}")
    result = None
    for branch, operand in zip(branches, instr.operands[1:]):
        _check_call_signature(instr, branch, [operand])
        if result is None:
            result = branch.root.shape
        elif not same_shape(result, branch.root.shape):
            raise ShapeProblem(f"branches return different shapes: {text(result)} and "
                               f"{text(branch.root.shape)}")
    return result



# ---------------------------------------------------------- more opcodes --
def _first_operand(instr: Instruction) -> Shape | None:
    """add-dependency, domain, set-dimension-size: the first operand's shape."""
    return instr.operands[0].shape


def _token(instr: Instruction) -> Shape | None:
    return TOKEN


def _matrix_like(instr: Instruction) -> Shape | None:
    """cholesky(a) and triangular-solve(a, b): the shape of the last operand, a batch of matrices."""
    x = _array(instr.operands[-1])
    if x.rank < 2:
        raise ShapeProblem(f"operand {text(x)} must have rank 2 or more")
    return x


def _batch_norm(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    f = _need(instr, "feature_index")
    if not 0 <= f < x.rank:
        raise ShapeProblem(f"feature_index={f} is out of range for {text(x)}")
    feature = ArrayShape(x.element_type, (x.dims[f],))
    for o in instr.operands[1:]:
        if instr.opcode is Opcode.BATCH_NORM_GRAD and o is instr.operands[-1]:
            if not same_shape(o.shape, x):
                raise ShapeProblem(f"grad_output {text(o.shape)} must have the operand's shape {text(x)}")
            continue
        if not same_shape(o.shape, feature):
            raise ShapeProblem(f"operand {o.name} must be {text(feature)} (one value per feature), "
                               f"got {text(o.shape)}")
    if instr.opcode is Opcode.BATCH_NORM_INFERENCE:
        return x
    return TupleShape((x, feature, feature))


_FFT_REAL_TO_COMPLEX = {PrimitiveType.F32: PrimitiveType.C64, PrimitiveType.F64: PrimitiveType.C128}


def _fft(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    kind = _need(instr, "fft_type")
    lengths = _ints(instr, "fft_length")
    if not 1 <= len(lengths) <= 3 or len(lengths) > x.rank:
        raise ShapeProblem(f"fft_length={{{','.join(map(str, lengths))}}} needs 1 to 3 dimensions of {text(x)}")
    minor = x.dims[x.rank - len(lengths):]
    if kind in ("FFT", "IFFT"):
        if not x.element_type.is_complex or tuple(minor) != tuple(lengths):
            raise ShapeProblem(f"{kind} needs a complex operand whose minor dimensions are fft_length")
        return x
    if kind == "RFFT":
        if x.element_type not in _FFT_REAL_TO_COMPLEX or tuple(minor) != tuple(lengths):
            raise ShapeProblem("RFFT needs an f32 or f64 operand whose minor dimensions are fft_length")
        dims = x.dims[:-1] + (lengths[-1] // 2 + 1,)
        return ArrayShape(_FFT_REAL_TO_COMPLEX[x.element_type], dims)
    if kind == "IRFFT":
        if not x.element_type.is_complex or tuple(minor[:-1]) != tuple(lengths[:-1]) \
                or minor[-1] != lengths[-1] // 2 + 1:
            raise ShapeProblem("IRFFT needs a complex operand of fft_length with the last dimension n/2+1")
        return ArrayShape(_COMPLEX_PART[x.element_type], x.dims[:-1] + (lengths[-1],))
    raise ShapeProblem(f"unknown fft_type {kind}")


def _map(instr: Instruction) -> Shape | None:
    shapes = [_array(o) for o in instr.operands]
    first = shapes[0]
    for x in shapes[1:]:
        if x.dims != first.dims:
            raise ShapeProblem(f"map operands differ in dimensions: {text(first)} and {text(x)}")
    comp = _called(instr, "to_apply")
    if comp is None or isinstance(comp, tuple) or comp.root is None:
        return None
    if len(comp.parameters) != len(shapes):
        raise ShapeProblem(f"to_apply={comp.name} takes {len(comp.parameters)} parameters; "
                           f"map has {len(shapes)} operands")
    root = comp.root.shape
    if type(root) is not ArrayShape or root.dims:
        raise ShapeProblem(f"to_apply={comp.name} must return a scalar, returns {text(root)}")
    return ArrayShape(root.element_type, first.dims)


def _window_dims(window, rank: int, what: str) -> list:
    dims = list(window.dimensions) if window is not None else []
    if not dims and rank == 0:
        return []
    if len(dims) != rank:
        raise ShapeProblem(f"window has {len(dims)} dimensions, {what} has {rank}")
    for d in dims:
        if d.size < 1 or d.stride < 1 or d.lhs_dilation < 1 or d.rhs_dilation < 1:
            raise ShapeProblem("window sizes, strides and dilations must be positive")
    return dims


def _windowed_size(size: int, d) -> int:
    """Output size of one window dimension (XLA's InferWindowOutputShape)."""
    base = (size - 1) * d.lhs_dilation + 1 if size else 0
    padded = base + d.padding_low + d.padding_high
    window = (d.size - 1) * d.rhs_dilation + 1
    if padded < 0:
        raise ShapeProblem("padding leaves a negative size")
    return (padded - window) // d.stride + 1 if padded >= window else 0


def _reduce_window(instr: Instruction) -> Shape | None:
    n = len(instr.operands) // 2
    inputs, inits = instr.operands[:n], instr.operands[n:]
    first = _array(inputs[0])
    dims = _window_dims(instr.attr("window"), first.rank, f"operand {text(first)}")
    out = tuple(_windowed_size(s, d) for s, d in zip(first.dims, dims)) if dims else first.dims
    results = []
    for x, init in zip(inputs, inits):
        xs, init_shape = _array(x), _array(init, "init value")
        if xs.dims != first.dims:
            raise ShapeProblem(f"reduce-window inputs differ in dimensions: {text(first)} and {text(xs)}")
        if init_shape.dims:
            raise ShapeProblem(f"init value {init.name} must be a scalar, got {text(init_shape)}")
        results.append(ArrayShape(init_shape.element_type, out))
    check_reducer(instr, "to_apply", [r.element_type for r in results])
    return results[0] if n == 1 else TupleShape(tuple(results))


def _select_and_scatter(instr: Instruction) -> Shape | None:
    x, source, init = (_array(o) for o in instr.operands)
    dims = _window_dims(instr.attr("window"), x.rank, f"operand {text(x)}")
    out = tuple(_windowed_size(s, d) for s, d in zip(x.dims, dims)) if dims else x.dims
    if source.dims != out:
        raise ShapeProblem(f"source {text(source)} must have the windowed operand's dimensions {list(out)}")
    if init.dims or init.element_type is not x.element_type:
        raise ShapeProblem(f"init value must be a {x.element_type.value} scalar, got {text(init)}")
    return x


def _conv_labels(instr: Instruction):
    labels = _need(instr, "dim_labels")
    return labels


def _convolution(instr: Instruction) -> Shape | None:
    lhs, rhs = _array(instr.operands[0]), _array(instr.operands[1])
    labels = _conv_labels(instr)
    if len(labels.input) != lhs.rank or len(labels.kernel) != rhs.rank:
        raise ShapeProblem(f"dim_labels={labels.to_hlo()} do not match the operand ranks {lhs.rank} and {rhs.rank}")
    if len(labels.output) != lhs.rank:
        raise ShapeProblem(f"dim_labels={labels.to_hlo()}: the output must have rank {lhs.rank}")
    spatial_in, spatial_k, spatial_out = labels.input_spatial, labels.kernel_spatial, labels.output_spatial
    dims = _window_dims(instr.attr("window"), len(spatial_in), "dim_labels' spatial dimensions")
    features = instr.attr("feature_group_count", 1)
    batches = instr.attr("batch_group_count", 1)
    if features < 1 or batches < 1:
        raise ShapeProblem("feature_group_count and batch_group_count must be positive")
    in_features = lhs.dims[labels.input_feature]
    k_in, k_out = rhs.dims[labels.kernel_input_feature], rhs.dims[labels.kernel_output_feature]
    if in_features != k_in * features:
        raise ShapeProblem(f"input feature dimension ({in_features}) must be the kernel's input feature "
                           f"dimension ({k_in}) times feature_group_count ({features})")
    if k_out % features or k_out % batches:
        raise ShapeProblem(f"kernel output features ({k_out}) must divide into the group counts")
    batch = lhs.dims[labels.input_batch]
    if batch % batches:
        raise ShapeProblem(f"batch ({batch}) must divide into batch_group_count ({batches})")
    out = [0] * lhs.rank
    out[labels.output_batch] = batch // batches
    out[labels.output_feature] = k_out
    for i, (si, sk, so) in enumerate(zip(spatial_in, spatial_k, spatial_out)):
        if dims and dims[i].size != rhs.dims[sk]:
            raise ShapeProblem(f"window size {dims[i].size} differs from kernel spatial dimension "
                               f"{rhs.dims[sk]}")
        out[so] = _windowed_size(lhs.dims[si], dims[i]) if dims else lhs.dims[si] - rhs.dims[sk] + 1
    declared = _declared(instr)
    etype = _array(instr, "result").element_type if declared is not None else higher_precision(lhs, rhs)
    return ArrayShape(etype, tuple(out))


def _gather(instr: Instruction) -> Shape | None:
    x, indices = _array(instr.operands[0]), _array(instr.operands[1], "start indices")
    offset_dims = _ints(instr, "offset_dims")
    collapsed = _ints(instr, "collapsed_slice_dims")
    batching = _ints(instr, "operand_batching_dims")
    sizes = _ints(instr, "slice_sizes")
    ivd = _need(instr, "index_vector_dim")
    if len(sizes) != x.rank:
        raise ShapeProblem(f"slice_sizes names {len(sizes)} dimensions for {text(x)}")
    _check_dims(collapsed + batching, x.rank, "collapsed or batching dimension")
    _check_index_dims(indices, ivd, _ints(instr, "start_index_map"), x.rank, batching,
                      _ints(instr, "start_indices_batching_dims"), "start_index_map", "start_indices_batching_dims")
    for i, size in enumerate(sizes):
        if not 0 <= size <= x.dims[i]:
            raise ShapeProblem(f"slice size {size} does not fit dimension {i} of {text(x)}")
    batch_sizes = [d for i, d in enumerate(indices.dims) if i != ivd]
    offset_sizes = [s for i, s in enumerate(sizes) if i not in collapsed and i not in batching]
    if len(offset_sizes) != len(offset_dims):
        raise ShapeProblem(f"offset_dims names {len(offset_dims)} dimensions; the slice keeps {len(offset_sizes)}")
    rank = len(batch_sizes) + len(offset_sizes)
    _check_dims(offset_dims, rank, "offset dimension")
    out, b, o = [], iter(batch_sizes), iter(offset_sizes)
    for d in range(rank):
        out.append(next(o) if d in offset_dims else next(b))
    return ArrayShape(x.element_type, tuple(out))


def _check_index_dims(indices: ArrayShape, ivd: int, to_operand: tuple[int, ...], operand_rank: int,
                      operand_batching: tuple[int, ...], indices_batching: tuple[int, ...],
                      map_name: str, batching_name: str) -> None:
    """A gather's or scatter's index dimension numbers (XLA's shape inference): the index
    vector's entries name distinct operand dims that are not batching dims, one per element of
    the index vector; the indices' batching dims are distinct, not the index vector dim, and
    pair one to one with the operand's."""
    if not 0 <= ivd <= indices.rank:
        raise ShapeProblem(f"index_vector_dim={ivd} is out of range for {text(indices)}")
    _check_dims(to_operand, operand_rank, f"{map_name} entry")
    if set(to_operand) & set(operand_batching):
        raise ShapeProblem(f"{map_name} {list(to_operand)} names a batching dimension")
    vector = indices.dims[ivd] if ivd < indices.rank else 1
    if len(to_operand) != vector:
        raise ShapeProblem(f"{map_name} has {len(to_operand)} entries; the index vector has {vector}")
    _check_dims(indices_batching, indices.rank, f"{batching_name} entry")
    if ivd in indices_batching:
        raise ShapeProblem(f"{batching_name} {list(indices_batching)} names the index vector dimension {ivd}")
    if len(indices_batching) != len(operand_batching):
        raise ShapeProblem(f"{batching_name} has {len(indices_batching)} entries, the operand's batching "
                           f"dimensions {len(operand_batching)}")


def _scatter(instr: Instruction) -> Shape | None:
    n = (len(instr.operands) - 1) // 2
    inputs = [_array(o) for o in instr.operands[:n]]
    for x in inputs[1:]:
        if x.dims != inputs[0].dims:
            raise ShapeProblem(f"scatter inputs differ in dimensions: {text(inputs[0])} and {text(x)}")
    indices = _array(instr.operands[n], "scatter indices")
    updates = [_array(o, "updates") for o in instr.operands[n + 1:]]
    ivd = _need(instr, "index_vector_dim")
    window = _ints(instr, "update_window_dims")
    inserted = _ints(instr, "inserted_window_dims")
    batching = _ints(instr, "input_batching_dims")
    _check_dims(inserted + batching, inputs[0].rank, "inserted window or batching dimension")
    if len(window) + len(inserted) + len(batching) != inputs[0].rank:
        raise ShapeProblem(f"update_window_dims, inserted_window_dims and input_batching_dims name "
                           f"{len(window) + len(inserted) + len(batching)} dimensions of {text(inputs[0])}")
    _check_index_dims(indices, ivd, _ints(instr, "scatter_dims_to_operand_dims"), inputs[0].rank, batching,
                      _ints(instr, "scatter_indices_batching_dims"), "scatter_dims_to_operand_dims",
                      "scatter_indices_batching_dims")
    rank = len(window) + indices.rank - (1 if ivd < indices.rank else 0)
    for u in updates:
        if u.rank != rank:
            raise ShapeProblem(f"updates {text(u)} should have rank {rank} (update_window_dims and the "
                               "indices' scatter dimensions)")
        _check_dims(window, u.rank, "update window dimension")
    check_reducer(instr, "to_apply", [x.element_type for x in inputs])
    return inputs[0] if n == 1 else TupleShape(tuple(inputs))


def _topk(instr: Instruction) -> Shape | None:
    x = _array(instr.operands[0])
    k = _need(instr, "k")
    if x.rank < 1 or not 0 <= k <= x.dims[-1]:
        raise ShapeProblem(f"k={k} does not fit the last dimension of {text(x)}")
    dims = x.dims[:-1] + (k,)
    return TupleShape((ArrayShape(x.element_type, dims), ArrayShape(PrimitiveType.S32, dims)))


# Opcodes whose result shape XLA infers when the text leaves it out (its parser's
# CanInferShape, for the opcodes this table has a rule for).
INFERABLE = frozenset({
    *ELEMENTWISE_UNARY, *ELEMENTWISE_BINARY, *ELEMENTWISE_TERNARY,
    Opcode.ADD_DEPENDENCY, Opcode.AFTER_ALL, Opcode.BATCH_NORM_GRAD, Opcode.BATCH_NORM_INFERENCE,
    Opcode.BATCH_NORM_TRAINING, Opcode.BROADCAST, Opcode.CALL, Opcode.CHOLESKY, Opcode.CONCATENATE,
    Opcode.CONDITIONAL, Opcode.CONVOLUTION, Opcode.DOMAIN, Opcode.DOT,
    Opcode.FFT, Opcode.GATHER, Opcode.GET_DIMENSION_SIZE, Opcode.SET_DIMENSION_SIZE,
    Opcode.GET_TUPLE_ELEMENT, Opcode.MAP, Opcode.PAD, Opcode.PARTITION_ID, Opcode.REDUCE,
    Opcode.REPLICA_ID, Opcode.REVERSE, Opcode.REDUCE_WINDOW, Opcode.SELECT_AND_SCATTER, Opcode.SCATTER,
    Opcode.SORT, Opcode.TRANSPOSE, Opcode.TRIANGULAR_SOLVE, Opcode.TUPLE, Opcode.WHILE, Opcode.TOPK,
}) - {Opcode.CONVERT, Opcode.BITCAST_CONVERT, Opcode.REDUCE_PRECISION, Opcode.STOCHASTIC_CONVERT}
# XLA also infers ragged-dot, scaled-dot and scan; this table has no rule for them yet.  XLA lists
# opt-barrier as inferable but its unary rule does not know it, so it is not.
UNINFERRED_BY_US = frozenset({Opcode.RAGGED_DOT, Opcode.SCALED_DOT, Opcode.SCAN})
_UNARY_INFERENCE = ELEMENTWISE_UNARY | {Opcode.DOMAIN}


def infer_shape(instr: Instruction) -> Shape:
    """The result shape of `instr` (built with shape=None) from its operands and attributes,
    by the opcode's rule; ShapeProblem when XLA would not infer it or the operands do not fit."""
    op = instr.opcode
    if op in UNINFERRED_BY_US:
        raise ShapeProblem(f"hlo-passes cannot infer the shape of {op.value} yet; write it out")
    if op not in INFERABLE:
        raise ShapeProblem(f"cannot infer shape for opcode: {op.value} (write the result shape)")
    problem = operand_count_problem(instr)
    if problem is not None:
        raise ShapeProblem(problem)
    if op in _UNARY_INFERENCE and type(instr.operands[0].shape) is not ArrayShape:
        # XLA infers these with its unary-op rule, which takes arrays only (a written shape
        # may still copy or fence a tuple).
        raise ShapeProblem(f"expected array argument for operand of unary operation, but got "
                           f"{text(instr.operands[0].shape)}")
    shape = SHAPE_RULES[op](instr)
    if shape is None:
        raise ShapeProblem(f"cannot infer shape for opcode: {op.value} here (write the result shape)")
    return shape


# ----------------------------------------------------------------- table --
Rule = Callable[[Instruction], "Shape | None"]

SHAPE_RULES: dict[Opcode, Rule] = {
    **{op: _same_type_unary if op in _SAME_TYPE_UNARY else _unary for op in ELEMENTWISE_UNARY},
    **{op: _binary if op in _NOT_SAME_TYPE_BINARY else _same_type_binary for op in ELEMENTWISE_BINARY},
    **{op: _ternary for op in ELEMENTWISE_TERNARY},
    Opcode.BROADCAST: _broadcast,
    Opcode.RESHAPE: _reshape,
    Opcode.TRANSPOSE: _transpose,
    Opcode.DOT: _dot,
    Opcode.REDUCE: _reduce,
    Opcode.SLICE: _slice,
    Opcode.DYNAMIC_SLICE: _dynamic_slice,
    Opcode.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Opcode.PAD: _pad,
    Opcode.CONCATENATE: _concatenate,
    Opcode.GET_TUPLE_ELEMENT: _get_tuple_element,
    Opcode.TUPLE: _tuple,
    Opcode.IOTA: _iota,
    Opcode.REPLICA_ID: _u32_scalar,
    Opcode.PARTITION_ID: _u32_scalar,
    Opcode.REVERSE: _same_as_operand,
    Opcode.OPTIMIZATION_BARRIER: _same_as_operand,
    Opcode.GET_DIMENSION_SIZE: _get_dimension_size,
    Opcode.SORT: _operand_shapes,
    Opcode.WHILE: _while,
    Opcode.CONDITIONAL: _conditional,
    Opcode.CALL: _call_like("to_apply"),
    Opcode.FUSION: _call_like("calls"),
    Opcode.ADD_DEPENDENCY: _first_operand,
    Opcode.DOMAIN: _first_operand,
    Opcode.SET_DIMENSION_SIZE: _set_dimension_size,
    Opcode.AFTER_ALL: _token,
    Opcode.CHOLESKY: _matrix_like,
    Opcode.TRIANGULAR_SOLVE: _matrix_like,
    Opcode.BATCH_NORM_TRAINING: _batch_norm,
    Opcode.BATCH_NORM_INFERENCE: _batch_norm,
    Opcode.BATCH_NORM_GRAD: _batch_norm,
    Opcode.FFT: _fft,
    Opcode.MAP: _map,
    Opcode.REDUCE_WINDOW: _reduce_window,
    Opcode.SELECT_AND_SCATTER: _select_and_scatter,
    Opcode.CONVOLUTION: _convolution,
    Opcode.GATHER: _gather,
    Opcode.SCATTER: _scatter,
    Opcode.TOPK: _topk,
}
# Collectives need the group size and the module's device counts: see collectives.py.
