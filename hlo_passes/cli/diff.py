"""`hlo-passes diff A B`: structural diff of two modules, ignoring renumbering.

Exit 0 when they are equal, 1 when they differ, 2 when either does not parse."""

from __future__ import annotations

import sys

from hlo_passes.cli.io import add_dump_arguments, two_modules, write_text
from hlo_passes.diff import diff_modules

COMMAND = "diff"
HELP = "structural diff of two modules (exit 0 equal, 1 different)"


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="HLO file, .pb proto, - for stdin, or an XLA dump directory")
    p.add_argument("b", metavar="B", nargs="?",
                   help="the same (omitted: a second stage of A's dump directory, from --stage A,B)")
    p.add_argument("--html", metavar="OUT.html", help="also write the diff as a side-by-side HTML page")
    add_dump_arguments(p, stages=2)


def main(args) -> int:
    (a, name_a), (b, name_b) = two_modules(args.a, args.b, args.module, args.stage,
                                           default_stages=("before_optimizations", "after_optimizations"))
    diff = diff_modules(a, b)
    if args.html:
        from hlo_passes.view import diff_html  # deferred: the page builder (~40 ms), for --html only

        write_text(args.html, diff_html(a, b, name_a, name_b))
    if diff.equal:
        return 0
    sys.stdout.write(f"--- {name_a}\n+++ {name_b}\n" + diff.format())
    return 1
