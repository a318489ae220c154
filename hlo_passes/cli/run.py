"""`hlo-passes run IN --passes=PIPELINE`: run a pipeline, like XLA's hlo-opt.

IN is a file, `-`, or an XLA dump directory with `--module NAME|NUMBER` (the
module's `before_optimizations` file is used, and named on stderr)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from hlo_passes.cli.io import read_module, read_text, write_text
from hlo_passes.cli.main import UserError

COMMAND = "run"
HELP = "run a pass pipeline on a module"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="IN", help="HLO file, -, or an XLA dump directory (with --module)")
    p.add_argument("--passes", required=True, metavar="PIPELINE",
                   help="e.g. spmd-partition,collective-fusion{threshold-bytes=1048576}")
    p.add_argument("-o", "--output", metavar="OUT", help="write the result here (default: stdout)")
    p.add_argument("--module", metavar="NAME|NUM", help="module of an XLA dump directory")
    p.add_argument("--num-partitions", type=int, help="set num-partitions on every pass that has it")
    p.add_argument("--verify", action="store_true", help="compare the result with the input numerically")
    p.add_argument("--verify-each", action="store_true", help="structural verifier after every pass")
    p.add_argument("--dump-dir", metavar="DIR", help="module before/after each pass, and a diff per pass")
    p.add_argument("--stats", action="store_true", help="instructions, collectives and FLOPs before/after")
    p.add_argument("--remarks", action="store_true", help="what each pass decided and why")


def pick_dump_file(directory: Path, module: str | None) -> Path:
    files = sorted(directory.glob("module_*.before_optimizations.txt"))
    if not files:
        raise UserError(f"{directory}: no module_*.before_optimizations.txt files (is it an XLA dump?)")
    if module is None:
        if len(files) == 1:
            return files[0]
        names = ", ".join(f.name.split(".")[1] for f in files[:10])
        raise UserError(f"{directory} holds {len(files)} modules; pick one with --module ({names}, ...)")
    for f in files:
        number, name = f.name.split(".")[0].removeprefix("module_"), f.name.split(".")[1]
        if module in (name, number) or (module.isdigit() and int(module) == int(number)):
            return f
    raise UserError(f"{directory}: no module named or numbered {module!r}")


def main(args) -> int:
    from hlo_passes.passes.manager import PassFailed, PassManager
    from hlo_passes.passes.pipeline import PipelineError, parse_pipeline, set_option_everywhere
    from hlo_passes.printer import print_module
    from hlo_passes.stats import module_stats

    try:
        pipeline = parse_pipeline(args.passes)
    except PipelineError as e:
        raise UserError(str(e)) from None
    if args.num_partitions is not None:
        set_option_everywhere(pipeline, "num_partitions", args.num_partitions)
    source = args.input
    if source != "-" and Path(source).is_dir():
        source = str(pick_dump_file(Path(source), args.module))
        print(f"hlo-passes: reading {source}", file=sys.stderr)
    text, _ = read_text(source)
    module = read_module(source)
    before_stats = module_stats(module) if args.stats else None
    dump_dir = Path(args.dump_dir) if args.dump_dir else None
    tty = sys.stderr.isatty()

    def dump(index, p, mod, when):
        if tty and when == "before":
            print(f"[{index + 1}/{len(pipeline.passes)}] {p.name}", file=sys.stderr)
        if dump_dir is None:
            return
        dump_dir.mkdir(parents=True, exist_ok=True)
        base = f"module_0000.{mod.name}.{index:04d}.{p.name}"
        printed = print_module(mod)
        (dump_dir / f"{base}.{when}.txt").write_text(printed)
        if when == "after":
            before = (dump_dir / f"{base}.before.txt").read_text()
            diff = difflib.unified_diff(before.splitlines(True), printed.splitlines(True),
                                        f"{base}.before.txt", f"{base}.after.txt")
            (dump_dir / f"{base}.diff").write_text("".join(diff))

    manager = PassManager(pipeline.passes, verify_each=args.verify_each, dump=dump)
    try:
        manager.run(module)
    except PassFailed as e:
        raise UserError(str(e)) from None
    out = print_module(module)
    if args.remarks:
        for r in manager.remarks:
            print(r.format(), file=sys.stderr)
    if args.stats:
        print(before_stats.format("before:"), file=sys.stderr)
        print(module_stats(module).format("after:"), file=sys.stderr)
        for rec in manager.records:
            print(f"  {rec.name}: {'changed' if rec.changed else 'no change'} in {rec.seconds:.3f}s",
                  file=sys.stderr)
    if args.verify:
        from hlo_passes.runtime import verify_equivalent
        from hlo_passes.runtime.xla_backend import ensure_devices

        ensure_devices(max(module.num_partitions, module.replica_count, 1))
        report = verify_equivalent(text, out)
        print(report.format(), file=sys.stderr)
        if not report.ok:
            return 1
    write_text(args.output or "-", out)
    return 0
