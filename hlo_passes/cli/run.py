"""`hlo-passes run IN --passes=PIPELINE`: run a pipeline, like XLA's hlo-opt.

IN is a file, `-`, a binary HLO proto (`.pb`), or an XLA dump directory with
`--module NAME|NUMBER` and `--stage` (default: the module's `before_optimizations`
file; the file used is named on stderr).

Exit codes: 0 done; 1 a check failed (the final module fails the structural verifier,
which always runs; --verify-each: a pass left a malformed module; --verify: the result
computes something else); 2 bad usage or input.  Nothing is written to OUT unless the
command succeeds."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import cast

from hlo_passes.cli.io import add_dump_arguments, read_text, write_text
from hlo_passes.cli.main import UserError
from hlo_passes.cli.progress import Progress
from hlo_passes.ir.sharding import ShardingKind
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.pipeline import PipelineError, parse_pipeline, set_option_everywhere
from hlo_passes.printer import print_module, write_module
from hlo_passes.stats import module_stats

COMMAND = "run"
HELP = "run a pass pipeline on a module"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="IN", help="HLO file, .pb proto, -, or an XLA dump directory (with --module)")
    p.add_argument("--passes", required=True, metavar="PIPELINE",
                   help="e.g. spmd-partition,collective-fusion{combine-threshold-in-bytes=1048576}")
    p.add_argument("-o", "--output", metavar="OUT", help="write the result here (default: stdout)")
    p.add_argument("--num-partitions", type=int, help="set num-partitions on every pass that has it")
    p.add_argument("--verify", action="store_true", help="compare the result with the input numerically")
    p.add_argument("--platform", choices=("cpu", "gpu", "tpu"),
                   help="with --verify: the XLA platform that runs both modules (default cpu; a GPU dump's "
                        "after_optimizations holds GPU-only custom-calls)")
    p.add_argument("--verify-each", action="store_true", help="structural verifier after every pass")
    p.add_argument("--dump-dir", metavar="DIR", help="module before/after each pass, and a diff per pass")
    p.add_argument("--stats", action="store_true",
                   help="instructions, collectives and FLOPs before/after; each pass's time and peak memory")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line (it appears only on a terminal, for passes over a second)")
    p.add_argument("--remarks", action="store_true", help="what each pass decided and why")
    p.add_argument("--report", metavar="OUT.html",
                   help="an HTML page: per pass its time, remarks, diff and before/after charts, and the "
                        "final module's view (written also when a pass fails)")
    add_dump_arguments(p)
    p.add_argument("--as", dest="as_kind", choices=("global", "per-device", "replica"),
                   help="with --verify: read IN as this kind of program instead of what its content says")


def main(args) -> int:
    # deferred: the manager loads the verifier (~10 ms); --help imports every command
    from hlo_passes.passes.manager import PassFailed, PassManager, structural_problems

    try:
        pipeline = parse_pipeline(args.passes)
    except PipelineError as e:
        raise UserError(str(e)) from None
    partitions_used = False
    if args.num_partitions is not None:
        if args.num_partitions < 1:
            raise UserError(f"--num-partitions must be at least 1, got {args.num_partitions}")
        partitions_used = set_option_everywhere(pipeline, "num_partitions", args.num_partitions)
        if not partitions_used:
            print(f"hlo-passes: warning: --num-partitions {args.num_partitions} is ignored: no pass in "
                  f"{pipeline} has a num-partitions option", file=sys.stderr)
    if args.output == "":
        raise UserError("-o: the output file name is empty (use - for standard output)")
    text, display = read_text(args.input, args.module, args.stage)  # read once: `-` is a stream
    source = display
    module = parse_module(text, display)
    # Only --verify reads the input text again: otherwise it is not kept through the pipeline
    # (its size is the file's, a tenth of what the parsed module takes).
    original = text if args.verify else None
    del text
    if partitions_used:
        check_device_counts(module, args.num_partitions)
    before_stats = module_stats(module) if args.stats else None
    dump_dir = Path(args.dump_dir) if args.dump_dir else None
    # Keep the number of an XLA dump's module_NNNN file so both dumps sort together.
    module_number = Path(source).name.split(".")[0].removeprefix("module_") \
        if Path(source).name.startswith("module_") else "0000"
    progress = Progress(len(pipeline.passes), enabled=False if args.quiet else None)
    pass_report = None
    if args.report:
        from hlo_passes.view.report_data import PassReport  # deferred: the page builder (~40 ms)

        pass_report = PassReport(display, str(pipeline))

    last_before: list[str] = []  # the text of the pass now running, for its diff

    def dump(index, p, mod, when):
        if pass_report is not None:
            pass_report.observe(index, p, mod, when)
        if when == "before":
            progress.pass_started(index, p.name)
        else:
            progress.pass_finished()
        if dump_dir is None:
            return
        base = f"module_{module_number}.{mod.name}.{index:04d}.{p.name}"
        printed = print_module(mod)
        # Through the safe writer like every output (no input, read-only file or FIFO there is
        # touched); the diff is made from the text kept here, not read back from the dump.
        write_text(str(dump_dir / f"{base}.{when}.txt"), printed, regular_only=True)
        if when == "before":
            last_before[:] = [printed]
        else:
            before = last_before.pop() if last_before else ""
            diff = difflib.unified_diff(before.splitlines(True), printed.splitlines(True),
                                        f"{base}.before.txt", f"{base}.after.txt")
            write_text(str(dump_dir / f"{base}.diff"), "".join(diff), regular_only=True)

    manager = PassManager(pipeline.passes, verify_each=args.verify_each, dump=dump)
    try:
        try:
            manager.run(module)
        finally:
            progress.close()
    except PassFailed as e:
        if e.pass_name == "input":
            raise UserError(f"{display}: {e}") from None
        _print_remarks(manager, args.remarks)
        where = f"\n(its output is in {dump_dir})" if dump_dir is not None else ""
        if pass_report is not None:
            write_text(args.report, pass_report.html(manager, module, error=str(e)))
            where += f"\n(the pass report is {args.report})"
        print(f"error: {e}{where}", file=sys.stderr)
        return 1
    if not args.verify_each:  # (--verify-each has checked every pass's output already)
        problems = structural_problems(module)
        if problems:  # cheap, and never write a module XLA's parser would reject
            _print_remarks(manager, args.remarks)
            print(f"error: the final module is malformed (structural verifier), nothing written:\n{problems}\n"
                  "(run with --verify-each to find the pass that broke it)", file=sys.stderr)
            return 1
    if pass_report is not None:  # a diagnostic, like --dump-dir: written before --verify judges
        write_text(args.report, pass_report.html(manager, module))
    _print_remarks(manager, args.remarks)
    if args.stats:
        print(before_stats.format("before:"), file=sys.stderr)
        print(module_stats(module).format("after:"), file=sys.stderr)
        print("passes:", file=sys.stderr)
        print(manager.timing_report(), file=sys.stderr)
    output = args.output if args.output is not None else "-"
    if not args.verify:
        # Printed into the output file as it is made: a big module's text is not held whole.
        write_text(output, lambda stream: write_module(module, stream))
        return 0
    out = print_module(module)
    # deferred: the runtime loads numpy and xla_backend (jax on first use)
    from hlo_passes.runtime import verify_equivalent
    from hlo_passes.runtime.inputs import InputError
    from hlo_passes.runtime.verify import VerificationError
    from hlo_passes.runtime.xla_backend import BackendUnavailable, quiet_cpp_logs

    quiet_cpp_logs()
    try:
        report = verify_equivalent(cast(str, original), out, original_as=args.as_kind, platform=args.platform)
    except (VerificationError, InputError, BackendUnavailable) as e:
        # nothing to compare with (XLA cannot run the original, no such platform here): the
        # passes' output was not judged
        raise UserError(f"--verify: {e}") from None
    except Exception as e:  # XLA's compile and run errors (e.g. a form XLA:CPU does not run)
        from hlo_passes.cli.verify import xla_failure

        raise UserError(f"--verify: {xla_failure('a module', e)}") from None
    print(report.format(), file=sys.stderr)
    if not report.ok:
        return 1
    write_text(output, out)
    return 0


def check_device_counts(module, num_partitions: int) -> None:
    """`--num-partitions N` must fit the module: every tiled sharding is over N devices (a pass
    cannot cut an 8-device tiling into 3 parts) and every named device is below N."""
    for instr in module.all_instructions():
        if not instr.has_attr("sharding"):
            continue
        try:
            stack = [instr.sharding]
        except ValueError:
            continue  # read (and reported) by the passes that need it
        while stack:
            s = stack.pop()
            if s is None:
                continue
            stack.extend(s.elements)
            if s.kind is ShardingKind.TILED and s.num_devices != num_partitions:
                raise UserError(f"--num-partitions {num_partitions}: {instr.parent.name}/{instr.name} is sharded over "
                                f"{s.num_devices} devices ({s.to_hlo()}); use --num-partitions {s.num_devices}")
            if s.kind is ShardingKind.MAXIMAL and s.device is not None and s.device >= num_partitions:
                raise UserError(f"--num-partitions {num_partitions}: {instr.parent.name}/{instr.name} is placed on "
                                f"device {s.device}")


def _print_remarks(manager, wanted: bool) -> None:
    if wanted:
        for r in manager.remarks:
            print(r.format(), file=sys.stderr)
