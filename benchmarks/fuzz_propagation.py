"""Random differential agreement of sharding-propagation with XLA's ShardingPropagation.

Random modules with few annotations (tests/spmd/random_propagation.py: every op family of the
README's propagation table, tuples and control flow, custom-calls, shard groups, partial
replication, the entry flags true/false/absent) are propagated by us and by XLA (read from
its `after_sharding-propagation` dump, as benchmarks/propagation_agreement.py does), and
compared instruction by instruction:

    agree      the same sharding (the same device for every tile)
    reorder    the same placement: each device holds the same tile, but a replica group lists
               its devices in another order (the printed form differs, the program does not)
    differ     another sharding, or one side has none

    python benchmarks/fuzz_propagation.py [--seeds 300] [--start 0] [--families dot,gather] [--show 30]
    make fuzz-propagation                     # the same, SEEDS=... START=...

Prints agreement per opcode and per family, the disagreements grouped by rule (opcode and
what differs) with the first few of each (seed, instruction, ours, XLA's), and the modules
XLA or we could not propagate.  Where our propagation departs from XLA on purpose (the
README's list: a reduce-window or select-and-scatter window wider than half its dim keeps no
tiling), the module is propagated again with that rule switched off; an instruction that then
agrees is counted apart ("deliberate").  A module reproduces with
`--start SEED --seeds 1 --dump`.

XLA runs in a worker process, restarted when XLA aborts it (a CHECK in the partitioner that
runs after propagation; the dump it wrote before is still read).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hlo_passes import parse_module  # noqa: E402
from hlo_passes.ir.sharding import Sharding, ShardingKind  # noqa: E402
from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation  # noqa: E402
from hlo_passes.passes.spmd import propagation_rules  # noqa: E402
from propagation_agreement import match  # noqa: E402
from tests.spmd.random_propagation import FAMILIES, module_from_seed  # noqa: E402

# The README's propagation table: which row an opcode belongs to.
FAMILY_OF = {
    "broadcast": "broadcast", "reshape": "reshape", "transpose": "transpose/reverse", "reverse": "transpose/reverse",
    "reduce": "reduce", "dot": "dot", "convolution": "convolution", "slice": "slice/pad", "pad": "slice/pad",
    "concatenate": "concatenate", "dynamic-slice": "dynamic-slice", "dynamic-update-slice": "dynamic-slice",
    "gather": "gather/scatter", "scatter": "gather/scatter", "sort": "sort", "reduce-window": "reduce-window",
    "select-and-scatter": "reduce-window", "tuple": "tuple/control flow", "get-tuple-element": "tuple/control flow",
    "opt-barrier": "tuple/control flow", "while": "tuple/control flow", "conditional": "tuple/control flow",
    "call": "tuple/control flow", "parameter": "parameters", "custom-call": "custom-calls", "iota": "iota/constant",
    "constant": "iota/constant", "rng-bit-generator": "iota/constant",
}
DELIBERATE_NOTE = "keep no tiling: their window spans more than half the dim"

_WORKER = """
import json, sys
from hlo_passes.runtime.xla_backend import pass_dump, quiet_cpp_logs
quiet_cpp_logs()
for line in sys.stdin:
    job = json.loads(line)
    try:
        pass_dump(open(job["src"]).read(), "sharding-propagation", num_partitions=job["n"],
                  propagate_to_output=tuple(job["output"]), propagate_to_parameters=tuple(job["parameters"]),
                  dump_dir=job["dump"])
        answer = {"ok": True}
    except Exception as e:
        answer = {"ok": False, "error": (str(e).strip().splitlines() or [type(e).__name__])[0][:300]}
    print(json.dumps(answer), flush=True)
"""


class XlaWorker:
    """XLA's propagation in a child process; restarted after XLA aborts it."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.jobs = 0

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)

    def propagate(self, text: str, n: int, output: tuple[bool, ...], parameters: tuple[bool, ...]) -> str:
        """XLA's module after its propagation (raises RuntimeError with XLA's reason if none)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.jobs += 1
        src = self.workdir / f"in{self.jobs}.hlo"
        dump = self.workdir / f"dump{self.jobs}"
        src.write_text(text)
        job = {"src": str(src), "n": n, "output": list(output), "parameters": list(parameters), "dump": str(dump)}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        answer = json.loads(line) if line else {"ok": False, "error": "XLA aborted (a CHECK failed)"}
        found = sorted(dump.glob("*after_sharding-propagation*.txt"))
        if not found:
            raise RuntimeError(answer.get("error", "XLA wrote no dump"))
        return found[-1].read_text()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def same_placement(a: Sharding, b: Sharding) -> bool:
    """Each device holds the same tile under `a` and `b` (replica order within a group ignored)."""
    if a.kind is ShardingKind.TUPLE or b.kind is ShardingKind.TUPLE:
        return (a.kind is b.kind and len(a.elements) == len(b.elements)
                and all(same_placement(x, y) for x, y in zip(a.elements, b.elements)))
    if a.kind is not ShardingKind.TILED or b.kind is not ShardingKind.TILED:
        return a == b
    if a.tile_dims[:a.data_rank] != b.tile_dims[:b.data_rank] or a.subgroups != b.subgroups:
        return False
    devices = set(a.devices)
    return devices == set(b.devices) and all(a.tile_index(d)[:a.data_rank] == b.tile_index(d)[:b.data_rank]
                                             for d in devices)


def _text(s: Sharding | None) -> str:
    return s.to_hlo() if s is not None else "-"


def _flags(module) -> dict[str, tuple[bool, ...]]:
    flags = {"output": (), "parameters": ()}
    for key, arg in (("allow_spmd_sharding_propagation_to_output", "output"),
                     ("allow_spmd_sharding_propagation_to_parameters", "parameters")):
        if key in module.attributes:
            value = module.header_attr(key)
            flags[arg] = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return flags


def difference(a: Sharding | None, b: Sharding | None) -> str:
    """What kind of disagreement: the rule bucket's second half."""
    if a is None:
        return "ours none"
    if b is None:
        return "XLA none"
    if b.kind is ShardingKind.REPLICATED:
        return "XLA replicated"
    if a.kind is ShardingKind.REPLICATED:
        return "ours replicated"
    if a.kind is ShardingKind.TUPLE:
        return "tuple element"
    return "other tiling"


@dataclass
class Report:
    modules: int = 0
    counts: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    deliberate: collections.Counter = field(default_factory=collections.Counter)
    rules: dict[tuple[str, str], list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    failed: list[str] = field(default_factory=list)

    def add(self, opcode: str, outcome: str) -> None:
        self.counts[opcode][outcome] += 1

    def totals(self) -> collections.Counter:
        total: collections.Counter = collections.Counter()
        for c in self.counts.values():
            total.update(c)
        return total

    def agreement(self) -> float:
        t = self.totals()
        return (t["agree"] + t["reorder"]) / max(sum(t.values()), 1)


def _as_xla(text: str) -> dict[str, Sharding | None]:
    """Our propagation of `text` with the deliberate difference switched off (the wide-window
    rule), by instruction name."""
    module = parse_module(text)
    saved = propagation_rules.wide_window_dims
    propagation_rules.wide_window_dims = lambda instr, operand: []  # XLA carries every window's tiling
    try:
        ShardingPropagation().run(module)
    finally:
        propagation_rules.wide_window_dims = saved
    return {i.name: (i.sharding.without_metadata() if "sharding" in i.attributes else None)
            for i in module.all_instructions()}


def judge(seed: int, text: str, xla: XlaWorker, report: Report, show: int) -> None:
    """Propagate `text` both ways and add the comparison to `report`."""
    try:
        module = parse_module(text)
    except Exception as e:  # noqa: BLE001 - a generator bug or a parser gap: reported per seed
        report.failed.append(f"seed {seed}: our parser: {str(e).splitlines()[0][:160]}")
        return
    flags = _flags(module)
    try:
        theirs = parse_module(xla.propagate(text, module.num_partitions, flags["output"], flags["parameters"]))
    except Exception as e:  # noqa: BLE001 - XLA rejected the module: reported, not fatal
        report.failed.append(f"seed {seed}: XLA: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}")
        return
    prop = ShardingPropagation()
    try:
        prop.run(module)
    except Exception as e:  # noqa: BLE001 - our failure is a finding, reported per seed
        report.failed.append(f"seed {seed}: ours: {type(e).__name__}: {str(e)[:160]}")
        return
    report.modules += 1
    as_xla = _as_xla(text) if any(DELIBERATE_NOTE in r.message for r in prop.remarks) else None
    for ours, other in match(module, theirs):
        a = ours.sharding if "sharding" in ours.attributes else None
        b = other.sharding if "sharding" in other.attributes else None
        if a is None and b is None:
            continue
        a, b = (s.without_metadata() if s is not None else None for s in (a, b))
        op = ours.opcode.value
        if a is not None and b is not None and a == b:
            outcome = "agree"
        elif a is not None and b is not None and same_placement(a, b):
            outcome = "reorder"
        else:
            outcome = "differ"
        if outcome == "differ" and as_xla is not None and as_xla.get(ours.name) == b:
            report.deliberate[outcome] += 1
            continue
        report.add(op, outcome)
        if outcome == "differ":
            rule = (op, difference(a, b))
            if len(report.rules[rule]) < show:
                report.rules[rule].append(f"seed {seed:<5} {ours.name:22} {ours.shape.to_hlo(False):24} "
                                          f"ours {_text(a):44} XLA {_text(b)}")
            else:
                report.rules[rule].append("")


def run(seeds, families=None, show: int = 3, progress: bool = False) -> Report:
    report = Report()
    with tempfile.TemporaryDirectory() as d:
        xla = XlaWorker(Path(d))
        try:
            for k, seed in enumerate(seeds):
                judge(seed, module_from_seed(seed, families=families), xla, report, show)
                if progress and k % 50 == 49:
                    print(f"  ... {k + 1} modules, agreement so far {100 * report.agreement():.1f}%",
                          file=sys.stderr, flush=True)
        finally:
            xla.close()
    return report


def _row(name: str, c: collections.Counter) -> str:
    n = sum(c.values())
    same = c["agree"] + c["reorder"]
    return f"  {name:24} {same:6}/{n:<6} {100 * same / max(n, 1):6.1f}%   (reorder {c['reorder']})"


def print_report(report: Report) -> None:
    families: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for op, c in report.counts.items():
        families[FAMILY_OF.get(op, "elementwise & other")].update(c)
    print(f"{report.modules} modules compared; instructions with the sharding XLA gives them:")
    print("\nby family")
    for name in sorted(families):
        print(_row(name, families[name]))
    print("\nby opcode")
    for op in sorted(report.counts):
        print(_row(op, report.counts[op]))
    print(_row("\nall", report.totals()))
    if report.deliberate:
        print(f"  deliberate (README): {report.deliberate['differ']} more differ only by the wide-window rule")
    print("\ndisagreements by rule (opcode, what differs): count, first cases")
    for (op, kind), lines in sorted(report.rules.items(), key=lambda kv: -len(kv[1])):
        print(f"  {op} / {kind}: {len(lines)}")
        for line in lines:
            if line:
                print(f"    {line}")
    if report.failed:
        print(f"\n{len(report.failed)} modules not compared:")
        for line in report.failed[:10]:
            print(f"  {line}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=300, help="how many modules")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument("--families", help=f"comma-separated, of: {', '.join(FAMILIES)}")
    ap.add_argument("--show", type=int, default=3, help="cases printed per disagreeing rule")
    ap.add_argument("--dump", action="store_true", help="print each module, ours and XLA's result (with --seeds 1)")
    args = ap.parse_args(argv)
    families = tuple(args.families.split(",")) if args.families else None
    seeds = range(args.start, args.start + args.seeds)
    if args.dump:
        _dump(seeds, families)
        return 0
    t0 = time.time()
    report = run(seeds, families, args.show, progress=True)
    print_report(report)
    print(f"\n{time.time() - t0:.0f} s")
    return 0


def _dump(seeds, families) -> None:
    from hlo_passes.printer import print_module

    with tempfile.TemporaryDirectory() as d:
        xla = XlaWorker(Path(d))
        for seed in seeds:
            text = module_from_seed(seed, families=families)
            module = parse_module(text)
            flags = _flags(module)
            print(f"// seed {seed}\n{text}")
            ShardingPropagation().run(module)
            print(f"// ours\n{print_module(module)}")
            try:
                print(f"// XLA\n{xla.propagate(text, module.num_partitions, flags['output'], flags['parameters'])}")
            except RuntimeError as e:
                print(f"// XLA: {e}")
        xla.close()


if __name__ == "__main__":
    sys.exit(main())
