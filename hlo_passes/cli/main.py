"""Entry point of `hlo-passes` / `python -m hlo_passes`.

Exit codes: 0 success, 1 a check failed (e.g. `verify` found a mismatch),
2 bad usage or bad input (with a file:line:col message, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import hlo_passes.cli as package
from hlo_passes.parse.errors import HloParseError


class UserError(Exception):
    """A problem with the user's input or request: printed as `error: ...`, exit 2."""


# Set for a supervised child (supervise.py) whose parent found these streams closed: the child
# gets /dev/null there, and must still treat them as closed.
CLOSED_STREAMS = "HLO_PASSES_CLOSED_STREAMS"


class ClosedStream:
    """Stands in for a standard stream the shell closed (`>&-`, `<&-`).  Python sets such a
    stream to None, where `print` drops the output silently and `.write` is an
    AttributeError; here any use is a UserError (exit 2) that says so."""

    def __init__(self, name: str):
        self.name = name

    def _closed(self, *_args, **_kwargs):
        raise UserError(f"standard {self.name} is closed (reopen it, or give a file)")

    write = read = readline = _closed

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("standard stream closed")  # what callers expect of a stream without one

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def closed_streams() -> list[str]:
    """'stdin', 'stdout' where they are ClosedStream stand-ins (for a supervised child)."""
    return [name for name in ("stdin", "stdout") if isinstance(getattr(sys, name), ClosedStream)]


def guard_standard_streams() -> None:
    """Replace closed stdin/stdout with ClosedStream, and give their descriptors /dev/null:
    otherwise the next file opened (an output's temporary file) would become descriptor 1,
    and anything written to "stdout" (by C++ code, or a child) would land in it.  A closed
    stderr goes to /dev/null (messages lost, exit status kept) rather than into stdout."""
    inherited = os.environ.get(CLOSED_STREAMS, "").split(",")
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
        if getattr(sys, name) is not None and name not in inherited:
            continue
        try:
            os.fstat(fd)
        except OSError:  # really closed (not a test that set sys.stdout = None)
            null = os.open(os.devnull, mode)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if name == "stderr":
            sys.stderr = open(os.devnull, "w")
        else:
            setattr(sys, name, ClosedStream("input" if fd == 0 else "output"))


def _module_names() -> list[str]:
    """The modules of hlo_passes.cli that may hold a subcommand (found without importing them)."""
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__)
                  if info.name != "main" and not info.name.startswith("_"))


def _subcommand_modules(only: str | None = None):
    """Subcommand modules (those defining COMMAND).  A subcommand lives in the module of its
    name (`fmt` in cli/fmt.py), so `only` imports just that one: `hlo-passes fmt` does not pay
    for the imports of `verify` (jax, numpy)."""
    mods = []
    names = _module_names()
    for name in ([only] if only in names else names):
        mod = importlib.import_module(f"hlo_passes.cli.{name}")
        if hasattr(mod, "COMMAND"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.COMMAND)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hlo-passes",
        description="Parse, rewrite and numerically verify XLA HLO text.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _subcommand_modules(command):
        p = sub.add_parser(mod.COMMAND, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_handler=mod.main)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named by `argv` (its first word not starting with '-'), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word in ("-h", "--help"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    words = list(argv) if argv is not None else sys.argv[1:]
    guard_standard_streams()
    if argv is None:  # from the command line: a command that runs XLA runs in a child (supervise.py)
        from hlo_passes.cli import supervise

        if supervise.needs_supervisor(words):
            return supervise.supervise(words)
    command = _command_of(words)
    parser = build_parser(command if command in _module_names() else None)
    try:
        args = parser.parse_args(argv)
    except UserError as e:  # --help or a usage message to a closed stream
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # a launcher re-runs the command
    cli_io = sys.modules.get("hlo_passes.cli.io")  # (loaded by the commands that read files)
    if cli_io is not None:
        cli_io.forget_inputs()
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
    except RecursionError:
        print("error: the input is nested too deeply for hlo-passes to process", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory (the input asks for more than this machine has)", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug must still end with a message, not a traceback
        print(internal_error(e), file=sys.stderr)
        return 2


def internal_error(e: BaseException) -> str:
    """One line naming an unexpected exception and where in hlo_passes it was raised (a bug:
    bad input should have been reported as such)."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "hlo_passes" in f.filename]
    where = f" at {frames[-1].filename.split('hlo_passes/')[-1]}:{frames[-1].lineno}" if frames else ""
    message = str(e).splitlines()[0] if str(e) else ""
    if len(message) > 300:
        message = message[:300] + "..."
    return (f"error: internal error in hlo-passes ({type(e).__name__}{where}): {message}\n"
            "(this is a bug in hlo-passes, not in your input: please report it with the input)")


if __name__ == "__main__":
    # `python -m hlo_passes.cli.main`: run the imported module's `main`, not this copy's.  Run as
    # a script this file is `__main__`, and the exception classes the commands raise (imported
    # from `hlo_passes.cli.main`) would not be the ones the `except` clauses here name: a bad
    # input would be reported as an internal error.
    from hlo_passes.cli.main import main as _imported_main

    sys.exit(_imported_main())
