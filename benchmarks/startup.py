"""Start-up time of `hlo-passes fmt` on a tiny module: wall time of whole processes.

    python benchmarks/startup.py [--runs 15] [--checkout DIR ...]

Each checkout (default: this one) runs `python -m hlo_passes fmt tiny.hlo` --runs
times, with Python's bytecode cache and without it for hlo_passes (its modules
compiled from source on every run, as in a checkout with PYTHONDONTWRITEBYTECODE=1:
the standard library and site-packages keep their .pyc files); the best and the
median wall time are printed.  What the command imports is listed with
`python -X importtime -m hlo_passes fmt FILE`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] negate(p)\n}\n"


def time_runs(checkout: Path, path: Path, runs: int, bytecode: bool, tmp: str) -> list[float]:
    if bytecode:
        env = dict(os.environ, PYTHONPATH=str(checkout))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:  # a copy of the package without .pyc files, none written: hlo_passes compiles each run
        copy = Path(tmp) / f"src{abs(hash(str(checkout)))}"
        if not copy.exists():
            shutil.copytree(checkout / "hlo_passes", copy / "hlo_passes",
                            ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-c", "import sys, hlo_passes.cli.main as m; "
           f"assert m.__file__.startswith({str(env['PYTHONPATH'])!r}); sys.exit(m.main(sys.argv[1:]))",
           "fmt", str(path)]
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH.
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp)  # warm: caches, .pyc files
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--checkout", action="append", type=Path,
                    help="a source tree to time (repeatable; default: this one)")
    args = ap.parse_args()
    checkouts = args.checkout or [Path(__file__).resolve().parents[1]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.hlo"
        path.write_text(TINY)
        print(f"{'checkout':40s} {'bytecode':9s} {'best':>7s} {'median':>7s}")
        for checkout in checkouts:
            for bytecode in (True, False):
                times = time_runs(checkout, path, args.runs, bytecode, tmp)
                print(f"{str(checkout):40s} {'cached' if bytecode else 'compiled':9s} "
                      f"{min(times):6.3f}s {statistics.median(times):6.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
