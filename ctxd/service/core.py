"""The service: what every request handler talks to.

It owns the storage (``store/backend.py``: SQLite or PostgreSQL), the per-session state
cache and the event sink. The operations are functions of a Service, each in the module
named after it (``sessions.py``, ``ingest.py``, ``prompt.py``, ``stats.py``), so handlers
read as "decode, call, return".
"""

from __future__ import annotations

import asyncio
import time

from ctxd import __version__
from ctxd.config import Config
from ctxd.service.events import EventSink, NullEvents
from ctxd.service.indexer import SearchIndexer
from ctxd.service.relay import RelayedEvents, resync_later
from ctxd.service.state import SessionCache
from ctxd.service.summarizers import Summarizers
from ctxd.store.backend import Storage, open_storage


class Service:
    def __init__(self, config: Config, db: Storage, events: EventSink | None = None) -> None:
        self.config = config
        self.db = db
        self.events: EventSink = events or NullEvents()
        self.relay: RelayedEvents | None = None
        if db.shared:  # other daemons' clients hear about this one's changes, and back
            self.events = self.relay = RelayedEvents(self.events, db)
        self.cache = SessionCache(db, config)
        self.summarizers = Summarizers(config)
        self.tasks: set[asyncio.Task[object]] = set()
        self.indexer = SearchIndexer(db)
        self.importing: set[str] = set()  # sessions a staged import is writing now (service/transfer.py)
        self.started = time.time()
        self.version = __version__

    @classmethod
    async def open(cls, config: Config, events: EventSink | None = None) -> Service:
        s = config.storage
        db = open_storage(s.url, sqlite_path=config.database_path, durability=s.durability,
                          busy_timeout_ms=s.busy_timeout_ms, password_file=s.password_file, pool_size=s.pool_size)
        await db.open()
        try:
            service = cls(config, db, events)
        except BaseException:  # e.g. a bad summarizer key file: the open database must not outlive it
            await db.close()
            raise
        if service.relay is not None:
            await db.subscribe(service.relay.received, resync=resync_later(service))
        service.indexer.start()
        return service

    async def close(self) -> None:
        """Stop background compressions (their work is not stored half-done), then storage."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.indexer.stop()
        await self.summarizers.aclose()
        await self.db.close()
