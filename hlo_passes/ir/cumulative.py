"""Cumulative reductions written as reduce-windows.

JAX's `cumsum`, `cummax`, `cummin` and `cumprod` lower on the CPU to a reduce-window as wide as
the scanned dim: output row i reduces input rows 0..i (a prefix: the window N rows wide with
N-1 rows of padding below) or rows i..N-1 (a suffix, `reverse=True`: the padding above).

    %c = f32[64,256] reduce-window(%x, f32[] constant(0)), window={size=64x1 pad=63_0x0_0}, to_apply=%add

Read as a window, every output row reads the whole dim (the partitioner would gather it, or
fetch a halo as wide as it, and compute N-row windows); read as a scan, each device can scan
its own rows and combine them with the totals of the rows before it.  Propagation
(`propagation_rules.wide_window_dims`) and the partitioner's reduce-window handler both ask
this module which reading applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType


@dataclass(frozen=True)
class CumulativeWindow:
    """A reduce-window that is a cumulative reduction along `dim` (a suffix when `suffix`):
    every other dim's window is one element and the init value is the reducer's `identity`.

    The reducer (`combiner`, the reduce-window's to_apply) is a named one (`reduction`: add,
    max, min, multiply, and, or), whose init value must then be its identity, or any binary
    scalar computation (JAX's cumulative logsumexp combines with a logaddexp region and starts
    from -inf), whose constant init value is taken as its identity, as XLA's semantics of a
    reduce-window take it: a backend may apply the init any number of times.  Another init
    value for a named reducer has no meaning a scan could keep: XLA applies it a number of
    times that depends on how it splits a wide window (its CPU backend rewrites a 256-wide
    cumsum into two levels and adds the init value twice), and a parameter's value is
    unknown."""

    dim: int
    suffix: bool
    identity: bool | int | float
    combiner: Computation
    reduction: Reduction | None  # the named reducer, when it is one (one op combines two values)

    @classmethod
    def of(cls, instr: Instruction) -> "CumulativeWindow | None":
        """The cumulative reduction `instr` computes, or None (not a reduce-window, variadic,
        strided, dilated, reversed, narrower than its dim, more than one windowed dim, a
        named reducer without an identity or with another init value, a reducer that is not
        a binary scalar computation, or an init value that is not a constant)."""
        window = instr.window
        if (instr.opcode is not Opcode.REDUCE_WINDOW or window is None or len(instr.operands) != 2
                or not instr.shape.is_array):
            return None
        windowed = window.windowed_dims()
        if len(windowed) != 1:
            return None
        d = windowed[0]
        rows = instr.operands[0].array_shape.dims[d]
        w = window.dimensions[d]
        if rows < 2 or (w.size, w.stride, w.lhs_dilation, w.rhs_dilation, w.reversal) != (rows, 1, 1, 1, False):
            return None
        if (w.padding_low, w.padding_high) not in ((rows - 1, 0), (0, rows - 1)):
            return None
        init = instr.operands[1]
        if init.opcode is not Opcode.CONSTANT:
            return None
        value = init.literal_value().item()
        combiner = instr.called_computation("to_apply")
        reduction = Reduction.of(combiner)
        if reduction is not None:
            try:
                identity = reduction.identity
            except ValueError:  # `and` over floats: no identity to mask with
                return None
            if value != identity:
                return None
        elif not _binary_scalar(combiner, instr.array_shape.element_type):
            return None
        return cls(d, w.padding_low == 0, value, combiner, reduction)


def _binary_scalar(comp: Computation, element_type: PrimitiveType) -> bool:
    """Two scalar parameters of `element_type` and a root of the same: a reducer of one operand."""
    scalar = ArrayShape(element_type, ())
    return (len(comp.parameters) == 2 and all(p.shape == scalar for p in comp.parameters)
            and comp.root is not None and comp.root.shape == scalar)
