"""Running a command on several JAX processes: `--processes P` on one machine, or one process
per host with `--coordinator HOST:PORT --num-processes P --process-id I`.

The local launcher starts P copies of the same command line, each joined to the others
through JAX's distributed runtime (`jax.distributed`, CPU collectives over gloo) with
devices/P CPU devices of its own — the same code path as one process per GPU host.  Every
process computes the same verdict (outputs are all-gathered); process 0 prints it, and the
launcher exits with process 0's status after checking that every process agrees.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from hlo_passes.cli.main import UserError



def add_process_arguments(p) -> None:
    p.add_argument("--processes", type=int, metavar="P",
                   help="run on P local processes joined by jax.distributed (CPU collectives over gloo), "
                        "each with devices/P devices")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="join a multi-process run (one process per host): the coordinator's address "
                        "(process 0 listens there)")
    p.add_argument("--num-processes", type=int, metavar="P", help="with --coordinator: how many processes")
    p.add_argument("--process-id", type=int, metavar="I", help="with --coordinator: this process's index")


def check_process_arguments(args) -> None:
    if args.processes is not None and args.processes < 1:
        raise UserError(f"--processes must be at least 1, got {args.processes}")
    joined = (args.coordinator, args.num_processes, args.process_id)
    if any(x is not None for x in joined) and any(x is None for x in joined):
        raise UserError("--coordinator, --num-processes and --process-id go together")
    if args.coordinator is not None:
        if args.processes is not None:
            raise UserError("--processes launches local processes; --coordinator joins one: pick one")
        if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
            raise UserError(f"--process-id must be in [0, {args.num_processes}) and --num-processes >= 1")


def local_device_count(total: int, processes: int) -> int:
    if total % processes:
        raise UserError(f"{total} devices do not split evenly over {processes} processes")
    return total // processes


def join(args, total_devices: int) -> None:
    """This process joins the multi-process run described by args (--coordinator ...)."""
    from hlo_passes.runtime.xla_backend import BackendUnavailable, init_distributed  # deferred: numpy, jax

    _keep_stdout_for_python()
    try:
        init_distributed(args.coordinator, args.num_processes, args.process_id,
                         local_device_count(total_devices, args.num_processes), getattr(args, "platform", None))
    except BackendUnavailable as e:
        raise UserError(str(e)) from None
    except RuntimeError as e:  # jax.distributed could not reach the coordinator
        raise UserError(f"cannot join the run at {args.coordinator}: {str(e).splitlines()[0]}") from None


def _keep_stdout_for_python() -> None:
    """gloo prints its connection progress to the C++ stdout of every rank, from several
    threads at once; the report must stay readable.  Python's stdout moves to a copy of file
    descriptor 1, and descriptor 1 itself (what C++ writes to) to /dev/null."""
    sys.stdout.flush()
    python_stdout = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = os.fdopen(python_stdout, "w", buffering=1)


def launch(argv: list[str], processes: int, timeout: float | None = None) -> int:
    """Run `hlo-passes ARGV` on `processes` local processes (see the module docstring)."""
    port = _free_port()
    base = [sys.executable, "-m", "hlo_passes", *_without_processes(argv)]
    env = dict(os.environ)
    children = [subprocess.Popen(base + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
                                         "--process-id", str(i)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for i in range(processes)]
    results = []
    try:
        for child in children:
            out, err = child.communicate(timeout=timeout)
            results.append((child.returncode, out, err))
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        raise UserError(f"the {processes} processes did not finish within {timeout:.0f} s") from None
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    (rc, out, err), rest = results[0], results[1:]
    sys.stdout.write(out)
    sys.stderr.write(err)
    for i, (other_rc, _, other_err) in enumerate(rest, 1):
        if other_rc != rc:
            sys.stderr.write(f"hlo-passes: process {i} exited {other_rc}, process 0 exited {rc}:\n{other_err}")
            return max(rc, other_rc, 2) if rc == 0 else rc
    return rc


def check_timeout(seconds: float | None) -> None:
    """--timeout must be a finite positive number of seconds that a timer can wait: `inf` or
    1e300 overflow the timer (in its thread, after the run has started), `nan` never expires."""
    import threading

    if seconds is not None and not 0 < seconds <= threading.TIMEOUT_MAX:  # (also NaN)
        raise UserError(f"--timeout must be a positive number of seconds (at most {threading.TIMEOUT_MAX:g}), "
                        f"got {seconds}")


def start_watchdog(seconds: float | None, what: str) -> None:
    """End the process with exit 2 and a clear message after `seconds`: XLA runs a program
    in C++, where a module that loops forever cannot be interrupted any other way."""
    if seconds is None:
        return
    check_timeout(seconds)
    import threading

    def expire() -> None:
        sys.stderr.write(f"error: {what} did not finish within {seconds:g} s (--timeout)\n")
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _without_processes(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--processes":
            skip = True
            continue
        if a.startswith("--processes="):
            continue
        out.append(a)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
