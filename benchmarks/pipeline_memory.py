"""Memory and time of `hlo-passes run` stage by stage, in one process, the way the CLI runs it.

    python benchmarks/pipeline_memory.py FILE [--passes P] [--num-partitions N] [--trace [--collect]] [--top K]

Stages: read, parse, each pass of the pipeline (through `PassManager`, as `run` does), the
final structural check, print (written as it is made, as `run` writes its output: to `-o`, or
to the null device).  Per stage: CPU and wall seconds, and either the process's peak
resident set so far (`ru_maxrss`; the default, what `--stats` shows) or, with `--trace`,
tracemalloc's peak and live Python allocations during and after the stage (tracemalloc slows
the run 2-3x; its figures count Python objects only, not the interpreter, the imported modules
or what numpy and C libraries allocate themselves; `--collect` tells garbage apart).  `--top K` prints, after each stage, the
K source lines holding the most live memory (with `--trace`).

Figures are also given as multiples of the input's size.  The import baseline (RSS before the
file is read, every module the pipeline needs already loaded) is printed first so it can be
subtracted from RSS figures.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.manager import PassManager, structural_problems  # noqa: E402
from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere  # noqa: E402
from hlo_passes.printer import print_module, write_module  # noqa: E402


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--passes", default="spmd-partition,weight-update-sharding,collective-fusion")
    ap.add_argument("--num-partitions", type=int, default=8)
    ap.add_argument("--trace", action="store_true", help="tracemalloc figures instead of RSS")
    ap.add_argument("--top", type=int, default=0, help="with --trace: the K lines holding most memory per stage")
    ap.add_argument("--collect", action="store_true",
                    help="with --trace: also the live memory after a full garbage collection at each stage's end "
                         "(the collection lowers the later stages' peaks: a separate run)")
    ap.add_argument("-o", "--output", type=Path, help="write the printed result here")
    args = ap.parse_args()

    pipeline = parse_pipeline(args.passes)
    set_option_everywhere(pipeline, "num_partitions", args.num_partitions)
    # Load what the passes import lazily, so the baseline counts it: a tiny module through the
    # same pipeline.
    tiny = parse_module("HloModule m\n\nENTRY e {\n  ROOT p = f32[8] parameter(0), sharding={replicated}\n}\n")
    PassManager(parse_pipeline(str(pipeline)).passes).run(tiny)
    print_module(tiny)
    del tiny
    gc.collect()
    size = args.file.stat().st_size
    print(f"{args.file.name}: {size / 2**20:.2f} MiB; RSS after imports {_rss_mib():.1f} MiB", file=sys.stderr)
    if args.trace:
        tracemalloc.start()

    def stage(name, fn):
        if args.trace:
            tracemalloc.reset_peak()
        cpu, wall = time.process_time(), time.perf_counter()
        result = fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if args.trace:
            current, peak = tracemalloc.get_traced_memory()
            memory = (f"traced peak {peak / 2**20:7.1f} MiB ({peak / size:5.1f}x)  "
                      f"live after {current / 2**20:7.1f} MiB ({current / size:5.1f}x)")
            if args.collect:
                gc.collect()
                current = tracemalloc.get_traced_memory()[0]
                memory += f"  not garbage {current / 2**20:7.1f} MiB ({current / size:5.1f}x)"
        else:
            memory = f"max RSS {_rss_mib():7.1f} MiB"
        print(f"{name:<34} cpu {cpu:7.2f} s  wall {wall:7.2f} s  {memory}", file=sys.stderr, flush=True)
        if args.trace and args.top:
            for s in tracemalloc.take_snapshot().statistics("lineno")[:args.top]:
                print(f"    {s.size / 2**20:7.1f} MiB {s.count:9d}  {s.traceback[0]}", file=sys.stderr)
        return result

    total_cpu, total_wall = time.process_time(), time.perf_counter()
    text = stage("read", lambda: args.file.read_text())
    module = stage("parse", lambda: parse_module(text, str(args.file)))
    del text  # what `run` keeps only for --verify
    for p in pipeline.passes:
        stage(p.pipeline_text(), lambda: PassManager([p]).run(module))
    stage("structural check", lambda: structural_problems(module))
    with open(args.output if args.output is not None else os.devnull, "w", encoding="utf-8", newline="") as f:
        stage("print", lambda: write_module(module, f))
    print(f"{'total':<34} cpu {time.process_time() - total_cpu:7.2f} s  "
          f"wall {time.perf_counter() - total_wall:7.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
