"""Fuzzing the front end and the CLI with mutants of real HLO (tests/frontend/fuzz.py).

The promise on hostile input: a clear error (HloParseError in the library; exit 2 and one
`file:line:col` message from the CLI), no traceback, bounded time, and no change to any
file when the command fails.  Whatever the parser accepts must also print, read back to the
same text, and survive the cleanup passes with the structural verifier after each.

Quick in CI (`--fuzz 400` mutants, the default); long locally: `make fuzz` (20,000), or
`pytest tests/frontend/test_fuzz.py --fuzz N --fuzz-seed S`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hlo_passes import HloParseError, parse_module, print_module
from hlo_passes.passes.manager import PassManager
from tests.frontend.fuzz import mutants, seed_texts

# Hang detection, not a speed target: a mutant of a small file reads in milliseconds.
MAX_SECONDS_PER_MUTANT = 30


@pytest.fixture(scope="module")
def corpus(request):
    count = request.config.getoption("--fuzz")
    seed = request.config.getoption("--fuzz-seed")
    return mutants(seed_texts(), count, seed)


def test_library_reads_or_rejects_every_mutant_cleanly(corpus):
    failures, accepted, slowest = [], 0, 0.0
    for description, text in corpus:
        start = time.perf_counter()
        try:
            module = parse_module(text, "mutant.hlo")
        except HloParseError as e:
            assert e.line >= 0 and len(e.format()) < 5000
        except Exception as e:  # noqa: BLE001 - the finding
            failures.append(f"{description}: parse raised {type(e).__name__}: {e}")
        else:
            accepted += 1
            try:
                printed = print_module(module)
                again = parse_module(printed, "printed.hlo")
                assert print_module(again) == printed, "printing is not stable"
                PassManager.from_pipeline("dce,cse", verify_each=True).run(again)
                print_module(again)
            except Exception as e:  # noqa: BLE001
                failures.append(f"{description}: after parsing, {type(e).__name__}: {str(e)[:300]}")
        slowest = max(slowest, time.perf_counter() - start)
    assert not failures, f"{len(failures)} of {len(corpus)} mutants:\n" + "\n".join(failures[:20])
    assert slowest < MAX_SECONDS_PER_MUTANT
    assert 0 < accepted < len(corpus)  # the mutants exercise both outcomes


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlo_passes", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_cli_on_mutants_never_damages_the_output(corpus, tmp_path):
    """Every tenth mutant (at least a few) through `fmt -o`: exit 0 with a module that reads, or
    exit 2 with one error and the old output file untouched."""
    picked = corpus[:: max(1, len(corpus) // 12)]
    out = tmp_path / "out.hlo"
    for i, (description, text) in enumerate(picked):
        source = tmp_path / f"mutant{i}.hlo"
        source.write_text(text)
        out.write_text("previous contents\n")
        done = _cli("fmt", source, "-o", out)
        where = f"{description}\n{done.stderr[-2000:]}"
        assert done.returncode in (0, 2), where
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, where
        if done.returncode == 0:
            parse_module(out.read_text())
        else:
            assert out.read_text() == "previous contents\n", where
            assert done.stderr.startswith(f"{source}:"), where


USAGE_MISTAKES = [
    ["fmt"],
    ["fmt", "{missing}"],
    ["fmt", "-", "--in-place"],
    ["fmt", "{good}", "-o", ""],
    ["fmt", "{good}", "-o", "{dir}"],
    ["fmt", "{good}", "--in-place", "-o", "{out}"],
    ["fmt", "{good}", "--stage", "after_optimizations"],
    ["fmt", "{dir}"],
    ["fmt", "/dev/zero"],
    ["run", "{good}"],
    ["run", "{good}", "--passes="],
    ["run", "{good}", "--passes=dce{{"],
    ["run", "{good}", "--passes=nope"],
    ["run", "{good}", "--passes=dce", "--num-partitions=0"],
    ["run", "{good}", "--passes=dce", "--num-partitions=x"],
    ["run", "{good}", "--passes=dce", "--dump-dir", "{good}"],
    ["passes", "--bogus"],
    ["diff", "{good}"],
    ["nosuchcommand"],
    ["--bogus"],
]


@pytest.mark.parametrize("argv", USAGE_MISTAKES, ids=[" ".join(a) or "nothing" for a in USAGE_MISTAKES])
def test_usage_mistakes_exit_2_without_traceback(argv, tmp_path):
    good = tmp_path / "good.hlo"
    good.write_text("HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT n = f32[2] negate(p)\n}\n")
    out = tmp_path / "out.hlo"
    out.write_text("previous\n")
    names = {"good": good, "missing": tmp_path / "missing.hlo", "dir": tmp_path, "out": out}
    done = _cli(*(a.format(**names) for a in argv), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert done.stderr.strip() and len(done.stderr) < 10_000
    assert out.read_text() == "previous\n" and good.read_text().startswith("HloModule m")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_device_is_an_error_not_a_traceback(tmp_path):
    good = tmp_path / "good.hlo"
    good.write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n")
    done = _cli("fmt", good, "-o", "/dev/full")
    assert done.returncode == 2 and "No space left" in done.stderr and "Traceback" not in done.stderr
