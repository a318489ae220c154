"""A status line while a pipeline runs, for long runs on a terminal.

A 24-layer model's partition takes tens of seconds; without a sign of life a user cannot
tell slow from stuck.  On a TTY, a pass that runs longer than a second gets a line that
ticks (`[2/3] spmd-partition  4.5 s`) and stays, with its final time, when it ends; short
passes print nothing.  On a pipe or a file nothing is printed (logs stay clean), and
`--quiet` silences it everywhere.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# Seconds a pass runs before its status line appears (tests set it to 0).
SHOW_AFTER = float(os.environ.get("HLO_PASSES_PROGRESS_AFTER", "1.0"))


class Progress:
    def __init__(self, total: int, stream=None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:  # a supervised child writes to its parent's terminal through a pipe
            enabled = self.stream.isatty() or (self.stream is sys.stderr and os.environ.get("HLO_PASSES_STDERR_TTY") == "1")
        self.enabled = enabled
        self.total = total
        self._label = ""
        self._started = 0.0
        self._shown = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pass_started(self, index: int, name: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._label, self._started, self._shown = f"[{index + 1}/{self.total}] {name}", time.monotonic(), False
            if SHOW_AFTER <= 0:  # every pass, from its start
                self._shown = True
                self._write(self._label)
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="hlo-passes-progress", daemon=True)
            self._thread.start()

    def pass_finished(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._shown:
                self._write(f"{self._label}  {time.monotonic() - self._started:.1f} s\n")
            self._label, self._shown = "", False

    def close(self) -> None:
        """Stop ticking; a line left mid-pass (the pass raised) is ended so the error starts
        on a line of its own."""
        self._stop.set()
        with self._lock:
            if self._shown:
                self._write(f"{self._label}  {time.monotonic() - self._started:.1f} s (stopped)\n")
            self._label, self._shown = "", False
        if self._thread is not None:
            self._thread.join(timeout=1)

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                if not self._label:
                    continue
                elapsed = time.monotonic() - self._started
                if elapsed >= SHOW_AFTER:
                    self._shown = True
                    self._write(f"{self._label}  {elapsed:.1f} s")

    def _write(self, text: str) -> None:
        """Rewrite the current line (carriage return, clear to end of line)."""
        try:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop talking to it
            self.enabled = False
