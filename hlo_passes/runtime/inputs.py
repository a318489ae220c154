"""Deterministic inputs for a module's ENTRY parameters, and .npz files of arrays.

Inputs are flat: one array per *leaf* of the ENTRY parameters, in parameter
order, a tuple-shaped parameter contributing its leaves depth-first (the way
PJRT passes tuple parameters).  Values are chosen so that tolerances stay
meaningful and nothing overflows:

    floats, complex      uniform in [-1, 1) (real and imaginary parts)
    ... feeding log, sqrt, rsqrt, power (base) or the divisor of a divide
                         uniform in [0.5, 1.5)
    f8e8m0fnu            powers of two in [2^-2, 2^2] (the type has no sign and no zero)
    signed int           integers in [-4, 5) ([-2, 2) for 2-bit types): negatives, so that
                         a rewrite that mishandles a sign (a wrapping convert, an unsigned
                         compare) shows; ... reaching a while loop's state: [0, 5), so that
                         a loop counting to it ends soon
    unsigned int         integers in [0, 5) ([0, 2) for 2-bit types)
    pred                 True/False

    inputs = random_inputs(module, seed=0)
    save_npz("in.npz", inputs)                 # arr_0, arr_1, ...
    inputs = load_npz("in.npz", module)        # checked against the parameters, dtypes restored
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np
from numpy.lib import format as npformat

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType


class InputError(ValueError):
    """Inputs that do not fit the module's parameters."""


# Ops through which "this value must be positive" is passed back to the producer unchanged.
_VALUE_PRESERVING = {Opcode.CONVERT, Opcode.BROADCAST, Opcode.RESHAPE, Opcode.COPY, Opcode.TRANSPOSE,
                     Opcode.SLICE, Opcode.BITCAST, Opcode.CONCATENATE, Opcode.DYNAMIC_SLICE,
                     Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE, Opcode.REVERSE, Opcode.PAD}
# (opcode, operand index) pairs whose operand should be positive.
_NEEDS_POSITIVE = {(Opcode.LOG, 0), (Opcode.SQRT, 0), (Opcode.RSQRT, 0), (Opcode.POWER, 0),
                   (Opcode.DIVIDE, 1)}


def parameter_leaves(module: Module) -> list[tuple[str, ArrayShape]]:
    """(label, shape) of every flattened ENTRY parameter leaf: `p`, or `p{1,0}` inside tuples."""
    leaves: list[tuple[str, ArrayShape]] = []

    def walk(label, shape, path):
        if shape.is_tuple:
            for i, element in enumerate(shape.elements):
                walk(label, element, path + (i,))
        else:
            leaves.append((label + ("{" + ",".join(map(str, path)) + "}" if path else ""), shape))

    for p in module.entry.parameters:
        walk(p.name, p.shape, ())
    return leaves


def positive_parameters(module: Module) -> set[str]:
    """Names of ENTRY parameters whose values reach log/sqrt/rsqrt/power/divisor operands
    through value-preserving ops only (reshape, broadcast, convert, slice, ...)."""
    positive: set[str] = set()
    for p in module.entry.parameters:
        stack, seen = [p], set()
        while stack:
            instr = stack.pop()
            if id(instr) in seen:
                continue
            seen.add(id(instr))
            for user in instr.users:
                if any((user.opcode, i) in _NEEDS_POSITIVE for i, op in enumerate(user.operands) if op is instr):
                    positive.add(p.name)
                    stack.clear()
                    break
                if user.opcode in _VALUE_PRESERVING:
                    stack.append(user)
    return positive


def random_array(rng: np.random.Generator, shape: ArrayShape, *, positive: bool = False,
                 counting: bool = False) -> np.ndarray:
    """One deterministic array of `shape` (see the module docstring for the value ranges);
    `counting`: it may bound a loop, so no negative integers."""
    etype = shape.element_type
    if not etype.is_array:
        raise InputError(f"cannot make inputs of type {etype.value}")
    dtype = etype.numpy_dtype()
    dims = tuple(shape.dims)
    low, high = (0.5, 1.5) if positive else (-1.0, 1.0)
    if etype is PrimitiveType.F8E8M0FNU:
        return np.exp2(rng.integers(-2, 3, dims)).astype(dtype)
    if etype.is_complex:
        return (rng.uniform(low, high, dims) + 1j * rng.uniform(low, high, dims)).astype(dtype)
    if etype.is_float:
        return rng.uniform(low, high, dims).astype(dtype)
    if etype is PrimitiveType.PRED:
        return rng.integers(0, 2, dims).astype(bool)
    top = 2 if etype.bit_width <= 2 else 5
    bottom = 1 if positive else (-min(top, 4) if etype.is_signed_integer and not counting else 0)
    return rng.integers(bottom, top, dims).astype(dtype)


def random_inputs(module: Module, seed: int = 0) -> list[np.ndarray]:
    """One array per flattened ENTRY parameter leaf, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    positive = positive_parameters(module)
    counting = counting_parameters(module)
    return [random_array(rng, shape, positive=label.split("{")[0] in positive,
                         counting=label.split("{")[0] in counting)
            for label, shape in parameter_leaves(module)]


class _Holds:
    """Does a computation hold an instruction `wanted` accepts, itself or in a computation it
    calls (memoized per computation)?"""

    def __init__(self, wanted: Callable[[Instruction], bool]):
        self.wanted = wanted
        self._known: dict[object, bool] = {}

    def __call__(self, comp) -> bool:
        if comp not in self._known:
            self._known[comp] = False  # (HLO has no recursion; a guard all the same)
            self._known[comp] = any(self.wanted(i) or any(self(c) for c in i.called_computations())
                                    for i in comp.instructions)
        return self._known[comp]


def _parameters_reaching(starts: Iterable[Instruction]) -> list[Instruction]:
    """The parameters among the transitive operands of `starts` (themselves included)."""
    found, stack, seen = [], list(starts), set()
    while stack:
        top = stack.pop()
        if id(top) in seen:
            continue
        seen.add(id(top))
        if top.opcode is Opcode.PARAMETER:
            found.append(top)
        stack.extend(top.operands)
    return found


def counting_parameters(module: Module) -> set[str]:
    """Names of ENTRY parameters that reach a while loop (in the entry, or in anything it
    calls): one may be the count a loop runs to, and a negative count could make a loop that
    counts up to it with `!=` run for 2^31 steps."""
    holds_loop = _Holds(lambda i: i.opcode is Opcode.WHILE)
    loops = [i for i in module.entry.instructions
             if i.opcode is Opcode.WHILE or any(holds_loop(c) for c in i.called_computations())]
    return {p.name for p in _parameters_reaching(loops)}


def steering_parameters(module: Module) -> set[int]:
    """ENTRY parameters (by number) that decide which branch a conditional takes or how often a
    while loop runs, where that conditional or loop holds a collective (in any computation it
    calls).  In a per-device program such a value must be the same on every device: devices
    that took different branches would wait for each other in different collectives and XLA
    would hang (JAX-program fuzz seed 2020: XLA's after_optimizations had lost the parameter's
    `replicated` sharding; JAX always fed it one value).  For a loop, every parameter that
    reaches its initial state counts (the condition may read any of it)."""
    holds_collective = _Holds(lambda i: i.opcode.is_collective)
    steered = [i.operands[0] for i in module.entry.instructions  # a branch index, a loop's initial state
               if i.opcode in (Opcode.CONDITIONAL, Opcode.WHILE)
               and any(holds_collective(c) for c in i.called_computations())]
    return {p.parameter_number for p in _parameters_reaching(steered) if p.parameter_number is not None}


def per_device_inputs(module: Module, n: int, *, replicated: list[bool] | None = None,
                      seed: int = 0) -> list[list[np.ndarray]]:
    """`args[leaf][device]`: random inputs per device, identical on every device for the
    parameters flagged in `replicated` (one flag per ENTRY parameter) and for those that steer
    control flow around collectives (`steering_parameters`)."""
    rng = np.random.default_rng(seed)
    positive = positive_parameters(module)
    counting = counting_parameters(module)
    steering = steering_parameters(module)
    flags = []
    for number, p in enumerate(module.entry.parameters):
        same = bool(replicated and number < len(replicated) and replicated[number]) or number in steering
        flags += [same] * len(p.shape.leaves())
    args = []
    for (label, shape), same in zip(parameter_leaves(module), flags):
        name = label.split("{")[0]
        arrays = [random_array(rng, shape, positive=name in positive, counting=name in counting)
                  for _ in range(1 if same else n)]
        args.append(arrays * n if same else arrays)
    return args


def check_inputs(module: Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`inputs` as the module's leaves need them: count and shape checked, dtypes cast
    (an .npz file stores bf16/f8 as raw bytes; they are reinterpreted, not converted)."""
    return check_leaves(parameter_leaves(module), inputs)


def check_leaves(leaves: list[tuple[str, ArrayShape]], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`check_inputs` against explicit (label, shape) leaves."""
    if len(inputs) != len(leaves):
        raise InputError(f"{len(inputs)} input arrays for {len(leaves)} parameter leaves "
                         f"({', '.join(label for label, _ in leaves) or 'none'})")
    out = []
    for (label, shape), array in zip(leaves, inputs):
        array = np.asarray(array)
        dtype = shape.element_type.numpy_dtype()
        if tuple(array.shape) != tuple(shape.dims):
            raise InputError(f"input for parameter {label}: shape {list(array.shape)}, "
                             f"expected {shape.to_hlo(with_layout=False)}")
        if array.dtype != dtype:
            if array.dtype.kind == "V" and array.dtype.itemsize == dtype.itemsize:
                array = array.view(dtype)
            else:
                array = array.astype(dtype)
        out.append(array)
    return out


def write_npz(stream: BinaryIO, arrays: list[np.ndarray] | dict[str, np.ndarray]) -> None:
    """Write arrays as .npz to an open binary stream: a list as arr_0, arr_1, ... (np.load
    order), a dict by its keys.  A stream, not a path: the CLI decides how a file is written
    (cli/io.py write_bytes: never over an input, a read-only file or a FIFO's nature)."""
    if isinstance(arrays, dict):
        np.savez(stream, **{k: np.asarray(v) for k, v in arrays.items()})
    else:
        np.savez(stream, *[np.asarray(a) for a in arrays])


def save_npz(path: str | Path, arrays: list[np.ndarray] | dict[str, np.ndarray]) -> None:
    """`write_npz` to exactly `path` (numpy would add `.npz` to a name without it), for
    library callers; the CLI writes through cli/io.py instead."""
    with open(path, "wb") as f:
        write_npz(f, arrays)


# Arrays of a .npz without parameters to check them against may declare at most this much in all.
MAX_NPZ_BYTES = 1 << 32
# The most bytes an element of an HLO array type takes (c128): an .npz array may be cast from a
# wider dtype than its parameter's, never from one wider than this.
_MAX_ITEMSIZE = 16


def _npz_headers(path: str | Path) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """(name, shape, dtype) of every array in an .npz, read from the .npy headers only: what
    each array would cost is known before any data is loaded (a 6 MB file may declare 6 GB)."""
    headers = []
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        if len(names) > 100_000:
            raise InputError(f"{path}: {len(names)} members; not an .npz of inputs")
        for name in names:
            if not name.endswith(".npy"):
                raise InputError(f"{path}: member {name[:100]!r} is not an .npy array")
            with zf.open(name) as f:
                version = npformat.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = npformat.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, _, dtype = npformat.read_array_header_2_0(f)
                else:
                    raise InputError(f"{path}: member {name[:100]!r} has .npy format {version}, not 1.0 or 2.0")
            headers.append((name.removesuffix(".npy"), tuple(shape), dtype))
    return headers


def _check_declared(path, headers, leaves: list[tuple[str, ArrayShape]] | None) -> None:
    """Refuse, from the headers alone, arrays that cannot feed `leaves` (count, shape, element
    size) or, without leaves, that declare more than MAX_NPZ_BYTES in all."""
    if leaves is None:
        total = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in headers)
        if total > MAX_NPZ_BYTES:
            raise InputError(f"{path}: its arrays declare {total} bytes, more than the {MAX_NPZ_BYTES >> 30} GiB "
                             "allowed without parameters to check them against")
        return
    if len(headers) != len(leaves):
        raise InputError(f"{len(headers)} input arrays for {len(leaves)} parameter leaves "
                         f"({', '.join(label for label, _ in leaves) or 'none'})")
    for (label, shape), (name, dims, dtype) in zip(leaves, _in_load_order(headers)):
        if dims != tuple(shape.dims):
            raise InputError(f"input for parameter {label}: shape {list(dims)}, "
                             f"expected {shape.to_hlo(with_layout=False)}")
        if dtype.itemsize > _MAX_ITEMSIZE:
            raise InputError(f"input for parameter {label}: dtype {dtype} ({dtype.itemsize} bytes an element), "
                             f"expected {shape.element_type.value}")


def _in_load_order(items: list) -> list:
    """`items` (name first) in the order load_npz returns them: arr_0, arr_1, ... when so
    named, else file order."""
    names = [item[0] for item in items]
    numbered = [f"arr_{i}" for i in range(len(names))]
    if set(numbered) != set(names):
        return list(items)
    by_name = {item[0]: item for item in items}
    return [by_name[n] for n in numbered]


def load_npz(path: str | Path, module: Module | None = None, *,
             leaves: list[tuple[str, ArrayShape]] | None = None) -> list[np.ndarray]:
    """Arrays arr_0, arr_1, ... of an .npz file (or every array in file order when not so named);
    checked against `module`'s parameter leaves when given.  `leaves` (label, shape) bound the
    arrays without checking them fully (the caller does, e.g. against global shapes).  The
    .npy headers are checked before any data is read (`_check_declared`)."""
    if module is not None:
        leaves = parameter_leaves(module)
    try:
        _check_declared(path, _npz_headers(path), leaves)
        with np.load(path, allow_pickle=False) as data:
            order = [name for name, in _in_load_order([(n,) for n in data.files])]
            arrays = [data[k] for k in order]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"{path}: cannot read arrays ({e})") from None
    return check_inputs(module, arrays) if module is not None else arrays
