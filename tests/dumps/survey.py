"""Every command of the dump workflow on every program of a dump directory, as a new user runs it.

    python tests/dumps/survey.py DIR [DIR ...] [--jobs 2] [--only NAME ...]

DIR is what `XLA_FLAGS=--xla_dump_to=DIR python tests/dumps/programs.py` wrote (with
`--xla_dump_hlo_pass_re=spmd-partitioning` for XLA's own partition).  For each program module
(`jit_<program>`) it runs the CLI in a subprocess and prints one line per check and a total:

    fmt            hlo-passes fmt BEFORE
    run            hlo-passes run BEFORE --passes spmd-partition --verify
    pipeline       hlo-passes run BEFORE --passes spmd-partition,weight-update-sharding,collective-fusion --verify
    dir            hlo-passes run DIR --module NAME --passes spmd-partition --verify
    exec           hlo-passes exec BEFORE
    xla-partition  hlo-passes verify BEFORE AFTER_SPMD (XLA's own after_spmd-partitioning dump)
    corrupted      hlo-passes verify BEFORE AFTER_SPMD' (a constant changed): must exit 1
    optimized      hlo-passes run AFTER_OPTIMIZATIONS --passes collective-fusion --verify

A check passes on the expected exit code with no traceback on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.dumps.programs import PROGRAMS  # noqa: E402

PIPELINE = "spmd-partition,weight-update-sharding,collective-fusion"
TIMEOUT = 300


@dataclass
class Check:
    program: str
    name: str
    argv: list[str]
    want: int = 0
    rc: int | None = None
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == self.want and "Traceback" not in self.stderr


def corrupt(text: str) -> str:
    """The module with its first array output x (the ROOT, or the ROOT tuple's first array
    element) replaced by 1 - x (pred outputs: not x): a program that computes something else,
    whatever the rest of it does, by more than any tolerance (1 - x = x only where x = 0.5)."""
    from hlo_passes.ir.builder import Builder
    from hlo_passes.ir.opcode import Opcode
    from hlo_passes.ir.types import PrimitiveType
    from hlo_passes.parse.module_parser import parse_module
    from hlo_passes.printer import print_module

    module = parse_module(text)
    entry = module.entry
    root = entry.root
    target = root
    if root.opcode is Opcode.TUPLE:
        target = next(op for op in root.operands if not op.shape.is_tuple)
    b = Builder(entry, before=root if root is not target else None)
    etype = target.shape.element_type
    if etype is PrimitiveType.PRED:
        changed = b.op(Opcode.NOT, target.shape, [target])
    else:
        one = b.broadcast(b.constant(1, etype), target.shape)
        changed = b.add(b.op(Opcode.NEGATE, target.shape, [target]), one)
    if root is target:
        entry.root = changed
    else:
        root.replace_operand(target, changed)
    return print_module(module)


def stage(directory: Path, module: str, suffix: str) -> Path | None:
    found = sorted(directory.glob(f"module_*.{module}.{suffix}"))
    return found[-1] if found else None


def checks_for(directory: Path, program: str, scratch: Path) -> list[Check]:
    module = PROGRAMS[program].module
    before = stage(directory, module, "before_optimizations.txt")
    if before is None:
        return []
    after_spmd = stage(directory, module, "*after_spmd-partitioning*.txt")
    optimized = stage(directory, module, "cpu_after_optimizations.txt")
    cli = [sys.executable, "-m", "hlo_passes"]
    out = scratch / f"{directory.name}.{program}"
    checks = [
        Check(program, "fmt", cli + ["fmt", str(before)]),
        Check(program, "run", cli + ["run", str(before), "--passes", "spmd-partition", "--verify",
                                     "-o", f"{out}.run.hlo"]),
        Check(program, "pipeline", cli + ["run", str(before), "--passes", PIPELINE, "--verify",
                                          "-o", f"{out}.pipeline.hlo"]),
        Check(program, "dir", cli + ["run", str(directory), "--module", module, "--passes", "spmd-partition",
                                     "--verify", "-o", f"{out}.dir.hlo"]),
        Check(program, "exec", cli + ["exec", str(before)]),
    ]
    if after_spmd is not None:
        bad = Path(f"{out}.corrupted.hlo")
        bad.write_text(corrupt(after_spmd.read_text()))
        checks += [Check(program, "xla-partition", cli + ["verify", str(before), str(after_spmd)]),
                   Check(program, "corrupted", cli + ["verify", str(before), str(bad)], want=1)]
    if optimized is not None:
        checks.append(Check(program, "optimized", cli + ["run", str(optimized), "--passes", "collective-fusion",
                                                         "--verify", "-o", f"{out}.optimized.hlo"]))
    return checks


def run(check: Check) -> Check:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    try:
        p = subprocess.run(check.argv, capture_output=True, text=True, env=env, cwd=HERE.parents[1],
                           timeout=TIMEOUT)
        check.rc, check.stderr = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        check.rc, check.stderr = -1, f"timed out after {TIMEOUT} s"
    return check


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the stderr of failed checks")
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="hlo-survey-"))
    checks = [c for d in args.dirs for p in (args.only or PROGRAMS) for c in checks_for(d, p, scratch)]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(run, checks))
    for c in done:
        mark = "ok  " if c.ok else "FAIL"
        tail = "" if c.ok else " | " + (c.stderr.strip().splitlines() or ["(no stderr)"])[-1][:160]
        print(f"{mark} {c.program:18} {c.name:14} rc={c.rc}{tail}")
        if args.verbose and not c.ok:
            print("     " + c.stderr.strip().replace("\n", "\n     ")[-3000:])
    passed = sum(c.ok for c in done)
    tracebacks = sum("Traceback" in c.stderr for c in done)
    print(f"{passed}/{len(done)} checks pass, {tracebacks} tracebacks")
    return 0 if passed == len(done) else 1


if __name__ == "__main__":
    sys.exit(main())
