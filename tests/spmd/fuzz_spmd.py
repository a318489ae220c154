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
    skipped      XLA cannot run the original itself, or XLA:CPU refuses to run the partitioned
                 program for a known fault of its own (XLA_CPU_FAULTS; not our bug)

A failing seed reproduces with `--start SEED --seeds 1 --show`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.printer import print_module  # noqa: E402
from hlo_passes.runtime import verify_equivalent  # noqa: E402
from hlo_passes.runtime import execute_module  # noqa: E402
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
    kind: str  # ok | WRONG | CRASH | MALFORMED | skipped
    detail: str = ""
    text: str = ""
    output: str = ""


def judge(seed: int, families=None, sparse: bool = False) -> Outcome:
    outcome = judge_text(module_from_seed(seed, families=families, sparse=sparse))
    outcome.seed = seed
    return outcome


def judge_text(text: str, seed: int = -1) -> Outcome:
    try:
        execute_module(text)
    except Exception as e:  # XLA cannot run the original: nothing to compare with
        return Outcome(seed, "skipped", str(e).splitlines()[0][:200], text)
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
    try:
        report = verify_equivalent(text, out)
    except Exception as e:
        first = str(e).splitlines()[0]
        if any(fault in first for fault in XLA_CPU_FAULTS):
            return Outcome(seed, "skipped", f"XLA:CPU cannot run the partitioned program: {first[:200]}", text, out)
        return Outcome(seed, "CRASH", f"verify: {type(e).__name__}: {first[:300]}", text, out)
    if not report.ok:
        return Outcome(seed, "WRONG", report.format()[:800], text, out)
    return Outcome(seed, "ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--families", help="comma-separated op families (random_hlo.OPS)")
    ap.add_argument("--sparse", action="store_true", help="few annotations: propagation chooses the rest")
    ap.add_argument("--show", action="store_true", help="print the module and our output of failures")
    args = ap.parse_args(argv)
    families = tuple(args.families.split(",")) if args.families else None
    counts: dict[str, int] = {}
    for seed in range(args.start, args.start + args.seeds):
        o = judge(seed, families, args.sparse)
        counts[o.kind] = counts.get(o.kind, 0) + 1
        if o.kind not in ("ok", "skipped"):
            print(f"{o.kind:9} seed {seed}: {o.detail.splitlines()[0] if o.detail else ''}", flush=True)
            if args.show:
                print(o.text, o.output, o.detail, sep="\n", flush=True)
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0 if not (counts.get("WRONG") or counts.get("CRASH") or counts.get("MALFORMED")) else 1


if __name__ == "__main__":
    sys.exit(main())
