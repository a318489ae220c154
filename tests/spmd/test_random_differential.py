"""Random differential tests of spmd-partition: random sharded modules (random_hlo.py), every
op family, 2-8 devices, uneven and size-1 dims, partial replication and maximal shardings —
each partitioned and checked against XLA's execution of the unpartitioned module.

A quick profile runs here (CI); `make fuzz-spmd` runs the long one (tests/spmd/fuzz_spmd.py).
Every bug it finds becomes a golden case or a test of its own.  Modules are judged in a child
process (IsolatedJudge): an XLA abort fails the module that caused it, with XLA's message, instead
of killing the test worker."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.spmd.fuzz_spmd import IsolatedJudge
from tests.spmd.random_hlo import OPS, module_from_seed, random_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def isolated():
    with IsolatedJudge() as judge:
        yield judge


def _check(outcome):
    assert outcome.kind in ("ok", "skipped"), f"{outcome.kind}: {outcome.detail}\n{outcome.text}\n{outcome.output}"


# derandomize: CI runs the same 25 modules every time (a random module that makes XLA itself abort,
# as an FFT layout or a new family might, would otherwise fail one CI run in many, far from its
# cause); `make fuzz-spmd` is where new random modules are drawn.
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=random_module())
def test_random_modules_partition_to_the_same_program(isolated, text):
    _check(isolated.judge_text(text))


@pytest.mark.parametrize("family", sorted(OPS))
def test_each_op_family(isolated, family):
    """Two modules per family made only of that family's ops (plus what they read)."""
    for seed in (sum(map(ord, family)), 7):  # str hashes are salted per process
        _check(isolated.judge(seed, (family,)))


@pytest.mark.parametrize("stage, kind", [("original", "skipped"), ("verify", "ABORT")])
def test_an_abort_is_judged_by_its_stage_and_the_judge_recovers(stage, kind):
    """A child that dies running XLA on the original skips the module (XLA's fault); one that dies
    on our partitioned program is ABORT, with the child's stderr; the next module gets a fresh child
    and the test worker lives on."""
    with IsolatedJudge(env={"FUZZ_SPMD_ABORT_AT": stage}) as judge:
        outcome = judge.judge(7)
        assert outcome.kind == kind
        assert "signal 6" in outcome.detail
        if kind == "ABORT":
            assert "aborting in stage verify as asked" in outcome.detail
        assert judge.judge(7).kind == kind  # a fresh child, judged the same way



def test_a_death_on_an_original_with_manual_regions_is_judged_again_by_the_regions_run_directly():
    """As the CLI's supervisor does (_xla_deaths.py): the module is judged once more in a
    fresh child told that XLA died on the original; verify then takes the regions run
    directly as the oracle, so the module is judged (here ok) rather than skipped.  A module
    without regions has no such oracle and stays skipped."""
    from tests.test_verify_manual_regions import FULLY_MANUAL
    with IsolatedJudge(env={"FUZZ_SPMD_ABORT_AT": "original"}) as judge:
        outcome = judge.judge_text(FULLY_MANUAL.format(rows=10), 1)
        assert outcome.kind == "ok", outcome.detail
        assert judge.judge(7).kind == "skipped"


def test_a_death_compiling_our_program_in_manual_mode_is_judged_again_as_a_replica_program():
    """Seed 11156: XLA's partitioner dies (a failed check) compiling our per-device program in
    manual mode; the judge, as the CLI, runs it once more as a replica program: ok, not ABORT."""
    text = (ROOT / "tests" / "dumps" / "data" / "xla_dies_compiling_manual_11156.hlo").read_text()
    with IsolatedJudge() as judge:
        outcome = judge.judge_text(text, 11156)
    assert outcome.kind == "ok", outcome.detail
