"""Parse + print speed of hlo-passes against XLA's own C++ parser, side by side.

    python benchmarks/parse_speed.py [FILE ...]

Without files it times real 12- and 20-layer transformer training-step dumps
(lowered and compiled text; generated into bench-data/ on first use by
benchmarks/transformer_dump.py).  Each figure is the best of --repeat runs, all
taken in the same process; memory is the peak traced by tracemalloc during one
extra parse (reported as a multiple of the file size).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes import parse_module, print_module  # noqa: E402


def xla_parse(text: str):
    from hlo_passes.runtime.xla_backend import parse_with_xla

    return parse_with_xla(text)


def best_of(n, fn):
    best = float("inf")
    result = None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def default_files() -> list[Path]:
    data = ROOT / "bench-data"
    wanted = [data / f"transformer{n}.{kind}.hlo" for n in (12, 20) for kind in ("lowered", "compiled")]
    if not all(f.exists() for f in wanted):
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import transformer_dump

        for n in (12, 20):
            transformer_dump.make(n)
    return wanted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = args.files or default_files()
    print(f"{'file':38} {'MB':>6} {'XLA parse':>10} {'ours parse':>10} {'(no checks)':>11} {'ours print':>10} "
          f"{'ours MB/s':>9} {'ratio':>6} {'mem/size':>8}")
    for f in files:
        text = f.read_text()
        mb = len(text) / 1e6
        t_xla, _ = best_of(args.repeat, lambda: xla_parse(text))
        t_parse, module = best_of(args.repeat, lambda: parse_module(text, str(f)))
        t_unchecked, _ = best_of(args.repeat, lambda: parse_module(text, str(f), check_semantics=False))
        t_print, out = best_of(args.repeat, lambda: print_module(module))
        assert print_module(parse_module(out)) == out, "print is not stable"
        tracemalloc.start()
        parse_module(text)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        ratio = (t_parse + t_print) / t_xla
        print(f"{f.name:38} {mb:6.2f} {t_xla:9.3f}s {t_parse:9.3f}s {t_unchecked:10.3f}s {t_print:9.3f}s "
              f"{mb / (t_parse + t_print):9.2f} {ratio:5.1f}x {peak / len(text):7.1f}x")
    print("ratio = (our parse + our print) / XLA's parse; lower is better; target <= 5x")


if __name__ == "__main__":
    main()
