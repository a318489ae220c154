"""Entry point of `hlo-passes` / `python -m hlo_passes`.

Exit codes: 0 success, 1 a check failed (e.g. `verify` found a mismatch),
2 bad usage or bad input (with a file:line:col message, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from hlo_passes.parse.errors import HloParseError


class UserError(Exception):
    """A problem with the user's input or request: printed as `error: ...`, exit 2."""


def _subcommand_modules():
    import hlo_passes.cli as package

    mods = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in ("main",) or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        if hasattr(mod, "COMMAND"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.COMMAND)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hlo-passes",
        description="Parse, rewrite and numerically verify XLA HLO text.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _subcommand_modules():
        p = sub.add_parser(mod.COMMAND, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_handler=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # a launcher re-runs the command
    try:
        return int(args._handler(args) or 0)
    except HloParseError as e:
        print(e.format(), file=sys.stderr)
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as e:  # unreadable input, unwritable output or dump directory
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
