"""In-process fixtures: a :class:`~ctxd.service.core.Service` on a temporary database
with a collecting event sink, no daemon process and no transport (see
``tests/unit/service_helpers.py`` for building params and waiting for background work)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from ctxd.config import Config, DaemonConfig, StorageConfig
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest) -> str:
    """Each in-process service test runs on both backends: SQLite (``""``: the data
    directory's file) and a fresh database on the test session's PostgreSQL server."""
    if request.param == "sqlite":
        return ""
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture
def service_config(tmp_path: Path, storage_url: str) -> Config:
    """The defaults (extractive summarizer: no network), data under ``tmp_path``."""
    return Config(daemon=DaemonConfig(data_dir=str(tmp_path / "data")), storage=StorageConfig(url=storage_url))


@pytest.fixture
def events() -> CollectingEvents:
    return CollectingEvents()


@pytest_asyncio.fixture
async def service(service_config: Config, events: CollectingEvents) -> AsyncIterator[Service]:
    """An open Service whose notifications go to ``events``; closed after the test."""
    svc = await Service.open(service_config, events=events)
    try:
        yield svc
    finally:
        await svc.close()
