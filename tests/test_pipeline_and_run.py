"""Pipeline strings and `hlo-passes run`: parsing, printing back, rejection before
anything runs, dumps, stats, remarks, verification, XLA dump directories."""

import subprocess
import sys
from pathlib import Path

import pytest

from hlo_passes.passes.pipeline import PipelineError, parse_pipeline, set_option_everywhere
from tests.frontend.xla_oracle import xla_canonical

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dp_mlp_step.hlo"


@pytest.mark.parametrize("text", [
    "collective-fusion",
    "collective-fusion{threshold-bytes=1048576}",
    "all-reduce-combiner{threshold-bytes=64,threshold-count=2},sharding-propagation",
    "collective-fusion{reduce-scatter-form=variadic,reassociate=false}",
])
def test_pipeline_prints_back_to_the_same_string(text):
    assert str(parse_pipeline(text)) == text


def test_default_valued_options_are_not_printed():
    assert str(parse_pipeline("all-reduce-combiner{threshold-count=256}")) == "all-reduce-combiner"


@pytest.mark.parametrize("text, words", [
    ("no-such-pass", "unknown pass 'no-such-pass'"),
    ("collective-fusion{bogus=1}", "unknown option 'bogus'"),
    ("collective-fusion{threshold-bytes=many}", "expects a int"),
    ("collective-fusion{reassociate=maybe}", "expects a bool"),
    ("collective-fusion{threshold-bytes}", "needs a value"),
    ("collective-fusion{threshold-bytes=1", "unbalanced"),
    ("", "empty pipeline"),
])
def test_bad_pipelines_are_rejected(text, words):
    with pytest.raises(PipelineError, match=words):
        parse_pipeline(text)


def test_global_option_reaches_only_passes_that_have_it():
    p = parse_pipeline("all-reduce-combiner,collective-fusion")
    set_option_everywhere(p, "threshold_bytes", 99)
    assert all(x.options.threshold_bytes == 99 for x in p.passes)
    set_option_everywhere(p, "num_partitions", 8)  # nobody has it: nothing happens
    assert str(p) == "all-reduce-combiner{threshold-bytes=99},collective-fusion{threshold-bytes=99}"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "hlo_passes", *args], capture_output=True, text=True, cwd=cwd)


def test_run_writes_dumps_stats_and_verifies(tmp_path):
    out = tmp_path / "out.hlo"
    dumps = tmp_path / "dumps"
    r = run("run", str(EXAMPLE), "--passes=collective-fusion", "--stats", "--remarks", "--verify",
            "--verify-each", "--dump-dir", str(dumps), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "all-reduce: 6 ×" in r.stderr and "all-reduce: 1 ×" in r.stderr
    assert "EQUIVALENT" in r.stderr
    names = sorted(p.name for p in dumps.iterdir())
    assert names == ["module_0000.jit__fun.0000.collective-fusion.after.txt",
                     "module_0000.jit__fun.0000.collective-fusion.before.txt",
                     "module_0000.jit__fun.0000.collective-fusion.diff"]
    assert "-  %psum" in (dumps / names[2]).read_text()
    xla_canonical(out.read_text())


def test_run_rejects_bad_pipeline_before_writing(tmp_path):
    out = tmp_path / "out.hlo"
    r = run("run", str(EXAMPLE), "--passes=collective-fusion,nope", "-o", str(out))
    assert r.returncode == 2 and "unknown pass 'nope'" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_run_prints_to_stdout_and_reads_dump_directories(tmp_path):
    dump = tmp_path / "xla_dump"
    dump.mkdir()
    (dump / "module_0007.jit_step.before_optimizations.txt").write_text(EXAMPLE.read_text())
    (dump / "module_0003.jit_other.before_optimizations.txt").write_text(EXAMPLE.read_text())
    ambiguous = run("run", str(dump), "--passes=collective-fusion")
    assert ambiguous.returncode == 2 and "--module" in ambiguous.stderr
    r = run("run", str(dump), "--module", "jit_step", "--passes=collective-fusion")
    assert r.returncode == 0 and "module_0007.jit_step" in r.stderr
    assert r.stdout.startswith("HloModule jit__fun")
    assert run("run", str(dump), "--module", "7", "--passes=collective-fusion").returncode == 0


def test_passes_lists_every_pass_with_options():
    r = run("passes")
    assert r.returncode == 0
    for name in ("collective-fusion", "all-reduce-combiner", "sharding-propagation"):
        assert f"{name}\n" in r.stdout
    assert "threshold-bytes=" in r.stdout
