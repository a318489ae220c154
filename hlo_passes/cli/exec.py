"""`hlo-passes exec FILE`: run one module on random inputs and summarise its outputs."""

from __future__ import annotations

import numpy as np

from hlo_passes.cli.io import read_module
from hlo_passes.cli.main import UserError

COMMAND = "exec"
HELP = "run a module through XLA and summarise its outputs"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="FILE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-outputs", metavar="F.npz")


def main(args) -> int:
    from hlo_passes.runtime import verify as v

    module = read_module(args.input)
    try:
        outputs = v.execute_module(module, seed=args.seed)
    except v.VerificationError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()][:6]
        raise UserError("XLA could not compile or run the module:\n  " + "\n  ".join(lines)) from None
    for i, out in enumerate(outputs):
        summary = f"output {i}: {out.dtype}{list(out.shape)}"
        if out.size and out.dtype.kind in "fiub":
            f = out.astype(np.float64)
            summary += (f" min {np.nanmin(f):.6g} max {np.nanmax(f):.6g} mean {np.nanmean(f):.6g} "
                        f"nan {int(np.isnan(f).sum())}")
        print(summary)
    if args.save_outputs:
        np.savez(args.save_outputs, *outputs)
    return 0
