"""all-reduce-reassociate: `all-reduce(a) + all-reduce(b)` → `all-reduce(a + b)`.

When two all-reduces with the same groups and reduction meet only in the very operation
they reduce with, the combination can happen before the communication: one all-reduce
instead of two, half the bytes.

    ra = f32[64] all-reduce(a), replica_groups={{0,1,2,3}}, to_apply=add
    rb = f32[64] all-reduce(b), replica_groups={{0,1,2,3}}, to_apply=add
    ROOT s = f32[64] add(ra, rb)
  becomes
    ab = f32[64] add(a, b)
    ROOT s = f32[64] all-reduce(ab), replica_groups={{0,1,2,3}}, to_apply=add

Conditions: the combining op is the reduction's own opcode (add for sums, maximum for max,
...), both all-reduces are used only by it, and they agree on groups, channel presence and
`use_global_device_ids`.  Floating-point sums are reassociated, as XLA does.  Through converts
(`convert(all-reduce(a)) max convert(all-reduce(b))`) only for maximum/minimum, where a
(monotone) convert commutes with the reduction exactly: the result is
`convert(all-reduce(max(a, b)))` in the narrow type.  Chains (`ar0 + ar1 + ar2`) fold
one step at a time.
"""

from __future__ import annotations

import math

from hlo_passes.ir.builder import Builder, next_channel_id
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.collective_groups import group_mode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.collectives.common import replica_groups
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import register_pass

_EXACT_THROUGH_CONVERT = frozenset({Opcode.MAXIMUM, Opcode.MINIMUM})


def _lands(value: float, t: PrimitiveType) -> float:
    """`value` converted to `t` (as ml_dtypes converts, which is XLA's rounding), as a float."""
    import numpy as np

    with np.errstate(all="ignore"):
        return float(np.array(value).astype(t.numpy_dtype()).astype(np.float64))


def _fits_order_of_float(source: PrimitiveType, target: PrimitiveType) -> bool:
    """Converting to a float type keeps the order when it rounds and overflows to ±inf (IEEE
    types) or saturates at its largest value (f4e2m1fn), and a NaN the source may hold stays a
    NaN.  Types without an infinity that overflow to NaN (f8e4m3fn, the fnuz types,
    f8e8m0fnu) keep it only if every source value lies within their range: -1000 becomes NaN
    in f8e4m3fn, and max(NaN, 5) is NaN where convert(max(-1000, 5)) is 5; a type without
    NaN (f4e2m1fn) cannot hold a source's NaN."""
    import ml_dtypes
    import numpy as np

    if source.is_float and math.isnan(_lands(math.nan, source)) and not math.isnan(_lands(math.nan, target)):
        return False
    top, bottom = _lands(math.inf, target), _lands(-math.inf, target)
    if (math.isinf(top) and math.isinf(bottom)) or (not math.isnan(top) and not math.isnan(bottom) and top > bottom):
        return True
    info = ml_dtypes.finfo(target.numpy_dtype())
    low, high = float(info.min), float(info.max)
    if source is PrimitiveType.PRED:
        return low <= 0.0 and high >= 1.0
    if source.is_integer:
        bounds = np.iinfo(source.numpy_dtype())
        return low <= bounds.min and bounds.max <= high
    source_info = ml_dtypes.finfo(source.numpy_dtype())
    return (not math.isinf(_lands(math.inf, source)) and low <= float(source_info.min)
            and float(source_info.max) <= high)


def is_order_preserving(source: PrimitiveType, target: PrimitiveType) -> bool:
    """Does converting `source` to `target` keep the order (a ≤ b ⇒ f(a) ≤ f(b)), so that
    max and min commute with it: f(max(a, b)) = max(f(a), f(b))?  Rounding does (float to a
    narrower float, integer or pred to float; values past a type's range round to its top,
    and a NaN stays a NaN, which max and min propagate either way), widening an integer does
    unless it drops the sign or puts an unsigned value into a signed type of the same width.
    Wrapping does not: a narrower integer (s32 300 → u8 44), a sign
    change (s32 -1 → u32 4294967295), float to integer (NaN becomes 0; f4e2m1fn has no NaN and
    keeps the order), and a signed or float
    value to pred (nonzero is true: -1 and 1 alike); an unsigned one keeps its order there."""
    if source is target:
        return True
    if target.is_float:
        if not (source.is_float or source.is_integer or source is PrimitiveType.PRED):
            return False
        return _fits_order_of_float(source, target)
    if target is PrimitiveType.PRED:  # nonzero is true: in order only where nothing is below zero
        return source.is_integer and not source.is_signed_integer
    if target.is_integer:
        if source is PrimitiveType.PRED:
            return True
        if source.is_float:  # truncating and saturating keep the order; NaN becomes 0 and does not
            return not math.isnan(_lands(math.nan, source))
        if not source.is_integer or target.bit_width < source.bit_width:
            return False
        if source.is_signed_integer:
            return target.is_signed_integer
        return not target.is_signed_integer or target.bit_width > source.bit_width  # u8 200 is s8 -56
    return False


@register_pass
class AllReduceReassociate(ModulePass):
    name = "all-reduce-reassociate"
    summary = "Rewrite all-reduce(a) op all-reduce(b) as all-reduce(a op b)"

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations:
            progress = True
            while progress:
                progress = False
                for instr in comp.post_order():
                    if instr.parent is comp and instr.opcode.is_elementwise_binary and self._try(module, comp, instr):
                        progress = changed = True
                        break
        return changed

    @staticmethod
    def _through_convert(x: Instruction) -> tuple[Instruction, Instruction | None]:
        if x.opcode is Opcode.CONVERT and len(x.users) == 1:
            return x.operands[0], x
        return x, None

    def _try(self, module: Module, comp: Computation, op: Instruction) -> bool:
        if len(op.operands) != 2 or op.operands[0] is op.operands[1]:
            return False
        (ra, ca), (rb, cb) = (self._through_convert(o) for o in op.operands)
        if ra.opcode is not Opcode.ALL_REDUCE or rb.opcode is not Opcode.ALL_REDUCE or ra is rb:
            return False
        if not ra.shape.is_array or not rb.shape.is_array or len(ra.users) != 1 or len(rb.users) != 1:
            return False
        kind_a, kind_b = Reduction.of_instruction(ra), Reduction.of_instruction(rb)
        if kind_a is None or kind_a != kind_b or kind_a.opcode is not op.opcode:
            if kind_a is not None and kind_a == kind_b and (ca or cb) is None:
                self.remark(op, f"{op.opcode.value} does not match the all-reduces' {kind_a.opcode.value}",
                            "missed")
            return False
        if (replica_groups(ra) != replica_groups(rb) or group_mode(ra) != group_mode(rb)
                or ra.shape.dims != rb.shape.dims or ra.constrain_layout
                or rb.constrain_layout or ra.sharding is not None or rb.sharding is not None):
            return False
        if (ca is None) != (cb is None):
            return False
        if ca is not None:
            if op.opcode not in _EXACT_THROUGH_CONVERT:
                self.remark(op, "not reassociated through converts: only max/min commute with a convert",
                            "missed")
                return False
            if ca.shape.element_type is not cb.shape.element_type:
                return False
            source, target = ra.shape.element_type, ca.shape.element_type
            if not (ra.shape.is_array and rb.shape.element_type is source and is_order_preserving(source, target)):
                self.remark(op, f"not reassociated through converts: {source.value} to {target.value} does not keep "
                                f"the order {op.opcode.value} depends on", "missed")
                return False
        if ra.control_predecessors or rb.control_predecessors or ra.control_successors or rb.control_successors:
            return False
        b = Builder(comp, before=op, metadata=op.attributes.get("metadata"))
        x, y = ra.operands[0], rb.operands[0]
        combined = b.op(op.opcode, x.shape, [x, y])
        mode = group_mode(ra)
        ar = b.all_reduce([combined], replica_groups(ra), ra.called["to_apply"],
                          channel_id=next_channel_id(module) if mode.has_channel else None,
                          use_global_device_ids=True if mode.use_global_device_ids else None)
        result = b.convert(ar, ca.shape.element_type) if ca is not None else ar
        comp.replace(op, result)
        for dead in (ca, cb, ra, rb):
            if dead is not None:
                comp.remove(dead)
        self.remark(ar, f"{ra.name} {op.opcode.value} {rb.name} reassociated into one all-reduce", "applied")
        return True
