"""Trip counts of while loops (ir/while_loop.py) and statistics of what a step executes."""

from __future__ import annotations

import pytest

from hlo_passes import parse_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.while_loop import trip_count
from hlo_passes.stats import module_stats

LOOP = """HloModule loop, num_partitions=2

cond {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(%BOUND%)
  ROOT c = pred[] compare(%CMP%), direction=%DIR%
}

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  step = s32[] constant(%STEP%)
  next = s32[] %UPDATE%
  r = f32[4] all-reduce(x), replica_groups={{0,1}}, to_apply=sum
  ROOT t = (s32[], f32[4]) tuple(next, r)
}

ENTRY main {
  x = f32[4] parameter(0)
  start = s32[] constant(%START%)
  init = (s32[], f32[4]) tuple(start, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body%CONFIG%
  ROOT y = f32[4] get-tuple-element(w), index=1
}
"""


def _loop(start=0, bound=12, step=1, direction="LT", cmp="i, n", update="add(i, step)", config=""):
    text = (LOOP.replace("%START%", str(start)).replace("%BOUND%", str(bound)).replace("%STEP%", str(step))
            .replace("%DIR%", direction).replace("%CMP%", cmp).replace("%UPDATE%", update)
            .replace("%CONFIG%", config))
    module = parse_module(text)
    return module, next(i for i in module.entry.instructions if i.opcode is Opcode.WHILE)


@pytest.mark.parametrize("kw, expected", [
    ({}, 12),                                                    # for i in range(12)
    ({"start": 3}, 9),
    ({"step": 5}, 3),                                            # 0, 5, 10
    ({"direction": "LE"}, 13),
    ({"start": 12, "bound": 0, "step": 1, "direction": "GT", "update": "subtract(i, step)"}, 12),
    ({"cmp": "n, i", "direction": "GT"}, 12),                    # 12 > i, written the other way round
    ({"bound": 0}, 0),
    ({"direction": "NE", "bound": 12, "step": 4}, 3),
    ({"direction": "NE", "bound": 13, "step": 4}, None),         # never equal: unknown, not a guess
    ({"update": "multiply(i, step)"}, None),
    ({"config": ', backend_config={"known_trip_count":{"n":"7"}}', "update": "multiply(i, step)"}, 7),
])
def test_trip_count(kw, expected):
    _, loop = _loop(**kw)
    assert trip_count(loop) == expected


def test_executed_statistics_count_a_loop_body_once_per_iteration():
    module, _ = _loop(bound=12)
    static = module_stats(module)
    executed = module_stats(module, executed=True)
    assert static.collective_count["all-reduce"] == 1 and static.collective_bytes["all-reduce"] == 16
    assert executed.collective_count["all-reduce"] == 12 and executed.collective_bytes["all-reduce"] == 12 * 16
    unknown, _ = _loop(update="multiply(i, step)")
    assert module_stats(unknown, executed=True).collective_count["all-reduce"] == 1  # unknown: once
