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
