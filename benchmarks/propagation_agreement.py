"""How often does our sharding-propagation give an instruction the sharding XLA's gives it?

For each module (HLO files in GSPMD form, or the generated models of spmd_models.py), XLA's
ShardingPropagation runs inside a compile for the module's device count and its result is read
from the `after_sharding-propagation` dump; ours runs on the same text.  Instructions are
matched by name (propagation renames nothing) and compared by meaning (Sharding equality: the
same device for every tile).  Prints per module the agreement and the first disagreements.

    .venv/bin/python benchmarks/propagation_agreement.py FILE.hlo ... [--models gpt_tp,...] [--show 10]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hlo_passes import parse_module  # noqa: E402
from hlo_passes.ir.program_kind import read_program  # noqa: E402
from hlo_passes.passes.spmd.sharding_propagation import ShardingPropagation  # noqa: E402
from hlo_passes.runtime.xla_backend import pass_dump, quiet_cpp_logs  # noqa: E402


def _sharding(instr):
    return instr.sharding if "sharding" in instr.attributes else None


def agreement(text: str, show: int = 0) -> tuple[int, int, list[str]]:
    """(instructions agreeing, instructions compared, disagreement lines)."""
    module = parse_module(text)
    n = read_program(module).num_devices
    header = module.attributes
    flags = {}
    for key, arg in (("allow_spmd_sharding_propagation_to_output", "propagate_to_output"),
                     ("allow_spmd_sharding_propagation_to_parameters", "propagate_to_parameters")):
        if key in header:
            flags[arg] = tuple(module.header_attr(key))
    xla = parse_module(pass_dump(text, "sharding-propagation", num_partitions=n, **flags))
    ShardingPropagation().run(module)
    theirs = {i.name: i for i in xla.all_instructions()}
    agree = total = 0
    lines = []
    for instr in module.all_instructions():
        other = theirs.get(instr.name)
        # XLA's passes before propagation (call inlining, simplification) can reuse a name for
        # another instruction: only same-named instructions of the same opcode and shape count
        if other is None or other.opcode is not instr.opcode or other.shape != instr.shape:
            continue
        a, b = _sharding(instr), _sharding(other)
        if b is None and a is None:
            continue
        total += 1
        if a is not None and b is not None and a.without_metadata() == b.without_metadata():
            agree += 1
        elif len(lines) < show:
            lines.append(f"  {instr.name:28} {instr.opcode.value:18} {instr.shape.to_hlo(False):22} ours "
                         f"{a.to_hlo() if a else '-':42} XLA {b.to_hlo() if b else '-'}")
    return agree, total, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--models", help="comma-separated models of benchmarks/spmd_models.py (GSPMD lowering)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--show", type=int, default=8)
    args = ap.parse_args(argv)
    quiet_cpp_logs()
    inputs = [(f.name, f.read_text()) for f in args.files]
    if args.models:
        import jax

        import spmd_models

        jax.config.update("jax_use_shardy_partitioner", False)
        for name in args.models.split(","):
            fn, fargs = spmd_models.MODELS[name](args.width)
            inputs.append((name, fn.lower(*fargs).as_text(dialect="hlo")))
    total_agree = total = 0
    for name, text in inputs:
        a, t, lines = agreement(text, args.show)
        total_agree += a
        total += t
        print(f"{name}: {a}/{t} instructions agree ({100 * a / max(t, 1):.0f}%)")
        for line in lines:
            print(line)
    print(f"\noverall: {total_agree}/{total} ({100 * total_agree / max(total, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
