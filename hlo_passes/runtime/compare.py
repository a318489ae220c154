"""Comparing an expected output array with an actual one.

    stats = compare_arrays("0", want, got)            # dtype-aware default tolerances
    stats = compare_arrays("1", want, got, rtol=1e-3)  # overrides
    stats.ok, stats.max_abs, stats.max_rel, stats.detail

An element is equal when |got - want| <= atol + rtol * |want| (numpy's
`allclose` rule) among finite elements, or (default tolerances only) when
|got - want| <= atol + rtol * max|want| (the array's scale: reductions rounded in another
order, e.g. partitioned, move a result whose terms cancel by many of its own ulps); NaN and ±Inf must sit at the same
positions (and infinities have the same sign).  Integers and pred compare
exactly, in their own type (no float rounding of 64-bit values).  Default
tolerances by element type (rtol, atol):

    pred, integers            exact
    f64, c128                 1e-9, 1e-9
    f32, c64                  1e-4, 1e-5   (reassociated reductions, e.g. all-reduce order)
    f16                       5e-3, 5e-3
    bf16                      2e-2, 2e-2
    f8 / f4 types             two units in the last place: 2·eps (e4m3fn 0.25, e5m2 0.5)

A float output computed from a less precise float type (an f32 loss of a bf16 model) gets that
type's tolerance (`computed_in`): the roundings of the narrow type reach the output.

`max_rel` is |got - want| / |want| over finite elements with want != 0.
The detail of a failed comparison names the first mismatching element (in
row-major order) with both values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_FIXED = {
    "float64": (1e-9, 1e-9), "complex128": (1e-9, 1e-9),
    "float32": (1e-4, 1e-5), "complex64": (1e-4, 1e-5),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}


@dataclass
class OutputStats:
    """How one output compared: `index` names it ("0", "1", or "2 (device 3)")."""

    index: str
    dtype: str
    shape: tuple
    max_abs: float = 0.0
    max_rel: float = 0.0
    ok: bool = True
    detail: str = ""
    rtol: float = 0.0
    atol: float = 0.0
    compared: bool = True  # False: values not comparable (see verify.drawn_at_random)

    def format(self) -> str:
        mark = "ok " if self.ok else "BAD"
        line = f"{mark} output {self.index}: {self.dtype}{list(self.shape)}"
        if self.compared:
            line += f" max abs {self.max_abs:.3g} max rel {self.max_rel:.3g}"
        return line + (f" — {self.detail}" if self.detail else "")


def default_tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) by element type: exact for integers and pred (see the module docstring)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu" or dtype.name.startswith(("int", "uint")):  # ml_dtypes int2/int4 too
        return 0.0, 0.0
    if dtype.name in _FIXED:
        return _FIXED[dtype.name]
    try:
        import ml_dtypes

        eps = float(ml_dtypes.finfo(dtype).eps)
    except (ImportError, ValueError, TypeError):
        return 1e-4, 1e-5
    return 2 * eps, 2 * eps


def _is_exact(dtype: np.dtype) -> bool:
    return default_tolerance(dtype) == (0.0, 0.0)


def compare_arrays(index: str, want: np.ndarray, got: np.ndarray, rtol: float | None = None,
                   atol: float | None = None, computed_in: np.dtype | None = None) -> OutputStats:
    """Compare `got` with `want` (the oracle); see the module docstring for the rule.
    `computed_in`: the least precise float type the output is computed from, when less precise
    than its own (an f32 loss of a bf16 model): the default tolerance is that type's, since its
    roundings reach the output (XLA:GPU and XLA:CPU round a bf16 model at different places)."""
    want, got = np.asarray(want), np.asarray(got)
    stats = OutputStats(index, str(want.dtype), tuple(want.shape))
    if want.shape != got.shape or want.dtype != got.dtype:
        stats.ok = False
        stats.detail = f"expected {want.dtype}{list(want.shape)}, got {got.dtype}{list(got.shape)}"
        return stats
    d_rtol, d_atol = default_tolerance(want.dtype)
    if computed_in is not None and want.dtype.kind in "fcV" and not _is_exact(want.dtype):
        c_rtol, c_atol = default_tolerance(computed_in)
        d_rtol, d_atol = max(d_rtol, c_rtol), max(d_atol, c_atol)
    stats.rtol = d_rtol if rtol is None else rtol
    stats.atol = d_atol if atol is None else atol
    if want.size == 0:
        return stats
    if _is_exact(want.dtype) and rtol is None and atol is None:
        bad = want != got
        w = want.astype(np.float64)
        g = got.astype(np.float64)
        diff = np.abs(w - g)
        finite = np.ones(want.shape, bool)
    else:
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        w, g = want.astype(wide), got.astype(wide)
        w_nan, g_nan = np.isnan(w), np.isnan(g)
        w_inf, g_inf = np.isinf(w), np.isinf(g)
        finite = ~(w_nan | g_nan | w_inf | g_inf)
        bad = (w_nan != g_nan) | (w_inf != g_inf) | (w_inf & g_inf & (w != g))
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where either is not finite
            diff = np.where(finite, np.abs(w - g), 0.0)
        allowed = stats.atol + stats.rtol * np.abs(np.where(finite, w, 0.0))
        if rtol is None and finite.any():
            # A float sum rounds every partial sum: a partitioned reduction adds in another order,
            # and where terms cancel the result moves by many of its own ulps.  The error is then
            # bounded by the terms' magnitude, not the result's: judged against the array's scale.
            allowed = np.maximum(allowed, stats.atol + stats.rtol * float(np.abs(w[finite]).max()))
        bad |= finite & (diff > allowed)
    stats.max_abs = float(diff.max())
    nonzero = finite & (np.abs(w) > 0)
    if nonzero.any():
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            stats.max_rel = float((diff[nonzero] / np.abs(w[nonzero])).max())
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        stats.ok = False
        stats.detail = (f"{int(bad.sum())} of {want.size} elements differ; first mismatch at "
                        f"{list(where)}: expected {_value(want[where])}, got {_value(got[where])}")
    return stats


def _value(x) -> str:
    try:
        v = x.item()
    except (AttributeError, ValueError):
        return str(x)
    return f"{v:.8g}" if isinstance(v, float) else repr(v)
