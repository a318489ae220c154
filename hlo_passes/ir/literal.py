"""Constant literals as numpy arrays, and back.

A constant keeps its literal text (printed back unchanged); passes that need
the values — offset tables indexed by partition-id, scalar factors — read them
with `literal_array`.  `format_literal` prints an array the way XLA does.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hlo_passes.ir.shape import ArrayShape, TupleShape


def literal_array(text: str, shape: ArrayShape) -> np.ndarray:
    """Values of an array literal (`{1, 2}`, `{ {1,2},{3,4} }`, `-inf`, `(1, 2)` for complex)."""
    if isinstance(shape, TupleShape):
        raise ValueError("tuple literals have no single array value")
    dtype = shape.element_type.numpy_dtype()
    body = text.strip()
    if shape.element_type.is_complex:
        body = body.replace("(", "[").replace(")", "]")
    body = body.replace("{", "[").replace("}", "]")
    body = (body.replace("-inf", "-Infinity").replace("inf", "Infinity").replace("-nan", "NaN")
            .replace("nan", "NaN"))
    values = json.loads(body)
    if shape.element_type.is_complex:
        arr = np.asarray(values, dtype=np.float64)
        arr = arr[..., 0] + 1j * arr[..., 1]
    else:
        arr = np.asarray(values, dtype=np.float64 if shape.element_type.is_float else None)
    if arr.size == 0:
        return np.zeros(shape.dims, dtype=dtype)
    return arr.astype(dtype).reshape(shape.dims)


def format_literal(values: np.ndarray) -> str:
    """XLA's spelling of an array literal: nested braces, `true`/`false`, `nan`/`inf`."""
    arr = np.asarray(values)

    def scalar(v: Any) -> str:
        if arr.dtype == np.bool_:
            return "true" if v else "false"
        if np.issubdtype(arr.dtype, np.integer):
            return str(int(v))
        if np.issubdtype(arr.dtype, np.complexfloating):
            return f"({scalar_float(v.real)}, {scalar_float(v.imag)})"
        return scalar_float(float(v))

    def scalar_float(v: float) -> str:
        if np.isnan(v):
            return "nan"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(float(v)).removesuffix(".0") if float(v).is_integer() else repr(float(v))

    def nest(a: np.ndarray) -> str:
        if a.ndim == 0:
            return scalar(a.item() if arr.dtype != np.bool_ else bool(a))
        return "{" + ", ".join(nest(x) for x in a) + "}"

    return nest(arr)
