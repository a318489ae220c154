"""Reading inputs and writing outputs for the CLI: outputs are written only
after the command succeeded, atomically (a temporary file renamed into place)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from hlo_passes.ir.module import Module
from hlo_passes.parse.module_parser import parse_module


def add_dump_arguments(p, *, stages: int = 1) -> None:
    """`--module` / `--stage` for inputs that are XLA dump directories."""
    p.add_argument("--module", metavar="NAME|NUM", help="module of an XLA dump directory (see `hlo-passes list`)")
    what = "STAGE" if stages == 1 else "STAGE[,STAGE]"
    p.add_argument("--stage", metavar=what,
                   help="stage of a dump directory's module: before_optimizations (default), "
                        "after_optimizations, a pass dump's number (0004), after_PASS or before_PASS"
                   + ("; two stages compare one module's stages (one directory argument)" if stages > 1 else ""))


def read_text(path: str, module: str | None = None, stage: str | None = None) -> tuple[str, str]:
    """(text, display name) of a file, '-' for standard input, a binary HLO proto (`.pb`), or
    one stage of one module of an XLA dump directory."""
    from hlo_passes.cli.main import UserError
    from hlo_passes.dump_dir import DumpDirectory, DumpError, proto_file_text

    if path == "-":
        return sys.stdin.read(), "<stdin>"
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file")
    try:
        if p.is_dir():
            found = DumpDirectory(p).find(module, stage)
            print(f"hlo-passes: reading {found.path}", file=sys.stderr)
            return found.read_text(), str(found.path)
        if module is not None or stage is not None:
            raise UserError(f"{path}: --module and --stage select from an XLA dump directory, not a file")
        if p.name.endswith(".pb"):
            return proto_file_text(p), path
    except DumpError as e:
        raise UserError(str(e)) from None
    try:
        return p.read_text(), path
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not HLO text (byte {e.start} is not UTF-8; a serialized HloModuleProto "
                        "is read from a file named *.pb)") from None


def read_module(path: str, module: str | None = None, stage: str | None = None) -> Module:
    text, name = read_text(path, module, stage)
    return parse_module(text, name)


def two_modules(first: str, second: str | None, module: str | None, stages: str | None,
                default_stages: tuple[str, str]):
    """The two modules of a two-input command: two files, two dump directories, or one dump
    directory and two stages (`--stage A,B`, default `default_stages`).  Returns
    [(Module, display name), (Module, display name)]."""
    from hlo_passes.cli.main import UserError

    picked = [s.strip() for s in stages.split(",")] if stages else []
    if len(picked) > 2:
        raise UserError(f"--stage: at most two stages, got {stages!r}")
    if second is None:
        if first == "-" or not Path(first).is_dir():
            raise UserError("a second module is needed (or one dump directory and --stage A,B)")
        second = first
        if len(picked) < 2:
            picked = list(default_stages) if not picked else [default_stages[0], picked[0]]
    elif len(picked) == 1:
        picked = picked * 2
    out = []
    for path, stage in zip((first, second), picked or [None, None]):
        is_dir = path != "-" and Path(path).is_dir()
        text, name = read_text(path, module if is_dir else None, stage if is_dir else None)
        out.append((parse_module(text, name), name))
    return out


def write_text(path: str, text: str) -> None:
    """Write `text` to `path` atomically ('-' writes to stdout)."""
    if path == "-":
        sys.stdout.write(text)
        return
    from hlo_passes.cli.main import UserError

    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
    try:
        # mkstemp makes the file private (0600); an output file gets the usual mode.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
