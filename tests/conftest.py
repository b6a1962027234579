"""Fixtures for every suite, and the suite's two parts.

**The two parts.** ``pytest`` alone (README's test command) runs the *fast* part: every
test that runs ctxd inside the test process on SQLite (the engine, the service, the
daemon on a real socket in a thread: ``tests/inprocess.py``, ``ctxd-cli`` through its
``main()``). The *process* part holds what needs other processes: lifecycle, signals
and SIGKILL, stdio, transports, file modes, the proxy and MCP servers, the editors'
clients, another local user's attacks (``tests/hostile``), PostgreSQL, and the tests
marked ``slow``. ``.ci/run`` runs both (``pytest --part process -n 3``).

Which part a test is in follows from where it is and what it uses, never from a list
of names: a test under one of ``PROCESS_DIRS``, using one of ``PROCESS_FIXTURES``,
parametrized on PostgreSQL (``storage_backend``, ``module_backend``, ``storage_url``...)
or marked ``slow`` or ``process``, is in the process part; every other one is fast. A
fast test that starts a ctxd process anyway fails, saying so (``_no_ctxd_process``).
Paths given on the command line run whatever they select (``--part`` narrows them).

A real PostgreSQL server (``tests/pgserver.py``) is started once per test session when
its binaries are installed; tests that need it are skipped with the reason otherwise.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import helpers as e2e_helpers
from tests.pgserver import PgServer, find_binaries, missing_reason, start_server, stop_server

TESTS = Path(__file__).resolve().parent

PROCESS_DIRS = ("e2e", "proxy", "mcp", "clients", "agents", "hostile")
"""``tests/<dir>/``: tests that start ``ctxd`` (stdio, socket, TCP, proxy, MCP), an editor,
an agent CLI or another user's attacker as processes."""

PROCESS_FIXTURES = frozenset({
    "pg_server",        # a PostgreSQL server
    "cli_process",      # tests/cli: ctxd-cli as a subprocess (autostart, signals, the terminal)
    "daemon_factory",   # tests/e2e: socket/TCP daemons as processes
    "stdio_factory",    # tests/e2e: ctxd over stdio
    "shared_lsp",
})
"""Fixtures that start ctxd processes: a test using one is in the process part wherever it is."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--part", choices=("fast", "process", "all"), default=None,
                     help="which part of the suite to run: fast (in process; the default when no path is "
                          "given), process (the tests that start ctxd processes), all")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "process: a test that starts ctxd processes (see tests/conftest.py)")


def is_process_test(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the process part (see the module's docstring)."""
    try:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
    except ValueError:
        parts = ()
    if parts[:1] and parts[0] in PROCESS_DIRS:
        return True
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgresql" in callspec.params.values():
        return True
    return item.get_closest_marker("process") is not None or item.get_closest_marker("slow") is not None


def _part(config: pytest.Config) -> str:
    part = config.getoption("--part")
    if part is not None:
        return part
    return "fast" if config.args_source == pytest.Config.ArgsSource.TESTPATHS else "all"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = _part(config)
    keep, drop = [], []
    for item in items:
        process = is_process_test(item)
        if process:
            item.add_marker(pytest.mark.process)
        (keep if part == "all" or (part == "process") == process else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _looks_like_ctxd(args: Any) -> bool:
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].split(".")[0] == "ctxd":
        return True
    return bool(argv) and Path(argv[0]).name in ("ctxd", "ctxd-cli")


@pytest.fixture(autouse=True)
def _no_ctxd_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fast part, starting ``ctxd``/``ctxd-cli`` as a process is an error that says
    where such a test belongs (it would make the fast part slow without anyone noticing)."""
    if _part(request.config) != "fast":
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if _looks_like_ctxd(args):
            raise AssertionError(
                f"{request.node.nodeid} starts a ctxd process ({args!r}) in the fast part of the suite: "
                "run ctxd in the test process (tests/inprocess.py, the cli fixture), or make it a process "
                "test (a fixture of PROCESS_FIXTURES, a directory of PROCESS_DIRS, or @pytest.mark.process; "
                "tests/conftest.py)")
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


# --- the storage backend ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once per backend: a module opts in with
    ``pytestmark = pytest.mark.usefixtures("storage_backend")`` (its daemons must be
    started by ``stdio_factory``/``daemon_factory``/``Daemon``/``CtxdProc``, which add
    ``storage_args``, and it reads the database through ``helpers.db_query``); a test of the
    SQLite file itself is marked ``@pytest.mark.sqlite_only("why")``.
    On PostgreSQL every daemon of the test gets a fresh database of the session's server."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    only = request.node.get_closest_marker("sqlite_only")
    if only is not None:
        pytest.skip(f"SQLite only: {only.args[0] if only.args else 'a test of the SQLite file'}")
    e2e_helpers.PG_SERVER = request.getfixturevalue("pg_server")
    try:
        yield "postgresql"
    finally:
        e2e_helpers.PG_SERVER = None


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """``storage_backend`` for a module whose daemon is shared by its tests (a module-scoped
    fixture, which takes this one as an argument): the module's tests run once per backend,
    grouped, and every daemon started meanwhile stores where the backend says. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("module_backend")``."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    e2e_helpers.PG_SERVER = request.getfixturevalue("pg_server")
    try:
        yield "postgresql"
    finally:
        e2e_helpers.PG_SERVER = None


@pytest.fixture(autouse=True)
def _sqlite_only(request: pytest.FixtureRequest) -> None:
    """Skip a test marked ``sqlite_only`` in a module run on PostgreSQL by ``module_backend``."""
    only = request.node.get_closest_marker("sqlite_only")
    if only is not None and "module_backend" in request.fixturenames \
            and request.getfixturevalue("module_backend") == "postgresql":
        pytest.skip(f"SQLite only: {only.args[0] if only.args else 'a test of the SQLite file'}")


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
