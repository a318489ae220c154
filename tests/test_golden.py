"""Golden tests: every `golden/<pass>/<case>.hlo` (except the corpus) starts with comment lines

    // RUN: --passes=<pipeline> [--num-partitions=N]
    // GUARDS: <what this case guards>
    // NUMERICS: skip <why>            (optional)

and its expected output is beside it as `<case>.expected.hlo`.  Each case runs the
pipeline with the verifier after every pass, compares the text exactly (showing a
unified diff), re-parses the output (print → parse → print is identical), runs the
structural verifier, and verifies numerically against the input through XLA unless it
says `// NUMERICS: skip <why>`.  A case whose name ends in `unchanged` is a negative
case: the pipeline must report no change and print the input back as it parsed.

    pytest tests/test_golden.py --update-golden   # rewrite expectations, print the diffs
"""

import difflib
import shlex
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.passes.manager import PassManager
from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere
from hlo_passes.verifier import verify_module

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted(p for p in (ROOT / "golden").rglob("*.hlo")
               if not p.name.endswith(".expected.hlo") and "corpus" not in p.parts)
DIRECTIVES = {"RUN", "GUARDS", "NUMERICS"}


def directives(path: Path, text: str) -> dict[str, str]:
    """The leading `// KEY: value` lines; unknown keys are an error (a typo would hide a check)."""
    found = {}
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        key, colon, value = line[2:].strip().partition(":")
        key = key.strip().upper()
        if colon and key in DIRECTIVES:
            found[key] = value.strip()
        elif colon and key.isalpha():
            raise AssertionError(f"{path}: unknown directive // {key}: (known: {', '.join(sorted(DIRECTIVES))})")
    return found


def pipeline_of(path: Path, run_line: str):
    passes, partitions = None, None
    for arg in shlex.split(run_line):
        key, _, value = arg.partition("=")
        if key == "--passes":
            passes = value
        elif key == "--num-partitions":
            partitions = int(value)
        else:
            raise AssertionError(f"{path}: // RUN: takes --passes=... and --num-partitions=N, got {arg!r}")
    assert passes, f"{path}: // RUN: needs --passes=<pipeline>"
    pipeline = parse_pipeline(passes)
    if partitions is not None:  # like `hlo-passes run`: passes without the option ignore it
        set_option_everywhere(pipeline, "num_partitions", partitions)
    return pipeline


def run_case(path: Path) -> tuple[str, bool, dict[str, str]]:
    text = path.read_text()
    d = directives(path, text)
    assert "RUN" in d, f"{path}: the first lines must say `// RUN: --passes=...`"
    assert d.get("GUARDS"), f"{path}: say what the case guards in a `// GUARDS: ...` line"
    module = parse_module(text, str(path))
    changed = PassManager(pipeline_of(path, d["RUN"]).passes, verify_each=True).run(module)
    return print_module(module), changed, d


def _diff(a: str, b: str, a_name: str, b_name: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), a_name, b_name))


@pytest.mark.parametrize("path", CASES, ids=lambda p: str(p.relative_to(ROOT / "golden")))
def test_golden(path, request):
    out, changed, d = run_case(path)
    expected_path = path.with_name(path.name.removesuffix(".hlo") + ".expected.hlo")
    if request.config.getoption("--update-golden"):
        old = expected_path.read_text() if expected_path.exists() else ""
        if old != out:
            expected_path.write_text(out)
            print(f"updated {expected_path.relative_to(ROOT)}:\n" +
                  _diff(old, out, str(expected_path), "updated"))
        return
    assert expected_path.exists(), f"{expected_path} is missing: run pytest {__file__} --update-golden"
    expected = expected_path.read_text()
    if out != expected:
        pytest.fail(f"{path.name}: output differs from {expected_path.name} (- expected, + actual)\n"
                    + _diff(expected, out, str(expected_path), "actual"), pytrace=False)
    if path.stem.endswith("unchanged"):
        as_parsed = print_module(parse_module(path.read_text(), str(path)))
        assert not changed, f"{path.name}: a negative case, but the pipeline says it changed the module"
        assert out == as_parsed, f"{path.name}: a negative case, but the output differs from the input:\n" + \
            _diff(as_parsed, out, "input", "output")
    reparsed = parse_module(out)
    assert print_module(reparsed) == out
    assert verify_module(reparsed) == []
    if d.get("NUMERICS", "").startswith("skip"):
        assert d["NUMERICS"][4:].strip(), f"{path.name}: say why numerics are skipped"
        return
    from hlo_passes.runtime import verify_equivalent

    report = verify_equivalent(path.read_text(), out)
    assert report.ok, report.format()


def test_every_pass_with_a_golden_folder_is_registered():
    from hlo_passes.passes.registry import all_passes

    folders = {p.parent.name for p in CASES}
    assert folders - set(all_passes()) == set(), "golden folders must be named after registered passes"
