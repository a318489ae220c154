"""`hlo-passes view FILE [-o OUT.html]`: the module as one self-contained HTML page.

The page shows each computation as a graph grouped by the model's op_name scopes, every
instruction's shape, sharding (a picture of its tile grid over the devices) and source line,
the collectives sized by bytes with their replica groups, and a summary (instructions by
opcode, collectives by kind, FLOPs, peak parameter bytes per device).  FILE may be HLO text,
`-`, a `.pb` proto or an XLA dump directory with `--module` (and `--stage`)."""

from __future__ import annotations

import sys
from pathlib import Path

from hlo_passes.cli.io import add_dump_arguments, read_text, write_text
from hlo_passes.parse.module_parser import parse_module

COMMAND = "view"
HELP = "write a module as a self-contained HTML page (graph, shardings, collectives, source lines)"


def add_arguments(p) -> None:
    p.add_argument("input", metavar="FILE", help="HLO file, .pb proto, -, or an XLA dump directory (with --module)")
    p.add_argument("-o", "--output", metavar="OUT.html",
                   help="where to write the page (default: FILE's name with .html, in the current directory)")
    add_dump_arguments(p)


def main(args) -> int:
    from hlo_passes.view import module_html  # deferred: the page builder (~40 ms); --help imports every command

    text, display = read_text(args.input, args.module, args.stage)
    module = parse_module(text, display)
    out = args.output or (Path(display).name.removesuffix(".txt").removesuffix(".hlo") + ".html"
                          if display != "<stdin>" else f"{module.name}.html")
    write_text(out, module_html(module, source=display))
    if out != "-":
        print(f"hlo-passes: wrote {out}", file=sys.stderr)
    return 0
