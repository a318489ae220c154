"""Reading inputs and writing outputs for the CLI.

Inputs are read with explicit bounds: at most `MAX_INPUT_BYTES`, and a NUL byte or bytes that
are not UTF-8 stop the read at once (so `fmt /dev/zero` or a binary file ends with an error,
not with the machine's memory).

Outputs are written only after the command succeeded, and never damage what is at the path:

* a new file, or a regular file with one link, gets a temporary file in the same directory
  renamed over it (atomic), with the old file's mode (and, where allowed, owner);
* a regular file with several hard links is rewritten in place, so every name sees the new
  text (a rename would leave the other names on the old inode);
* a symlink is followed: its target is written by these rules and the link stays a link;
* a FIFO, a character or block device (`-o /dev/null`) is written through, never replaced by
  a regular file;
* `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and `/proc/self/fd/N` (or a symlink to one) name a
  descriptor this process already has open: the data is written to that descriptor, where it
  stands (`-o /dev/stdout >> log` appends, a pipe works), never to a file found behind it;
* a read-only file (no write permission bit, even for root), a directory, a dangling symlink
  and an empty name are refused with an error;
* a file this command read as an input (the same inode, whatever the name) is refused, so
  that `-o IN`, `--report IN` or a dump named like an input never turns the input into
  something else (`fmt --in-place` asks for it explicitly);
* where `regular_only` is asked for (files the command names itself, as in `run --dump-dir`)
  a FIFO, device or socket is refused rather than written to (a FIFO would block).

Standard input or output that the shell closed (`<&-`, `>&-`) is an error, not a traceback
and not output silently lost (`guard_standard_streams` in main.py).
"""

from __future__ import annotations

import codecs
import io
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, TextIO

from hlo_passes.cli.main import UserError
from hlo_passes.ir.module import Module
from hlo_passes.parse.module_parser import parse_module

# The largest input read (text or stdin).  A real training-step dump is tens of MB; parsing
# needs 4-9x the text in memory, so a 1 GiB file is already a big machine's worth.
MAX_INPUT_BYTES = 1 << 30
_CHUNK = 1 << 20


def add_dump_arguments(p, *, stages: int = 1) -> None:
    """`--module` / `--stage` for inputs that are XLA dump directories."""
    p.add_argument("--module", metavar="NAME|NUM", help="module of an XLA dump directory (see `hlo-passes list`)")
    what = "STAGE" if stages == 1 else "STAGE[,STAGE]"
    p.add_argument("--stage", metavar=what,
                   help="stage of a dump directory's module: before_optimizations (default), "
                        "after_optimizations, a pass dump's number (0004), after_PASS or before_PASS"
                   + ("; two stages compare one module's stages (one directory argument)" if stages > 1 else ""))


# (st_dev, st_ino) of every file this command read: outputs may not replace them.
_inputs_read: set[tuple[int, int]] = set()


def note_input(path_or_fd: str | os.PathLike | int) -> None:
    """Remember a file the command reads, so that no output is written over it."""
    try:
        st = os.fstat(path_or_fd) if isinstance(path_or_fd, int) else os.stat(path_or_fd)
    except OSError:
        return  # reading it will say what is wrong
    if stat.S_ISREG(st.st_mode):
        _inputs_read.add((st.st_dev, st.st_ino))


def forget_inputs() -> None:
    """A new command starts (main() may run several in one process, e.g. in tests)."""
    _inputs_read.clear()


def read_bounded(stream, name: str, limit: int | None = None) -> str:
    """The UTF-8 text of a binary `stream`, read in chunks: at most `limit` bytes, and an error
    at the first NUL or non-UTF-8 byte (HLO text has neither) before the rest is read."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts: list[str] = []
    total = 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        nul = chunk.find(b"\0")
        if nul >= 0:
            raise UserError(f"{name}: not HLO text (byte {total + nul} is NUL)")
        try:
            parts.append(decoder.decode(chunk))
        except UnicodeDecodeError as e:
            raise UserError(f"{name}: not HLO text (byte {total + e.start} is not UTF-8; a serialized "
                            "HloModuleProto is read from a file named *.pb)") from None
        total += len(chunk)
        if total > limit:
            raise UserError(f"{name}: larger than the {limit >> 20} MiB an input may have")
    try:
        parts.append(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        raise UserError(f"{name}: not HLO text (it ends inside a UTF-8 character)") from None
    return "".join(parts)


def _read_bounded_text(stream, name: str) -> str:
    """`read_bounded` for a text stream without a binary buffer (a StringIO standing in for stdin)."""
    parts, total = [], 0
    while chunk := stream.read(_CHUNK):
        if "\0" in chunk:
            raise UserError(f"{name}: not HLO text (character {total + chunk.index(chr(0))} is NUL)")
        parts.append(chunk)
        total += len(chunk)
        if total > MAX_INPUT_BYTES:
            raise UserError(f"{name}: larger than the {MAX_INPUT_BYTES >> 20} MiB an input may have")
    return "".join(parts)


def read_text(path: str, module: str | None = None, stage: str | None = None) -> tuple[str, str]:
    """(text, display name) of a file, '-' for standard input, a binary HLO proto (`.pb`), or
    one stage of one module of an XLA dump directory."""
    if path == "":
        raise UserError("an input file name is empty")
    if path == "-":
        if sys.stdin is None:
            raise UserError("standard input is closed (nothing to read for -)")
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            try:
                note_input(sys.stdin.fileno())  # `- < IN.hlo`: IN.hlo is an input too
            except (OSError, ValueError, io.UnsupportedOperation):
                pass
        return (read_bounded(stream, "<stdin>") if stream is not None
                else _read_bounded_text(sys.stdin, "<stdin>")), "<stdin>"
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file")
    if not p.is_dir() and not p.name.endswith(".pb") and module is None and stage is None:
        note_input(path)
        with open(p, "rb") as f:  # plain text: no need for the dump-directory machinery
            return read_bounded(f, path), path
    # deferred: only dump directories and .pb files need it; `fmt FILE` starts without it
    from hlo_passes.dump_dir import DumpDirectory, DumpError, proto_file_text

    try:
        if p.is_dir():
            found = DumpDirectory(p).find(module, stage)
            note_input(found.path)
            print(f"hlo-passes: reading {found.path}", file=sys.stderr)
            return found.read_text(), str(found.path)
        if module is not None or stage is not None:
            raise UserError(f"{path}: --module and --stage select from an XLA dump directory, not a file")
        if p.name.endswith(".pb"):
            note_input(path)
            return proto_file_text(p), path
    except DumpError as e:
        raise UserError(str(e)) from None
    note_input(path)
    with open(p, "rb") as f:
        return read_bounded(f, path), path


def read_module(path: str, module: str | None = None, stage: str | None = None) -> Module:
    text, name = read_text(path, module, stage)
    return parse_module(text, name)


def two_modules(first: str, second: str | None, module: str | None, stages: str | None,
                default_stages: tuple[str, str]):
    """The two modules of a two-input command: two files, two dump directories, or one dump
    directory and two stages (`--stage A,B`, default `default_stages`).  Returns
    [(Module, display name), (Module, display name)]."""
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


# What writes a text (or bytes) to a stream, for outputs too big to hold whole.
TextWriter = Callable[[TextIO], None]
BytesWriter = Callable[[BinaryIO], None]


def write_text(path: str, text: str | TextWriter, *, in_place: bool = False, regular_only: bool = False) -> None:
    """Write `text` to `path` ('-' is stdout) without damaging what is there (module docstring).

    `text` may be a function that writes the text to a stream.  Where the path is replaced
    through a temporary file (a new file, or a regular file with one link: the usual case) it
    writes into that file as it goes, and the text is never held whole; elsewhere (stdout, a
    FIFO or device, a file with several links) the text is made in memory first, so that
    nothing is written unless it is complete.  `in_place`: `path` is the input, rewritten on
    purpose; `regular_only`: refuse a FIFO or device at `path` (see `write_bytes`)."""
    if path == "-" or descriptor_named(path) == 1:
        if not isinstance(text, str):
            made = io.StringIO()
            text(made)
            text = made.getvalue()
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_bytes(path, text.encode() if isinstance(text, str) else _utf8(text),
                in_place=in_place, regular_only=regular_only)


def _utf8(write: TextWriter) -> BytesWriter:
    def write_bytes_to(f: BinaryIO) -> None:
        stream = io.TextIOWrapper(f, encoding="utf-8", newline="")  # (no newline translation)
        write(stream)
        stream.flush()
        stream.detach()  # `f` stays open: its owner closes it

    return write_bytes_to


def _complete(data: bytes | BytesWriter) -> bytes:
    if isinstance(data, bytes):
        return data
    made = io.BytesIO()
    data(made)
    return made.getvalue()


# /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, /proc/<this pid>/fd/N.
_DESCRIPTOR_NAME = re.compile(r"/dev/(?P<std>stdin|stdout|stderr)|/(?:dev|proc/(?P<pid>self|thread-self|\d+))/fd/(?P<fd>\d+)")


def descriptor_named(path: str) -> int | None:
    """The descriptor `path` names, if it is one of this process's open descriptors' names
    (or a chain of symlinks reaching one).  Such a name must not be resolved to a path: it
    leads to the file the descriptor was opened on (replaced whole, losing `>>`), or to
    nothing at all for a pipe ("pipe:[1234]")."""
    name = os.path.abspath(path)
    for _ in range(40):  # (the kernel's own limit on symlinks followed)
        m = _DESCRIPTOR_NAME.fullmatch(name)
        if m and m["std"]:
            return ("stdin", "stdout", "stderr").index(m["std"])
        if m and m["pid"] in (None, "self", "thread-self", str(os.getpid())):
            return int(m["fd"])
        try:
            link = os.readlink(name)
        except OSError:
            return None
        name = os.path.normpath(os.path.join(os.path.dirname(name), link))
    return None


def _write_descriptor(path: str, fd: int, data: bytes | BytesWriter) -> None:
    """Write complete `data` to the open descriptor `fd`, where it stands (no truncation)."""
    data = _complete(data)
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    if stream is not None:
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # a ClosedStream, or a StringIO standing in for it
            stream.write(data.decode("utf-8", errors="replace"))
            stream.flush()
            return
        stream.flush()
        buffer.write(data)
        buffer.flush()
        return
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    except OSError as e:
        raise UserError(f"{path}: cannot write to descriptor {fd} ({e.strerror or e})") from None


def write_bytes(path: str, data: bytes | BytesWriter, *, in_place: bool = False,
                regular_only: bool = False) -> None:
    """Write `data` (or what the function `data` writes) to the file `path` by the rules of
    the module docstring ('-' and /dev/stdout are standard output).  A file the command read
    is refused unless `in_place`; with `regular_only` anything but a regular file (or a new
    name) is refused: a name the command made up itself (a dump) must not block on a FIFO."""
    if path == "":
        raise UserError("the output file name is empty (use - for standard output)")
    fd = 1 if path == "-" else descriptor_named(path)
    if fd is not None and not regular_only:
        _write_descriptor(path, fd, data)
        return
    target = path
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(target)
        except FileNotFoundError:
            raise UserError(f"{path}: a symbolic link to nothing (its target does not exist)") from None
        except OSError as e:
            raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
        target = os.path.realpath(target)
    if st is not None and not in_place and (st.st_dev, st.st_ino) in _inputs_read and stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: is an input of this command; not writing over it")
    try:
        if st is None:
            _replace_atomically(target, data, None)
        elif stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: is a directory")
        elif not stat.S_ISREG(st.st_mode):  # FIFO, device, socket: write to what is there
            if regular_only:
                raise UserError(f"{path}: not a regular file (a FIFO, device or socket); not writing to it")
            _write_through(target, data, truncate=False)
        elif not st.st_mode & 0o222 or not os.access(target, os.W_OK):
            raise UserError(f"{path}: the file is read-only; not replacing it")
        elif st.st_nlink > 1:
            _write_through(target, data, truncate=True)
        else:
            _replace_atomically(target, data, st)
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None


def _write_through(path: str, data: bytes | BytesWriter, *, truncate: bool) -> None:
    """Write into the existing file: no new inode, no creation (O_CREAT is not given).  The
    data is complete before the file is opened (truncated)."""
    data = _complete(data)
    flags = os.O_WRONLY | (os.O_TRUNC if truncate else 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _replace_atomically(path: str, data: bytes | BytesWriter, old: os.stat_result | None) -> None:
    """A temporary file in the target's directory, renamed over it; the old file's mode (and
    owner, where allowed) carry over.  A directory we may not create files in, holding a file
    we may write, gets the file rewritten in place instead."""
    target = Path(path)
    if old is None:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except PermissionError:
        if old is None:
            raise
        _write_through(path, data, truncate=True)
        return
    try:
        # mkstemp makes the file private (0600): a new file gets the usual mode, an old one its own.
        os.fchmod(fd, stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask())
        if old is not None and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.fchown(fd, old.st_uid, old.st_gid)
            except PermissionError:
                pass
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)  # straight into the temporary file: renamed only once complete
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
