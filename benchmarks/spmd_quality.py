"""How good is our spmd-partition compared with XLA's own SPMD partitioner?

For every sharded corpus program with XLA's partitioned module beside it
(`golden/corpus/<p>/<p>.xla_spmd.hlo`), partition the Shardy-form input with
ours, verify it numerically on 8 devices, and print per program the collectives
by kind and the bytes each device sends into them, for both, and the byte ratio
(ours / XLA; 1.00 = as good, lower is better).  The geometric mean closes the table.

    .venv/bin/python benchmarks/spmd_quality.py
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes import parse_module, print_module  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.runtime import VerificationError, verify_equivalent  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402

ABBREV = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
          "collective-permute": "CP"}


def summary(stats) -> str:
    parts = [f"{ABBREV.get(k, k)}×{stats.collective_count[k]}" for k in sorted(stats.collective_count)]
    return " ".join(parts) or "none"


def main() -> int:
    rows, ratios = [], []
    for xla_path in sorted((ROOT / "golden" / "corpus").glob("*/*.xla_spmd.hlo")):
        program = xla_path.parent.name
        text = (xla_path.parent / f"{program}.lowered.shardy.hlo").read_text()
        xla = module_stats(parse_module(xla_path.read_text()))
        meta = xla_path.parent / "meta.json"
        n = json.loads(meta.read_text()).get("num_devices", 8) if meta.exists() else 8
        module = parse_module(text)
        try:
            SpmdPartitioner(num_partitions=n).run(module)
        except Exception as e:  # noqa: BLE001 - a failure is a row of the table, not the end of it
            rows.append((program, f"error: {type(e).__name__}: {str(e)[:60]}", 0, summary(xla),
                         sum(xla.collective_bytes.values()), float("nan"), "NO"))
            continue
        out = print_module(module)
        try:
            ok = "yes" if verify_equivalent(text, out, num_devices=n).ok else "NO"
        except VerificationError:
            # Manual regions (shard_map/pmap) cannot run unpartitioned on one device: compare
            # per device with XLA's own partitioned program instead.
            try:
                ok = "yes*" if verify_equivalent(xla_path.read_text(), out, num_devices=n).ok else "NO*"
            except Exception as e:  # noqa: BLE001 - reported in the table
                ok = f"n/a ({type(e).__name__})"
        ours = module_stats(parse_module(out))
        ob, xb = sum(ours.collective_bytes.values()), sum(xla.collective_bytes.values())
        ratio = 1.0 if ob == xb else (ob / xb if xb else float("inf"))
        if math.isfinite(ratio) and ratio > 0:
            ratios.append(ratio)
        rows.append((program, summary(ours), ob, summary(xla), xb, ratio, ok))
    header = ("program", "ours", "bytes/dev", "XLA", "bytes/dev", "ratio", "verified")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = lambda r: " | ".join(str(v).ljust(w) if i in (0, 1, 3, 6) else str(v).rjust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(r, widths)))
    print(fmt(header))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(fmt(r[:5] + (f"{r[5]:.2f}",) + r[6:]))
    gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
    print(f"\ngeometric mean of byte ratios (ours / XLA): {gm:.2f} over {len(ratios)} programs")
    print("verified: yes = against the unpartitioned program on 8 devices; yes* = device by device "
          "against XLA's partitioned program (manual regions cannot run unpartitioned)")
    return 0 if all(r[6].startswith("yes") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
