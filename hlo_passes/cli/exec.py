"""`hlo-passes exec FILE`: run one module through XLA and summarise its outputs.

What kind of program the file holds is read from its content (ir/program_kind.py) and
said on stderr; `--as` overrides it.  A global module runs on one device, or through XLA's
SPMD partitioner when it needs several devices or `--num-devices N` asks for them; a
partitioned module with logical shardings on its ENTRY parameters and ROOT runs on its
devices and its global result is summarised; any other per-device program (XLA's own
partition, a replica program) runs on its devices with random inputs per device, and each
output is summarised over all devices.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hlo_passes import _xla_deaths
from hlo_passes.cli.io import add_dump_arguments, note_input, read_module, write_bytes
from hlo_passes.cli.main import UserError
from hlo_passes.cli.verify import quiet_xla_logs, xla_failure
from hlo_passes.ir.program_kind import ProgramKind, read_program

if TYPE_CHECKING:
    import numpy as np
else:
    from hlo_passes._deferred import numpy as np  # deferred: --help imports every command

COMMAND = "exec"
HELP = "run a module through XLA and summarise its outputs"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="FILE", help="HLO file, .pb proto, - for stdin, or an XLA dump directory")
    add_dump_arguments(p)
    p.add_argument("--num-devices", type=int, metavar="N",
                   help="run a global module on N devices through XLA's SPMD partitioner")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--inputs", metavar="F.npz", help="inputs arr_0, arr_1, ... instead of random ones")
    p.add_argument("--save-outputs", metavar="F.npz", help="write the outputs as arr_0, arr_1, ...")
    p.add_argument("--platform", choices=("cpu", "gpu", "tpu"), help="XLA platform (default cpu)")
    p.add_argument("--as", dest="as_kind", choices=("global", "per-device", "replica"),
                   help="read FILE as this kind of program instead of what its content says")


def summary(index: int, out: np.ndarray) -> str:
    """`output I: DTYPE[dims] min .. max .. mean .. nan N` (values for numeric outputs)."""
    line = f"output {index}: {out.dtype}{list(out.shape)}"
    if out.size == 0:
        return line + " (empty)"
    if out.dtype.kind == "c":
        mags = np.abs(out.astype(np.complex128))
        return line + f" |min| {mags.min():.6g} |max| {mags.max():.6g} nan {int(np.isnan(mags).sum())}"
    try:
        f = out.astype(np.float64)
    except (TypeError, ValueError):
        return line
    nan = int(np.isnan(f).sum())
    finite = f[np.isfinite(f)]
    if finite.size == 0:
        return line + f" nan {nan} inf {int(np.isinf(f).sum())}"
    inf = int(np.isinf(f).sum())
    return (line + f" min {finite.min():.6g} max {finite.max():.6g} mean {finite.mean():.6g} nan {nan}"
            + (f" inf {inf}" if inf else ""))


def per_device_summary(index: int, out: np.ndarray) -> str:
    """`output I: DTYPE[dims] on each of N devices (equal|different): min .. max ..` over all devices."""
    n = out.shape[0]
    same = all(np.array_equal(out[0], out[d], equal_nan=True) for d in range(1, n))
    values = summary(index, out).split("]", 1)[1]
    return (f"output {index}: {out.dtype}{list(out.shape[1:])} on each of {n} devices "
            f"({'equal on all' if same else 'different per device'}){values}")


def main(args) -> int:
    # deferred: the runtime loads numpy and xla_backend (jax on first use); --help imports every command
    from hlo_passes.runtime import inputs as inp
    from hlo_passes.runtime import verify as v
    from hlo_passes.runtime.xla_backend import BackendUnavailable

    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    quiet_xla_logs()
    module = read_module(args.input, args.module, args.stage)
    kind = ProgramKind(args.as_kind) if args.as_kind else None
    reading = read_program(module, kind)
    print(f"hlo-passes: {args.input}: {reading.describe()}", file=sys.stderr)
    per_device = reading.kind.is_per_device and not v.has_logical_shardings(module)
    if per_device and args.inputs:
        raise UserError("--inputs gives global arrays; a per-device program without logical shardings "
                        "runs on random inputs per device")
    try:
        if per_device:
            outputs, n = v.execute_per_device(module, num_devices=args.num_devices, seed=args.seed,
                                              platform=args.platform)
            stacked = [np.stack([dev[i] for dev in outputs]) for i in range(len(outputs[0]))]
            for i, out in enumerate(stacked):
                print(per_device_summary(i, out))
            if args.save_outputs:
                write_bytes(args.save_outputs, lambda f: inp.write_npz(f, stacked))
            return 0
        inputs = None
        if args.inputs:
            note_input(args.inputs)
            inputs = inp.load_npz(args.inputs, leaves=input_leaves(module, reading.kind.is_per_device))
        outputs = v.execute_module(module, inputs, num_devices=args.num_devices, seed=args.seed,
                                   platform=args.platform, as_kind=kind)
    except (v.VerificationError, inp.InputError, BackendUnavailable) as e:
        raise UserError(str(e)) from None
    except UserError:  # (an output that cannot be written: not XLA's failure)
        raise
    except Exception as e:
        raise xla_failure("the module", e) from None
    died = _xla_deaths.oracle_died_reason()
    if died:
        print(f"note: XLA died partitioning this module in a first try ({died}); its manual regions ran "
              "directly on each device instead (manual_regions.py)", file=sys.stderr)
    for i, out in enumerate(outputs):
        print(summary(i, out))
    if args.save_outputs:
        write_bytes(args.save_outputs, lambda f: inp.write_npz(f, outputs))
    return 0


def input_leaves(module, per_device: bool):
    """The (label, shape) leaves `--inputs` feeds: the ENTRY parameters' leaves, global shapes
    for a per-device module with logical shardings.  They bound the .npz's arrays before any
    is loaded; execute_module checks them fully."""
    from hlo_passes.runtime import inputs as inp
    from hlo_passes.runtime import verify as v

    if not per_device:
        return inp.parameter_leaves(module)
    shapes = [v._global_shape(p.shape, p.sharding) for p in module.entry.parameters]
    return [(f"#{i}", leaf) for i, leaf in enumerate(leaf for s in shapes for leaf in s.leaves())]
