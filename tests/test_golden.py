"""Golden tests: every `golden/<pass>/<case>.hlo` (except the corpus) states its
pipeline in a leading `// RUN:` line; its expected output is beside it as
`<case>.expected.hlo`.  Each case runs the pipeline, compares the text exactly
(showing a unified diff), re-parses the output, runs the structural check, and
verifies numerically against the input unless it says `// NUMERICS: skip <why>`.

    pytest tests/test_golden.py --update-golden   # rewrite expectations, print the diffs
"""

import difflib
import shlex
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.passes.manager import PassManager, structural_problems
from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted(p for p in (ROOT / "golden").rglob("*.hlo")
               if not p.name.endswith(".expected.hlo") and "corpus" not in p.parts)


def directives(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        key, _, value = line[2:].strip().partition(":")
        found[key.strip().upper()] = value.strip()
    return found


def run_case(path: Path) -> tuple[str, dict[str, str]]:
    text = path.read_text()
    d = directives(text)
    assert "RUN" in d, f"{path}: the first lines must say `// RUN: --passes=...`"
    args = shlex.split(d["RUN"])
    passes = next(a.split("=", 1)[1] for a in args if a.startswith("--passes="))
    pipeline = parse_pipeline(passes)
    for a in args:
        if a.startswith("--num-partitions="):
            set_option_everywhere(pipeline, "num_partitions", int(a.split("=", 1)[1]))
    module = parse_module(text, str(path))
    PassManager(pipeline.passes, verify_each=True).run(module)
    return print_module(module), d


@pytest.mark.parametrize("path", CASES, ids=lambda p: str(p.relative_to(ROOT / "golden")))
def test_golden(path, request):
    out, d = run_case(path)
    expected_path = path.with_name(path.name.removesuffix(".hlo") + ".expected.hlo")
    if request.config.getoption("--update-golden"):
        old = expected_path.read_text() if expected_path.exists() else ""
        if old != out:
            expected_path.write_text(out)
            print("".join(difflib.unified_diff(old.splitlines(True), out.splitlines(True),
                                               str(expected_path), "updated")))
        return
    assert expected_path.exists(), f"{expected_path} is missing: run pytest {__file__} --update-golden"
    expected = expected_path.read_text()
    if out != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), out.splitlines(True),
                                            str(expected_path), "actual"))
        pytest.fail(f"{path.name}: output differs from {expected_path.name}\n{diff}", pytrace=False)
    reparsed = parse_module(out)
    assert print_module(reparsed) == out
    assert not structural_problems(reparsed)
    if d.get("NUMERICS", "").startswith("skip"):
        return
    from hlo_passes.runtime import verify_equivalent

    report = verify_equivalent(path.read_text(), out)
    assert report.ok, report.format()
