"""A few fixed seeds of the random JAX-program fuzzer (tests/dumps/fuzz_jax_dumps.py; `make
fuzz-dumps` runs it at length): each program is jitted and run with XLA dumping it, and every
check of its stage files (our pipeline on before_optimizations, collective-fusion on
after_optimizations, `verify` of XLA's own compile) must come out ok.  The seeds cover between
them shard_map regions, scan and fori loops, cond, convolutions, gathers and scatters, a
gradient, sorts and explicit output shardings (seed 5: a jit with out_shardings, whose result
lost its sharding before), on all four mesh shapes and both lowerings."""

from __future__ import annotations

import pytest

from tests.dumps.fuzz_jax_dumps import run_seed

# (seed, lowering, whether to verify XLA's own compile too: seed 5's result is tiled by XLA
# while its parameter is replicated, which verify once misread)
CASES = [(5, "shardy", True), (14, "gspmd", False), (28, "shardy", False), (27, "gspmd", False),
         (13, "shardy", False)]


@pytest.mark.parametrize("seed,lowering,xla_own", CASES, ids=[f"{s}-{lo}" for s, lo, _ in CASES])
def test_fixed_seed_is_ok(seed, lowering, xla_own, tmp_path):
    results, info = run_seed(seed, lowering, tmp_path, xla_own=xla_own)
    bad = [f"{r.check}: {r.kind} {r.detail}" for r in results if r.kind != "ok"]
    assert not bad, f"seed {seed} ({lowering}; ops {info.get('ops')}, mesh {info.get('mesh')}): " + "; ".join(bad)
    assert {r.check for r in results} >= {"before", "optimized"}
