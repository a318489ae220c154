"""Where XLA died, told by a supervised child to its parent, and what the parent tells a retry.

XLA stops the process when one of its checks fails (cli/supervise.py), and its SPMD partitioner
has such checks that fire on modules it was given to partition: `verify` partitions a global
original with manual regions through XLA to know what it computes, and when XLA dies there the
verdict is lost although another oracle exists (the regions run directly, manual_regions.py).
So the child marks the step it is in, in a file the parent names (`phase`); when the child dies
of a signal inside `PARTITIONING_ORACLE`, the parent runs it once more with `ORACLE_DIED` set to
XLA's reason, and that run judges by the other oracle without asking XLA's partitioner.

The same holds for running a per-device program: the runtime compiles it in XLA's manual mode
(every value `{manual}`, XLA's partitioner asked to leave it alone), and that partitioner has
checks that fire on valid manual code (SPMD fuzz seed 11156: a sort after an all-gather and a
slice, `Check failed: !IsManualLeaf()` in its sort handler).  The same program runs as a
replica program without XLA's partitioner (runtime/per_device.py), so a child that dies inside
`COMPILING_MANUAL` is run once more with `MANUAL_DIED` set, and that run takes the replica
form directly.  `RETRIES` maps each step to the variable its retry sets.

No heavy imports: the parent imports this.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

PHASE_FILE = "HLO_PASSES_PHASE_FILE"  # the parent's file the child writes its step into
ORACLE_DIED = "HLO_PASSES_XLA_DIED_PARTITIONING_ORACLE"  # XLA's reason, for the retry
PARTITIONING_ORACLE = "xla-partitions-the-oracle"
MANUAL_DIED = "HLO_PASSES_XLA_DIED_COMPILING_MANUAL"  # XLA's reason, for the retry
COMPILING_MANUAL = "xla-compiles-a-per-device-program-in-manual-mode"
RETRIES = {PARTITIONING_ORACLE: ORACLE_DIED, COMPILING_MANUAL: MANUAL_DIED}


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the block as step `name` for a parent that asked (PHASE_FILE), cleared when the
    block ends however it ends; a process that dies inside leaves the mark."""
    path = os.environ.get(PHASE_FILE)
    if not path or not _write(path, name):
        yield
        return
    try:
        yield
    finally:
        _write(path, "")


def _write(path: str, text: str) -> bool:
    """The mark written; False where it cannot be (the parent then simply does not retry)."""
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def read_phase(path: str) -> str:
    """The step a dead child was in ('' when none or unreadable)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def oracle_died_reason() -> str | None:
    """XLA's reason when a first try died partitioning the oracle (set by the parent)."""
    return os.environ.get(ORACLE_DIED) or None


def manual_died_reason() -> str | None:
    """XLA's reason when a first try died compiling a per-device program in manual mode."""
    return os.environ.get(MANUAL_DIED) or None


def retry_variable(path: str, env: dict[str, str]) -> str | None:
    """The variable a retry of a child that died in the step `path` names should set: None when
    that step has no retry or its retry already ran."""
    variable = RETRIES.get(read_phase(path))
    return variable if variable is not None and variable not in env else None
