"""cse's structural comparison of called computations and its merging of twin SPMD collectives."""

from collections import Counter
from pathlib import Path

from hlo_passes import parse_module
from hlo_passes.ir import Opcode
from hlo_passes.ir.structural import StructuralFingerprints
from hlo_passes.passes.manager import PassManager
from hlo_passes.verifier import verify_module

ROOT = Path(__file__).resolve().parents[2]
PMAP = ROOT / "golden" / "corpus" / "pmap_collectives" / "pmap_collectives.lowered.shardy.hlo"

REDUCERS = """HloModule m

add0 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b), metadata={op_name="first"}
}

add1 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(x, y)
}

swapped {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(y, x)
}

f64_add {
  x = f64[] parameter(0)
  y = f64[] parameter(1)
  ROOT z = f64[] add(x, y)
}

outer0 {
  v = f32[8] parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[] reduce(v, c), dimensions={0}, to_apply=add0
}

outer1 {
  v = f32[8] parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[] reduce(v, c), dimensions={0}, to_apply=add1
}

outer_swapped {
  v = f32[8] parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[] reduce(v, c), dimensions={0}, to_apply=swapped
}

ENTRY e {
  p = f32[8] parameter(0)
  ROOT r = f32[] call(p), to_apply=outer0
}
"""


def test_fingerprints_ignore_names_and_metadata_but_not_wiring_types_or_callees():
    module = parse_module(REDUCERS)
    comps = {c.name: c for c in module.computations}
    fp = StructuralFingerprints()
    assert fp.equal(comps["add0"], comps["add1"])
    assert not fp.equal(comps["add0"], comps["swapped"])      # operand wiring
    assert not fp.equal(comps["add0"], comps["f64_add"])      # parameter and result types
    assert fp.equal(comps["outer0"], comps["outer1"])         # callees compared recursively
    assert not fp.equal(comps["outer0"], comps["outer_swapped"])
    assert fp.of(comps["add0"]) is fp.of(comps["add0"])       # cached per computation
    assert hash(fp.of(comps["add0"])) == hash(fp.of(comps["add1"]))


def test_cse_merges_the_twin_psums_of_a_shard_map_body_and_nothing_else():
    module = parse_module(PMAP.read_text())
    body = next(c for c in module.computations if c.name.startswith("xla.sdy.manual_computation_body"))
    before = Counter(i.opcode for i in body.instructions if i.opcode.is_collective)
    manager = PassManager.from_pipeline("cse", verify_each=True)
    assert manager.run(module)
    after = Counter(i.opcode for i in body.instructions if i.opcode.is_collective)
    assert before - after == Counter({Opcode.ALL_REDUCE: 1})
    names = {i.name for i in body.instructions}
    assert "psum.10" in names and "psum.11" not in names and "pmax.5" in names
    assert body.find("div.1").operands[0] is body.find("psum.10")
    assert verify_module(module) == []
    assert not PassManager.from_pipeline("cse").run(module)  # idempotent


def test_cse_keeps_collectives_that_differ_only_in_having_a_channel_id():
    """Without a channel_id the groups name replicas, with one (and no global ids) they name
    replicas × partitions: the same text means different devices."""
    text = """HloModule m, num_partitions=8
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }
ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] all-reduce(p), channel_id=1, replica_groups={}, to_apply=add
  b = f32[4] all-reduce(p), replica_groups={}, to_apply=add
  c = f32[4] all-reduce(p), channel_id=2, replica_groups={}, to_apply=add
  ROOT t = (f32[4], f32[4], f32[4]) tuple(a, b, c)
}
"""
    module = parse_module(text)
    assert PassManager.from_pipeline("cse").run(module)
    assert [o.name for o in module.entry.root.operands] == ["a", "b", "a"]
