"""How good is our spmd-partition compared with XLA's own SPMD partitioner?

For every sharded corpus program with XLA's partitioned module beside it
(`golden/corpus/<p>/<p>.xla_spmd.hlo`), partition the Shardy-form input with
ours, verify it numerically on 8 devices, and print per program the collectives
by kind and the bytes each device sends into them, for both, and the byte ratio
(ours / XLA; 1.00 = as good, lower is better).  The geometric mean closes the table.

Programs with manual regions (shard_map, pmap) run unpartitioned through XLA's own
SPMD partitioner (verify's mode b); should that fail, they are compared device by
device with XLA's partitioned program instead (`compare_with_xla`, marked yes*).

    .venv/bin/python benchmarks/spmd_quality.py [PROGRAM ...]
"""

from __future__ import annotations

import argparse
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
from hlo_passes.runtime.lowered import with_propagation_flags  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402

ABBREV = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
          "collective-permute": "CP"}


def summary(stats) -> str:
    parts = [f"{ABBREV.get(k, k)}×{stats.collective_count[k]}" for k in sorted(stats.collective_count)]
    return " ".join(parts) or "none"


def compare_with_xla(ours: str, xla: str, n: int) -> tuple[bool, str]:
    """Run our and XLA's per-device programs on the same per-device inputs; (ok, note).

    XLA may tile a result more finely than its annotation says (it is compiled with
    allow_spmd_sharding_propagation_to_output); ours keeps the annotated (logical)
    sharding.  Where the per-device shapes differ that way, each of XLA's device
    values must equal one block of ours on that device, and every block must occur."""
    import numpy as np

    from hlo_passes.runtime.per_device import execute, random_inputs
    from hlo_passes.runtime.verify import _declared_replicated

    a, b = parse_module(xla), parse_module(ours)
    replicated = [_declared_replicated(pa) or _declared_replicated(pb)
                  for pa, pb in zip(a.entry.parameters, b.entry.parameters)]
    inputs = random_inputs(xla, n, replicated=replicated)
    want, got = execute(xla, inputs, n), execute(ours, inputs, n)
    finer = set()
    for d, (ws, gs) in enumerate(zip(want, got)):
        if len(ws) != len(gs):
            return False, f"device {d}: {len(ws)} outputs vs {len(gs)}"
        for i, (w, g) in enumerate(zip(ws, gs)):
            if w.shape == g.shape:
                if not np.allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True):
                    return False, f"device {d} output {i} differs"
                continue
            if w.ndim != g.ndim or any(gd % wd for gd, wd in zip(g.shape, w.shape)):
                return False, f"device {d} output {i}: {list(w.shape)} vs {list(g.shape)}"
            counts = [gd // wd for gd, wd in zip(g.shape, w.shape)]
            blocks = [tuple(slice(k * wd, (k + 1) * wd) for k, wd in zip(idx, w.shape))
                      for idx in np.ndindex(*counts)]
            hit = [k for k, blk in enumerate(blocks) if np.allclose(g[blk], w, rtol=1e-5, atol=1e-5)]
            if not hit:
                return False, f"device {d} output {i}: XLA's tile is no block of ours"
            finer.add((i, hit[0]))
    outputs = {i for i, _ in finer}
    for i in outputs:  # every block of a finer-tiled output is held by some XLA device
        shape_w = want[0][i].shape
        shape_g = got[0][i].shape
        total = int(np.prod([gd // wd for gd, wd in zip(shape_g, shape_w)]))
        if len({k for j, k in finer if j == i}) != total:
            return False, f"output {i}: XLA's tiles do not cover ours"
    note = f" (XLA tiles output {','.join(map(str, sorted(outputs)))} finer)" if outputs else ""
    return True, note


def lowered_as_compiled(folder: Path, program: str, form: str = "shardy") -> str:
    """A corpus program's lowered text with the `allow_spmd_sharding_propagation_to_*` flags JAX
    compiled it with (from the compiled module beside it): `.lower().as_text()` does not record
    them, and their absence means no propagation to parameters and outputs, as in XLA."""
    text = (folder / f"{program}.lowered.{form}.hlo").read_text()
    compiled = folder / f"{program}.compiled.hlo"
    if not compiled.exists():
        return text
    return with_propagation_flags(text, compiled.read_text().split("\n", 1)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help="corpus program names (default: every sharded one)")
    args = ap.parse_args(argv)
    rows, ratios = [], []
    for xla_path in sorted((ROOT / "golden" / "corpus").glob("*/*.xla_spmd.hlo")):
        program = xla_path.parent.name
        if args.programs and program not in args.programs:
            continue
        text = lowered_as_compiled(xla_path.parent, program)
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
            # The original cannot run (an XLA limitation): compare per device with XLA's own
            # partitioned program instead.
            try:
                same, note = compare_with_xla(out, xla_path.read_text(), n)
                ok = ("yes*" if same else "NO*") + note
            except Exception as e:  # noqa: BLE001 - reported in the table
                ok = f"n/a ({type(e).__name__})"
        ours = module_stats(parse_module(out))
        ob, xb = sum(ours.collective_bytes.values()), sum(xla.collective_bytes.values())
        ratio = 1.0 if ob == xb else (ob / xb if xb else float("inf"))
        if math.isfinite(ratio) and ratio > 0:
            ratios.append(ratio)
        rows.append((program, summary(ours), ob, summary(xla), xb, ratio, ok))
    header = ("program", "ours", "bytes/dev", "XLA", "bytes/dev", "ratio", "verified")
    table = [r[:5] + (f"{r[5]:.2f}",) + r[6:] for r in rows]
    widths = [max(len(str(r[i])) for r in table + [header]) for i in range(len(header))]
    fmt = lambda r: " | ".join(str(v).ljust(w) if i in (0, 1, 3, 6) else str(v).rjust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(r, widths))).rstrip()
    print(fmt(header))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(fmt(r))
    gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
    print(f"\ngeometric mean of byte ratios (ours / XLA): {gm:.2f} over {len(ratios)} programs")
    print("verified: yes = against the unpartitioned program on its devices; yes* = device by device "
          "against XLA's partitioned program (where the unpartitioned one cannot run)")
    return 0 if all(r[6].startswith("yes") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
