"""Tuple shardings of nested tuples.  XLA's form (HLO text, HloSharding) has one entry per
array leaf, depth first: `((a, b), c)` takes three entries and an empty tuple inside takes
none.  The partitioner used to read an entry per top-level element, so a nested tuple in a
loop's state or a call's operand crashed it, an empty tuple in loop state did too, and a
nested ENTRY parameter or result got its leaves' shardings shifted (wrong per-device shapes)
and printed nested, which XLA's parser rejects.  Each case is partitioned, its shardings are
checked by hand, and the output is verified against XLA's run of the original."""

from __future__ import annotations

import pytest

from hlo_passes import parse_module
from hlo_passes.ir import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.shape import TupleShape
from hlo_passes.runtime import verify_equivalent
from tests.frontend.xla_oracle import xla_canonical
from tests.spmd.partitioning import partition

NESTED_ROOT = """HloModule nested_root, num_partitions=8

ENTRY main {
  x = f32[8,8] parameter(0), sharding={devices=[8,1]<=[8]}
  y = f32[8,8] parameter(1), sharding={devices=[1,8]<=[8]}
  z = f32[8,8] parameter(2), sharding={devices=[2,4]<=[8]}
  a = f32[8,8] sine(x)
  b = f32[8,8] cosine(y)
  c = f32[8,8] negate(z)
  in = (f32[8,8], f32[8,8]) tuple(a, b)
  ROOT o = ((f32[8,8], f32[8,8]), f32[8,8]) tuple(in, c), sharding={{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}, {devices=[2,4]<=[8]}}
}
"""

NESTED_PARAMETER = """HloModule nested_param, num_partitions=8

ENTRY main {
  p = ((f32[8,8], f32[8,8]), f32[8,8]) parameter(0), sharding={{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}, {devices=[2,4]<=[8]}}
  in = (f32[8,8], f32[8,8]) get-tuple-element(p), index=0
  a = f32[8,8] get-tuple-element(in), index=0
  b = f32[8,8] get-tuple-element(in), index=1
  c = f32[8,8] get-tuple-element(p), index=1
  ab = f32[8,8] add(a, b)
  ROOT r = f32[8,8] multiply(ab, c), sharding={devices=[2,4]<=[8]}
}
"""

NESTED_LOOP_STATE = """HloModule nested_loop, num_partitions=8

body {
  p = ((s32[], f32[8,8]), f32[8]) parameter(0)
  inner = (s32[], f32[8,8]) get-tuple-element(p), index=0
  i = s32[] get-tuple-element(inner), index=0
  a = f32[8,8] get-tuple-element(inner), index=1
  v = f32[8] get-tuple-element(p), index=1
  a2 = f32[8,8] sine(a)
  v2 = f32[8] cosine(v)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  in2 = (s32[], f32[8,8]) tuple(i1, a2)
  ROOT out = ((s32[], f32[8,8]), f32[8]) tuple(in2, v2)
}

cond {
  p = ((s32[], f32[8,8]), f32[8]) parameter(0)
  inner = (s32[], f32[8,8]) get-tuple-element(p), index=0
  i = s32[] get-tuple-element(inner), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[8,8] parameter(0), sharding={devices=[8,1]<=[8]}
  v = f32[8] parameter(1), sharding={devices=[8]<=[8]}
  i0 = s32[] constant(0)
  in = (s32[], f32[8,8]) tuple(i0, x)
  init = ((s32[], f32[8,8]), f32[8]) tuple(in, v)
  loop = ((s32[], f32[8,8]), f32[8]) while(init), condition=cond, body=body
  o1 = (s32[], f32[8,8]) get-tuple-element(loop), index=0
  a = f32[8,8] get-tuple-element(o1), index=1
  b = f32[8] get-tuple-element(loop), index=1
  ROOT o = (f32[8,8], f32[8]) tuple(a, b), sharding={{devices=[1,8]<=[8]}, {devices=[8]<=[8]}}
}
"""

NESTED_CALL_AND_CONDITIONAL = """HloModule nested_call, num_partitions=8

f {
  p = ((f32[8,8], f32[8]), s32[]) parameter(0)
  in = (f32[8,8], f32[8]) get-tuple-element(p), index=0
  a = f32[8,8] get-tuple-element(in), index=0
  v = f32[8] get-tuple-element(in), index=1
  vb = f32[8,8] broadcast(v), dimensions={1}
  ROOT r = f32[8,8] add(a, vb)
}

g {
  p = ((f32[8,8], f32[8]), s32[]) parameter(0)
  in = (f32[8,8], f32[8]) get-tuple-element(p), index=0
  a = f32[8,8] get-tuple-element(in), index=0
  ROOT r = f32[8,8] negate(a)
}

ENTRY main {
  x = f32[8,8] parameter(0), sharding={devices=[4,2]<=[8]}
  v = f32[8] parameter(1), sharding={devices=[2,4]<=[8] last_tile_dim_replicate}
  k = s32[] parameter(2)
  in = (f32[8,8], f32[8]) tuple(x, v)
  t = ((f32[8,8], f32[8]), s32[]) tuple(in, k)
  c = f32[8,8] call(t), to_apply=f
  z = s32[] constant(0)
  gt = pred[] compare(k, z), direction=GT
  d = f32[8,8] conditional(gt, t, t), true_computation=f, false_computation=g
  ROOT o = (f32[8,8], f32[8,8]) tuple(c, d), sharding={{devices=[8,1]<=[8]}, {devices=[4,2]<=[8]}}
}
"""

EMPTY_TUPLE_IN_LOOP_STATE = """HloModule empty_in_loop, num_partitions=8

body {
  p = (s32[], (), f32[8,12], f32[12]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  a = f32[8,12] get-tuple-element(p), index=2
  v = f32[12] get-tuple-element(p), index=3
  e = () tuple()
  vb = f32[8,12] broadcast(v), dimensions={1}
  a2 = f32[8,12] add(a, vb)
  v2 = f32[12] cosine(v)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT out = (s32[], (), f32[8,12], f32[12]) tuple(i1, e, a2, v2)
}

cond {
  p = (s32[], (), f32[8,12], f32[12]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[8,12] parameter(0), sharding={devices=[8,1]<=[8]}
  v = f32[12] parameter(1), sharding={devices=[4,2]<=[8] last_tile_dim_replicate}
  e = () tuple()
  i0 = s32[] constant(0)
  init = (s32[], (), f32[8,12], f32[12]) tuple(i0, e, x, v)
  loop = (s32[], (), f32[8,12], f32[12]) while(init), condition=cond, body=body, sharding={{replicated}, {devices=[1,8]<=[8]}, {devices=[8]<=[8]}}
  a = f32[8,12] get-tuple-element(loop), index=2
  b = f32[12] get-tuple-element(loop), index=3
  ROOT o = (f32[8,12], f32[12]) tuple(a, b), sharding={{devices=[2,4]<=[8]}, {replicated}}
}
"""


def _leaf_dims(shape) -> list[tuple[int, ...]]:
    return [tuple(leaf.dims) for leaf in shape.leaves()]


def test_a_nested_result_keeps_each_leafs_sharding_and_prints_in_xlas_form():
    module, out, _ = partition(NESTED_ROOT, 8)
    root = module.entry.root
    assert _leaf_dims(root.shape) == [(1, 8), (8, 1), (4, 2)]  # [8,1], [1,8], [2,4] tiles of 8x8
    assert root.sharding.to_hlo() == "{{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}, {devices=[2,4]<=[8]}}"
    xla_canonical(out)  # XLA's parser takes the output (it refused a nested `{{{...}}}`)
    report = verify_equivalent(NESTED_ROOT, out, num_devices=8)
    assert report.ok, report.format()


def test_a_nested_parameter_takes_each_leafs_tile():
    module, out, _ = partition(NESTED_PARAMETER, 8)
    param = module.entry.parameters[0]
    assert _leaf_dims(param.shape) == [(1, 8), (8, 1), (4, 2)]
    report = verify_equivalent(NESTED_PARAMETER, out, num_devices=8)
    assert report.ok, report.format()


@pytest.mark.parametrize("text", [NESTED_LOOP_STATE, NESTED_CALL_AND_CONDITIONAL, EMPTY_TUPLE_IN_LOOP_STATE],
                         ids=["loop_state", "call_and_conditional", "empty_tuple_in_loop_state"])
def test_nested_and_empty_tuples_through_loops_calls_and_conditionals(text):
    module, out, _ = partition(text, 8)
    assert any(i.opcode in (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL) for i in module.all_instructions())
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format()


def test_subsharding_reads_the_flat_and_the_nested_form_alike():
    a, b, c = (Sharding.tiled([[i] for i in range(8)]), Sharding.replicated(), Sharding.tiled([list(range(8))]))
    module = parse_module(NESTED_ROOT)
    shape = module.entry.root.shape
    assert isinstance(shape, TupleShape)
    flat = Sharding.tuple_of([a, b, c])
    nested = Sharding.tuple_of([Sharding.tuple_of([a, b]), c])
    for s in (flat, nested):
        assert s.subsharding(shape, 0) == Sharding.tuple_of([a, b])
        assert s.subsharding(shape, 1) == c
        assert s.leaves() == (a, b, c)
    assert nested.flattened() == flat and nested.to_hlo() == flat.to_hlo()
    # an empty tuple takes no entry: ((), f32[8]) holds one leaf
    empty = parse_module("HloModule e\n\nENTRY m {\n  p = f32[8] parameter(0)\n  e = () tuple()\n"
                         "  ROOT t = ((), f32[8]) tuple(e, p)\n}\n").entry.root.shape
    assert Sharding.tuple_of([c]).subsharding(empty, 0) == Sharding.tuple_of([])
    assert Sharding.tuple_of([c]).subsharding(empty, 1) == c
    # an instruction's sharding is stored in XLA's form, however it was built
    root = module.entry.root
    root.sharding = nested
    assert root.sharding == flat


LOOP_AS_RESULT = """HloModule loop_result, num_partitions=8

cond {
  s = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8,8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[8,8] sine(x)
  ROOT t = (s32[], f32[8,8]) tuple(j, y)
}

ENTRY main {
  p = f32[8,8] parameter(0), sharding={devices=[4,2]<=[8]}
  z = s32[] constant(0)
  init = (s32[], f32[8,8]) tuple(z, p)
  w = (s32[], f32[8,8]) while(init), condition=cond, body=body
  i = s32[] get-tuple-element(w), index=0
  x = f32[8,8] get-tuple-element(w), index=1
  ROOT out = (s32[], f32[8,8]) tuple(i, x), sharding={{replicated}, {devices=[4,2]<=[8]}}
}
"""


def test_a_loop_that_becomes_the_result_keeps_the_result_sharding():
    """The partitioner's cleanup folds the root tuple of the loop's elements into the loop;
    the partitioned program still says how its result is sharded (without it `verify` cannot
    read the per-device outputs: a probe found this on Shardy-lowered scans)."""
    module, out, _ = partition(LOOP_AS_RESULT, 8)
    root = module.entry.root
    assert root.opcode is Opcode.WHILE
    assert root.sharding.to_hlo() == "{{replicated}, {devices=[4,2]<=[8]}}"
    report = verify_equivalent(LOOP_AS_RESULT, out, num_devices=8)
    assert report.ok, report.format()
