"""Reading inputs and writing outputs for the CLI: outputs are written only
after the command succeeded, atomically (a temporary file renamed into place)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from hlo_passes.ir.module import Module
from hlo_passes.parse.module_parser import parse_module


def read_text(path: str) -> tuple[str, str]:
    """(text, display name) of a file or '-' for standard input."""
    from hlo_passes.cli.main import UserError

    if path == "-":
        return sys.stdin.read(), "<stdin>"
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file")
    if p.is_dir():
        raise UserError(f"{path}: is a directory")
    try:
        return p.read_text(), path
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not HLO text (byte {e.start} is not UTF-8; "
                        "a serialized HloModuleProto is not read here)") from None


def read_module(path: str) -> Module:
    text, name = read_text(path)
    return parse_module(text, name)


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
