"""`hlo-passes verify ORIGINAL REWRITTEN`: run both on the same inputs and compare."""

from __future__ import annotations

import numpy as np

from hlo_passes.cli.io import read_module
from hlo_passes.cli.main import UserError

COMMAND = "verify"
HELP = "numerically compare two modules through XLA (exit 0 equal, 1 different)"


def add_arguments(p) -> None:
    p.add_argument("original")
    p.add_argument("rewritten")
    p.add_argument("--num-devices", type=int, help="devices for per-device programs (default: from the module)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--inputs", metavar="F.npz", help="global inputs (arr_0, arr_1, ...) instead of random ones")
    p.add_argument("--save-inputs", metavar="F.npz")
    p.add_argument("--save-outputs", metavar="F.npz",
                   help="both modules' outputs (expected_N from ORIGINAL, actual_N from REWRITTEN)")


def main(args) -> int:
    from hlo_passes.runtime import verify as v
    from hlo_passes.runtime.xla_backend import ensure_devices

    original, rewritten = read_module(args.original), read_module(args.rewritten)
    ensure_devices(max(args.num_devices or 1, original.num_partitions, rewritten.num_partitions,
                       original.replica_count, rewritten.replica_count))
    inputs = None
    if args.inputs:
        data = np.load(args.inputs)
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    elif args.save_inputs:
        base = original if not v.is_per_device(original) else rewritten
        inputs = v.random_inputs(base, args.seed)
    if args.save_inputs and inputs is not None:
        np.savez(args.save_inputs, *inputs)
    try:
        report = v.verify_equivalent(original, rewritten, num_devices=args.num_devices, seed=args.seed,
                                     rtol=args.rtol, atol=args.atol, inputs=inputs)
    except v.VerificationError as e:
        raise UserError(str(e)) from None
    except Exception as e:  # XLA's compile errors: its message, trimmed
        lines = [ln for ln in str(e).splitlines() if ln.strip()][:6]
        raise UserError("XLA could not compile or run a module:\n  " + "\n  ".join(lines)) from None
    print(report.format())
    if args.save_outputs:
        arrays = {f"expected_{i}": a for i, a in enumerate(report.expected)}
        arrays.update({f"actual_{i}": a for i, a in enumerate(report.actual)})
        np.savez(args.save_outputs, **arrays)
    return 0 if report.ok else 1
