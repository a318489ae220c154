"""The round-trip contract on every HLO file of the real corpus (golden/corpus)
and of the golden tests: XLA's canonical print of our output equals XLA's
canonical print of the input, printing is stable, and the fast line scanner
reads every file itself (no fallback) and agrees with the full grammar, source spans
included."""

from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from tests.frontend.xla_oracle import xla_canonical

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for p in (ROOT / "golden").rglob("*.hlo")) + sorted((ROOT / "examples").glob("*.hlo"))
CORPUS = [p for p in FILES if "corpus" in p.parts]


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_round_trip_matches_xla(path):
    text = path.read_text()
    ours = print_module(parse_module(text, str(path)))
    assert xla_canonical(ours) == xla_canonical(text)
    assert print_module(parse_module(ours)) == ours


def _spans(module) -> list:
    return [(c.name, c.span, [(i.name, i.span) for i in c.instructions]) for c in module.computations]


@pytest.mark.parametrize("path", CORPUS, ids=_id)
def test_fast_path_reads_and_agrees(path):
    """Same text and the same source span on every instruction and computation."""
    text = path.read_text()
    fast = parse_module(text, str(path), engine="fast")
    full = parse_module(text, str(path), engine="lark")
    assert print_module(fast) == print_module(full)
    assert _spans(fast) == _spans(full)


def test_corpus_is_present():
    assert len(CORPUS) >= 30, "golden/corpus is missing: run `make corpus`"


def test_every_sharding_and_replica_group_reads_as_a_value():
    """The typed attributes passes read exist for every instruction of the corpus, in every
    spelling XLA prints (the dumps after Shardy's export use the named mesh form)."""
    read = 0
    for path in CORPUS:
        for instr in parse_module(path.read_text(), str(path)).all_instructions():
            if instr.has_attr("sharding"):
                assert instr.sharding is not None, f"{path.name}: {instr.name}"
                read += 1
            if instr.has_attr("replica_groups"):
                assert instr.attr("replica_groups") is not None, f"{path.name}: {instr.name}"
    assert read > 1000
