"""Makes the README's pictures with headless Chromium (`make screenshots`).

    docs/view-collectives.png  the GPT-24 training step after XLA's spmd-partitioning: the
                               collectives panel opened on one source line, an all-reduce
                               selected (its source line, Python stack, replica groups on the mesh)
    docs/view-sharding.png     the same step before partitioning: a layer opened, a dot selected
                               with its sharding drawn as a tile grid over the 8 devices
    docs/pass-report.png       `hlo-passes run examples/dp_mlp_step.hlo --report`: per-pass time,
                               remarks with source lines, before/after charts, the diff

Needs bench-data/gpt24.dump (made by benchmarks/gpt_dump.py when missing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hlo_passes.cli.main import main as cli
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.view.headless import Browser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DUMP = ROOT / "bench-data" / "gpt24.dump"


def _dump_file(pattern: str) -> Path:
    if not DUMP.is_dir():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpt_dump.py")], check=True)
    return next(iter(sorted(DUMP.glob(pattern))))


def main() -> None:
    os.chdir(ROOT)  # file names on the pages as a user in the checkout types them
    tmp = Path(tempfile.mkdtemp(prefix="screens-"))
    partitioned = _dump_file("*jit_step*after_spmd-partitioning*.txt").relative_to(ROOT)
    global_ = _dump_file("*jit_step*before_spmd-partitioning.txt").relative_to(ROOT)
    for src, name in ((partitioned, "partitioned"), (global_, "global")):
        assert cli(["view", str(src), "-o", str(tmp / f"{name}.html")]) == 0
    report = tmp / "report.html"
    assert cli(["run", "examples/dp_mlp_step.hlo", "--passes=collective-fusion{combine-threshold-in-bytes=16384},dce",
                "--report", str(report), "-o", str(tmp / "fused.hlo")]) == 0
    # A dot of layer 3's MLP, sharded over both mesh axes, for the sharding picture.
    module = parse_module(global_.read_text())
    dot = next(i for i in module.entry.instructions
               if i.opcode.value == "dot" and i.sharding is not None and i.sharding.is_tiled
               and sum(t > 1 for t in i.sharding.data_tile_dims) == 2 and "jvp(layer3)" in (i.metadata.op_name or ""))
    with Browser() as browser:
        page = browser.open((tmp / "partitioned.html").as_uri(), width=1600, height=1000)
        page.click('.coll-line[data-source$=":67"] summary')
        page.click('.coll-line[open] .coll-row')
        page.screenshot(DOCS / "view-collectives.png")
        page = browser.open((tmp / "global.html").as_uri(), width=1600, height=1000)
        page.type_text("#search", dot.name)
        page.screenshot(DOCS / "view-sharding.png")
        page = browser.open(report.as_uri(), width=1400, height=1000)
        page.screenshot(DOCS / "pass-report.png")
        assert page.errors == [], page.errors
    for name in ("view-collectives.png", "view-sharding.png", "pass-report.png"):
        print(DOCS / name, (DOCS / name).stat().st_size)


if __name__ == "__main__":
    main()
