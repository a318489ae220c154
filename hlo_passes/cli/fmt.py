"""`hlo-passes fmt FILE|-`: parse and print a module (canonical layout of our printer)."""

from __future__ import annotations

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
    text = print_module(read_module(args.input, args.module, args.stage))
    write_text(args.input if args.in_place else (args.output if args.output is not None else "-"), text)
    return 0
