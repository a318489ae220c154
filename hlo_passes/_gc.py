"""The cyclic garbage collector, paused around work that makes many objects and few cycles.

Python's collector runs a collection every few hundred new container objects, and every so
often a full one that walks every object alive.  A pass over a large module makes hundreds
of thousands of small objects (shardings, tile maps, tuples) that reference counting frees,
while the module itself, also alive, is what a full collection spends its time walking.
The parser, the printer and `Module.clone` pause the collector for the same reason.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (unless it was off already).  The switch is
    the process's: with several threads, the first to leave may turn it back on under the
    others, which then only run slower."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
