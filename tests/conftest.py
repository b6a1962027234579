"""Fixtures for every suite: a real PostgreSQL server (``tests/pgserver.py``) started once
per test session when its binaries are installed; tests that need it are skipped with
the reason otherwise."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.pgserver import PgServer, find_binaries, missing_reason, start_server, stop_server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server (Unix socket in its temp dir, trust auth), stopped and
    removed at the end of the session; ``pg_server.create_database()`` gives a fresh URL."""
    if find_binaries() is None:
        pytest.skip(missing_reason())
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pytest.skip("psycopg / psycopg_pool not installed: pip install 'ctxd[postgres]'")
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)
