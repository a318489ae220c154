"""How often does our sharding-propagation give an instruction the sharding XLA's gives it?

For each module (HLO files in GSPMD form, a folder of them, or the generated models of
spmd_models.py), XLA's ShardingPropagation runs inside a compile for the module's device
count and its result is read from the `after_sharding-propagation` dump; ours runs on the
same text.  XLA's import renames some instructions (`param0` -> `param0.1`, keeping the old
name as `op_name` metadata), so instructions are matched by name (not to an XLA instruction
whose op_name names another: its own name is then XLA's invention), else by that op_name, else
by name without XLA's `.N` suffix — always of the same opcode and shape — and compared by
meaning (Sharding equality: the same device for every tile).  An instruction both leave
without a sharding is not counted.  Prints per module the agreement and the first
disagreements.

    .venv/bin/python benchmarks/propagation_agreement.py FILE.hlo DIR ... [--models gpt_tp,...] [--show 10]

XLA runs in a child process per module (`--in-process` to skip that): XLA's partitioner, which
runs after propagation, aborts the process (a CHECK) on some modules its propagation handles.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
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


def _flags(module) -> dict[str, tuple[bool, ...]]:
    flags = {}
    for key, arg in (("allow_spmd_sharding_propagation_to_output", "propagate_to_output"),
                     ("allow_spmd_sharding_propagation_to_parameters", "propagate_to_parameters")):
        if key in module.attributes:
            value = module.header_attr(key)
            flags[arg] = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return flags


def xla_propagation(text: str, isolate: bool = False):
    """XLA's module right after its sharding propagation, compiled as the module's header says."""
    module = parse_module(text)
    n = read_program(module).num_devices
    flags = _flags(module)
    if not isolate:
        return parse_module(pass_dump(text, "sharding-propagation", num_partitions=n, **flags))
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.hlo"
        src.write_text(text)
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={d}/dump --xla_dump_hlo_as_text"
                            " --xla_dump_hlo_pass_re=sharding-propagation")
        args = [sys.executable, __file__, "--child", str(src), str(n),
                ",".join(map(str, flags.get("propagate_to_output", ()))),
                ",".join(map(str, flags.get("propagate_to_parameters", ())))]
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        found = sorted(Path(d).glob("dump/*after_sharding-propagation*.txt"))
        if not found:
            lines = [l for l in (run.stdout + run.stderr).splitlines() if "Error" in l or "error" in l]
            raise RuntimeError(lines[-1] if lines else f"XLA wrote no dump (exit {run.returncode})")
        return parse_module(found[-1].read_text())


def _child(src: str, n: str, output: str, parameters: str) -> int:
    from hlo_passes.runtime.xla_backend import compile_hlo

    def bools(text):
        return tuple(v == "True" for v in text.split(",") if v)

    try:
        compile_hlo(Path(src).read_text(), num_partitions=int(n), spmd=True, propagate_to_output=bools(output),
                    propagate_to_parameters=bools(parameters))
    except Exception as e:  # noqa: BLE001 - the dump written before the error is what the parent reads
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return 0


def match(ours, theirs):
    """Pairs (our instruction, XLA's) of the same opcode and shape (see the module docstring)."""
    by_name, by_op_name, by_stem = {}, {}, {}
    for i in theirs.all_instructions():
        md = i.metadata
        if md is not None and md.op_name:
            by_op_name.setdefault(md.op_name, []).append(i)
            if md.op_name != i.name:
                continue  # renamed by XLA: its name may be another instruction's
        by_name.setdefault(i.name, []).append(i)
        stem, dot, suffix = i.name.rpartition(".")
        if dot and suffix.isdigit():
            by_stem.setdefault(stem, []).append(i)
    pairs = []
    taken = set()
    for instr in ours.all_instructions():
        md = instr.metadata
        keys = [(by_name, instr.name)]
        if md is None or not md.op_name:
            keys.append((by_op_name, instr.name))
        keys.append((by_stem, instr.name))
        for table, key in keys:
            found = [o for o in table.get(key, ()) if o.opcode is instr.opcode and o.shape.to_hlo(False) == instr.shape.to_hlo(False)
                     and id(o) not in taken and _same_literal(o, instr)
                     and (table is by_op_name or _same_operands(o, instr))]
            if len(found) == 1:
                taken.add(id(found[0]))
                pairs.append((instr, found[0]))
                break
    return pairs


def _same_operands(theirs, ours) -> bool:
    """A match by name reads the same values: each XLA operand that names its origin (op_name)
    names our operand (XLA gives the instructions it makes names ours may have too)."""
    if len(theirs.operands) != len(ours.operands):
        return False
    for t, o in zip(theirs.operands, ours.operands):
        md = t.metadata
        if md is not None and md.op_name and md.op_name != o.name:
            return False
    return True


def _same_literal(a, b) -> bool:
    """Constants match only with the same value (XLA names the constants it makes afresh)."""
    if a.literal is None or b.literal is None:
        return a.literal is b.literal
    return "".join(str(a.literal).split()) == "".join(str(b.literal).split())


def agreement(text: str, show: int = 0, isolate: bool = False) -> tuple[int, int, list[str]]:
    """(instructions agreeing, instructions compared, disagreement lines)."""
    xla = xla_propagation(text, isolate)
    module = parse_module(text)
    ShardingPropagation().run(module)
    agree = total = 0
    lines = []
    for instr, other in match(module, xla):
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
    ap.add_argument("files", nargs="*", type=Path, help="HLO files, or folders of *.hlo files")
    ap.add_argument("--models", help="comma-separated models of benchmarks/spmd_models.py (GSPMD lowering)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--show", type=int, default=8)
    ap.add_argument("--in-process", action="store_true", help="run XLA in this process (faster; a CHECK kills it)")
    args = ap.parse_args(argv)
    quiet_cpp_logs()
    inputs = []
    for f in args.files:
        for path in (sorted(p for p in f.glob("*.hlo") if not p.name.endswith(".expected.hlo")) if f.is_dir() else [f]):
            inputs.append((path.name, path.read_text()))
    if args.models:
        import jax

        import spmd_models

        jax.config.update("jax_use_shardy_partitioner", False)
        for name in args.models.split(","):
            fn, fargs = spmd_models.MODELS[name](args.width)
            inputs.append((name, fn.lower(*fargs).as_text(dialect="hlo")))
    total_agree = total = full = 0
    for name, text in inputs:
        try:
            a, t, lines = agreement(text, args.show, isolate=not args.in_process)
        except Exception as e:  # noqa: BLE001 - a module either side cannot propagate is reported, not fatal
            print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        total_agree += a
        total += t
        full += a == t
        print(f"{name}: {a}/{t} instructions agree ({100 * a / max(t, 1):.0f}%)")
        for line in lines:
            print(line)
    print(f"\noverall: {total_agree}/{total} ({100 * total_agree / max(total, 1):.1f}%), "
          f"{full}/{len(inputs)} modules agree fully")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(*sys.argv[2:6]))
    sys.exit(main())
