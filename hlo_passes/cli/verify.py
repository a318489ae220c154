"""`hlo-passes verify ORIGINAL REWRITTEN`: run both on the same inputs through XLA and compare.

Exit 0 when every output matches, 1 on a mismatch (the report says which output and
element), 2 on bad usage, unreadable input or a module XLA cannot compile (XLA's message
trimmed to its useful lines).
"""

from __future__ import annotations

from pathlib import Path

from hlo_passes.cli.io import add_dump_arguments, note_input, two_modules, write_bytes
from hlo_passes.cli.main import UserError
from hlo_passes.cli.processes import (add_process_arguments, check_process_arguments, join, launch,
                                      check_timeout, local_device_count, start_watchdog)
from hlo_passes.ir.program_kind import ProgramKind, read_program
from hlo_passes.parse.attribute_reader import reader_for

COMMAND = "verify"
HELP = "numerically compare two modules through XLA (exit 0 equal, 1 different)"


def add_arguments(p) -> None:
    p.add_argument("original", metavar="ORIGINAL", help="HLO file, .pb proto, or an XLA dump directory")
    p.add_argument("rewritten", metavar="REWRITTEN", nargs="?",
                   help="the same (omitted: a second stage of ORIGINAL's dump directory, --stage A,B; "
                        "default before_optimizations,after_optimizations)")
    add_dump_arguments(p, stages=2)
    add_process_arguments(p)
    p.add_argument("--num-devices", type=int, metavar="N",
                   help="devices for per-device programs and XLA-partitioned runs (default: from the modules)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by element type)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by element type)")
    p.add_argument("--inputs", metavar="F.npz",
                   help="inputs arr_0, arr_1, ... (one per ENTRY parameter leaf) instead of random ones")
    p.add_argument("--save-inputs", metavar="F.npz", help="write the inputs used")
    p.add_argument("--save-outputs", metavar="F.npz",
                   help="both modules' outputs (expected_N from ORIGINAL, actual_N from REWRITTEN)")
    p.add_argument("--platform", choices=("cpu", "gpu", "tpu"), help="XLA platform (default cpu)")
    p.add_argument("--as", dest="as_kinds", metavar="KIND[,KIND]",
                   help="read ORIGINAL (and REWRITTEN) as a global|per-device|replica program instead of "
                        "what their content says, e.g. --as global,per-device")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="give up after S seconds (exit 2); with --processes, for the whole run")
    p.add_argument("--result-sharding", metavar="SHARDING",
                   help="logical sharding of REWRITTEN's result when the file does not carry it, e.g. "
                        "'{{devices=[4,2]<=[8]}, {replicated}}' for XLA's own partitioned dump "
                        "(default: the ROOT's sharding, else the one XLA's partitioner picks)")


KINDS = ("global", "per-device", "replica")


def read_kinds(text: str | None, count: int) -> list[str | None]:
    """`--as KIND[,KIND]`: one kind per module (one given: the same for all)."""
    if text is None:
        return [None] * count
    kinds = [k.strip() for k in text.split(",")]
    bad = [k for k in kinds if k not in KINDS]
    if bad or len(kinds) not in (1, count):
        raise UserError(f"--as: expected {count if count > 1 else 'one'} of {', '.join(KINDS)} "
                        f"(comma-separated), got {text!r}")
    return kinds * count if len(kinds) == 1 else kinds


def quiet_xla_logs() -> None:
    from hlo_passes.runtime.xla_backend import quiet_cpp_logs  # deferred: numpy, jax

    quiet_cpp_logs()


def read_sharding_option(flag: str, text: str | None):
    """A sharding given on the command line, read like `sharding=` in HLO text."""
    if text is None:
        return None
    try:
        return reader_for("sharding")(text.strip())
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def xla_failure(what: str, error: BaseException) -> UserError:
    from hlo_passes.runtime.xla_backend import xla_error_lines  # deferred: numpy, jax

    return UserError(f"XLA could not compile or run {what}:\n  " + "\n  ".join(xla_error_lines(error)))


def main(args) -> int:
    # deferred: the runtime loads numpy and xla_backend (jax on first use); --help imports every command
    from hlo_passes.runtime import inputs as inp
    from hlo_passes.runtime import verify as v
    from hlo_passes.runtime.xla_backend import BackendUnavailable, ensure_devices, process_index

    check_timeout(args.timeout)
    if args.seed < 0:  # (numpy's generator refuses it, deep inside, where it looks like XLA's failure)
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    quiet_xla_logs()
    (original, _), (rewritten, _) = two_modules(args.original, args.rewritten, args.module, args.stage,
                                                default_stages=("before_optimizations", "after_optimizations"))
    kinds = [ProgramKind(k) if k else None for k in read_kinds(args.as_kinds, 2)]
    readings = [read_program(m, k) for m, k in zip((original, rewritten), kinds)]
    root_sharding = read_sharding_option("--result-sharding", args.result_sharding)
    if args.num_devices is not None and args.num_devices < 1:
        raise UserError("--num-devices must be at least 1")
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if value is not None and not value >= 0:  # also NaN
            raise UserError(f"{flag} must be a number >= 0, got {value}")
    for flag, path in (("--save-inputs", args.save_inputs), ("--save-outputs", args.save_outputs)):
        if path is not None and (path == "" or Path(path).is_dir()):
            raise UserError(f"{flag}: {path!r} is not a file name (the arrays are written to exactly that file)")
    check_process_arguments(args)
    devices_needed = max([args.num_devices or 1] + [r.num_devices for r in readings])
    if args.processes is not None and args.processes > 1:
        local_device_count(devices_needed, args.processes)
        return launch(args.argv, args.processes, timeout=args.timeout)
    if args.coordinator is not None:
        join(args, devices_needed)
    start_watchdog(args.timeout, "verify")
    try:
        ensure_devices(max([args.num_devices or 1] + [r.num_devices for r in readings if r.kind.is_per_device]),
                       args.platform)
        original_global = not readings[0].kind.is_per_device
        inputs = None
        if args.inputs:
            note_input(args.inputs)
            inputs = inp.load_npz(args.inputs, original if original_global else None)
        elif args.save_inputs and original_global:
            inputs = inp.random_inputs(original, args.seed)
        if args.save_inputs:
            if inputs is None:
                raise UserError("--save-inputs is for global modules (per-device inputs are drawn per device)")
            write_bytes(args.save_inputs, lambda f: inp.write_npz(f, inputs))
        report = v.verify_equivalent(original, rewritten, num_devices=args.num_devices, seed=args.seed,
                                     rtol=args.rtol, atol=args.atol, inputs=inputs, platform=args.platform,
                                     root_sharding=root_sharding, original_as=kinds[0], rewritten_as=kinds[1])
    except (v.VerificationError, inp.InputError, BackendUnavailable) as e:
        raise UserError(str(e)) from None
    except UserError:
        raise
    except Exception as e:  # XLA's compile and run errors
        raise xla_failure("a module", e) from None
    if args.coordinator is not None:
        report.notes.append(f"ran on {args.num_processes} processes joined by jax.distributed, "
                            f"{local_device_count(devices_needed, args.num_processes)} devices each")
    if process_index() != 0:  # every process reached the same verdict; the first one says it
        return 0 if report.ok else 1
    print(report.format())
    if args.save_outputs:
        arrays = {f"expected_{i}": a for i, a in enumerate(report.expected)}
        arrays.update({f"actual_{i}": a for i, a in enumerate(report.actual)})
        write_bytes(args.save_outputs, lambda f: inp.write_npz(f, arrays))
    return 0 if report.ok else 1
