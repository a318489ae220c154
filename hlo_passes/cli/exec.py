"""`hlo-passes exec FILE`: run one module through XLA and summarise its outputs.

A global module runs on one device, or through XLA's SPMD partitioner with
`--num-devices N`; a partitioned module with logical shardings on its ENTRY
parameters and ROOT runs on its devices and its global result is summarised.
"""

from __future__ import annotations

import numpy as np

from hlo_passes.cli.io import read_module
from hlo_passes.cli.main import UserError

COMMAND = "exec"
HELP = "run a module through XLA and summarise its outputs"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="FILE")
    p.add_argument("--num-devices", type=int, metavar="N",
                   help="run a global module on N devices through XLA's SPMD partitioner")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--inputs", metavar="F.npz", help="inputs arr_0, arr_1, ... instead of random ones")
    p.add_argument("--save-outputs", metavar="F.npz", help="write the outputs as arr_0, arr_1, ...")
    p.add_argument("--platform", choices=("cpu", "gpu", "tpu"), help="XLA platform (default cpu)")


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


def main(args) -> int:
    from hlo_passes.cli.verify import quiet_xla_logs, xla_failure
    from hlo_passes.runtime import inputs as inp
    from hlo_passes.runtime import verify as v
    from hlo_passes.runtime.xla_backend import BackendUnavailable

    quiet_xla_logs()
    module = read_module(args.input)
    try:
        inputs = inp.load_npz(args.inputs) if args.inputs else None
        outputs = v.execute_module(module, inputs, num_devices=args.num_devices, seed=args.seed,
                                   platform=args.platform)
    except (v.VerificationError, inp.InputError, BackendUnavailable) as e:
        raise UserError(str(e)) from None
    except Exception as e:
        raise xla_failure("the module", e) from None
    for i, out in enumerate(outputs):
        print(summary(i, out))
    if args.save_outputs:
        inp.save_npz(args.save_outputs, outputs)
    return 0
