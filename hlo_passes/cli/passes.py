"""`hlo-passes passes`: every registered pass with its summary and options.

    dce
        Remove unused instructions without side effects, and computations nobody calls
        remove-dead-computations: bool = true    also drop computations nobody calls
"""

from __future__ import annotations

import dataclasses

from hlo_passes.cli.main import UserError
from hlo_passes.passes.pipeline import describe_type, format_value, kebab, option_types
from hlo_passes.passes.registry import all_passes

COMMAND = "passes"
HELP = "list every pass and its options"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="PASS", help="only these passes")


def main(args) -> int:
    passes = all_passes()
    unknown = [n for n in args.names if n not in passes]
    if unknown:
        raise UserError(f"unknown pass {unknown[0]!r}; known passes: {', '.join(passes)}")
    for name, cls in passes.items():
        if args.names and name not in args.names:
            continue
        print(f"{name}\n    {cls.summary}")
        kinds = option_types(cls.Options)
        rows = []
        for f in dataclasses.fields(cls.Options):
            default = f.default if f.default is not dataclasses.MISSING else None
            rows.append((f"{kebab(f.name)}: {describe_type(kinds[f.name])} = {format_value(default)}",
                         f.metadata.get("help", "")))
        width = max((len(r[0]) for r in rows), default=0)
        for spec, help_text in rows:
            print(f"    {spec:<{width}}    {help_text}".rstrip())
    return 0
