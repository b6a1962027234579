"""The service: what every request handler talks to.

It owns the database, the per-session state cache and the event sink. The operations
are functions of a Service, each in the module named after it (``sessions.py``,
``ingest.py``, ``prompt.py``, ``stats.py``), so handlers read as "decode, call, return".
"""

from __future__ import annotations

import time

from ctxd import __version__
from ctxd.config import Config
from ctxd.service.events import EventSink, NullEvents
from ctxd.service.state import SessionCache
from ctxd.store.db import Database


class Service:
    def __init__(self, config: Config, db: Database, events: EventSink | None = None) -> None:
        self.config = config
        self.db = db
        self.events: EventSink = events or NullEvents()
        self.cache = SessionCache(db, config)
        self.started = time.time()
        self.version = __version__

    @classmethod
    async def open(cls, config: Config, events: EventSink | None = None) -> "Service":
        db = Database(config.database_path, durability=config.storage.durability,
                      busy_timeout_ms=config.storage.busy_timeout_ms)
        await db.open()
        return cls(config, db, events)

    async def close(self) -> None:
        await self.db.close()
