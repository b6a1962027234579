"""Shared by the tests of staged writes (``test_staged_push.py``, ``test_staged_import.py``):
on SQLite a large push or import writes its rows in several transactions."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ctxd.config import Config, DaemonConfig
from ctxd.doctor.check import check
from ctxd.protocol.errors import CtxdError
from ctxd.service import ingest
from ctxd.service.core import Service
from ctxd.store import messages as message_store


def hook_chunks(svc: Service, monkeypatch: pytest.MonkeyPatch, after: int,
                action: Callable[[], Awaitable[None]] | None = None) -> list[int]:
    """Run ``action`` once, right after the ``after``-th staged row transaction committed
    (and before the next one). The sizes of the transactions, as they are written."""
    real = svc.db.write
    chunks: list[int] = []

    async def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = await real(fn, *args, **kwargs)
        if fn is ingest._stage_rows:
            chunks.append(len(args[1]))
            if len(chunks) == after and action is not None:
                await action()
        return result

    monkeypatch.setattr(svc.db, "write", write)
    return chunks


def snapshot(path: Path, to: Path) -> None:
    """What a SIGKILL leaves on disk: every committed transaction, nothing else."""
    to.parent.mkdir(parents=True)
    src, dst = sqlite3.connect(path), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def failing_stages(svc: Service, monkeypatch: pytest.MonkeyPatch, at: int, cleanup_failures: int) -> dict[str, int]:
    """The ``at``-th staged row transaction fails ("disk full (simulated)"), and so do the
    next ``cleanup_failures`` clean-ups after a failure ("still full (simulated)"). The
    counts (``n``: staged transactions so far), for the test to reset between attempts."""
    real = svc.db.write
    calls = {"n": 0, "cleanup_failures": cleanup_failures}

    async def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is ingest._stage_rows:
            calls["n"] += 1
            if calls["n"] == at:
                raise CtxdError(-32000, "disk full (simulated)")
        if fn is message_store.drop_unfinished and calls["cleanup_failures"] > 0:
            calls["cleanup_failures"] -= 1
            raise CtxdError(-32000, "still full (simulated)")
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(svc.db, "write", write)
    return calls


@contextlib.asynccontextmanager
async def restarted(path: Path) -> AsyncIterator[Service]:
    """The service opened again on the database at ``path`` (which removes what unfinished
    writes left, before anything else); closed on leaving, and the file then clean for
    ``ctxd-cli doctor`` (no unfinished write noted)."""
    svc = await Service.open(Config(daemon=DaemonConfig(data_dir=str(path.parent))))
    try:
        yield svc
    finally:
        await svc.close()
    final = check(path)
    assert final.ok and not any("unfinished" in n for n in final.notes), (final.problems, final.notes)


def written_jobs(svc: Service, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every job given to the writer from now on, in order."""
    real = svc.db.write
    jobs: list[Any] = []

    async def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(svc.db, "write", write)
    return jobs
