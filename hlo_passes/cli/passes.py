"""`hlo-passes passes`: every registered pass with its summary and options."""

from __future__ import annotations

import dataclasses

from hlo_passes.passes.registry import all_passes

COMMAND = "passes"
HELP = "list every pass and its options"


def add_arguments(p) -> None:
    pass


def main(args) -> int:
    for name, cls in all_passes().items():
        print(f"{name}\n    {cls.summary}")
        for f in dataclasses.fields(cls.Options):
            default = f.default
            if isinstance(default, bool):
                default = "true" if default else "false"
            print(f"    {f.name.replace('_', '-')}={default}  ({f.type}) {f.metadata.get('help', '')}")
    return 0
