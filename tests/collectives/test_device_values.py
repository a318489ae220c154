"""The per-device evaluator (`passes/collectives/device_values.py`): values of partition-id
expressions on each device, checked against arithmetic done here by hand."""

from __future__ import annotations

import pytest

from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.collectives.device_values import DeviceEvaluator, NotDeviceConstant


def _chain_module(length: int) -> str:
    """partition-id * 3, then `length` times + 1, and the same chain added to a parameter."""
    lines = ["HloModule chain, num_partitions=4", "", "ENTRY main {",
             "  p = s32[] parameter(0)", "  id = u32[] partition-id()", "  x0 = s32[] convert(id)",
             "  three = s32[] constant(3)", "  one = s32[] constant(1)", "  m = s32[] multiply(x0, three)"]
    prev = "m"
    for i in range(length):
        lines.append(f"  a{i} = s32[] add({prev}, one)")
        prev = f"a{i}"
    lines.append(f"  tainted = s32[] add({prev}, p)")
    lines.append(f"  ROOT t = (s32[], s32[]) tuple({prev}, tainted)")
    lines.append("}")
    return "\n".join(lines)


def test_a_chain_deeper_than_pythons_stack_is_evaluated():
    # The dropout key of a 96-layer GPT step chains through every layer: the evaluator used to
    # recurse once per link and died with RecursionError inside weight-update-sharding.
    length = 20_000
    module = parse_module(_chain_module(length))
    last = module.entry.root.operands[0]
    for partition in range(4):
        assert int(DeviceEvaluator(0, partition)(last)) == partition * 3 + length


def test_a_value_reading_a_parameter_is_not_device_constant_and_stays_so():
    module = parse_module(_chain_module(50))
    tainted = module.entry.root.operands[1]
    evaluate = DeviceEvaluator(0, 1)
    for _ in range(2):  # the second answer comes from the memo, and is the same
        with pytest.raises(NotDeviceConstant, match="parameter"):
            evaluate(tainted)
    assert int(evaluate(module.entry.root.operands[0])) == 3 + 50


# Values where numpy's casts and float arithmetic part from XLA's: past each integer type's
# ends, NaN, fractions, signs (XLA saturates float-to-integer converts and makes NaN 0).
_FLOATS = [float("nan"), float("inf"), float("-inf"), -3e9, 3e9, -1e19, 1e19, -300.5, -200.0, -129.0, -1.5,
           -0.5, 0.0, 0.7, 127.9, 200.0, 255.0, 256.0, 65536.0, 2.0 ** 31, 2.0 ** 63, 2.0 ** 64]


@pytest.mark.parametrize("target", ["s8", "u8", "s16", "s32", "u32", "s64", "u64", "pred", "f16", "bf16"])
def test_the_evaluators_convert_is_xlas(target):
    """Float-to-integer converts evaluated per device equal XLA's own (numpy's cast wrapped
    256.0 to u8 0 and gave INT_MIN for NaN, so unlike devices looked alike and an offset looked
    like the device's own shard: wrong programs from all-reduce-simplifier and
    reduce-scatter-creator)."""
    import numpy as np

    from hlo_passes.ir.types import PrimitiveType
    from hlo_passes.passes.collectives.device_values import xla_convert
    from hlo_passes.runtime import execute_module

    n = len(_FLOATS)
    text = (f"HloModule c\nENTRY e {{\n  x = f32[{n}] parameter(0)\n  ROOT y = {target}[{n}] convert(x)\n}}\n")
    x = np.array(_FLOATS, np.float32)
    (want,) = execute_module(text, [x])
    got = xla_convert(x, PrimitiveType(target).numpy_dtype())
    assert got.dtype == want.dtype
    assert np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True), (got, want)


@pytest.mark.parametrize("etype", ["s8", "s32", "s64", "u64"])
def test_integer_division_is_exact_and_wraps_as_xla(etype):
    """divide and remainder of integers past 2^53 (a float64 quotient lost the low bits) and
    at the type's ends (INT_MIN / -1), against XLA's own."""
    import numpy as np

    from hlo_passes.ir.types import PrimitiveType
    from hlo_passes.passes.collectives.device_values import _integer_division
    from hlo_passes.runtime import execute_module

    dtype = PrimitiveType(etype).numpy_dtype()
    info = np.iinfo(dtype)
    a = [info.min, info.min + 1, -7, -1, 0, 5, 7, info.max - 1, info.max, 2 ** 60 + 3 if info.bits == 64 else 3]
    b = [-1, 3, 2, -3, 7, -2, 1, 2, info.max, 1]
    if info.min == 0:
        a, b = [abs(int(v)) for v in a], [abs(int(v)) or 1 for v in b]
    a_arr, b_arr = np.array(a, dtype), np.array(b, dtype)
    n = len(a)
    text = (f"HloModule d\nENTRY e {{\n  a = {etype}[{n}] parameter(0)\n  b = {etype}[{n}] parameter(1)\n"
            f"  q = {etype}[{n}] divide(a, b)\n  r = {etype}[{n}] remainder(a, b)\n"
            f"  ROOT t = ({etype}[{n}], {etype}[{n}]) tuple(q, r)\n}}\n")
    want_q, want_r = execute_module(text, [a_arr, b_arr])
    assert np.array_equal(_integer_division(a_arr, b_arr, dtype, remainder=False), want_q)
    assert np.array_equal(_integer_division(a_arr, b_arr, dtype, remainder=True), want_r)
