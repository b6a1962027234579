"""The interpreter settings of a process that runs the daemon: ``ctxd`` itself, and
``ctxd proxy`` when it serves the daemon in its own process."""

from __future__ import annotations

import gc
import sys

GC_THRESHOLDS = (10_000, 10, 10)
"""The cyclic garbage collector's thresholds in the daemon (Python's are 700, 10, 10). A
push allocates thousands of objects, most freed by their reference counts within the
request; collecting every 700 allocations scanned them (and the cached messages they were
promoted beside) several times per push: ~5 of the ~65 µs of CPU a batch-pushed message
cost (docs/performance.md, "Spine results"). What start-up imported is frozen out of
every collection (``gc.freeze``): it lives as long as the process."""

SWITCH_INTERVAL_SECONDS = 0.001
"""How long a thread waiting for the interpreter lock waits before asking its holder to
let go (Python's default is 5 ms). The daemon's event loop and its SQLite threads give
the lock up at every system call and statement and must win it back each time: while
threads decode and prepare a 168 MB push, a small push waited up to 5 ms per hop,
hundreds of ms in all (docs/performance.md, "Fairness benchmark")."""


def tune_for_daemon() -> None:
    """Apply :data:`SWITCH_INTERVAL_SECONDS` and :data:`GC_THRESHOLDS`, once start-up has
    imported what the process needs (it is frozen out of every collection)."""
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
