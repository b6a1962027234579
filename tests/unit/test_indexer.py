"""The background search indexer gives way to pushes between batches (it shares the one
writer with them), and a search still gets everything indexed first."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from ctxd.service import indexer as indexer_module
from ctxd.service.indexer import SearchIndexer


class FakeStorage:
    """A writer that 'indexes' one batch per call from ``batches`` (counts), then 0."""

    shared = False

    def __init__(self, batches: list[int]) -> None:
        self.batches = list(batches)
        self.calls = 0
        self.called = asyncio.Event()
        self.during: Callable[[], None] | None = None

    async def write(self, fn: Callable[..., Any], *args: Any) -> int:
        self.calls += 1
        self.called.set()
        if self.during is not None:
            self.during()
        await asyncio.sleep(0)
        return self.batches.pop(0) if self.batches else 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(indexer_module, "time", SimpleNamespace(monotonic=fake.monotonic))  # (not the loop's clock)
    monkeypatch.setattr(indexer_module, "IDLE_SECONDS", 0.01)  # (real seconds slept between looks)
    return fake


async def wait_for_calls(db: FakeStorage, n: int) -> None:
    async def reached() -> None:
        while db.calls < n:
            db.called.clear()
            await db.called.wait()
    await asyncio.wait_for(reached(), 10)


async def test_a_push_during_background_indexing_pauses_it_after_the_batch(clock: Clock) -> None:
    db = FakeStorage([1, 1, 1])
    idx = SearchIndexer(db)  # type: ignore[arg-type]
    idx._last_stored = clock.now - 10  # nothing pushed lately: indexing may start
    # The first batch is being written when a push is stored.
    db.during = lambda: (setattr(db, "during", None), idx.stored(1))
    idx.start()
    try:
        await wait_for_calls(db, 1)
        for _ in range(20):  # the indexer looks again, several times: pushes keep the writer
            await asyncio.sleep(0.01)
        assert db.calls == 1
        clock.now += 10  # pushes paused: the rest is indexed
        await wait_for_calls(db, 4)
        assert db.batches == []
    finally:
        await idx.stop()


async def test_a_search_catches_up_on_everything_at_once(clock: Clock) -> None:
    db = FakeStorage([5, 5, 5])
    idx = SearchIndexer(db)  # type: ignore[arg-type]
    idx.stored(15)  # just pushed: the background indexer would wait
    await idx.catch_up()
    assert db.batches == [] and db.calls == 4
