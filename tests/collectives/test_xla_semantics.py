"""The combiners and reduce-scatter-creator against XLA's rules, one rule per test: the
expectation of each is derived by hand from XLA's algorithm (which members merge, what is
declined), and every rewrite is run against its input through XLA on the module's devices."""

import pytest

from hlo_passes.ir import Opcode
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.collectives.post_order import xla_post_order
from hlo_passes.passes.collectives.domains import DomainMap
from hlo_passes.passes.pipeline import parse_pipeline
from tests.collectives.helpers import G2, G4, merged_names, module, ops, run

AR = Opcode.ALL_REDUCE
AG = Opcode.ALL_GATHER
RS = Opcode.REDUCE_SCATTER


# ------------------------------------------------------------ grouping --
def test_post_order_is_xlas_depth_first_walk_from_the_root():
    m = parse_module(module("""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] all-reduce(p), replica_groups={}, to_apply=add
  b = f32[4] all-reduce(q), replica_groups={}, to_apply=add
  c = f32[4] negate(q), control-predecessors={b}
  ROOT t = (f32[4], f32[4], f32[4]) tuple(c, a, b)"""))
    # from the root: c first (its control predecessor b before its operand q), then a
    assert [i.name for i in xla_post_order(m.entry)] == ["q", "b", "c", "p", "a", "t"]


def test_groups_follow_xlas_order_not_the_text_order():
    # pairs (32 bytes): the walk meets z, y, x (the root's operands first to last)
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  r = f32[4] parameter(2)
  x = f32[4] all-reduce(p), {G4}, to_apply=add
  y = f32[4] all-reduce(q), {G4}, to_apply=add
  z = f32[4] all-reduce(r), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4]) tuple(z, y, x)""")
    _, m, _ = run("all-reduce-combiner", text, combine_threshold_in_bytes=32)
    assert merged_names(m, AR) == [["p"], ["q", "r"]]


def test_a_dependent_candidate_closes_the_group():
    # b waits on a (control edge): the first group is {a} alone; b and c merge on the next walk
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  r = f32[4] parameter(2)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(q), {G4}, to_apply=add, control-predecessors={{a}}
  c = f32[4] all-reduce(r), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4]) tuple(a, b, c)""")
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed and merged_names(m, AR) == [["p"], ["q", "r"]]
    (merged,) = [x for x in ops(m, AR) if x.shape.is_tuple]
    assert [x.name for x in merged.control_predecessors] == ["a"]


def test_a_later_group_sees_the_dependences_an_earlier_merge_made():
    # walk 1 merges a1 and a2 (G4).  Before that merge b1 and b2 (G2) are independent; after
    # it b2 reads a1's share of the merged all-reduce, which reads f, so b1: merging b1 and b2
    # would close a cycle through the merged all-reduce.  The merge also moves b1 before b2
    # in the post order (the root's first operand b2 now reaches b1 through the merge).
    text = module(f"""
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  b1 = f32[4] all-reduce(x), {G2}, to_apply=add
  f = f32[4] negate(b1)
  a2 = f32[4] all-reduce(f), {G4}, to_apply=add
  a1 = f32[4] all-reduce(y), {G4}, to_apply=add
  g = f32[4] negate(a1)
  b2 = f32[4] all-reduce(g), {G2}, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(b2, a2)""")
    assert [i.name for i in xla_post_order(parse_module(text).entry) if i.opcode is AR] == ["a1", "b2", "b1", "a2"]
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed and merged_names(m, AR) == [["f", "y"], ["g"], ["x"]]


def test_control_dependency_alone_is_respected():
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(q), {G4}, to_apply=add, control-predecessors={{a}}
  ROOT t = (f32[4], f32[4]) tuple(a, b)""")
    changed, m, _ = run("all-reduce-combiner", text, numerics=False)
    assert not changed and len(ops(m, AR)) == 2


def test_byte_threshold_closes_groups_and_drops_oversized_members():
    # 16 bytes each, big 64 > 40: {a, b} (c would make 48), then big is dropped and {c, d} merge
    text = module(f"""
  p = f32[4] parameter(0)
  w = f32[16] parameter(1)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(p), {G4}, to_apply=sum
  c = f32[4] negate(p)
  ac = f32[4] all-reduce(c), {G4}, to_apply=add
  big = f32[16] all-reduce(w), {G4}, to_apply=add
  e = f32[4] exponential(p)
  d = f32[4] all-reduce(e), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4], f32[16], f32[4]) tuple(a, b, ac, big, d)""")
    _, m, _ = run("all-reduce-combiner", text, combine_threshold_in_bytes=40)
    assert merged_names(m, AR) == [["c", "e"], ["p", "p"], ["w"]]


def test_count_threshold_and_non_positive_thresholds():
    body = "\n".join(f"  p{k} = f32[2] parameter({k})\n  a{k} = f32[2] all-reduce(p{k}), {G2}, to_apply=add"
                     for k in range(5))
    text = module(body + "\n  ROOT t = (f32[2], f32[2], f32[2], f32[2], f32[2]) tuple(a0, a1, a2, a3, a4)")
    _, m, _ = run("all-reduce-combiner", text, combine_threshold_count=2)
    assert merged_names(m, AR) == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    for options in ({"combine_threshold_count": 0}, {"combine_threshold_in_bytes": 0}):
        changed, _, p = run("all-reduce-combiner", text, numerics=False, **options)
        assert not changed and any("not positive" in r.message for r in p.remarks)


def test_key_fields_reduction_type_channel_global_ids_and_groups_as_written():
    text = module(f"""
  p = f32[4] parameter(0)
  i = s32[4] parameter(1)
  a = f32[4] all-reduce(p), replica_groups={{}}, to_apply=add
  b = f32[4] all-reduce(p), replica_groups={{}}, to_apply=sum
  c = f32[4] all-reduce(p), replica_groups={{{{0,1,2,3,4,5,6,7}}}}, to_apply=add
  d = f32[4] all-reduce(p), replica_groups={{}}, to_apply=mx
  e = s32[4] all-reduce(i), replica_groups={{}}, to_apply=add_s32
  f = s32[4] all-reduce(i), replica_groups={{}}, to_apply=add_s32
  g = f32[4] all-reduce(p), channel_id=1, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=add
  h = f32[4] all-reduce(p), channel_id=2, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4], f32[4], s32[4], s32[4], f32[4], f32[4]) tuple(a, b, c, d, e, f, g, h)""")
    _, m, _ = run("all-reduce-combiner", text)
    # add == sum by meaning; {} and the spelled-out group differ; max, s32 and channels apart
    assert merged_names(m, AR) == [["i", "i"], ["p"], ["p"], ["p", "p"], ["p", "p"]]
    (g,) = [x for x in ops(m, AR) if x.attr("channel_id") is not None]
    assert g.attr("channel_id") == 1 and g.attr("use_global_device_ids")  # the first member's channel


def test_a_layout_constrained_collective_stops_only_its_own_combiner():
    text = module(f"""
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(p), {G4}, to_apply=add
  c = f32[4] all-reduce(p), {G2}, to_apply=add, constrain_layout=true
  x = f32[16] all-gather(p), {G4}, dimensions={{0}}
  y = f32[16] all-gather(p), {G4}, dimensions={{0}}
  ROOT t = (f32[4], f32[4], f32[4], f32[16], f32[16]) tuple(a, b, c, x, y)""")
    changed, m, p = run("all-reduce-combiner", text, numerics=False)
    assert not changed and any("layout-constrained" in r.message for r in p.remarks)
    changed, m, _ = run("all-gather-combiner", text)
    assert changed and len(ops(m, AG)) == 1


@pytest.mark.parametrize("scheduled", [False, True])
def test_scheduled_module_keeps_its_schedule(scheduled):
    # n (which needs a) sits between a and b in the schedule: merging would move n after b
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  n = f32[4] negate(a)
  b = f32[4] all-reduce(q), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(n, b)""", "replica_count=8" + (", is_scheduled=true" if scheduled else ""))
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed is not scheduled


def test_sharding_domains_with_the_same_metadata_combine():
    dom = 'domain={{kind="sharding", entry={{maximal device={0}}}, exit={{maximal device={1}}}}}'
    text = f"""HloModule m, replica_count=2

add {{ a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }}

ENTRY e {{
  p = f32[4] parameter(0), sharding={{maximal device=0}}
  q = f32[4] parameter(1), sharding={{maximal device=0}}
  d0 = f32[4] domain(p), {dom.format(1, 0)}
  d1 = f32[4] domain(q), {dom.format(1, 0)}
  d2 = f32[4] domain(q), {dom.format(2, 0)}
  a = f32[4] all-reduce(d0), replica_groups={{}}, to_apply=add, sharding={{maximal device=1}}
  b = f32[4] all-reduce(d1), replica_groups={{}}, to_apply=add, sharding={{maximal device=1}}
  c = f32[4] all-reduce(d2), replica_groups={{}}, to_apply=add, sharding={{maximal device=2}}
  ea = f32[4] domain(a), {dom.format(0, 1)}
  eb = f32[4] domain(b), {dom.format(0, 1)}
  ec = f32[4] domain(c), {dom.format(0, 2)}
  ROOT t = (f32[4], f32[4], f32[4]) tuple(ea, eb, ec), sharding={{{{maximal device=0}}, {{maximal device=0}}, {{maximal device=0}}}}
}}
"""
    m = parse_module(text)
    ids = DomainMap(m.entry)
    by_name = {i.name: ids.metadata_id(i) for i in m.entry.instructions}
    assert by_name["a"] == by_name["b"] != by_name["c"] != by_name["p"]  # a and b: two regions, one device
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed and merged_names(m, AR) == [["d0", "d1"], ["d2"]]
    gtes = ops(m, Opcode.GET_TUPLE_ELEMENT)
    assert {str(g.sharding.to_hlo()) for g in gtes} == {"{maximal device=1}"}


def test_without_domains_every_instruction_has_metadata_id_zero():
    m = parse_module(module(f"  p = f32[4] parameter(0)\n  ROOT a = f32[4] all-reduce(p), {G4}, to_apply=add"))
    assert {DomainMap(m.entry).metadata_id(i) for i in m.entry.instructions} == {0}


WHILE_MODULE = """HloModule m, replica_count=4

add { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }

body {
  s = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  y = f32[8] get-tuple-element(s), index=2
  OPS
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[8], f32[8]) tuple(j, gx, gy)
}

cond {
  s = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  p = f32[8] parameter(0)
  q = f32[8] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[8], f32[8]) tuple(z, p, q)
  w = (s32[], f32[8], f32[8]) while(init), condition=cond, body=body
  a = f32[8] get-tuple-element(w), index=1
  b = f32[8] get-tuple-element(w), index=2
  ROOT r = (f32[8], f32[8]) tuple(a, b)
}
"""
GATHERS = """sx = f32[2] slice(x), slice={[0:2]}
  sy = f32[2] slice(y), slice={[2:4]}
  gx = f32[8] all-gather(sx), replica_groups={}, dimensions={0}
  gy = f32[8] all-gather(sy), replica_groups={}, dimensions={0}"""
SCATTERS = """rx = f32[2] reduce-scatter(x), replica_groups={}, dimensions={0}, to_apply=add
  ry = f32[2] reduce-scatter(y), replica_groups={}, dimensions={0}, to_apply=add
  zf = f32[] constant(0)
  gx = f32[8] pad(rx, zf), padding=0_6
  gy = f32[8] pad(ry, zf), padding=0_6"""
REDUCES = """gx = f32[8] all-reduce(x), replica_groups={}, to_apply=add
  gy = f32[8] all-reduce(y), replica_groups={}, to_apply=add"""


@pytest.mark.parametrize("pass_name, ops_text, opcode", [
    ("all-gather-combiner", GATHERS, AG),
    ("reduce-scatter-combiner", SCATTERS, RS),
    ("all-reduce-combiner", REDUCES, AR),
])
def test_while_loop_bodies(pass_name, ops_text, opcode):
    text = WHILE_MODULE.replace("OPS", ops_text)
    changed, m, _ = run(pass_name, text)
    assert changed and len(ops(m, opcode, m.computation("body"))) == 1
    if opcode is AR:  # XLA's all-reduce combiner has no combine-while-loops: always inside loops
        return
    changed, m, p = run(pass_name, text, numerics=False, combine_while_loops=False)
    assert not changed and len(ops(m, opcode, m.computation("body"))) == 2
    assert any("while loop" in r.message for r in p.remarks)


# ---------------------------------------------------------- all-gather --
def test_all_gather_by_dimension_five_into_two():
    # dims 0, 0, 1, 0, 1: one merged gather per dimension; the dim-1 pair has a dim larger than 1
    # before it, so it is merged over dim 0 through transposes (same group, XLA CPU-safe form)
    text = module(f"""
  p = f32[2,3] parameter(0)
  q = f32[4,2] parameter(1)
  a = f32[8,3] all-gather(p), {G4}, dimensions={{0}}
  b = f32[16,2] all-gather(q), {G4}, dimensions={{0}}
  c = f32[2,12] all-gather(p), {G4}, dimensions={{1}}
  d = f32[8,3] all-gather(p), {G4}, dimensions={{0}}
  e = f32[4,8] all-gather(q), {G4}, dimensions={{1}}
  ROOT t = (f32[8,3], f32[16,2], f32[2,12], f32[8,3], f32[4,8]) tuple(a, b, c, d, e)""")
    _, m, _ = run("all-gather-combiner", text)
    assert merged_names(m, AG) == [["p", "p", "q"], ["p", "q"]]
    assert sorted(x.attr("dimensions") for x in ops(m, AG)) == [(0,), (0,)]


def test_all_gather_across_dimensions_takes_the_most_frequent():
    # combine-by-dim=false: dims 1, 1, 0 -> dimension 1 (leading for all three once swapped)
    text = module(f"""
  p = f32[1,4] parameter(0)
  q = f32[1,3] parameter(1)
  r = f32[2,1] parameter(2)
  a = f32[1,16] all-gather(p), {G4}, dimensions={{1}}
  b = f32[1,12] all-gather(q), {G4}, dimensions={{1}}
  c = f32[8,1] all-gather(r), {G4}, dimensions={{0}}
  ROOT t = (f32[1,16], f32[1,12], f32[8,1]) tuple(a, b, c)""")
    _, m, _ = run("all-gather-combiner", text, combine_by_dim=False)
    (merged,) = ops(m, AG)
    assert merged.attr("dimensions") == (1,) and len(ops(m, Opcode.TRANSPOSE)) == 2


def test_all_gather_mixed_ranks_merge_into_dimension_zero():
    # dims 0, 1, 1: dimension 1 is most frequent but the rank-1 member lacks it -> dimension 0
    text = module(f"""
  p = f32[2] parameter(0)
  q = f32[3,2] parameter(1)
  a = f32[8] all-gather(p), {G4}, dimensions={{0}}
  b = f32[3,8] all-gather(q), {G4}, dimensions={{1}}
  c = f32[3,8] all-gather(q), {G4}, dimensions={{1}}
  ROOT t = (f32[8], f32[3,8], f32[3,8]) tuple(a, b, c)""")
    _, m, _ = run("all-gather-combiner", text, combine_by_dim=False)
    assert merged_names(m, AG) == [["p", "q", "q"]] and ops(m, AG)[0].attr("dimensions") == (0,)


def test_all_gather_leading_is_read_in_the_layout_the_module_carries():
    # A dump after XLA's optimizations gathers dimension 2 of f32[1,16,12]{1,0,2}: major in
    # memory, so the pieces are contiguous and the merged gather stays over dimension 2 (no
    # transposes; the row-major reading took it for a trailing dimension and transposed)
    text = module(f"""
  p = f32[1,16,3]{{1,0,2}} parameter(0)
  q = f32[16,1,3]{{1,0,2}} parameter(1)
  a = f32[1,16,12]{{1,0,2}} all-gather(p), {G4}, dimensions={{2}}
  b = f32[16,1,12]{{1,0,2}} all-gather(q), {G4}, dimensions={{2}}
  ROOT t = (f32[1,16,12]{{1,0,2}}, f32[16,1,12]{{1,0,2}}) tuple(a, b)""")
    _, m, _ = run("all-gather-combiner", text)
    (merged,) = ops(m, AG)
    assert merged.attr("dimensions") == (2,) and not ops(m, Opcode.TRANSPOSE)
    assert [str(e) for e in merged.shape.elements] == ["f32[1,16,12]{1,0,2}", "f32[16,1,12]{1,0,2}"]


def test_all_gather_a_layout_that_hides_the_gathered_dimension_goes_through_row_major():
    # b gathers dimension 0, which its layout {1,0,2} puts behind dimension 2 (size 16): it is
    # merged through an identity transpose to row-major; a swapped member gets row-major
    # transposes too (a transpose that kept {1,0,2} would leave the memory order as it was)
    text = module(f"""
  p = f32[2,3]{{1,0}} parameter(0)
  q = f32[3,1,16]{{1,0,2}} parameter(1)
  r = f32[4,2]{{1,0}} parameter(2)
  a = f32[8,3]{{1,0}} all-gather(p), {G4}, dimensions={{0}}
  b = f32[12,1,16]{{1,0,2}} all-gather(q), {G4}, dimensions={{0}}
  c = f32[4,8]{{1,0}} all-gather(r), {G4}, dimensions={{1}}
  ROOT t = (f32[8,3]{{1,0}}, f32[12,1,16]{{1,0,2}}, f32[4,8]{{1,0}}) tuple(a, b, c)""")
    _, m, _ = run("all-gather-combiner", text, combine_by_dim=False)
    (merged,) = ops(m, AG)
    assert merged.attr("dimensions") == (0,)
    assert [str(e) for e in merged.shape.elements] == ["f32[8,3]{1,0}", "f32[12,1,16]{2,1,0}", "f32[8,4]{1,0}"]
    into = {t.operands[0].name: t for t in ops(m, Opcode.TRANSPOSE) if t.operands[0].opcode is Opcode.PARAMETER}
    assert into["q"].attr("dimensions") == (0, 1, 2) and str(into["q"].shape) == "f32[3,1,16]{2,1,0}"
    assert str(into["r"].shape) == "f32[2,4]{1,0}"


def test_all_gather_element_types():
    text = module(f"""
  p = f32[2] parameter(0)
  i = s32[2] parameter(1)
  a = f32[8] all-gather(p), {G4}, dimensions={{0}}
  b = s32[8] all-gather(i), {G4}, dimensions={{0}}
  c = f32[8] all-gather(p), {G4}, dimensions={{0}}
  ROOT t = (f32[8], s32[8], f32[8]) tuple(a, b, c)""")
    _, m, _ = run("all-gather-combiner", text)
    assert merged_names(m, AG) == [["i", "p", "p"]]
    _, m, _ = run("all-gather-combiner", text, combine_different_dtypes=False)
    assert merged_names(m, AG) == [["i"], ["p", "p"]]


# ------------------------------------------------------ reduce-scatter --
def test_reduce_scatter_threshold_counts_result_bytes():
    # operands 64 bytes each, results 16: a 32-byte threshold merges them (XLA counts results)
    text = module(f"""
  p = f32[16] parameter(0)
  q = f32[16] parameter(1)
  a = f32[4] reduce-scatter(p), {G4}, dimensions={{0}}, to_apply=add
  b = f32[4] reduce-scatter(q), {G4}, dimensions={{0}}, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(a, b)""")
    changed, m, _ = run("reduce-scatter-combiner", text, combine_threshold_in_bytes=32)
    assert changed and len(ops(m, RS)) == 1


# ------------------------------------------------ reduce-scatter-creator --
def creator_module(ar: str, offset: str, shapes=("f32[16,3]", "f32[2,3]", "{2,3}"), header="replica_count=8",
                   extra_body: str = "") -> str:
    full, piece, sizes = shapes
    return module(f"""
  p = {full} parameter(0)
  ar = {full} {ar}
  {offset}
  zero = s32[] constant(0){extra_body}
  ROOT ds = {piece} dynamic-slice(ar, off, zero), dynamic_slice_sizes={sizes}""", header)


REPLICA_OFFSET = """rid = u32[] replica-id()
  two = u32[] constant(2)
  m = u32[] multiply(rid, two)
  off = s32[] convert(m)"""
PARTITION_OFFSET = REPLICA_OFFSET.replace("replica-id", "partition-id")


def test_creator_all_replicas_written_as_empty_groups():
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add", REPLICA_OFFSET)
    changed, m, _ = run("reduce-scatter-creator", text)
    assert changed and m.entry.root.opcode is RS and m.entry.root.attr("replica_groups").groups == ()
    assert m.entry.root.attr("channel_id") is None


def test_creator_empty_groups_over_replicas_of_each_partition():
    # 2 replicas x 4 partitions, no channel: each partition's two replicas form a group
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add",
                          REPLICA_OFFSET.replace("two = u32[] constant(2)", "two = u32[] constant(8)"),
                          shapes=("f32[16,3]", "f32[8,3]", "{8,3}"), header="replica_count=2, num_partitions=4")
    changed, m, _ = run("reduce-scatter-creator", text)
    assert changed and m.entry.root.opcode is RS


def test_creator_cross_replica_and_partition_one_group_per_replica():
    text = creator_module("all-reduce(p), channel_id=3, replica_groups={{0},{1}}, to_apply=add",
                          PARTITION_OFFSET.replace("constant(2)", "constant(4)"),
                          shapes=("f32[16,3]", "f32[4,3]", "{4,3}"), header="replica_count=2, num_partitions=4")
    changed, m, _ = run("reduce-scatter-creator", text)
    rs = m.entry.root
    assert changed and rs.opcode is RS and rs.attr("channel_id") == 4  # a new channel id
    assert not rs.attr("use_global_device_ids")


@pytest.mark.parametrize("groups, header, why", [
    ("channel_id=1, replica_groups={}", "replica_count=2, num_partitions=4", "one {r} per replica"),
    ("channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true", "replica_count=8",
     "one partition"),
])
def test_creator_declines_groups_xla_does_not_read(groups, header, why):
    text = creator_module(f"all-reduce(p), {groups}, to_apply=add", REPLICA_OFFSET, header=header)
    changed, _, p = run("reduce-scatter-creator", text, numerics=False)
    assert not changed and any(why in r.message for r in p.remarks)


def test_creator_looks_through_a_reshape_that_keeps_the_split_dimension():
    text = module("""
  p = f32[8,2,3] parameter(0)
  ar = f32[8,2,3] all-reduce(p), replica_groups={}, to_apply=add
  r = f32[8,6] reshape(ar)
  rid = u32[] replica-id()
  off = s32[] convert(rid)
  zero = s32[] constant(0)
  ROOT ds = f32[1,6] dynamic-slice(r, off, zero), dynamic_slice_sizes={1,6}""")
    changed, m, _ = run("reduce-scatter-creator", text)
    assert changed and m.entry.root.opcode is Opcode.RESHAPE
    rs = m.entry.root.operands[0]
    assert rs.opcode is RS and rs.shape.dims == (1, 2, 3) and rs.attr("dimensions") == (0,)


def test_creator_declines_a_reshape_that_changes_the_split_dimension():
    text = module("""
  p = f32[2,8,3] parameter(0)
  ar = f32[2,8,3] all-reduce(p), replica_groups={}, to_apply=add
  r = f32[16,3] reshape(ar)
  rid = u32[] replica-id()
  two = u32[] constant(2)
  m = u32[] multiply(rid, two)
  off = s32[] convert(m)
  zero = s32[] constant(0)
  ROOT ds = f32[2,3] dynamic-slice(r, off, zero), dynamic_slice_sizes={2,3}""")
    changed, _, p = run("reduce-scatter-creator", text, numerics=False)
    assert not changed and any("changes the sliced dimension" in r.message for r in p.remarks)


def test_creator_non_uniform_split_reduces_the_leading_shards():
    text = creator_module("all-reduce(p), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=add",
                          REPLICA_OFFSET.replace("m = u32[] multiply(rid, two)", "t = u32[] constant(3)\n"
                                                 "  r2 = u32[] remainder(rid, two)\n  m = u32[] multiply(r2, t)"),
                          shapes=("f32[7,5]", "f32[3,5]", "{3,5}"))
    changed, m, _ = run("reduce-scatter-creator", text)
    rs = m.entry.root
    assert changed and rs.opcode is RS and rs.operands[0].opcode is Opcode.SLICE
    assert rs.operands[0].shape.dims == (6, 5)


def test_creator_offsets_must_be_exact_before_the_slice_clamps_them():
    # the table's last entry (20) is clamped by the dynamic-slice to 14, the right start, but
    # XLA requires the table to say 14
    table = "table = s32[8] constant({0,2,4,6,8,10,12,20})\n  one = s32[1] dynamic-slice(table, rid), " \
            "dynamic_slice_sizes={1}\n  off = s32[] reshape(one)"
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add", "rid = u32[] replica-id()\n  " + table)
    changed, _, p = run("reduce-scatter-creator", text, numerics=False)
    assert not changed and any("device 7" in r.message and "is 20, expected 14" in r.message for r in p.remarks)
    changed, m, _ = run("reduce-scatter-creator", text.replace("12,20}", "12,14}"))
    assert changed and ops(m, Opcode.CONSTANT) == []  # the table and the zero offset died with the slice


@pytest.mark.parametrize("upper, applies", [(13, False), (14, True), (100, True)])
def test_creator_clamped_offsets(upper, applies):
    offset = REPLICA_OFFSET + f"\n  lo = s32[] constant(0)\n  hi = s32[] constant({upper})\n" \
                              "  off2 = s32[] clamp(lo, off, hi)"
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add", offset).replace(
        "dynamic-slice(ar, off, zero)", "dynamic-slice(ar, off2, zero)")
    changed, _, _ = run("reduce-scatter-creator", text, numerics=applies)
    assert changed is applies


def test_creator_iota_table():
    offset = """rid = u32[] replica-id()
  table = s32[8] iota(), iota_dimension=0
  one = s32[1] dynamic-slice(table, rid), dynamic_slice_sizes={1}
  off = s32[] reshape(one)"""
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add", offset,
                          shapes=("f32[8,3]", "f32[1,3]", "{1,3}"))
    changed, _, _ = run("reduce-scatter-creator", text)
    assert changed


@pytest.mark.parametrize("groups, applies", [
    ("{{0,1,2,3},{4,5,6,7}}", True),    # replica r, partition p at position p: partition-id says it
    ("{{0,1,4,5},{2,3,6,7}}", False),   # device 4 (replica 1, partition 0) sits at position 2
])
def test_creator_global_ids_from_partition_id(groups, applies):
    text = creator_module(f"all-reduce(p), channel_id=1, replica_groups={groups}, use_global_device_ids=true, "
                          "to_apply=add", PARTITION_OFFSET.replace("constant(2)", "constant(4)"),
                          shapes=("f32[16,3]", "f32[4,3]", "{4,3}"), header="replica_count=2, num_partitions=4")
    changed, _, p = run("reduce-scatter-creator", text, numerics=applies)
    assert changed is applies
    if not applies:
        assert any("device 4 (position 2 in its group)" in r.message for r in p.remarks)


@pytest.mark.parametrize("edit, why", [
    ("two users", ""),
    ("two dims", "slices 2 dimensions"),
    ("wrong size", "is not one of 8 shards"),
    ("empty slice", "0 of 16 is not one of 8 shards"),
])
def test_creator_declines(edit, why):
    text = creator_module("all-reduce(p), replica_groups={}, to_apply=add", REPLICA_OFFSET)
    if edit == "two users":
        text = text.replace("ROOT ds = f32[2,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,3}",
                            "ds = f32[2,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,3}\n"
                            "  ROOT t = (f32[2,3], f32[16,3]) tuple(ds, ar)")
    elif edit == "two dims":
        text = text.replace("f32[2,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,3}",
                            "f32[2,1] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,1}")
    elif edit == "wrong size":
        text = text.replace("f32[2,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,3}",
                            "f32[4,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={4,3}")
    else:
        text = text.replace("f32[2,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={2,3}",
                            "f32[0,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={0,3}")
    changed, _, p = run("reduce-scatter-creator", text, numerics=False)
    assert not changed
    assert any(why in r.message for r in p.remarks) if why else not p.remarks


# -------------------------------------------------------- the pipeline --
def test_collective_fusion_forwards_xlas_options():
    (fusion,) = parse_pipeline("collective-fusion{combine-threshold-in-bytes=4096,combine-threshold-count=3,"
                               "combine-by-dim=false,combine-different-dtypes=false,"
                               "combine-while-loops=false}").passes
    subs = {p.name: p.options for p in fusion.sub_passes()}
    for name in ("all-reduce-combiner", "all-gather-combiner", "reduce-scatter-combiner",
                 "collective-permute-combiner"):
        assert subs[name].combine_threshold_in_bytes == 4096 and subs[name].combine_threshold_count == 3
    assert subs["all-gather-combiner"].combine_by_dim is False
    assert subs["all-gather-combiner"].combine_different_dtypes is False
    assert subs["all-gather-combiner"].combine_while_loops is False
    assert subs["reduce-scatter-combiner"].combine_by_dim is False
    assert subs["reduce-scatter-combiner"].combine_while_loops is False
    assert str(parse_pipeline("all-gather-combiner{combine-by-dim=true,combine-while-loops=true}")) == \
        "all-gather-combiner"  # XLA's defaults print as nothing


@pytest.mark.parametrize("header, merges", [("replica_count=8", False), ("num_partitions=8", True)])
def test_shared_channel_ids_order_an_mpmd_program_only(header, merges):
    # d and b share channel 5: in an MPMD program b then also reaches what d reads (y, so a) and
    # may not merge with a; an SPMD module (several partitions) has no such dependence
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] all-reduce(p), channel_id=1, {G4}, use_global_device_ids=true, to_apply=add
  y = f32[4] negate(a)
  d = f32[4] all-reduce(y), channel_id=5, {G4}, use_global_device_ids=true, to_apply=mx
  b = f32[4] all-reduce(q), channel_id=5, {G4}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(d, b)""", header)
    changed, m, _ = run("all-reduce-combiner", text, numerics=merges)
    assert changed is merges


def test_reduction_computations_with_more_than_one_operation_are_not_combined():
    # XLA's key reads to_apply only when it is two parameters and the reduction
    extra = "add_extra { a = f32[] parameter(0)\n b = f32[] parameter(1)\n c = f32[] constant(0)\n" \
            " ROOT s = f32[] add(a, b) }\n"
    text = module(f"""
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), {G4}, to_apply=add_extra
  b = f32[4] all-reduce(p), {G4}, to_apply=add_extra
  q = f32[16] parameter(1)
  c = f32[4] reduce-scatter(q), {G4}, dimensions={{0}}, to_apply=add_extra
  d = f32[4] reduce-scatter(q), {G4}, dimensions={{0}}, to_apply=add_extra
  ROOT t = (f32[4], f32[4], f32[4], f32[4]) tuple(a, b, c, d)""", extra=extra)
    for name in ("all-reduce-combiner", "reduce-scatter-combiner"):
        changed, _, _ = run(name, text, numerics=False)
        assert not changed, name
    changed, _, _ = run("all-reduce-combiner", text.replace("to_apply=add_extra", "to_apply=add"))
    assert changed
