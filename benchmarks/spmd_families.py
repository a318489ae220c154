"""spmd-partition beside XLA's partitioner, one small module per op family.

`benchmarks/spmd_families/*.hlo` are hand-written sharded modules, one per handler family the
partitioner issues name (grouped and depthwise convolutions and their kernel gradients, a
grouped convolution whose tiles split groups, sort and top-k along the sharded dim,
gather/scatter with passthrough, batch and index-parallel dims, tables tiled by vocabulary and
embedding, take-along-axis, variadic scatter, dynamic-update-slice into sharded dims, slices
from the middle of a dim, pad with partial replication, concatenate, reshape merges, iota along
a tiled dim, cholesky, triangular-solve, an RFFT and a LAPACK call on batch tiles, a variadic
reduce-window).  Per
module: collective bytes (what each device sends in: its operands), wire bytes (what each device
receives as the cost model's ring algorithms move them: an all-gather's operand is 1/g of what
it moves, an all-to-all's 8/7 of it, so the first column alone weighs an all-to-all g times an
all-gather per byte on the wire), XLA-counted FLOPs of the per-device
module, ours beside XLA's, whether ours verified against the unpartitioned module, and the
fallbacks our pass reported.

    .venv/bin/python benchmarks/spmd_families.py [FILE ...] [--profile accelerator|cpu]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes import parse_module, print_module  # noqa: E402
from hlo_passes.passes.spmd.cost_model import module_estimate  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.runtime import verify_equivalent  # noqa: E402
from hlo_passes.runtime.xla_backend import cost_analysis, pass_dump, quiet_cpp_logs  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402

HERE = Path(__file__).resolve().parent / "spmd_families"


def _bytes(text: str) -> int:
    return sum(module_stats(parse_module(text)).collective_bytes.values())


def _wire(text: str) -> int:
    """Bytes each device receives over the wire, by the cost model's collective algorithms."""
    return module_estimate(parse_module(text)).bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--profile", default="accelerator")
    args = ap.parse_args(argv)
    quiet_cpp_logs()
    files = args.files or sorted(HERE.glob("*.hlo"))
    print(f"{'module':28} {'bytes ours':>10} {'XLA':>9} | {'wire ours':>10} {'XLA':>10} | {'FLOPs ours':>10} {'XLA':>10} | verified | fallbacks")
    ratios = []
    for f in files:
        text = f.read_text()
        module = parse_module(text)
        p = SpmdPartitioner(num_partitions=module.num_partitions, cost_profile=args.profile)
        p.run(module)
        ours = print_module(module)
        xla = pass_dump(text, "spmd-partitioning", num_partitions=module.num_partitions, propagate_to_output=(True,))
        ob, xb = _bytes(ours), _bytes(xla)
        ow, xw = _wire(ours), _wire(xla)
        of, xf = cost_analysis(ours).get("flops", 0.0), cost_analysis(xla).get("flops", 0.0)
        ok = "yes" if verify_equivalent(text, ours).ok else "NO"
        missed = "; ".join(r.message[:60] for r in p.remarks if r.kind == "missed")
        ratios.append(((ob + 1) / (xb + 1), (of + 1) / (xf + 1), (ow + 1) / (xw + 1)))
        print(f"{f.stem:28} {ob:10,} {xb:9,} | {ow:10,} {xw:10,} | {of:10,.0f} {xf:10,.0f} | {ok:8} | {missed}", flush=True)
    gb = math.exp(sum(math.log(r[0]) for r in ratios) / len(ratios))
    gf = math.exp(sum(math.log(r[1]) for r in ratios) / len(ratios))
    gw = math.exp(sum(math.log(r[2]) for r in ratios) / len(ratios))
    print(f"\ngeomean ours/XLA (+1 smoothed): bytes {gb:.2f}, wire bytes {gw:.2f}, FLOPs {gf:.2f} "
          f"over {len(ratios)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
