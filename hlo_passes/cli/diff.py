"""`hlo-passes diff A B`: structural diff of two modules, ignoring renumbering.

Exit 0 when they are equal, 1 when they differ, 2 when either does not parse."""

from __future__ import annotations

import sys

from hlo_passes.cli.io import read_module

COMMAND = "diff"
HELP = "structural diff of two modules (exit 0 equal, 1 different)"


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="HLO file, or - for stdin")
    p.add_argument("b", metavar="B", help="HLO file, or - for stdin")


def main(args) -> int:
    from hlo_passes.diff import diff_modules

    diff = diff_modules(read_module(args.a), read_module(args.b))
    if diff.equal:
        return 0
    sys.stdout.write(f"--- {args.a}\n+++ {args.b}\n" + diff.format())
    return 1
