"""`hlo-passes list DIR [--module M]`: what an XLA dump directory holds.

Without `--module`: one line per module (number, name, stages, size of its
`before_optimizations` file, device count and the kind of program that file is).  With
`--module`: one line per stage of that module, in pipeline order, with the stage selector
that picks it for `--stage`, its size, its kind and its device count.
"""

from __future__ import annotations

from pathlib import Path

from hlo_passes.cli.main import UserError
from hlo_passes.dump_dir import DumpDirectory, DumpError, select_stage
from hlo_passes.ir.program_kind import read_program
from hlo_passes.parse.errors import HloParseError
from hlo_passes.parse.module_parser import parse_module

COMMAND = "list"
HELP = "list the modules and stages of an XLA dump directory"


def add_arguments(p) -> None:
    p.add_argument("directory", metavar="DIR", help="an XLA dump directory (--xla_dump_to=DIR)")
    p.add_argument("--module", metavar="NAME|NUM", help="list this module's stages")


def _describe(stage) -> str:
    try:
        reading = read_program(parse_module(stage.read_text(), str(stage.path)))
    except (HloParseError, ValueError) as e:
        return f"unreadable ({str(e).splitlines()[0][:60]})"
    return f"{reading.kind.value}, {reading.num_devices} device{'s' * (reading.num_devices != 1)}"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def main(args) -> int:
    try:
        dump = DumpDirectory(Path(args.directory))
        if args.module is None:
            modules = dump.modules()
            if not modules:
                raise DumpError(f"{args.directory}: no module_*.txt or .hlo.pb files "
                                "(is it an XLA dump directory?)")
            print(f"{'module':>6}  {'name':30} {'stages':>6} {'size':>9}  before_optimizations")
            for m in modules:
                try:
                    first = select_stage(m, "before_optimizations")
                    size, what = _size(first.size()), _describe(first)
                except DumpError:
                    size, what = "-", "-"
                print(f"{m.number:6d}  {m.name:30} {len(m.stages):6d} {size:>9}  {what}")
            return 0
        module = dump.module(args.module)
    except DumpError as e:
        raise UserError(str(e)) from None
    print(f"{module.label}")
    print(f"  {'--stage':28} {'size':>9}  {'kind':28} file")
    for stage in module.stages:
        selector = f"{stage.sequence:04d}" if stage.sequence is not None else stage.stage
        label = selector if stage.sequence is None else f"{selector} after_{stage.after_pass}"
        print(f"  {label:28} {_size(stage.size()):>9}  {_describe(stage):28} {stage.path.name}")
    return 0
