"""The search indexer: messages enter the full-text index in batches, in the background.

Indexing each push in its own transaction cost more than the rest of the push (FTS5's
per-transaction overhead); batching costs a fraction. Indexing waits until pushes pause
(they share the one writer), unless a large backlog builds up, and looks again after
every batch: a push that comes while it works waits for one batch, and the rest waits
for the next pause (run back to back, the 40 batches of a 168 MB push held other
clients' pushes ~80 ms each for 3 s). Searches call :meth:`catch_up` first, so search
results are never behind what was acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ctxd.store.backend import Storage
from ctxd.store.search import index_pending

log = logging.getLogger(__name__)

BATCH = 2000
BATCH_BYTES = 2 * 1024 * 1024
"""...and at most this much stored text per transaction (a large message goes alone), so
a push waiting for the writer never waits long behind indexing."""
IDLE_SECONDS = 0.5
"""Index when no push came for this long (searches catch up first anyway)..."""
MAX_BACKLOG = 50_000
"""...or when this many messages wait, so a search never has a huge backlog to index."""


class SearchIndexer:
    def __init__(self, db: Storage) -> None:
        self.db = db
        self._wake = asyncio.Event()
        self._pending = True  # unknown at start: messages may predate this process
        self._backlog = 0
        self._last_stored = 0.0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.unfinished = 0
        """Message rows of pushes still being written (``ingest.py``, staged pushes): they are
        indexed like any other, and a search drops them (it ranks this many more)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ctxd-search-indexer")
        self._wake.set()

    def stored(self, count: int = 1) -> None:
        """New messages were committed."""
        self._pending = True
        self._backlog += count
        self._last_stored = time.monotonic()
        self._wake.set()

    async def catch_up(self) -> None:
        """Index everything stored so far (a search calls this first). A batch being
        indexed in the background is waited for, not assumed done."""
        async with self._lock:
            if not self._pending and not self.db.shared:  # (shared: other daemons' pushes wait too)
                return
            self._pending = False
            self._backlog = 0
            while await self.db.write(index_pending, BATCH, BATCH_BYTES):
                pass

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while True:
                    await self._pause()
                    if not await self._one_batch():
                        break
            except Exception:  # a failed batch is retried at the next wake or search
                self._pending = True
                log.exception("search indexing failed")

    async def _pause(self) -> None:
        """Pushes and indexing share the one writer: while pushes keep coming, wait."""
        while self._backlog < MAX_BACKLOG:
            idle = time.monotonic() - self._last_stored
            if idle >= IDLE_SECONDS:
                return
            await asyncio.sleep(IDLE_SECONDS - idle)

    async def _one_batch(self) -> bool:
        """Index one batch in the background; whether more may wait."""
        async with self._lock:
            if not self._pending and not self.db.shared:
                return False
            self._pending = False  # (a push stored meanwhile sets it again)
            indexed = await self.db.write(index_pending, BATCH, BATCH_BYTES)
            if indexed:
                self._pending = True
                self._backlog = max(0, self._backlog - indexed)
            else:
                self._backlog = 0
            return bool(indexed)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
