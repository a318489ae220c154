"""The child process of `xla_backend.pass_times`: compile one HLO file the way hlo-passes
compiles elsewhere (`xla_backend._compile`), while XLA logs each pass's time to stderr.

    TF_CPP_VMODULE=hlo_pass_pipeline=1 TF_CPP_MIN_LOG_LEVEL=0 \\
    XLA_FLAGS=--xla_force_host_platform_device_count=N \\
        python -m hlo_passes.runtime.xla_pass_timer FILE N [--shardy] [--propagate-to-output 1,0,...]

It is a process of its own because XLA reads the log verbosity and the device count once, when
it starts; the parent (`pass_times`) sets both and parses the log.
"""

from __future__ import annotations

import argparse
import sys

from hlo_passes.runtime import xla_backend


def _flags(text: str) -> tuple[bool, ...]:
    return tuple(x == "1" for x in text.split(",")) if text else ()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("num_partitions", type=int)
    ap.add_argument("--shardy", action="store_true", help="text in JAX's Shardy form: XLA's Shardy partitioner")
    ap.add_argument("--gspmd", dest="shardy", action="store_false")
    ap.add_argument("--propagate-to-output", default="")
    ap.add_argument("--propagate-to-parameters", default="")
    args = ap.parse_args(argv)
    with open(args.file) as f:
        text = f.read()
    options = xla_backend.CompileOptions(num_partitions=args.num_partitions, spmd=True, shardy=args.shardy,
                                         propagate_to_output=_flags(args.propagate_to_output),
                                         propagate_to_parameters=_flags(args.propagate_to_parameters))
    xla_backend._compile(text, options, {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
