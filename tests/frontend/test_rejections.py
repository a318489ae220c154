"""What XLA rejects, we reject: one `file:line:col` error per rule (rejection_cases.py), at the
offending token, from both parser paths, never an exception of another type; and XLA rejects
the same text (its parser, or for the "compile" cases its compiler)."""

import pytest

from hlo_passes import HloParseError, parse_module
from tests.frontend.rejection_cases import CASES
from tests.verifier.xla_oracle import xla_rejects


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_rejected_at_the_offending_token(name, engine):
    text, line, column, words, _ = CASES[name]
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo", engine=engine)
    err = info.value
    assert (err.line, err.column) == (line, column), err.format()
    for word in words:
        assert word in err.message, err.format()
    rendered = err.format().splitlines()
    assert rendered[0].startswith(f"bad.hlo:{line}:{column}: error: ")
    assert rendered[2].index("^") == column - 1 or len(rendered[1]) > 240


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[4] in ("rejects", "compile")))
def test_xla_rejects_them_too(name):
    text, _, _, _, verdict = CASES[name]
    complaint = xla_rejects(text)
    assert complaint is not None, f"{name}: XLA takes it"
    if verdict == "rejects":
        assert complaint.startswith("parser:"), complaint
