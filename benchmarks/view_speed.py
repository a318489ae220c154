"""How fast `hlo-passes view` writes a big module's page, and how fast Chromium opens it.

    .venv/bin/python benchmarks/gpt_dump.py            # once: bench-data/gpt24.dump (about 30 s)
    .venv/bin/python benchmarks/view_speed.py [FILE ...]

Default files: the GPT-24 training step's dump (8 devices) before and after XLA's
spmd-partitioning pass.  For each file it prints

  * write: `hlo-passes view FILE -o OUT` end to end in this process (read, parse, page data, HTML),
    best of 3, and the page's size;
  * open: headless Chromium from navigation until the page has drawn its first graph (best of 3),
    and the part of it spent in the page's own script (`__mountMs`);
  * every collective of the module is listed on the page (checked);
  * find: the user's path to an all-reduce's source line: two clicks (a source line in the
    collectives panel, then its first all-reduce) until the graph has revealed it, and the
    layout time of that graph.

Figures, not assertions: the targets (under 10 s to write, under 3 s to open, for a 24k-instruction
step) are checked by reading this output; the machine is shared, so the numbers move.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from hlo_passes.cli.main import main as cli
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.stats import module_stats
from hlo_passes.view.headless import Browser

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "bench-data" / "gpt24.dump"


def default_files() -> list[Path]:
    if not DUMP.is_dir():
        sys.exit(f"{DUMP} is missing: run `.venv/bin/python benchmarks/gpt_dump.py` first")
    picked = []
    for pattern in ("*jit_step*before_spmd-partitioning.txt", "*jit_step*after_spmd-partitioning*.txt"):
        picked += sorted(DUMP.glob(pattern))
    return picked


def best_of(n, fn):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main(files: list[Path]) -> None:
    out_dir = Path(tempfile.mkdtemp(prefix="view-bench-"))
    rows = []
    with Browser() as browser:
        for f in files:
            module = parse_module(f.read_text(), str(f))
            stats = module_stats(module)
            out = out_dir / (f.name + ".html")
            write_best, write_median = best_of(3, lambda: cli(["view", str(f), "-o", str(out)]))
            opens, mounts = [], []
            for _ in range(3):
                page = browser.open(out.as_uri(), width=1600, height=1000, timeout=120)
                opens.append(page.open_seconds)
                mounts.append(page.evaluate("window.__mountMs") / 1000)
                assert page.errors == [], page.errors
            listed = page.evaluate("document.querySelectorAll('.coll-row').length")
            assert listed == sum(stats.collective_count.values()), (listed, stats.collective_count)
            find = "-"
            if page.evaluate("document.querySelectorAll('.coll-line').length"):
                start = time.perf_counter()
                page.click(".coll-line summary")
                page.click(".coll-line[open] .coll-row")
                page.wait_for("document.querySelector('svg.graph .node.selected')")
                took = time.perf_counter() - start
                layout = page.evaluate("window.__page.gv.lastStats.layoutMs") / 1000
                line = page.evaluate("document.getElementById('source-line').textContent")
                find = f"{took:.2f} s (layout {layout:.2f} s) → {line}"
            rows.append((f.name, f.stat().st_size / 1e6, stats.instructions, sum(stats.collective_count.values()),
                         write_best, write_median, out.stat().st_size / 1e6, min(opens), min(mounts), find))
    print(f"{'file':<90} {'MB':>5} {'instrs':>7} {'colls':>5} {'write':>7} {'(median)':>8} {'page MB':>7} "
          f"{'open':>6} {'(script)':>8}  find the all-reduce")
    for name, mb, n, colls, wb, wm, pmb, op, mo, find in rows:
        print(f"{name:<90} {mb:5.2f} {n:7d} {colls:5d} {wb:6.2f}s {wm:7.2f}s {pmb:7.2f} {op:5.2f}s {mo:7.2f}s  {find}")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or default_files())
