"""A body called from several sites gets the shardings of each site (as XLA, which inlines every
call before propagation; the partitioned calls are inlined at the end, unless bodies shared by
many sites would be copied along every path), and broadcasts and iotas wanted in several shardings are made again in
each instead of being moved.  Both were found on a scanned transformer step: every stacked
weight but the first was all-to-all'd whole (all layers) on every iteration of the loop, and the
zero broadcast initialising the gradient accumulators once per step."""

from __future__ import annotations

from collections import Counter

import pytest

from hlo_passes.runtime import verify_equivalent
from tests.spmd.partitioning import collectives as _collectives
from tests.spmd.partitioning import partition as _partition

PICK = """HloModule sites, num_partitions=8

pick {
  stack = f32[4,16,32] parameter(0)
  i = s32[] parameter(1)
  zero = s32[] constant(0)
  ds = f32[1,16,32] dynamic-slice(stack, i, zero, zero), dynamic_slice_sizes={1,16,32}
  ROOT r = f32[16,32] reshape(ds)
}

ENTRY main {
  a = f32[4,16,32] parameter(0), sharding={devices=[1,8,1]<=[8]}
  b = f32[4,16,32] parameter(1), sharding={devices=[1,1,8]<=[8]}
  i = s32[] parameter(2), sharding={replicated}
  pa = f32[16,32] call(a, i), to_apply=pick
  pb = f32[16,32] call(b, i), to_apply=pick
  ea = f32[16,32] exponential(pa), sharding={devices=[8,1]<=[8]}
  eb = f32[16,32] exponential(pb), sharding={devices=[1,8]<=[8]}
  ROOT t = (f32[16,32], f32[16,32]) tuple(ea, eb), sharding={{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}}
}
"""


def _verify(text: str, out: str, n: int = 8) -> None:
    report = verify_equivalent(text, out, num_devices=n, seed=1)
    assert report.ok, report.format() + "\n" + out


def test_each_call_site_slices_its_own_stack_where_it_lies():
    module, out, remarks = _partition(PICK)
    assert _collectives(module) == Counter(), out  # no stack moves: each site's body slices locally
    assert any("pick: its call sites disagree on its shardings; 2 bodies" in r.message for r in remarks)
    # each site's body is inlined where it lies once partitioned (XLA inlines every call)
    assert not [i for i in module.all_instructions() if i.opcode.value == "call"], out
    _verify(PICK, out)


def test_sites_that_agree_share_one_body_as_before():
    text = PICK.replace("sharding={devices=[1,1,8]<=[8]}", "sharding={devices=[1,8,1]<=[8]}").replace(
        "eb = f32[16,32] exponential(pb), sharding={devices=[1,8]<=[8]}",
        "eb = f32[16,32] exponential(pb), sharding={devices=[8,1]<=[8]}").replace(
        "{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}", "{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}")
    module, out, remarks = _partition(text)
    assert ".site" not in out and _collectives(module) == Counter()
    assert not any("call sites disagree" in r.message for r in remarks)
    _verify(text, out)


NESTED = PICK.replace("""ENTRY main {""", """twice {
  s = f32[4,16,32] parameter(0)
  j = s32[] parameter(1)
  ROOT c = f32[16,32] call(s, j), to_apply=pick
}

ENTRY main {""").replace("call(a, i), to_apply=pick", "call(a, i), to_apply=twice").replace(
    "call(b, i), to_apply=pick", "call(b, i), to_apply=twice")


def test_a_call_inside_a_body_called_twice_follows_each_outer_site():
    module, out, _ = _partition(NESTED)
    assert _collectives(module) == Counter(), out
    _verify(NESTED, out)


@pytest.mark.parametrize("maker", ["z = f32[] constant(0)\n  bz = f32[8,64,64] broadcast(z), dimensions={}",
                                   "bz = f32[8,64,64] iota(), iota_dimension=2",
                                   "z = f32[64] parameter(2), sharding={replicated}\n"
                                   "  bz = f32[8,64,64] broadcast(z), dimensions={2}"])
def test_a_broadcast_or_iota_wanted_in_two_shardings_is_made_in_each(maker):
    text = f"""HloModule remat, num_partitions=8

ENTRY main {{
  {maker}
  x = f32[8,64,64] parameter(0), sharding={{devices=[1,8,1]<=[8]}}
  y = f32[8,64,64] parameter(1), sharding={{devices=[1,1,8]<=[8]}}
  ax = f32[8,64,64] add(x, bz), sharding={{devices=[1,8,1]<=[8]}}
  ay = f32[8,64,64] add(y, bz), sharding={{devices=[1,1,8]<=[8]}}
  ROOT t = (f32[8,64,64], f32[8,64,64]) tuple(ax, ay), sharding={{{{devices=[1,8,1]<=[8]}}, {{devices=[1,1,8]<=[8]}}}}
}}
"""
    module, out, _ = _partition(text)
    assert _collectives(module) == Counter(), out
    _verify(text, out)


ACCUMULATORS = """HloModule accumulators, num_partitions=8

body {
  p = (s32[], f32[4,64,64], f32[4,64,64], f32[4,64,64]) parameter(0), sharding={{replicated}, {devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}, {devices=[1,8,1]<=[8]}}
  i = s32[] get-tuple-element(p), index=0
  a = f32[4,64,64] get-tuple-element(p), index=1
  b = f32[4,64,64] get-tuple-element(p), index=2
  g = f32[4,64,64] get-tuple-element(p), index=3
  a1 = f32[4,64,64] add(a, g), sharding={devices=[1,8,1]<=[8]}
  e = f32[4,64,64] exponential(b), sharding={devices=[1,1,8]<=[8]}
  b1 = f32[4,64,64] add(b, e), sharding={devices=[1,1,8]<=[8]}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT out = (s32[], f32[4,64,64], f32[4,64,64], f32[4,64,64]) tuple(i1, a1, b1, g), sharding={{replicated}, {devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}, {devices=[1,8,1]<=[8]}}
}

cond {
  p = (s32[], f32[4,64,64], f32[4,64,64], f32[4,64,64]) parameter(0), sharding={{replicated}, {devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}, {devices=[1,8,1]<=[8]}}
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  g = f32[4,64,64] parameter(0), sharding={devices=[1,8,1]<=[8]}
  z = f32[] constant(0)
  zeros = f32[4,64,64] broadcast(z), dimensions={}, sharding={devices=[8,1,1]<=[8]}
  i0 = s32[] constant(0)
  init = (s32[], f32[4,64,64], f32[4,64,64], f32[4,64,64]) tuple(i0, zeros, zeros, g), sharding={{replicated}, {devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}, {devices=[1,8,1]<=[8]}}
  loop = (s32[], f32[4,64,64], f32[4,64,64], f32[4,64,64]) while(init), condition=cond, body=body, sharding={{replicated}, {devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}, {devices=[1,8,1]<=[8]}}
  ra = f32[4,64,64] get-tuple-element(loop), index=1, sharding={devices=[1,8,1]<=[8]}
  rb = f32[4,64,64] get-tuple-element(loop), index=2, sharding={devices=[1,1,8]<=[8]}
  ROOT r = (f32[4,64,64], f32[4,64,64]) tuple(ra, rb), sharding={{devices=[1,8,1]<=[8]}, {devices=[1,1,8]<=[8]}}
}
"""


def test_a_loops_init_tuple_makes_its_zero_accumulators_in_each_sharding():
    """One zero broadcast initialises two accumulators of a loop, each sharded its own way in
    the loop: the init tuple is built again from its elements, each resharded as its own value,
    so the broadcast is made in each sharding instead of all-to-all'd (once per step, the whole
    stack of layers, in the scanned transformer step)."""
    module, out, _ = _partition(ACCUMULATORS)
    assert _collectives(module) == Counter(), out
    _verify(ACCUMULATORS, out)


@pytest.mark.parametrize("shapes", [("f32[10]", "f32[10,1]"), ("f32[10,1]", "f32[10]"), ("f32[1,10,3]", "f32[10,1,3]"),
                                    ("f32[10,6]", "f32[10,1,6]")])
def test_a_reshape_that_only_adds_or_drops_size_one_dims_keeps_an_uneven_tiling(shapes):
    # 10 rows over 4 devices (3, 3, 3, 1): the same padded tile on both sides of the reshape.
    src, dst = shapes
    tiled_src = "{devices=[" + ",".join("4" if d == "10" else "1" for d in src[4:-1].split(",")) + "]<=[4]}"
    tiled_dst = "{devices=[" + ",".join("4" if d == "10" else "1" for d in dst[4:-1].split(",")) + "]<=[4]}"
    text = f"""HloModule uneven, num_partitions=4

ENTRY main {{
  x = {src} parameter(0), sharding={tiled_src}
  e = {src} exponential(x), sharding={tiled_src}
  r = {dst} reshape(e), sharding={tiled_dst}
  ROOT n = {dst} negate(r), sharding={tiled_dst}
}}
"""
    module, out, _ = _partition(text, n=4)
    assert _collectives(module) == Counter(), out
    _verify(text, out, n=4)


def _fan_out(depth: int, shard_leaf: bool = False) -> str:
    """c_d calls c_{d-1} twice, `depth` levels: 2^depth call paths to c0 in `depth` + 1 bodies."""
    lines = ["HloModule fan, num_partitions=8", "", "c0 {", "  x = f32[8] parameter(0)",
             "  ROOT r = f32[8] negate(x)" + (", sharding={devices=[8]<=[8]}" if shard_leaf else ""), "}", ""]
    for d in range(1, depth + 1):
        lines += [f"c{d} {{", "  x = f32[8] parameter(0)", f"  p = f32[8] call(x), to_apply=c{d - 1}",
                  f"  q = f32[8] call(p), to_apply=c{d - 1}", "  ROOT r = f32[8] add(p, q)", "}", ""]
    lines += ["ENTRY main {", "  a = f32[8] parameter(0), sharding={devices=[8]<=[8]}",
              f"  ROOT r = f32[8] call(a), to_apply=c{depth}", "}"]
    return "\n".join(lines) + "\n"


def test_bodies_called_along_many_paths_get_one_copy_per_site_and_merge_back():
    """Four levels of a body calling its callee twice: every site of every level gets its body
    while shardings are chosen (copies of copies made it remove a body another copy still
    called: an IRError), and where all sites agree propagation leaves the module as it was.
    The partitioner gives each call site a partitioned body of its own up to a bound (c0 has
    16 sites), then shares: twelve levels stay under a hundred bodies, not 2^12."""
    from hlo_passes.passes.spmd.spmd_partitioner import SHARED_AFTER_COPIES

    text = _fan_out(4)
    module, out, _ = _partition(text, 8)
    bodies = Counter(c.name.split(".")[0] for c in module.computations if not c.is_entry)
    assert bodies == {"c0": SHARED_AFTER_COPIES, "c1": SHARED_AFTER_COPIES, "c2": 4, "c3": 2, "c4": 1}
    _verify(text, out)
    deep, _, remarks = _partition(_fan_out(12), 8)
    assert len(deep.computations) <= 12 * SHARED_AFTER_COPIES + 2
    # the cleanup does not inline shared bodies along each of the 4,096 paths
    assert any(r.message.startswith("calls kept: inlining them would copy bodies") for r in remarks)


def test_inlining_that_would_explode_is_refused_in_bounded_time():
    """Thirty levels are 2^30 inlined copies of the innermost body (XLA, which inlines every
    call before propagating, would make them all): an input error, counted without copying."""
    from hlo_passes import parse_module
    from hlo_passes.passes.spmd.sharding_propagation import PropagationError, ShardingPropagation

    with pytest.raises(PropagationError, match=r"would make [0-9,]+ instructions \(limit"):
        ShardingPropagation().run(parse_module(_fan_out(30)))


def test_side_effects_and_flops_are_counted_once_per_body_not_per_path():
    """`has_side_effect` (cse asks it of every call) and the statistics' FLOPs walked every
    path of calls: thirty levels did not finish in minutes."""
    from hlo_passes import parse_module
    from hlo_passes.ir import Opcode
    from hlo_passes.passes.cleanup.cse import CommonSubexpressionElimination
    from hlo_passes.stats import module_stats

    module = parse_module(_fan_out(30))
    call = module.entry.root
    assert call.opcode is Opcode.CALL and not call.has_side_effect
    CommonSubexpressionElimination().run(module)
    assert module_stats(module).flops == 8 * (2 ** 30) + 8 * (2 ** 30 - 1)  # negates and adds, 8 elements each


def test_a_value_computed_inside_a_call_and_beside_it_is_computed_once():
    """`jnp.var` is a call that computes the mean itself; a program that also takes the mean
    beside it computed the sum twice until the partitioned calls were inlined (as XLA inlines
    them) so that cse sees the twin; a shard_map region's body stays a call, as in XLA's."""
    text = """HloModule twin, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

var {
  x = f32[16,64] parameter(0)
  z = f32[] constant(0)
  s = f32[16] reduce(x, z), dimensions={1}, to_apply=add
  sq = f32[16] multiply(s, s)
  ROOT r = f32[16] negate(sq)
}

ENTRY main {
  x = f32[16,64] parameter(0), sharding={devices=[8,1]<=[8]}
  z = f32[] constant(0)
  v = f32[16] call(x), to_apply=var
  s = f32[16] reduce(x, z), dimensions={1}, to_apply=add
  ROOT t = f32[16] add(v, s), sharding={devices=[8]<=[8]}
}
"""
    module, out, _ = _partition(text)
    assert [i.opcode.value for i in module.all_instructions()].count("reduce") == 1, out
    assert "call(" not in out
    _verify(text, out)
