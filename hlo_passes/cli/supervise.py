"""Commands that run XLA, run in a child process: XLA aborting ends with an error, not a core.

XLA stops the whole process when one of its internal checks fails (`CHECK failed`, a
rendezvous that waited too long): SIGABRT, a C++ stack dump and exit status 134, with no
chance for Python to report anything.  It does so on programs it cannot compile or run
itself (the JAX-program fuzzer met a GSPMD propagation check, a CPU emitter check and a
collective rendezvous timeout).  So `verify`, `exec` and `run --verify`, when started from the
command line, run as a child of a small parent that imports nothing heavy.  The child's
output passes through as it comes; XLA's fatal lines and stack dump are held back, and if the
child dies of a signal the parent prints one `error:` line with XLA's own reason and exits 2.
One death is retried: inside XLA's partition of the oracle's global module (`verify` marks that
step, _xla_deaths.py), where the child can judge by the module's manual regions run directly.
Multi-process runs (`--processes`, `--coordinator`) have their own launcher and are left as
they are; `main(argv)` called from Python (tests, scripts) runs in process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile

from hlo_passes import _xla_deaths

SUPERVISED = "HLO_PASSES_SUPERVISED"  # set in the child: run the command itself
STDERR_IS_TTY = "HLO_PASSES_STDERR_TTY"  # the parent's stderr is a terminal (the child's is a pipe)

# The lines XLA and absl write while aborting: `F1126 13:46:27.031659   18113 file.cc:2714] ...`,
# `*** Check failure stack trace: ***`, `    @     0x7f48ca17050f  Symbol`, `*** SIGABRT received`,
# `PC: @ ...`, and Python's faulthandler dump after them.
_FATAL = re.compile(rb"^F\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<where>[^\]]+)\] (?P<what>.*)$")
_DUMP = re.compile(rb"^(\*\*\* |PC: @|\s+@\s|Fatal Python error|Current thread|Thread 0x|\s+File \")")


def needs_supervisor(argv: list[str]) -> bool:
    if os.environ.get(SUPERVISED) == "1":
        return False
    words = [w for w in argv if not w.startswith("-")]
    command = words[0] if words else None
    if any(w in ("--processes", "--coordinator") or w.startswith(("--processes=", "--coordinator="))
           for w in argv):
        return False
    if any(w in ("-h", "--help") for w in argv):
        return False
    return command in ("verify", "exec") or (command == "run" and "--verify" in argv)


def supervise(argv: list[str], child_command: list[str] | None = None) -> int:
    """Run `hlo-passes ARGV` (or `child_command`) as a child; its exit status, or 2 with an
    `error:` line when it dies of a signal.  A child that dies while XLA partitions the
    oracle's global module, or compiles a per-device program in manual mode, runs once more,
    told so (_xla_deaths.py): it judges by the module's manual regions run directly, or runs
    the per-device program as a replica program, instead."""
    from hlo_passes.cli.main import CLOSED_STREAMS, closed_streams

    env = dict(os.environ, **{SUPERVISED: "1", CLOSED_STREAMS: ",".join(closed_streams())})
    if sys.stderr.isatty():
        env[STDERR_IS_TTY] = "1"
    command = child_command or [sys.executable, "-m", "hlo_passes", *argv]
    try:
        handle, phase_file = tempfile.mkstemp(prefix="hlo-passes-phase-")
        os.close(handle)
        env[_xla_deaths.PHASE_FILE] = phase_file
    except OSError:  # no writable temporary directory: no retry, nothing else lost
        phase_file = ""
    try:
        named = _named_descriptors(argv)
        rc, fatal, held = _run_child(command, env, named)
        while rc < 0 and fatal and phase_file:  # each step's retry runs at most once
            variable = _xla_deaths.retry_variable(phase_file, env)
            if variable is None:
                break
            env[variable] = _reason(fatal)
            rc, fatal, held = _run_child(command, env, named)
    except KeyboardInterrupt:  # the child, in the same process group, got it too
        return 130
    finally:
        if phase_file:
            os.unlink(phase_file)
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    if rc >= 0:
        for line in held:
            _write(out, line)
        return rc
    try:
        name = signal.Signals(-rc).name
    except ValueError:  # a number the signal module has no name for
        name = f"signal {-rc}"
    if fatal:
        print(f"error: XLA stopped the process ({name}): {_reason(fatal)}\n(an internal check of XLA failed on this "
              "program: XLA could not compile or run it; not something hlo-passes can report better)", file=sys.stderr)
    elif -rc == signal.SIGKILL:
        print("error: the process was killed (SIGKILL), most likely for lack of memory", file=sys.stderr)
    else:
        print(f"error: the process ended on {name} inside XLA or a library it calls", file=sys.stderr)
    return 2


def _named_descriptors(argv: list[str]) -> tuple[int, ...]:
    """The descriptors above stderr that arguments name (`--save-outputs /dev/fd/3`): the
    child must hold them too, as the command run directly would (a child gets none but the
    standard three unless told)."""
    from hlo_passes.cli.io import descriptor_named

    found = set()
    for word in argv:
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        fd = descriptor_named(value)
        if fd is not None and fd > 2:
            try:
                os.fstat(fd)
            except OSError:
                continue  # not open here: the child reports it as the direct command would
            found.add(fd)
    return tuple(sorted(found))


def _run_child(command: list[str], env: dict[str, str],
               descriptors: tuple[int, ...] = ()) -> tuple[int, list[re.Match], list[bytes]]:
    """Run the child to its end, passing its output through as it comes: its exit status
    (negative: the signal it died of), XLA's fatal lines and what was held back from them on.
    `descriptors`: open descriptors beyond the standard three the child inherits."""
    child = subprocess.Popen(command, stderr=subprocess.PIPE, env=env, pass_fds=descriptors)
    assert child.stderr is not None
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    held: list[bytes] = []  # XLA's dying words, shown only if it did not die after all
    fatal: list[re.Match] = []
    partial = b""
    try:
        while True:
            chunk = os.read(child.stderr.fileno(), 65536)
            if not chunk:
                break
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                _route(line + b"\n", held, fatal, out)
            if partial and not held and not _looks_like_dump(partial):
                _write(out, partial)  # a status line ends in "\r...", without a newline
                partial = b""
        if partial:
            _route(partial, held, fatal, out)
        return child.wait(), fatal, held
    except KeyboardInterrupt:
        child.wait()
        raise


def _reason(fatal: list[re.Match]) -> str:
    """XLA's last fatal line as `what (where)`, bounded."""
    where = fatal[-1].group("where").decode(errors="replace").strip()
    what = fatal[-1].group("what").decode(errors="replace").strip()
    reason = f"{what} ({where})"
    return reason[:400] + "..." if len(reason) > 400 else reason


def _looks_like_dump(line: bytes) -> bool:
    return bool(_FATAL.match(line.rstrip(b"\n")) or _DUMP.match(line))


def _route(line: bytes, held: list[bytes], fatal: list[re.Match], out) -> None:
    match = _FATAL.match(line.rstrip(b"\n"))
    if match:
        fatal.append(match)
    if match or held or _DUMP.match(line):
        held.append(line)  # from XLA's first dying word on, everything waits for the verdict
        return
    _write(out, line)


def _write(out, data: bytes) -> None:
    if out is None:
        sys.stderr.write(data.decode(errors="replace"))
    else:
        out.write(data)
    sys.stderr.flush()
