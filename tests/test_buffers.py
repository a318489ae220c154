"""ir/buffers.py: which uses write a buffer in place after XLA's copy insertion, and the check
that a rewrite shares nothing copy insertion kept apart; cse's care on such modules.  The
end-to-end cases (jax.jit through the hook, where merging gave wrong results) are in
tests/test_jax_hook.py."""

from __future__ import annotations

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode
from hlo_passes.ir.buffers import in_place_operands, in_place_sharing, new_sharing, shares_in_place_buffer
from hlo_passes.passes.cleanup.cse import CommonSubexpressionElimination

OPS = """HloModule ops

add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }

writes_param_1 {
  p0 = s32[] parameter(0)
  p1 = f32[8] parameter(1)
  v = f32[1] parameter(2)
  ROOT u = f32[8] dynamic-update-slice(p1, v, p0)
}

ENTRY e {
  x = f32[8] parameter(0)
  i = s32[] parameter(1)
  v = f32[1] parameter(2)
  idx = s32[1,1] parameter(3)
  dus = f32[8] dynamic-update-slice(x, v, i)
  sc = (f32[8], f32[8]) scatter(x, dus, idx, v, v), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add2
  fu = f32[8] fusion(i, x, v), kind=kLoop, calls=writes_param_1
  cc = f32[8] custom-call(v, i, x), custom_call_target="t", output_to_operand_aliasing={{}: (2, {})}
  ROOT a = f32[8] add(fu, cc)
}
"""
OPS = OPS.replace("to_apply=add2", "to_apply=add2").replace("ENTRY e {", """add2 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  d = f32[] parameter(3)
  s = f32[] add(a, c)
  t = f32[] add(b, d)
  ROOT r = (f32[], f32[]) tuple(s, t)
}

ENTRY e {""")


def test_which_operands_each_op_writes_in_place():
    m = parse_module(OPS)
    by_name = {i.name: i for i in m.entry.instructions}
    assert in_place_operands(by_name["dus"]) == {0}
    assert in_place_operands(by_name["sc"]) == {0, 1}          # both scattered operands
    assert in_place_operands(by_name["fu"]) == {1}             # the fused DUS writes its parameter 1
    assert in_place_operands(by_name["cc"]) == {2}             # output_to_operand_aliasing
    assert in_place_operands(by_name["a"]) == frozenset()


LOOPS = """HloModule loops

cond { s = (s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=1
  ROOT lt = pred[] compare(i, n), direction=LT }

body { s = (s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], s32[]) tuple(j, n) }

ENTRY e {
  n = s32[] parameter(0)
  zero = s32[] constant(0)
  c1 = s32[] copy(zero)
  c2 = s32[] copy(zero)
  t1 = (s32[], s32[]) tuple(c1, n)
  w1 = (s32[], s32[]) while(t1), condition=cond, body=body
  r1 = s32[] get-tuple-element(w1), index=0
  t2 = (s32[], s32[]) tuple(c2, r1)
  w2 = (s32[], s32[]) while(t2), condition=cond, body=body
  r2 = s32[] get-tuple-element(w2), index=0
  ROOT out = (s32[], s32[]) tuple(r1, r2)
}
"""


def test_cse_keeps_copies_apart_after_copy_insertion_and_merges_them_before():
    """Two copies of 0, each a loop counter's buffer: after copy insertion they stay two (one
    buffer would make the second loop start where the first ended); in a module XLA has not
    compiled yet (read from a file) they are one value, as XLA's own cse would merge them."""
    fixed = parse_module(LOOPS)
    fixed.copies_inserted = True
    assert not CommonSubexpressionElimination().run(fixed)
    assert sum(i.opcode is Opcode.COPY for i in fixed.entry.instructions) == 2
    fresh = parse_module(LOOPS)
    assert CommonSubexpressionElimination().run(fresh)
    assert sum(i.opcode is Opcode.COPY for i in fresh.entry.instructions) == 1


def test_the_sharing_check_sees_a_loop_counter_merged_through_a_tuple():
    before = parse_module(LOOPS)
    after = parse_module(LOOPS)
    CommonSubexpressionElimination().run(after)  # as if nothing cared: c2 -> c1
    problems = new_sharing(in_place_sharing(before), in_place_sharing(after))
    assert "c1 is written in place by w1 and now also read by w2#0" in problems
    assert new_sharing(in_place_sharing(before), in_place_sharing(parse_module(print_module(before)))) == []


def test_the_sharing_check_sees_outputs_returned_twice_and_parameters_written_in_place():
    base = parse_module(LOOPS)
    twice = parse_module(LOOPS.replace("ROOT out = (s32[], s32[]) tuple(r1, r2)", "ROOT out = (s32[], s32[]) tuple(r1, r1)"))
    assert any("returned twice" in p for p in new_sharing(in_place_sharing(base), in_place_sharing(twice)))
    param = parse_module(LOOPS.replace("t2 = (s32[], s32[]) tuple(c2, r1)", "t2 = (s32[], s32[]) tuple(n, r1)"))
    assert any("n (an entry parameter or a constant) is now written in place by w2" in p
               for p in new_sharing(in_place_sharing(base), in_place_sharing(param)))


def test_the_sharing_check_follows_an_output_through_a_loop_to_the_parameter_it_started_in():
    """w1 passes the entry parameter n through its state unchanged, so w1's element 1 is n's
    buffer; copy insertion returns a copy of it.  A rewrite that drops the copy returns the
    parameter's buffer as an output, however many loops it passed through."""
    kept = parse_module(LOOPS.replace("ROOT out = (s32[], s32[]) tuple(r1, r2)",
                                      "m1 = s32[] get-tuple-element(w1), index=1\n  cm = s32[] copy(m1)\n"
                                      "  ROOT out = (s32[], s32[]) tuple(cm, r2)"))
    dropped = parse_module(LOOPS.replace("ROOT out = (s32[], s32[]) tuple(r1, r2)",
                                         "m1 = s32[] get-tuple-element(w1), index=1\n"
                                         "  ROOT out = (s32[], s32[]) tuple(m1, r2)"))
    problems = new_sharing(in_place_sharing(kept), in_place_sharing(dropped))
    assert any(p.startswith("m1's buffer (an entry parameter's") for p in problems), problems
    # element 0 starts in a copy (c1): returning it needs no copy of its own
    outputs = {key: readers for key, readers in in_place_sharing(parse_module(LOOPS)).items() if key[1] < 0}
    assert outputs and not any("<read-only>" in readers for readers in outputs.values())
    # through two loops: w2's element 1 is r1 = w1's element 0 (c1); element 1 of a loop fed n
    two = parse_module(LOOPS.replace("t2 = (s32[], s32[]) tuple(c2, r1)", "t2 = (s32[], s32[]) tuple(c2, n)")
                       .replace("ROOT out = (s32[], s32[]) tuple(r1, r2)",
                                "m2 = s32[] get-tuple-element(w2), index=1\n  ROOT out = (s32[], s32[]) tuple(r1, m2)"))
    assert any(p.startswith("m2's buffer") for p in new_sharing(in_place_sharing(kept), in_place_sharing(two)))


def test_what_cse_must_not_merge_after_copy_insertion():
    m = parse_module(LOOPS)
    by_name = {i.name: i for i in m.entry.instructions}
    assert shares_in_place_buffer(by_name["c1"])     # a copy, and a loop's state
    assert shares_in_place_buffer(by_name["r2"])     # an output
    assert not shares_in_place_buffer(by_name["zero"])  # only copied from
