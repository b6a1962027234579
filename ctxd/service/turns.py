"""Heavy work in threads steps aside while other clients' small requests run.

Python runs one thread at a time (the interpreter lock). A thread decoding, validating
or encoding a 168 MB push holds that lock for a few milliseconds at a stretch, and a
small request of another client needs it many times on its way through the event loop
and the writer thread (each SQLite statement gives it up and takes it back): every
hand-over waited for the heavy thread's current stretch, and a one-message push that
takes 1 ms alone took 30-40 ms, so a client pushing every 10 ms fell further behind
for as long as the heavy work lasted (docs/performance.md, "Fairness benchmark").

So the connections count the requests they are running (:meth:`Turns.begin`,
:meth:`Turns.end`), a request that starts heavy work says so (:meth:`Turns.mark_heavy`),
and heavy work in a thread calls :meth:`Turns.step_aside` between its pieces: while a
request that is not heavy and started less than ``YOUNG_SECONDS`` ago is running, the
thread waits (without the lock) for it to finish. A request running longer than that
(waiting for an LLM, for a lock the heavy work holds) no longer holds the heavy work up:
each request can cost it at most ``YOUNG_SECONDS``. Work that holds the lock most of the
time (a large body's decode, a push's validation) also rests while other clients are
active (:meth:`Turns.step_aside_and_rest`), so that the loop gets the CPU to read their
next requests on a machine whose other processes take a core.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Hashable

YOUNG_SECONDS = 0.05
"""How long a running request is waited for; a small request takes a few ms."""
ACTIVE_SECONDS = 0.2
"""Other clients count as active for this long after one of their requests began."""
MAX_REST_SECONDS = 0.02
MAX_WAIT_SECONDS = 0.1
"""The longest one :meth:`Turns.step_aside` waits: small requests arriving back to back
(each young for ``YOUNG_SECONDS``) would otherwise keep heavy work from ever going on."""

_current: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("ctxd_request", default=None)


class Turns:
    """The requests running now, seen from heavy work in other threads."""

    def __init__(self, young_seconds: float = YOUNG_SECONDS, max_wait_seconds: float = MAX_WAIT_SECONDS) -> None:
        self.young_seconds = young_seconds
        self.max_wait_seconds = max_wait_seconds
        self._cond = threading.Condition(threading.Lock())
        self._light: dict[Hashable, float] = {}
        self.waits = 0
        """How many times :meth:`step_aside` waited (for tests and logs)."""
        self.rests = 0
        """How many times :meth:`step_aside_and_rest` rested."""
        self.last_begin = -1e9
        """When the last request began (``time.monotonic``)."""
        self._local = threading.local()

    def begin(self, key: Hashable) -> contextvars.Context:
        """A request started (on the event loop, before its handler runs). Create its task
        in the context returned (``context.run``): there ``key`` is the current request,
        for :meth:`mark_heavy`."""
        context = contextvars.copy_context()
        context.run(_current.set, key)
        with self._cond:
            self._light[key] = self.last_begin = time.monotonic()
        return context

    def end(self, key: Hashable) -> None:
        """The request was answered, however it ended."""
        with self._cond:
            if self._light.pop(key, None) is not None:
                self._cond.notify_all()

    def step_aside_and_rest(self) -> float:
        """:meth:`step_aside`, then, if a request began in the last ``ACTIVE_SECONDS``, sleep
        as long as this thread worked since its last call (at most ``MAX_REST_SECONDS``):
        half the CPU while other clients are active. Stepping aside only waits for requests
        the loop already read; on a machine whose other processes take a core, the heavy
        thread's own CPU delays the loop from reading the next one (the first 1-2 s of a
        168 MB push, its decode and validation). For those phases only: counting releases
        the lock and would take twice as long. Seconds waited and rested."""
        waited = self.step_aside()
        now = time.monotonic()
        since = getattr(self._local, "since", None)
        rested = 0.0
        if since is not None and now - self.last_begin < ACTIVE_SECONDS:
            rested = min(MAX_REST_SECONDS, now - since - waited)
            if rested > 0:
                self.rests += 1
                time.sleep(rested)
            else:
                rested = 0.0
        self._local.since = time.monotonic()
        return waited + rested

    def mark_heavy(self) -> None:
        """The current request (its task's) starts heavy work: nobody waits for it."""
        key = _current.get()
        if key is not None:
            self.end(key)

    def running(self) -> int:
        """Requests running that heavy work would wait for now."""
        with self._cond:
            return len(self._young(time.monotonic()))

    def _young(self, now: float) -> list[float]:
        limit = now - self.young_seconds
        return [started for started in self._light.values() if started > limit]

    def step_aside(self) -> float:
        """From heavy work in a thread, between two pieces of it: wait while small requests
        are running (each at most until it is ``young_seconds`` old, all of them at most
        ``max_wait_seconds``). Seconds waited."""
        began = now = time.monotonic()
        deadline = began + self.max_wait_seconds
        with self._cond:
            young = self._young(now)
            if not young:
                return 0.0
            self.waits += 1
            while young and now < deadline:
                self._cond.wait(min(min(young) + self.young_seconds, deadline) - now)
                now = time.monotonic()
                young = self._young(now)
        return now - began


TURNS = Turns()
"""The daemon's (one per process: requests of every connection count)."""
