"""Differential fuzzing of spmd-partition: random sharded modules (random_hlo.py), partitioned
by us, checked by XLA's execution of the unpartitioned module.

    python tests/spmd/fuzz_spmd.py [--seeds 500] [--start 0] [--families dot,reduce] [--sparse] [--show]

`--sparse` draws modules with few annotations (random_hlo's sparse mode): what is partitioned
is then mostly what sharding-propagation chose.

Prints one line per failing seed and a summary.  Outcomes:

    ok           the partitioned module computes what the original computes
    WRONG        it computes something else (a wrong program: the worst outcome)
    CRASH        spmd-partition raised
    MALFORMED    its output fails the structural verifier or XLA's parser
    ABORT        XLA aborted the process (a CHECK failure or a signal) compiling or running our
                 partitioned program
    skipped      XLA cannot run the original itself (or aborts on it), or XLA:CPU refuses to run
                 the partitioned program for a known fault of its own (XLA_CPU_FAULTS; not our bug)

Each module is judged in a child process (IsolatedJudge): XLA reports some faults by aborting the
process, and one abort must cost one seed, not the run or a test worker.  `--in-process` judges in
this process instead (for a debugger).  A failing seed reproduces with `--start SEED --seeds 1 --show`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hlo_passes import _xla_deaths  # noqa: E402
from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.printer import print_module  # noqa: E402
from hlo_passes.runtime import verify_equivalent  # noqa: E402
from hlo_passes.runtime import execute_module  # noqa: E402
from hlo_passes.runtime.verify import OriginalFailed  # noqa: E402
from hlo_passes.runtime.xla_backend import canonical_text  # noqa: E402
from hlo_passes.verifier import verify_module  # noqa: E402
from tests.spmd.random_hlo import module_from_seed  # noqa: E402


# Runtime errors of XLA:CPU that a valid program meets (the partitioned program is not wrong; it
# cannot be run here).  XLA:CPU's layout assignment leaves an FFT's layout free, and an
# all-gather along an inner dim asks for that dim major: an FFT whose result (or operand) is
# gathered that way gets a column-major layout its FFT kernel then refuses.  Unpartitioned code
# gathered before the FFT (the replicating fallback) meets it as often.
XLA_CPU_FAULTS = ("LayoutUtil::IsMonotonicWithDim0Major(input_shape_.layout())",)


@dataclass
class Outcome:
    seed: int
    kind: str  # ok | WRONG | CRASH | MALFORMED | ABORT | skipped
    detail: str = ""
    text: str = ""
    output: str = ""


def judge(seed: int, families=None, sparse: bool = False) -> Outcome:
    outcome = judge_text(module_from_seed(seed, families=families, sparse=sparse))
    outcome.seed = seed
    return outcome


def judge_text(text: str, seed: int = -1, on_stage: Callable[[str], None] = lambda stage: None) -> Outcome:
    """Judge one module in this process.  `on_stage` hears each stage as it starts ("original",
    "partition", "verify"), so that a parent can tell whose fault an abort was."""
    on_stage("original")
    if _xla_deaths.oracle_died_reason() is None:  # (else a first try died here: verify knows)
        try:
            execute_module(text)
        except Exception as e:  # XLA cannot run the original: nothing to compare with
            return Outcome(seed, "skipped", str(e).splitlines()[0][:200], text)
    on_stage("partition")
    module = parse_module(text)
    try:
        SpmdPartitioner().run(module)
    except Exception as e:
        return Outcome(seed, "CRASH", f"{type(e).__name__}: {e}"[:300] + "\n" + traceback.format_exc(limit=-3),
                       text)
    out = print_module(module)
    errors = verify_module(module)
    if errors:
        return Outcome(seed, "MALFORMED", errors[0].format()[:400], text, out)
    try:
        canonical_text(out)
    except Exception as e:
        return Outcome(seed, "MALFORMED", "XLA's parser: " + str(e).splitlines()[0][:300], text, out)
    on_stage("verify")
    try:
        report = verify_equivalent(text, out)
    except OriginalFailed as e:  # (after a first try died on the original, and no other oracle)
        return Outcome(seed, "skipped", str(e).splitlines()[0][:200], text, out)
    except Exception as e:
        first = str(e).splitlines()[0]
        if any(fault in first for fault in XLA_CPU_FAULTS):
            return Outcome(seed, "skipped", f"XLA:CPU cannot run the partitioned program: {first[:200]}", text, out)
        return Outcome(seed, "CRASH", f"verify: {type(e).__name__}: {first[:300]}", text, out)
    if not report.ok:
        return Outcome(seed, "WRONG", report.format()[:800], text, out)
    return Outcome(seed, "ok")


class IsolatedJudge:
    """Judges modules in a child process, one at a time, restarting it when XLA kills it.

    An abort while XLA runs the original is XLA's own fault with a module we generated: skipped.
    An abort compiling or running our partitioned program is ABORT, with the end of XLA's stderr
    (its CHECK message): our output made XLA die, which a user would meet too."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        handle, self._phase = tempfile.mkstemp(prefix="fuzz-spmd-phase-")  # see _xla_deaths.py
        os.close(handle)
        self._env = {**os.environ, **(env or {}), _xla_deaths.PHASE_FILE: self._phase}
        self._child: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    def __enter__(self) -> IsolatedJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
        self._stderr.close()
        os.unlink(self._phase)

    def _start(self) -> subprocess.Popen[str]:
        if self._child is None or self._child.poll() is not None:
            self._stderr.seek(0)
            self._stderr.truncate()
            self._child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=self._env)
        return self._child

    def judge(self, seed: int, families=None, sparse: bool = False) -> Outcome:
        return self.judge_text(module_from_seed(seed, families=families, sparse=sparse), seed)

    def judge_text(self, text: str, seed: int = -1) -> Outcome:
        child = self._start()
        assert child.stdin is not None and child.stdout is not None
        self._stderr.seek(0, os.SEEK_END)
        stderr_from = self._stderr.tell()
        child.stdin.write(json.dumps({"text": text, "seed": seed}) + "\n")
        child.stdin.flush()
        stage = "start"
        for line in child.stdout:
            message = json.loads(line)
            if "stage" in message:
                stage = message["stage"]
                continue
            return Outcome(**message["outcome"])
        child.wait()
        self._stderr.seek(stderr_from)
        tail = self._stderr.read()[-1500:]
        self._child = None
        signal = -child.returncode if child.returncode < 0 else None
        how = f"signal {signal}" if signal else f"exit {child.returncode}"
        if stage == "original":
            return self._judge_again_without_xla_partitioning_the_original(text, seed, how)
        if _xla_deaths.retry_variable(self._phase, self._env) == _xla_deaths.MANUAL_DIED:
            # XLA's partitioner died on our per-device program in manual mode: run as the CLI
            # does, once more as a replica program (the verdict is ours, not XLA's check's)
            with IsolatedJudge(env={_xla_deaths.MANUAL_DIED: f"XLA died compiling it ({how})"}) as again:
                return again.judge_text(text, seed)
        return Outcome(seed, "ABORT", f"the judge died in stage {stage!r} ({how}); its stderr ends:\n{tail}", text)


    def _judge_again_without_xla_partitioning_the_original(self, text: str, seed: int, how: str) -> Outcome:
        """XLA died on the original: where it has manual regions, judged once more by them run
        directly (as the CLI's supervisor does, _xla_deaths.py); else skipped."""
        skipped = Outcome(seed, "skipped", f"XLA died running the original ({how})", text)
        if _xla_deaths.ORACLE_DIED in self._env or "SPMDFullToShardShape" not in text:
            return skipped
        with IsolatedJudge(env={_xla_deaths.ORACLE_DIED: f"XLA died running it ({how})"}) as again:
            outcome = again.judge_text(text, seed)
        return skipped if outcome.kind == "skipped" else outcome


def serve() -> int:
    """The child side of IsolatedJudge: one JSON request per line on stdin, stage and outcome
    lines on the original stdout (anything else printed goes to stderr)."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    abort_at = os.environ.get("FUZZ_SPMD_ABORT_AT")  # the judge's own test: die in this stage

    def say(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()
        if abort_at and message.get("stage") == abort_at:
            print(f"aborting in stage {abort_at} as asked", file=sys.stderr, flush=True)
            os.abort()

    for line in sys.stdin:
        request = json.loads(line)
        outcome = judge_text(request["text"], request["seed"], on_stage=lambda stage: say({"stage": stage}))
        say({"outcome": asdict(outcome)})
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--families", help="comma-separated op families (random_hlo.OPS)")
    ap.add_argument("--sparse", action="store_true", help="few annotations: propagation chooses the rest")
    ap.add_argument("--show", action="store_true", help="print the module and our output of failures")
    ap.add_argument("--in-process", action="store_true", help="judge in this process (an XLA abort ends the run)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve()
    families = tuple(args.families.split(",")) if args.families else None
    counts: dict[str, int] = {}
    isolated = None if args.in_process else IsolatedJudge()
    for seed in range(args.start, args.start + args.seeds):
        o = isolated.judge(seed, families, args.sparse) if isolated else judge(seed, families, args.sparse)
        counts[o.kind] = counts.get(o.kind, 0) + 1
        if o.kind not in ("ok", "skipped"):
            print(f"{o.kind:9} seed {seed}: {o.detail.splitlines()[0] if o.detail else ''}", flush=True)
            if args.show:
                print(o.text, o.output, o.detail, sep="\n", flush=True)
    if isolated:
        isolated.close()
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0 if not any(counts.get(k) for k in ("WRONG", "CRASH", "MALFORMED", "ABORT")) else 1


if __name__ == "__main__":
    sys.exit(main())
