"""The benchmark scripts still run and still say what they claim.

Benchmarks are scripts, not tests, so nothing else would notice when a refactoring breaks
one (the collective-fusion benchmark once imported a test helper that had been deleted).
Each runs here once, in a subprocess of its own (they configure XLA before JAX starts),
with the fewest repeats; the figures are not judged, the rows they must print are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(*argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_collective_fusion_benchmark_verifies_every_program():
    out = run_benchmark("benchmarks/collective_fusion.py", "--repeats", "1")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    assert set(rows) == {"dp-mlp", "wus-mlp", "ar-slice"}
    for name, row in rows.items():
        assert row[-1] == "yes", name  # numerically verified before it was timed
        assert int(row[3]) < int(row[1]), name  # fewer collectives after collective-fusion


def test_weight_update_sharding_benchmark_shards_the_adam_state():
    out = run_benchmark("benchmarks/weight_update_sharding.py", "--repeats", "1",
                        "--only", "jit adam mlp keep-state + combiners")
    (row,) = [line for line in out.splitlines() if line.startswith("| jit adam mlp")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    flops_before, flops_after = (int(x.replace(",", "")) for x in cells[1].split("→"))
    state_before, state_after = (int(x.replace(",", "")) for x in cells[2].split("→"))
    assert flops_after < flops_before
    assert state_after * 7 < state_before  # about 1/8 of the state per device (padding aside)
    assert cells[3].startswith("AR:") and "RS:1x" in cells[4] and "AG:1x" in cells[4]


def test_parse_speed_benchmark_prints_a_row_per_file():
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "golden/corpus/mlp_train_step").glob("*.hlo"))
    assert len(files) >= 2
    out = run_benchmark("benchmarks/parse_speed.py", *files, "--repeat", "1")
    rows = [line.split()[0] for line in out.splitlines()[1:] if line.endswith("x") and not line.startswith("ratio")]
    assert rows == [Path(f).name for f in files]


def test_spmd_quality_benchmark_verifies_and_compares_with_xla():
    programs = ["sharded_megatron_mlp", "shard_map_collectives"]
    out = run_benchmark("benchmarks/spmd_quality.py", *programs)
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")]
            for line in out.splitlines() if line.split("|")[0].strip() in programs}
    assert set(rows) == set(programs)
    for program, cells in rows.items():
        assert cells[-1].startswith("yes"), program
        assert float(cells[5]) <= 1.0, program  # no more bytes than XLA's partitioner sends
    assert "over 2 programs" in out


def test_spmd_models_benchmark_verifies_a_small_model_and_prints_both_estimates():
    """One model at a small width: verified, and both estimates (the no-overlap step and the
    exposed time the partitioner decides by) printed for ours and XLA's; the Megatron block
    is XLA's plan, so its bytes are XLA's."""
    out = run_benchmark("benchmarks/spmd_models.py", "--only", "gpt_tp", "--widths", "64")
    row = next(line for line in out.splitlines() if line.startswith("gpt_tp"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[-1] == "yes", row
    assert float(cells[1].split()[2]) <= 1.0, row
    est, exposed = cells[4].split(), cells[5].split()
    assert len(est) == 2 and len(exposed) == 2 and all(float(x) > 0 for x in est + exposed), row


def test_random_quality_benchmark_verifies_and_compares_with_xla(tmp_path):
    out = run_benchmark("benchmarks/jax_random_quality.py", "--seeds", "2", "--lowering", "shardy",
                        "--work", str(tmp_path))
    rows = [line for line in out.splitlines() if line.split()[:2] in (["0", "shardy"], ["1", "shardy"])]
    assert len(rows) == 2 and all(row.rstrip().endswith("yes") for row in rows), out
    assert "not verified: 0" in out and "geomean ours/XLA" in out, out
