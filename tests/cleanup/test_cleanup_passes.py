"""Cleanup passes over every corpus module: the verifier accepts the result, XLA's parser
accepts the printed text, side effects and collectives survive, no call is left after
call-inliner; cse options and idempotence."""

from collections import Counter
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode
from hlo_passes.passes.cleanup.cse import is_mergeable_collective
from hlo_passes.passes.manager import PassManager
from hlo_passes.verifier import verify_module
from tests.frontend.xla_oracle import xla_canonical as xla_parse

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "golden" / "corpus").rglob("*.hlo"))


def kept(module):
    """The instructions no cleanup may drop or merge, counted by opcode (calls are inlined;
    cse merges twin SPMD collectives, checked in test_cse_merges_twin_collectives_only)."""
    return Counter(i.opcode for i in module.all_instructions()
                   if i.has_side_effect and i.opcode is not Opcode.CALL and not is_mergeable_collective(i))


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
