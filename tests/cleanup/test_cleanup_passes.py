"""Cleanup passes over every corpus module: the verifier accepts the result, XLA's parser
accepts the printed text, side effects survive (collectives as XLA's HasSideEffect counts
them), no call is left after call-inliner; cse options and idempotence; dce drops exactly the
dead collectives XLA's compile drops."""

from collections import Counter
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode
from hlo_passes.passes.cleanup.cse import is_mergeable_collective
from hlo_passes.passes.cleanup.dce import has_effect
from hlo_passes.passes.manager import PassManager
from hlo_passes.verifier import verify_module
from tests.frontend.xla_oracle import xla_canonical as xla_parse

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "golden" / "corpus").rglob("*.hlo"))


def kept(module):
    """The instructions no cleanup may drop or merge, counted by opcode (calls are inlined;
    cse merges twin SPMD collectives, checked in test_cse_merges_twin_collectives_only; dce
    drops dead collectives without an effect, checked in test_dce_drops_the_dead_collectives_xla_drops)."""
    spmd = module.num_partitions > 1
    return Counter(i.opcode for i in module.all_instructions()
                   if has_effect(i, spmd=spmd) and i.opcode is not Opcode.CALL and not is_mergeable_collective(i))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_cleanup_pipeline_on_corpus(path):
    module = parse_module(path.read_text(), str(path))
    before = kept(module)
    manager = PassManager.from_pipeline("call-inliner,tuple-simplifier,cse,dce", verify_each=True)
    manager.run(module)
    assert verify_module(module) == []
    missed = {r.instruction for r in manager.remarks if r.kind == "missed"}
    assert all(i.name in missed for i in module.all_instructions() if i.opcode is Opcode.CALL)
    after = kept(module)
    # Inlining can duplicate a side-effecting callee body (two call sites): never fewer.
    assert all(after[op] >= n for op, n in before.items()), (before, after)
    xla_parse(print_module(module))  # raises when XLA's parser rejects the result


def test_dce_and_cse_are_idempotent_on_a_compiled_module():
    path = ROOT / "golden" / "corpus" / "transformer_block" / "transformer_block.compiled.hlo"
    module = parse_module(path.read_text())
    PassManager.from_pipeline("cse,dce").run(module)
    text = print_module(module)
    assert not PassManager.from_pipeline("cse,dce").run(module)
    assert print_module(module) == text


def test_cse_merges_only_what_is_identical():
    text = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] exponential(p)
  b = f32[4] exponential(p), metadata={op_name="b"}
  c = f32[4]{0} exponential(p)
  ROOT t = (f32[4], f32[4], f32[4]) tuple(a, b, c)
}
"""
    module = parse_module(text)
    assert PassManager.from_pipeline("cse").run(module)
    root = module.entry.root
    assert [o.name for o in root.operands] == ["a", "a", "c"]  # c has a layout: kept apart
    module = parse_module(text)
    PassManager.from_pipeline("cse{layout-sensitive=false}").run(module)
    assert [o.name for o in module.entry.root.operands] == ["a", "a", "a"]


DEAD_COLLECTIVES = """HloModule dead{header}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY e {{
  p = f32[8] parameter(0)
  ar = f32[8] all-reduce(p), {channel}replica_groups={{{{0,1,2,3}}}},{global_ids} to_apply=add
  ROOT n = f32[8] negate(p)
}}
"""


@pytest.mark.parametrize("header, channel, spmd", [
    (", replica_count=4", "", False),                 # cross-replica, no channel: no effect
    (", replica_count=4", "channel_id=1, ", False),   # a channel in a program that is not SPMD: kept
    (", num_partitions=4", "channel_id=1, ", True),   # SPMD: every device drops it alike
], ids=["replicas-no-channel", "replicas-channel", "spmd-channel"])
def test_dce_drops_the_dead_collectives_xla_drops(header, channel, spmd):
    """The oracle is XLA's compile of the same module (its pipeline runs HloDCE): the dead
    all-reduce is in XLA's optimized module exactly when ours keeps it."""
    from hlo_passes.runtime.xla_backend import compile_hlo

    text = DEAD_COLLECTIVES.format(header=header, channel=channel, global_ids=" use_global_device_ids=true," if spmd else "")
    module = parse_module(text)
    PassManager.from_pipeline("dce").run(module)
    ours = any(i.opcode is Opcode.ALL_REDUCE for i in module.all_instructions())
    exe = compile_hlo(text, num_replicas=1 if spmd else 4, num_partitions=4 if spmd else 1, spmd=spmd)
    assert ours == ("all-reduce" in exe.optimized_text())
    forced = parse_module(text)
    PassManager.from_pipeline("dce{remove-cross-partition-collectives=true}").run(forced)
    assert not any(i.opcode is Opcode.ALL_REDUCE for i in forced.all_instructions())


ROOT_TUPLE_OF_A_LOOP = """HloModule root_loop, num_partitions=2

cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[4] negate(x)
  ROOT t = (s32[], f32[4]) tuple(j, y)
}

ENTRY e {
  p = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, p)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  i = s32[] get-tuple-element(w), index=0
  x = f32[4] get-tuple-element(w), index=1
  ROOT out = (s32[], f32[4]) tuple(i, x), sharding={{replicated}, {devices=[2]<=[2]}}
}
"""


def test_a_cleanup_that_moves_the_entry_root_keeps_the_result_sharding():
    """tuple-simplifier makes the loop the root; the program's result sharding moves with the
    root role, as XLA's ReplaceInstruction copies a sharding the new instruction lacks (the
    partitioner's own cleanup dropped it, and `verify` then had no result sharding to read
    the per-device outputs with)."""
    module = parse_module(ROOT_TUPLE_OF_A_LOOP)
    PassManager.from_pipeline("tuple-simplifier").run(module)
    root = module.entry.root
    assert root.opcode is Opcode.WHILE
    assert root.sharding is not None and root.sharding.to_hlo() == "{{replicated}, {devices=[2]<=[2]}}"
    xla_parse(print_module(module))
