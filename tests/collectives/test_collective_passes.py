"""Collective passes: hand-derived structure of each rewrite, must-not-change cases, and every
rewrite run against the original on 8 virtual CPU devices (each device its own inputs)."""

import numpy as np
import pytest

from hlo_passes.ir import Opcode
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.registry import lookup
from hlo_passes.printer import print_module
from hlo_passes.runtime.per_device import compare_per_device

ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
SUM = "sum { x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT z = f32[] add(y, x) }\n"
MAX = "mx { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] maximum(a, b) }\n"
G4 = "replica_groups={{0,1,2,3},{4,5,6,7}}"
G2 = "replica_groups={{0,1},{2,3},{4,5},{6,7}}"


def module(body: str, header: str = "replica_count=8") -> str:
    return f"HloModule m, {header}\n\n{ADD}\n{SUM}\n{MAX}\nENTRY e {{\n{body}\n}}\n"


def run(pass_name: str, text: str, *, numerics: bool = True, **options):
    m = parse_module(text)
    p = lookup(pass_name)(**options)
    changed = p.run(m)
    out = print_module(m)
    parse_module(out)  # prints back to something we (and below, XLA) read
    if numerics:
        n = m.num_partitions * m.replica_count
        report = compare_per_device(text, out, num_devices=n)
        assert report.ok, report.format()
    return changed, m, p


def ops(m, opcode):
    return [i for i in m.entry.instructions if i.opcode is opcode]


# ------------------------------------------------------------ combiners --
def test_all_reduce_combiner_merges_by_meaning_and_keeps_others_apart():
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[2,3] parameter(1)
  i = s32[4] parameter(2)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[2,3] all-reduce(q), {G4}, to_apply=sum
  c = f32[4] all-reduce(p), {G4}, to_apply=mx
  d = f32[4] all-reduce(p), replica_groups={{{{0,1,2,3,4,5,6,7}}}}, to_apply=add
  ROOT t = (f32[4], f32[2,3], f32[4], f32[4]) tuple(a, b, c, d)""")
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed
    ars = ops(m, Opcode.ALL_REDUCE)
    assert len(ars) == 3  # add+sum merged; max and the other groups stay
    merged = [a for a in ars if a.shape.is_tuple]
    assert len(merged) == 1 and [o.name for o in merged[0].operands] == ["p", "q"]


def test_all_reduce_combiner_never_merges_dependent_all_reduces():
    text = module(f"""
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  n = f32[4] negate(a)
  b = f32[4] all-reduce(n), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(a, b)""")
    changed, m, _ = run("all-reduce-combiner", text, numerics=False)
    assert not changed and len(ops(m, Opcode.ALL_REDUCE)) == 2


def test_combiner_rechecks_cycles_created_by_an_earlier_merge():
    # Groups {a1,a2} and {b1,b2} are each independent, but a2 needs b1 and b2 needs a1:
    # merging both would make a cycle, so the second merge must be refused.
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a1 = f32[4] all-reduce(p), {G4}, to_apply=add
  b1 = f32[4] all-reduce(q), {G2}, to_apply=add
  x = f32[4] negate(b1)
  a2 = f32[4] all-reduce(x), {G4}, to_apply=add
  y = f32[4] negate(a1)
  b2 = f32[4] all-reduce(y), {G2}, to_apply=add
  ROOT t = (f32[4], f32[4]) tuple(a2, b2)""")
    changed, m, _ = run("all-reduce-combiner", text)
    assert changed
    assert len([a for a in ops(m, Opcode.ALL_REDUCE) if a.shape.is_tuple]) == 1
    m.entry.sort_topologically()  # raises nothing; and the printer found an order XLA accepted


def test_all_reduce_combiner_thresholds_and_channels():
    body = "\n".join(f"  p{k} = f32[8] parameter({k})\n  a{k} = f32[8] all-reduce(p{k}), channel_id={k + 1}, "
                     f"{G4}, use_global_device_ids=true, to_apply=add" for k in range(5))
    body += "\n  ROOT t = (f32[8], f32[8], f32[8], f32[8], f32[8]) tuple(a0, a1, a2, a3, a4)"
    text = module(body, "num_partitions=8")
    _, m, _ = run("all-reduce-combiner", text, combine_threshold_count=2)
    assert sorted(len(a.operands) for a in ops(m, Opcode.ALL_REDUCE)) == [1, 2, 2]
    ids = [a.attr("channel_id") for a in ops(m, Opcode.ALL_REDUCE)]
    assert len(set(ids)) == len(ids) and all(a.attr("use_global_device_ids") for a in ops(m, Opcode.ALL_REDUCE))
    _, m, _ = run("all-reduce-combiner", text, numerics=False, combine_threshold_in_bytes=64)  # 32 bytes each: pairs
    assert sorted(len(a.operands) for a in ops(m, Opcode.ALL_REDUCE)) == [1, 2, 2]


def test_combined_all_reduce_takes_control_edges():
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  e = f32[4] exponential(q)
  a = f32[4] all-reduce(p), {G4}, to_apply=add, control-predecessors={{e}}
  b = f32[4] all-reduce(q), {G4}, to_apply=add
  l = f32[4] log(p), control-predecessors={{b}}
  ROOT t = (f32[4], f32[4], f32[4], f32[4]) tuple(a, b, e, l)""")
    _, m, _ = run("all-reduce-combiner", text)
    (ar,) = ops(m, Opcode.ALL_REDUCE)
    assert [x.name for x in ar.control_predecessors] == ["e"]
    assert [x.name for x in ar.control_successors] == ["l"]


def test_all_gather_combiner_dtypes_and_dimensions():
    text = module(f"""
  p = f32[4,2] parameter(0)
  q = s32[3] parameter(1)
  r = f32[2,5] parameter(2)
  a = f32[16,2] all-gather(p), channel_id=1, {G4}, dimensions={{0}}, use_global_device_ids=true
  b = s32[12] all-gather(q), channel_id=2, {G4}, dimensions={{0}}, use_global_device_ids=true
  c = f32[2,20] all-gather(r), channel_id=3, {G4}, dimensions={{1}}, use_global_device_ids=true
  ROOT t = (f32[16,2], s32[12], f32[2,20]) tuple(a, b, c)""", "num_partitions=8")
    _, m, _ = run("all-gather-combiner", text)
    assert sorted(len(a.operands) for a in ops(m, Opcode.ALL_GATHER)) == [1, 2]
    _, m, _ = run("all-gather-combiner", text, combine_different_dtypes=False, combine_by_dim=False)
    (merged,) = [a for a in ops(m, Opcode.ALL_GATHER) if a.shape.is_tuple]
    assert merged.attr("dimensions") == (0,) and len(ops(m, Opcode.TRANSPOSE)) == 2


@pytest.mark.parametrize("form", ["packed", "variadic"])
def test_reduce_scatter_combiner(form):
    text = module(f"""
  p = f32[8,3] parameter(0)
  q = f32[2,4] parameter(1)
  r = f32[12] parameter(2)
  a = f32[2,3] reduce-scatter(p), {G4}, dimensions={{0}}, to_apply=add
  b = f32[2,1] reduce-scatter(q), {G4}, dimensions={{1}}, to_apply=add
  c = f32[3] reduce-scatter(r), {G4}, dimensions={{0}}, to_apply=sum
  d = f32[3] reduce-scatter(r), {G4}, dimensions={{0}}, to_apply=mx
  ROOT t = (f32[2,3], f32[2,1], f32[3], f32[3]) tuple(a, b, c, d)""")
    # XLA's CPU path (StableHLO) cannot run a variadic reduce-scatter: structure only.
    _, m, _ = run("reduce-scatter-combiner", text, numerics=form == "packed", form=form)
    rs = ops(m, Opcode.REDUCE_SCATTER)
    # combine-by-dim (the default): a and c (dimension 0, add) merge; b (dimension 1) and d (max) stay
    assert len(rs) == 3
    if form == "packed":
        assert [r.shape.dims for r in rs if r.shape.rank == 2 and r.shape.dims[0] == 1] == [(1, 9)]
    else:
        assert sorted(len(r.operands) for r in rs) == [1, 1, 2]
    # across dimensions: a, b and c merge
    _, m, _ = run("reduce-scatter-combiner", text, numerics=form == "packed", form=form, combine_by_dim=False)
    rs = ops(m, Opcode.REDUCE_SCATTER)
    assert len(rs) == 2
    if form == "packed":
        assert [r.shape.dims for r in rs if r.shape.rank == 2 and r.shape.dims[0] == 1] == [(1, 11)]
    else:
        (merged,) = [r for r in rs if r.shape.is_tuple]
        assert merged.attr("dimensions") == (0,) and len(ops(m, Opcode.TRANSPOSE)) == 2


def test_collective_permute_combiner():
    pairs = "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"
    text = module(f"""
  p = f32[4,2] parameter(0)
  q = f32[3] parameter(1)
  a = f32[4,2] collective-permute(p), channel_id=1, {pairs}
  b = f32[3] collective-permute(q), channel_id=2, {pairs}
  c = f32[3] collective-permute(q), channel_id=3, source_target_pairs={{{{0,1}},{{1,0}}}}
  ROOT t = (f32[4,2], f32[3], f32[3]) tuple(a, b, c)""", "num_partitions=8")
    _, m, _ = run("collective-permute-combiner", text)
    assert len(ops(m, Opcode.COLLECTIVE_PERMUTE)) == 2


# ------------------------------------------------------ reduce-scatter-creator --
RSC_TABLE = """
  p = f32[16,3] parameter(0)
  ar = f32[16,3] all-reduce(p), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=add
  rid = u32[] replica-id()
  table = s32[8] constant({TABLE})
  one = s32[1] dynamic-slice(table, rid), dynamic_slice_sizes={1}
  off = s32[] reshape(one)
  zero = s32[] constant(0)
  ROOT ds = f32[4,3] dynamic-slice(ar, off, zero), dynamic_slice_sizes={4,3}"""


def test_reduce_scatter_creator_replica_table():
    changed, m, _ = run("reduce-scatter-creator", module(RSC_TABLE.replace("TABLE", "0,4,8,12,0,4,8,12")))
    assert changed and ops(m, Opcode.ALL_REDUCE) == [] and m.entry.root.opcode is Opcode.REDUCE_SCATTER
    assert m.entry.root.attr("dimensions") == (0,)
    assert ops(m, Opcode.REPLICA_ID) == []  # the offset computation died with the slice


def test_reduce_scatter_creator_declines_wrong_offsets():
    changed, m, p = run("reduce-scatter-creator", module(RSC_TABLE.replace("TABLE", "0,4,8,12,4,0,8,12")),
                        numerics=False)
    assert not changed
    assert any("device 4 (position 0 in its group)" in r.message for r in p.remarks)


def test_reduce_scatter_creator_partition_arithmetic():
    text = module("""
  p = f32[3,8] parameter(0)
  ar = f32[3,8] all-reduce(p), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=add
  pid = u32[] partition-id()
  two = u32[] constant(2)
  pos = u32[] divide(pid, two)
  c = s32[] convert(pos)
  k = s32[] constant(2)
  off = s32[] multiply(c, k)
  zero = s32[] constant(0)
  ROOT ds = f32[3,2] dynamic-slice(ar, zero, off), dynamic_slice_sizes={3,2}""", "num_partitions=8")
    changed, m, _ = run("reduce-scatter-creator", text)
    # a new channel id, as XLA gives the reduce-scatter (the all-reduce's was 1)
    assert changed and m.entry.root.attr("dimensions") == (1,) and m.entry.root.attr("channel_id") == 2


def test_reduce_scatter_creator_keeps_all_reduce_with_other_users():
    text = module(RSC_TABLE.replace("TABLE", "0,4,8,12,0,4,8,12").replace(
        "ROOT ds = f32[4,3]", "ds = f32[4,3]") + "\n  ROOT t = (f32[4,3], f32[16,3]) tuple(ds, ar)")
    changed, _, _ = run("reduce-scatter-creator", text, numerics=False)
    assert not changed


# ------------------------------------------------------ reassociate / simplify --
def test_all_reduce_reassociate_chain_and_max_through_converts():
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  r = f32[4] parameter(2)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(q), {G4}, to_apply=sum
  c = f32[4] all-reduce(r), {G4}, to_apply=add
  s = f32[4] add(a, b)
  s_2 = f32[4] add(s, c)
  i = f32[4] parameter(3)
  mi = f32[4] all-reduce(i), {G4}, to_apply=mx
  mj = f32[4] all-reduce(p), {G4}, to_apply=mx
  ci = f16[4] convert(mi)
  cj = f16[4] convert(mj)
  m = f16[4] maximum(ci, cj)
  x = f32[4] all-reduce(p), {G4}, to_apply=add
  y = f32[4] all-reduce(q), {G4}, to_apply=add
  z = f32[4] multiply(x, y)
  ROOT t = (f32[4], f16[4], f32[4]) tuple(s_2, m, z)""")
    _, m, p = run("all-reduce-reassociate", text)
    assert len(ops(m, Opcode.ALL_REDUCE)) == 4  # 3 -> 1, 2 -> 1, multiply keeps its 2
    assert any(r.kind == "missed" and "multiply" in r.message for r in p.remarks)


def test_all_reduce_reassociate_does_not_sum_through_converts():
    text = module(f"""
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(q), {G4}, to_apply=add
  ca = f16[4] convert(a)
  cb = f16[4] convert(b)
  ROOT s = f16[4] add(ca, cb)""")
    changed, _, _ = run("all-reduce-reassociate", text, numerics=False)
    assert not changed


# Values that show every way a convert can break the order: negatives, the ends of each
# integer range and past them, fractions, and for floats inf and NaN.
_ORDER_SAMPLES = {
    "pred": [0, 1],
    "s8": [-128, -1, 0, 1, 100, 127], "u8": [0, 1, 100, 200, 255],
    "s32": [-2147483648, -300, -1, 0, 1, 100, 200, 300, 70000, 2147483647],
    "u32": [0, 1, 100, 200, 300, 70000, 2147483648, 4294967295],
    "f16": [float("-inf"), -60000.0, -300.0, -1.5, -0.0, 0.5, 1.0, 200.0, 300.0, 65504.0, float("inf"), float("nan")],
    "bf16": [float("-inf"), -3e38, -300.0, -1.5, 0.0, 0.5, 200.0, 300.0, 3e38, float("inf"), float("nan")],
    "f32": [float("-inf"), -3e38, -300.0, -1.5, -0.0, 0.5, 1.0, 200.0, 300.0, 70000.0, 3e38, float("inf"),
            float("nan")],
    # no infinity: past 448 is NaN
    "f8e4m3fn": [-448.0, -300.0, -1.5, -0.0, 0.5, 1.0, 192.0, 448.0, float("nan")],
    "f8e5m2": [float("-inf"), -57344.0, -300.0, -1.5, 0.0, 0.5, 256.0, 57344.0, float("inf"), float("nan")],
    "f4e2m1fn": [-6.0, -1.5, -0.0, 0.5, 1.0, 6.0],  # saturates: no infinity, no NaN
}
_FED_AS_F32 = ("bf16", "f8e4m3fn", "f8e5m2", "f4e2m1fn")  # no numpy type: read as f32 and converted


@pytest.mark.parametrize("source", sorted(_ORDER_SAMPLES))
def test_the_order_rule_for_converts_agrees_with_xla(source):
    """`is_order_preserving` against XLA's own converts: for every pair of samples,
    convert(max(a, b)) == max(convert(a), convert(b)) (and the same for min) wherever the rule
    says the convert keeps the order, and it fails somewhere wherever the rule says it does
    not (so the rule refuses nothing it could allow, on these samples)."""
    from hlo_passes.ir.types import PrimitiveType
    from hlo_passes.passes.collectives.all_reduce_reassociate import is_order_preserving
    from hlo_passes.runtime import execute_module

    samples = _ORDER_SAMPLES[source]
    n = len(samples)
    a = np.repeat(np.array(samples), n)
    b = np.tile(np.array(samples), n)
    dtype = {"pred": np.bool_, "s8": np.int8, "u8": np.uint8, "s32": np.int32, "u32": np.uint32,
             "f16": np.float16}.get(source, np.float32)
    for target in sorted(_ORDER_SAMPLES):
        if target == source:
            continue
        rows = []
        for op in ("maximum", "minimum"):
            rows += [f"  m_{op} = {source}[{n * n}] {op}(a, b)",
                     f"  outer_{op} = {target}[{n * n}] convert(m_{op})",
                     f"  {op}_ca = {target}[{n * n}] convert(a)",
                     f"  {op}_cb = {target}[{n * n}] convert(b)",
                     f"  inner_{op} = {target}[{n * n}] {op}({op}_ca, {op}_cb)"]
        text = (f"HloModule order\n\nENTRY e {{\n  a = {source}[{n * n}] parameter(0)\n"
                f"  b = {source}[{n * n}] parameter(1)\n" + "\n".join(rows) +
                f"\n  ROOT t = ({', '.join([f'{target}[{n * n}]'] * 4)}) tuple(outer_maximum, inner_maximum, "
                "outer_minimum, inner_minimum)\n}\n")
        if source in _FED_AS_F32:  # feed f32 values that the type holds exactly
            text = text.replace(f"a = {source}", "a32 = f32").replace(f"b = {source}", "b32 = f32").replace(
                "  m_maximum",
                f"  a = {source}[{n * n}] convert(a32)\n  b = {source}[{n * n}] convert(b32)\n  m_maximum")
        outs = execute_module(text, [a.astype(dtype), b.astype(dtype)])
        wide = [o.astype(np.float64) if o.dtype.kind not in "biu" else o for o in outs]  # bf16 too
        same = all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
                   for x, y in ((wide[0], wide[1]), (wide[2], wide[3])))
        assert is_order_preserving(PrimitiveType(source), PrimitiveType(target)) == same, (source, target)


def test_all_reduce_reassociate_does_not_take_max_or_min_through_a_wrapping_convert():
    """s32 → u8 wraps (-1 becomes 255): min(u8(pmin(a)), u8(pmin(b))) is not u8(pmin(min(a, b)))
    (a = -1 on one device, b = 100: 100 against 255).  Widening to s64 keeps the order, and is
    reassociated (checked on the verifier's inputs)."""
    text = module(f"""
  p = s32[4] parameter(0)
  q = s32[4] parameter(1)
  a = s32[4] all-reduce(p), {G4}, to_apply=mn_s32
  b = s32[4] all-reduce(q), {G4}, to_apply=mn_s32
  ca = u8[4] convert(a)
  cb = u8[4] convert(b)
  ROOT m = u8[4] minimum(ca, cb)""").replace("ENTRY e {", "mn_s32 { a = s32[] parameter(0)\n b = s32[] parameter(1)\n "
                                               "ROOT s = s32[] minimum(a, b) }\n\nENTRY e {")
    changed, _, p = run("all-reduce-reassociate", text, numerics=False)
    assert not changed
    assert any(r.kind == "missed" and "s32 to u8 does not keep the order" in r.message for r in p.remarks)
    widening = text.replace("u8[4]", "s64[4]")
    changed, m, _ = run("all-reduce-reassociate", widening)
    assert changed and len(ops(m, Opcode.ALL_REDUCE)) == 1


def test_all_reduce_simplifier():
    one = "replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}"
    text = module(f"""
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), {one}, to_apply=add
  g = f32[4] all-gather(p), {one}, dimensions={{0}}
  two = f32[] constant(2)
  c = f32[4] broadcast(two), dimensions={{}}
  s = f32[4] all-reduce(c), {G4}, to_apply=add
  mm = f32[4] all-reduce(c), {G4}, to_apply=mx
  k = f32[4] all-reduce(p), {G4}, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(a, g, s, mm, k)""")
    _, m, _ = run("all-reduce-simplifier", text)
    assert [a.name for a in ops(m, Opcode.ALL_REDUCE)] == ["k"] and not ops(m, Opcode.ALL_GATHER)


def test_all_reduce_simplifier_folds_values_an_earlier_collective_made_alike():
    """An all-reduce of a value its groups already share (`pmean` of a reduced gradient) is the
    value times the group size (max: the value); shared means alike within *each* group, so a
    sum over groups of 4 is not shared over all 8 devices or by groups its groups straddle.
    Each device gets its own input: a wrong fold shows in the run."""
    all8 = "replica_groups={{0,1,2,3,4,5,6,7}}"
    text = module(f"""
  p = f32[4] parameter(0)
  s = f32[4] all-reduce(p), {G4}, to_apply=add
  twice = f32[4] all-reduce(s), {G4}, to_apply=add
  inner = f32[4] all-reduce(s), {G2}, to_apply=mx
  e = f32[4] exponential(s)
  of_expr = f32[4] all-reduce(e), {G2}, to_apply=add
  wider = f32[4] all-reduce(s), {all8}, to_apply=add
  pairs = f32[4] all-reduce(p), {G2}, to_apply=add
  straddled = f32[4] all-reduce(pairs), {G4}, to_apply=add
  r = u32[] replica-id()
  four = u32[] constant(4)
  q = u32[] divide(r, four)
  by_group = u32[] all-reduce(q), {G4}, to_apply=addu
  by_device = u32[] all-reduce(r), {G4}, to_apply=addu
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4], u32[], u32[]) tuple(twice, inner, of_expr, wider, straddled, by_group, by_device)""")
    text = text.replace("ENTRY e", "addu { a = u32[] parameter(0)\n b = u32[] parameter(1)\n ROOT s = u32[] add(a, b) }\n\nENTRY e")
    _, m, _ = run("all-reduce-simplifier", text)
    kept = {a.name for a in ops(m, Opcode.ALL_REDUCE)}
    assert kept == {"s", "wider", "pairs", "straddled", "by_device"}
    assert m.entry.root.operands[1].name == "s"  # the max of a shared value is the value


def test_all_reduce_simplifier_reads_shardings_of_partitioned_parameters():
    """After partitioning, a parameter is alike within a group when every device of the group
    holds the same tile: replicated, or tiled so each group sees one tile; not otherwise."""
    text = module("""
  w = f32[4] parameter(0), sharding={replicated}
  t = f32[4] parameter(1), sharding={devices=[2,4]<=[8] last_tile_dim_replicate}
  a = f32[4] all-reduce(w), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=add
  b = f32[4] all-reduce(t), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=add
  c = f32[4] all-reduce(t), channel_id=3, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=add
  ROOT r = (f32[4], f32[4], f32[4]) tuple(a, b, c)""", "num_partitions=8")
    _, m, _ = run("all-reduce-simplifier", text, numerics=False)
    assert {a.name for a in ops(m, Opcode.ALL_REDUCE)} == {"c"}
    report = compare_per_device(text, print_module(m), num_devices=8, replicated=[True, True])
    assert report.ok, report.format()


@pytest.mark.parametrize("header, folded", [("replica_count=8", True), ("num_partitions=8", False)])
def test_all_reduce_simplifier_reads_parameter_replication_over_replicas_only(header, folded):
    """`parameter_replication={true}` says the replicas hold the parameter alike; over the
    partitions of a partitioned module it says nothing (XLA reads `sharding=` there)."""
    channel = ", channel_id=1, use_global_device_ids=true" if "partitions" in header else ""
    text = module(f"""
  w = f32[4] parameter(0), parameter_replication={{true}}
  ROOT a = f32[4] all-reduce(w), replica_groups={{{{0,1,2,3,4,5,6,7}}}}{channel}, to_apply=add""", header)
    _, m, _ = run("all-reduce-simplifier", text, numerics=False)
    assert bool(ops(m, Opcode.ALL_REDUCE)) is not folded
    report = compare_per_device(text, print_module(m), num_devices=8, replicated=[True])
    assert report.ok, report.format()


# ------------------------------------------------------------------ async --
def test_async_collective_creator_places_done_before_first_user():
    text = module(f"""
  p = f32[4] parameter(0)
  ar = f32[4] all-reduce(p), channel_id=1, {G4}, use_global_device_ids=true, to_apply=add
  ag = f32[16] all-gather(p), channel_id=2, {G4}, dimensions={{0}}, use_global_device_ids=true
  cp = f32[4] collective-permute(p), channel_id=3, source_target_pairs={{{{0,1}},{{1,2}},{{2,0}}}}
  e1 = f32[4] exponential(p)
  e2 = f32[4] sine(e1)
  s = f32[4] add(ar, e2)
  s3 = f32[4] add(s, cp)
  ROOT t = (f32[4], f32[16]) tuple(s3, ag)""", "num_partitions=8")
    _, m, _ = run("async-collective-creator", text)
    lines = [ln.split("=")[0].strip() for ln in print_module(m).split("ENTRY")[1].splitlines()[1:-1]]
    assert lines.index("e2") < lines.index("ar-done") < lines.index("s")
    assert lines.index("ar-start") < lines.index("e1")
    assert ops(m, Opcode.ALL_GATHER_START)[0].shape.is_tuple


def test_async_collective_creator_counts_what_lies_between_start_and_done():
    # a and b share their first user u: x lies between both; b's done also has a's done
    # (placed before u first) between its start and it
    text = module(f"""
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), {G4}, to_apply=add
  b = f32[4] all-reduce(p), {G2}, to_apply=add
  x = f32[4] negate(p)
  u = f32[4] add(a, b)
  ROOT t = (f32[4], f32[4]) tuple(u, x)""")
    _, _, p = run("async-collective-creator", text)
    assert [r.message for r in p.remarks] == ["all-reduce split; 2 instructions between start and done"] * 2


# ------------------------------------------------------------ pipeline --
def test_collective_fusion_pipeline_and_failure_is_contained(monkeypatch):
    text = module(f"""
  p = f32[16,3] parameter(0)
  q = f32[16,3] parameter(1)
  a = f32[16,3] all-reduce(p), {G4}, to_apply=add
  b = f32[16,3] all-reduce(q), {G4}, to_apply=add
  s = f32[16,3] add(a, b)
  c = f32[16,3] all-reduce(q), {G4}, to_apply=mx
  ROOT t = (f32[16,3], f32[16,3]) tuple(s, c)""")
    changed, m, _ = run("collective-fusion", text, combine_threshold_in_bytes=1 << 20)
    assert changed and len(ops(m, Opcode.ALL_REDUCE)) == 2

    from hlo_passes.passes.collectives.all_reduce_combiner import AllReduceCombiner

    def broken(self, module):
        module.entry.root.operands[0].name = "half-done"
        raise RuntimeError("boom")

    monkeypatch.setattr(AllReduceCombiner, "run", broken)
    m = parse_module(text)
    fusion = lookup("collective-fusion")()
    fusion.run(m)
    assert any("all-reduce-combiner failed" in r.message for r in fusion.remarks)
    assert "half-done" not in print_module(m)


def test_all_reduce_simplifier_tells_minus_zero_from_zero():
    """-0.0 on device 0, 0.0 elsewhere: equal as numbers, not alike (1 / x tells them apart),
    so the sum is not folded into x * 8 (device 0 got -inf where XLA's sum gives +inf)."""
    text = """HloModule m, num_partitions=8

add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }

ENTRY e {
  pid = u32[] partition-id()
  z = u32[] constant(0)
  first = pred[] compare(pid, z), direction=EQ
  nz = f32[] constant(-0.0)
  pz = f32[] constant(0)
  v = f32[] select(first, nz, pz)
  vb = f32[4] broadcast(v), dimensions={}
  r = f32[4] all-reduce(vb), replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, channel_id=1, to_apply=add
  one = f32[4] constant({1,1,1,1})
  ROOT d = f32[4] divide(one, r)
}
"""
    changed, m, _ = run("all-reduce-simplifier", text)
    assert not changed and len(ops(m, Opcode.ALL_REDUCE)) == 1
    alike = text.replace("nz = f32[] constant(-0.0)", "nz = f32[] constant(0)")
    changed, m, _ = run("all-reduce-simplifier", alike)  # the guard: equal bits do fold
    assert changed and not ops(m, Opcode.ALL_REDUCE)
