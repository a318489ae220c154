"""spmd-partition beside XLA's partitioner, on random JAX programs (partition quality).

The random programs are those of `tests/dumps/fuzz_jax_dumps.py` (matmuls, reductions, reshapes,
gathers and scatters, sorts, convolutions, loops, shard_map regions, ... with random meshes over 8
devices and random in/out shardings): its child jits and runs program `fz_SEED` with XLA dumping
every stage, here with `--xla_dump_hlo_pass_re=spmd-partitioning` too, so that XLA's own module
after its SPMD partitioner is on disk (the last `*after_spmd-partitioning*` stage file of
`jit_fz_SEED`).  Our partitioner then runs on the user's input as a user runs it,

    hlo-passes run BEFORE_OPTIMIZATIONS --passes spmd-partition -o OURS
    hlo-passes verify BEFORE_OPTIMIZATIONS OURS

and per seed the table gives, ours beside XLA's: collective bytes (what each device sends in: the
collectives' operands, `module_stats`, loop bodies counted once), wire bytes (what each device
receives as the cost model's ring algorithms move them; see benchmarks/spmd_families.py),
executed bytes (the collective bytes as a run executes them: a while body times its trip count,
each conditional branch once per call, so a reshard hoisted out of a loop counts less), the
XLA-counted FLOPs of the per-device module (`cost_analysis`), and whether ours verified against
the input (a seed that does not verify is a wrong program: it is listed at the end).  The
fuzzer asks whether we are right; this asks how far from XLA's partition our right answers are,
and which seeds are worst, so that they can be read.

Ratios are ours / XLA's with a floor of 64 on both sides, (ours + 64) / (XLA + 64), for bytes,
wire bytes, executed bytes and FLOPs alike, so that a seed where neither side communicates
counts 1 and one with a few bytes against none does not dominate; the summary's means are
geometric over the seeds that have both modules (seeds whose program the generator could not
build, that XLA could not compile, that our run refused, or whose XLA module our parser cannot
read are counted and skipped).  `> 1.1x` / `< 0.9x` count the seeds where ours is more than
10% above / below XLA's, in collective bytes and in FLOPs.  The worst seeds are ranked by the
collective-bytes ratio, which counts operands: a reshard that ours does in several steps (say
an all-to-all, a collective-permute and an all-gather) counts each step's operand where XLA's
single all-gather of the whole counts one shard, though ours may move fewer bytes on the wire;
read the wire and executed columns beside it.

    .venv/bin/python benchmarks/jax_random_quality.py [--seeds N] [--start S]
        [--lowering shardy|gspmd|both] [--big] [--jobs J] [--json FILE] [--worst K] [--work DIR]

Each seed's dump directory (with OURS as `ours.hlo`) stays under `--work` (default a new temp
directory, printed) so that the worst seeds can be inspected.  `make bench-random-quality
ARGS="--seeds 60 --lowering shardy"`.  Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes import parse_module  # noqa: E402
from hlo_passes.passes.spmd.cost_model import module_estimate  # noqa: E402
from hlo_passes.runtime.xla_backend import cost_analysis, quiet_cpp_logs  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402
from tests.dumps import fuzz_jax_dumps as fz  # noqa: E402

FLOOR = 64  # added to both sides of every ratio


def _byte_figures(text: str) -> tuple[int, int, int]:
    """A module's collective bytes (what each device sends in), wire bytes (what each device
    receives as the cost model's collective algorithms move them; see spmd_families.py) and
    executed bytes (a while body times its trip count where the module says it, each
    conditional branch once per call: module_stats(executed=True)), from one parse."""
    module = parse_module(text)
    return (sum(module_stats(module).collective_bytes.values()), module_estimate(module).bytes,
            sum(module_stats(module, executed=True).collective_bytes.values()))


def _ratio(ours: float, xla: float) -> float:
    return (ours + FLOOR) / (xla + FLOOR)


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def xla_partitioned(dump: Path, seed: int) -> Path | None:
    """XLA's module right after its SPMD partitioner: the last such stage file of jit_fz_SEED."""
    found = sorted(dump.glob(f"module_*.jit_fz_{seed}.*after_spmd-partitioning*.txt"))
    return found[-1] if found else None


def run_seed(seed: int, lowering: str, work: Path, big: bool) -> dict:
    """The subprocess part of one seed (child, our run, verify): safe to run in parallel."""
    dump = work / f"{lowering}.{seed}"
    info = fz.run_child(seed, lowering, dump, big, xla_flags="--xla_dump_hlo_pass_re=spmd-partitioning")
    row: dict = {"seed": seed, "lowering": lowering, "mesh": info.get("mesh"), "ops": info.get("ops"),
                 "dir": str(dump), "status": "ok"}
    if info["phase"] in ("generate", "lower"):
        return {**row, "status": "skipped", "detail": f"{info['phase']}: " + fz._last_line(info["error"])}
    if info["phase"] != "ran":
        return {**row, "status": "xla-failed", "detail": f"{info['phase']}: " + fz._last_line(info["error"])}
    before = fz.stage_file(dump, f"jit_fz_{seed}", "before_optimizations.txt")
    xla = xla_partitioned(dump, seed)
    if before is None or xla is None:
        return {**row, "status": "skipped", "detail": "no before_optimizations or after_spmd-partitioning dump"}
    ours = dump / "ours.hlo"
    row.update(before=str(before), ours=str(ours), xla=str(xla))
    rc, out = fz._cli(["run", str(before), "--passes", "spmd-partition", "-o", str(ours)])
    if rc != 0 or not ours.exists():
        kind, detail = fz.classify(rc, out)
        return {**row, "status": "ours-failed", "detail": f"{kind}: {detail}"}
    rc, out = fz._cli(["verify", str(before), str(ours)])
    row["verified"] = rc == 0 and "Traceback" not in out
    if not row["verified"]:
        row["verify"] = "%s: %s" % fz.classify(rc, out)
    return row


def measure(row: dict) -> dict:
    """The in-process part: bytes, wire bytes and FLOPs of both modules."""
    if row["status"] != "ok":
        return row
    ours, xla = Path(row["ours"]).read_text(), Path(row["xla"]).read_text()
    try:
        row["bytes"], row["wire"], row["exec"] = _byte_figures(ours)
    except Exception as e:  # noqa: BLE001 (our own output not readable: a bug, but keep going)
        return {**row, "status": "ours-unparsed", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    try:
        row["xla_bytes"], row["xla_wire"], row["xla_exec"] = _byte_figures(xla)
    except Exception as e:  # noqa: BLE001 (XLA's text our parser cannot read: recorded, skipped)
        return {**row, "status": "xla-unparsed", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    try:
        row["flops"] = cost_analysis(ours).get("flops", 0.0)
        row["xla_flops"] = cost_analysis(xla).get("flops", 0.0)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "no-cost", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    row["bytes_ratio"] = _ratio(row["bytes"], row["xla_bytes"])
    row["wire_ratio"] = _ratio(row["wire"], row["xla_wire"])
    row["exec_ratio"] = _ratio(row["exec"], row["xla_exec"])
    row["flops_ratio"] = _ratio(row["flops"], row["xla_flops"])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--lowering", choices=("shardy", "gspmd", "both"), default="shardy")
    ap.add_argument("--big", action="store_true", help="longer programs (fuzz_jax_dumps --big)")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in parallel (child processes)")
    ap.add_argument("--json", type=Path, help="write one JSON line per seed here")
    ap.add_argument("--worst", type=int, default=5, help="list the K worst seeds by bytes ratio")
    ap.add_argument("--work", type=Path, help="keep the seeds' dump directories here (default: a temp dir)")
    args = ap.parse_args(argv)
    quiet_cpp_logs()
    work = args.work or Path(tempfile.mkdtemp(prefix="random-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory {work}", flush=True)
    lowerings = ("shardy", "gspmd") if args.lowering == "both" else (args.lowering,)
    tasks = [(s, lw) for s in range(args.start, args.start + args.seeds) for lw in lowerings]
    if args.json:
        args.json.write_text("")
    print(f"{'seed':>5} {'lowering':8} {'mesh':26} | {'bytes ours':>10} {'XLA':>9} {'ratio':>6} | "
          f"{'wire ours':>10} {'XLA':>9} | {'exec ours':>10} {'XLA':>9} | "
          f"{'FLOPs ours':>10} {'XLA':>10} {'ratio':>6} | verified", flush=True)
    rows = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(lambda t: run_seed(t[0], t[1], work, args.big), tasks):
            row = measure(row)
            rows.append(row)
            head = f"{row['seed']:5} {row['lowering']:8} {str(row.get('mesh') or ''):26}"
            if row["status"] == "ok":
                print(f"{head} | {row['bytes']:10,} {row['xla_bytes']:9,} {row['bytes_ratio']:6.2f} | "
                      f"{row['wire']:10,} {row['xla_wire']:9,} | {row['exec']:10,} {row['xla_exec']:9,} | "
                      f"{row['flops']:10,.0f} {row['xla_flops']:10,.0f} "
                      f"{row['flops_ratio']:6.2f} | {'yes' if row['verified'] else 'NO  ' + row['verify']}",
                      flush=True)
            else:
                print(f"{head} | {row['status']}: {row.get('detail', '')}", flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    ok = [r for r in rows if r["status"] == "ok"]
    print()
    for lowering in lowerings:
        mine = [r for r in ok if r["lowering"] == lowering]
        others = {}
        for r in rows:
            if r["lowering"] == lowering and r["status"] != "ok":
                others[r["status"]] = others.get(r["status"], 0) + 1
        b = [r["bytes_ratio"] for r in mine]
        w = [r["wire_ratio"] for r in mine]
        x = [r["exec_ratio"] for r in mine]
        fl = [r["flops_ratio"] for r in mine]
        print(f"{lowering}: {len(mine)} seeds measured"
              + "".join(f", {v} {k}" for k, v in sorted(others.items())))
        print(f"  geomean ours/XLA ((x+{FLOOR}) / (y+{FLOOR})): bytes {_gmean(b):.3f}, "
              f"wire bytes {_gmean(w):.3f}, executed bytes {_gmean(x):.3f}, FLOPs {_gmean(fl):.3f}")
        print(f"  bytes: ours > 1.1x XLA on {sum(x > 1.1 for x in b)}, < 0.9x on {sum(x < 0.9 for x in b)}; "
              f"FLOPs: > 1.1x on {sum(x > 1.1 for x in fl)}, < 0.9x on {sum(x < 0.9 for x in fl)}")
        bad = [r for r in mine if not r["verified"]]
        print(f"  not verified: {len(bad)}")
        for r in bad:
            print(f"    seed {r['seed']}: {r['verify']}\n      {r['before']}\n      {r['ours']}")
    if args.worst and ok:
        print(f"\nworst {args.worst} by bytes ratio:")
        for r in sorted(ok, key=lambda r: -r["bytes_ratio"])[:args.worst]:
            print(f"  seed {r['seed']} {r['lowering']}: bytes {r['bytes']:,} vs {r['xla_bytes']:,} "
                  f"({r['bytes_ratio']:.2f}x), FLOPs {r['flops_ratio']:.2f}x, ops {r['ops']}\n"
                  f"    before {r['before']}\n    ours   {r['ours']}\n    xla    {r['xla']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
