"""Fixtures of the end-to-end suite: pytest-lsp clients over stdio, and socket/TCP
daemons that are always stopped (and their directories removed) after the test."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.e2e.helpers import CTXD, Daemon, daemon_env, short_dir, storage_args
from tests.e2e.lsp import finish_client, initialize, make_client

# --- pytest-lsp over stdio ------------------------------------------------------------


StdioFactory = Callable[..., Any]


@pytest_asyncio.fixture
async def stdio_factory(tmp_path: Path) -> AsyncIterator[StdioFactory]:
    """``await stdio_factory(*extra_args)``: a pytest-lsp client connected to a fresh
    ``ctxd`` over stdio (data dir under tmp_path), not yet initialized."""
    clients: list[LanguageClient] = []

    async def start(*args: str, data_dir: Path | None = None, env: dict[str, str] | None = None) -> LanguageClient:
        directory = data_dir or tmp_path / f"data{len(clients)}"
        config = ClientServerConfig(server_command=[*CTXD, "--data-dir", str(directory), *storage_args(directory),
                                                    *args],
                                    client_factory=make_client, server_env=env or daemon_env())
        client = await config.start()
        client.data_dir = directory  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield start
    for client in clients:
        await finish_client(client)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["sqlite", "postgresql"])
async def shared_lsp(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LanguageClient]:
    """An initialized pytest-lsp client on one stdio daemon shared by a whole module
    (whose tests run in the module's event loop and use their own session ids), once per
    storage backend (on PostgreSQL, a fresh database of the session's server)."""
    directory = tmp_path_factory.mktemp("shared") / "data"
    storage = [] if request.param == "sqlite" else storage_args(directory, request.getfixturevalue("pg_server"))
    config = ClientServerConfig(server_command=[*CTXD, "--data-dir", str(directory), *storage],
                                client_factory=make_client, server_env=daemon_env())
    client = await config.start()
    client.data_dir = directory  # type: ignore[attr-defined]
    await initialize(client)
    yield client
    await finish_client(client)


# --- socket and TCP daemons -------------------------------------------------------------


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A short directory (socket paths must stay under 107 bytes), removed afterwards."""
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


DaemonFactory = Callable[..., Daemon]


@pytest.fixture
def daemon_factory(base_dir: Path) -> Iterator[DaemonFactory]:
    """``daemon_factory(socket=True, tcp=False, args=[...])``: a started daemon in
    ``base_dir``; every one is stopped after the test."""
    daemons: list[Daemon] = []

    def make(*, socket: bool = True, tcp: bool = False, args: list[str] | None = None, name: str = "",
             data_dir: Path | None = None, start: bool = True, **kwargs: Any) -> Daemon:
        tag = name or str(len(daemons))
        daemon = Daemon(data_dir or base_dir / f"data{tag}",
                        socket_path=base_dir / f"run{tag}" / "ctxd.sock" if socket else None,
                        tcp=tcp, args=args,
                        token_file=base_dir / f"state{tag}" / "tcp-token" if tcp else None, **kwargs)
        daemons.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in daemons:
        daemon.stop()


@pytest.fixture
def daemon(daemon_factory: DaemonFactory) -> Daemon:
    """A socket daemon with default settings."""
    return daemon_factory()
