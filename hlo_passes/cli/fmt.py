"""`hlo-passes fmt FILE|-`: parse and print a module (canonical layout of our printer)."""

from __future__ import annotations

import os
import stat

from hlo_passes.cli.io import add_dump_arguments, read_module, write_text
from hlo_passes.cli.main import UserError
from hlo_passes.printer import print_module

COMMAND = "fmt"
HELP = "parse an HLO module and print it back"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="FILE", help="HLO text file, .pb proto, - for stdin, or an XLA dump directory")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    p.add_argument("--in-place", action="store_true", help="rewrite FILE (only after a successful parse)")
    add_dump_arguments(p)


def main(args) -> int:
    if args.in_place and (args.input == "-" or args.output is not None or args.module or args.stage
                          or args.input.endswith(".pb")):
        raise UserError("--in-place needs an HLO text file and no -o")
    if args.output == "":
        raise UserError("-o: the output file name is empty (use - for standard output)")
    if args.in_place:
        _check_regular(args.input)
    text = print_module(read_module(args.input, args.module, args.stage))
    if args.in_place:
        write_text(args.input, text, in_place=True)
    else:
        write_text(args.output if args.output is not None else "-", text)
    return 0


def _check_regular(path: str) -> None:
    """--in-place reads the file and writes it back: a FIFO would be read (its writer's data
    consumed) and then block the write, a device or directory has nothing to rewrite."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"--in-place: {path} is not a regular file (a FIFO, device or directory); use -o")
