"""Random differential tests of loops whose body constrains its carried value (issue 11).

Propagation lets a `Sharding` constraint inside a while body decide the loop state's sharding
when it conflicts with the initial value's (propagation_rules._loop_carried_constraints; XLA's
GSPMD propagation keeps whichever reached the loop first).  Each drawn module — an initial
tiling, a constraint at the body's start, end, both or neither, a second carried value, an
element-wise or reducing step, a trip count from 0 to 4 (0 and 1 keep XLA's rule), a result
sharding or none — is partitioned and checked against XLA's run of the unpartitioned module on
8 devices, with no op left to the replicating fallback."""

from __future__ import annotations

import random

import pytest

from tests.spmd.partitioning import partition_verified

TILINGS = (
    "{replicated}",
    "{devices=[8,1]<=[8]}",
    "{devices=[1,8]<=[8]}",
    "{devices=[4,2]<=[8]}",
    "{devices=[2,4]<=[4,2]T(1,0)}",
    "{devices=[4,1,2]<=[8] last_tile_dim_replicate}",
    "{devices=[1,4,2]<=[8] last_tile_dim_replicate}",
    "{devices=[2,1,4]<=[2,4]T(1,0) last_tile_dim_replicate}",
)

STEPS = (
    "  x2 = f32[{r},{c}] add(xa, bt)",
    "  x2 = f32[{r},{c}] multiply(xa, xa)",
    "  x2 = f32[{r},{c}] tanh(xa)",
    "  rv = f32[{r},{c}] reverse(xa), dimensions={{0}}\n  x2 = f32[{r},{c}] add(rv, bt)",
)


def loop_module(seed: int) -> str:
    rng = random.Random(seed)
    rows, cols = rng.choice(((16, 32), (8, 8), (12, 16), (24, 8)))
    shape = f"f32[{rows},{cols}]"
    at_start, at_end = rng.choice(((True, False), (False, True), (True, True), (False, False), (False, True)))
    start = rng.choice(TILINGS)
    end = rng.choice(TILINGS)
    read = (f'  xa = {shape} custom-call(x), custom_call_target="Sharding", sharding={rng.choice(TILINGS)}'
            if at_start else f"  xa = {shape} copy(x)")
    step = rng.choice(STEPS).format(r=rows, c=cols)
    write = (f'  x3 = {shape} custom-call(x2), custom_call_target="Sharding", sharding={end}'
             if at_end else f"  x3 = {shape} negate(x2)")
    trips = rng.randint(0, 4)
    result = rng.choice(("", f", sharding={rng.choice(TILINGS)}"))
    return f"""HloModule loop_{seed}, num_partitions=8

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

body {{
  p = ({shape}, f32[6,10], s32[]) parameter(0)
  x = {shape} get-tuple-element(p), index=0
  y = f32[6,10] get-tuple-element(p), index=1
  zero = f32[] constant(0)
  total = f32[] reduce(y, zero), dimensions={{0,1}}, to_apply=add
  bt = {shape} broadcast(total), dimensions={{}}
{read}
{step}
{write}
  half = f32[] constant(0.5)
  hb = f32[6,10] broadcast(half), dimensions={{}}
  y2 = f32[6,10] multiply(y, hb)
  i = s32[] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT t = ({shape}, f32[6,10], s32[]) tuple(x3, y2, i2)
}}

cond {{
  p = ({shape}, f32[6,10], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=2
  n = s32[] constant({trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

ENTRY e {{
  x = {shape} parameter(0), sharding={start}
  y0 = f32[6,10] parameter(1), sharding={{replicated}}
  y = f32[6,10] custom-call(y0), custom_call_target="Sharding", sharding={rng.choice(TILINGS[:2])}
  zero = s32[] constant(0)
  init = ({shape}, f32[6,10], s32[]) tuple(x, y, zero)
  loop = ({shape}, f32[6,10], s32[]) while(init), condition=cond, body=body
  ROOT r = {shape} get-tuple-element(loop), index=0{result}
}}
"""


@pytest.mark.parametrize("seed", range(16))
def test_random_loop_with_constrained_carry_computes_the_same(seed):
    partition_verified(loop_module(seed))
