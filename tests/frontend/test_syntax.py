"""Round-trip contract on hand-written modules, one per syntax feature.

For each case: XLA's parser accepts our printed text, XLA's canonical print of
our output equals XLA's canonical print of the input, printing again is
byte-identical, and the fast line scanner and the full grammar build the same
module (or the scanner defers to the grammar)."""

import pytest

from hlo_passes import parse_module, print_module
from tests.frontend.syntax_cases import CASES
from tests.frontend.xla_oracle import xla_canonical


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_matches_xla(name):
    _guards, text = CASES[name]
    expected = xla_canonical(text)
    ours = print_module(parse_module(text, name))
    assert xla_canonical(ours) == expected
    assert print_module(parse_module(ours)) == ours


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_agrees_with_grammar(name):
    _guards, text = CASES[name]
    assert print_module(parse_module(text, engine="auto")) == print_module(parse_module(text, engine="lark"))
