"""One daemon per SQLite data directory (issue 12): a second ``ctxd`` on a data directory
a live daemon uses refuses to start (exit 2, one line naming the directory, the pid and
the socket of the daemon using it) and changes nothing; a daemon killed with SIGKILL
leaves a lock file that does not block the next one; the lock file is 0600 and never
followed through a symbolic link; a daemon started while the holder is stopping waits for
it. On PostgreSQL (several daemons by design) nothing is locked.

Real daemons in subprocesses (tests/e2e/helpers.py), real files.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Daemon, one_line, parse_frames, request_frame, run_ctxd, user

LOCK = "ctxd.db.lock"


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop()


def start(daemon: Daemon, daemons: list[Daemon], *, wait: bool = True) -> Daemon:
    daemons.append(daemon)
    return daemon.start(wait=wait)


def dump(data: Path) -> list[str]:
    """Everything in the database, as SQL (read-only), but the search index's rows: the
    running daemon's indexer writes those in the background, whenever a loaded machine lets
    it (a CI run saw them land after the dump had been the same twice, 0.5 s apart). Its
    schema stays in: a migration would show."""
    conn = sqlite3.connect(f"file:{data / 'ctxd.db'}?mode=ro", uri=True, timeout=30)
    try:
        return [line for line in conn.iterdump() if not line.startswith('INSERT INTO "messages_fts')]
    finally:
        conn.close()


def _indexed(data: Path) -> bool:
    """Whether the search index holds every message (the indexer runs in the background,
    and on a loaded machine it may not have started half a second after the push)."""
    conn = sqlite3.connect(f"file:{data / 'ctxd.db'}?mode=ro", uri=True, timeout=30)
    try:
        messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        indexed = conn.execute("SELECT count(*) FROM messages_fts").fetchone()[0]
        return bool(indexed >= messages)
    finally:
        conn.close()


async def settled(data: Path) -> list[str]:
    """The database once the running daemon's background work (the search index) is done:
    every message indexed, then the same dump twice, half a second apart."""
    last = dump(data)
    for _ in range(120):
        await asyncio.sleep(0.5)
        now = dump(data)
        if now == last and _indexed(data):
            return now
        last = now
    raise AssertionError("the database kept changing")


async def push(daemon: Daemon, session: str, text: str, *, create: bool = False) -> dict:
    client = await daemon.client()
    try:
        if create:
            await client.result("session/create", {"sessionId": session, "model": "m", "contextWindow": 8192})
        return await client.result("session/push", {"sessionId": session, "messages": [user(text)]})
    finally:
        await client.close()


async def test_second_daemon_on_the_data_directory_is_refused(base_dir, daemons):
    data = base_dir / "data"
    first = start(Daemon(data, socket_path=base_dir / "a.sock"), daemons)
    await push(first, "twin2", "A", create=True)
    before = await settled(data)

    other = base_dir / "other.sock"
    result = run_ctxd(["--socket", str(other), "--data-dir", str(data), "--idle-exit", "5"])
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ctxd: ")
    assert str(data) in line and f"pid {first.pid}" in line and str(base_dir / "a.sock") in line, line
    assert f"ctxd-cli --socket {base_dir / 'a.sock'}" in line  # what to do instead
    assert not other.exists()  # it never listened
    assert dump(data) == before  # nor touched the database (no migration, no retention)

    # A stdio daemon (what an agent spawns) is refused the same way, before it answers anything.
    result = run_ctxd(["--data-dir", str(data)], stdin=request_frame(1, "initialize", {"processId": None}))
    assert result.returncode == 2 and result.stdout == b""
    assert f"pid {first.pid}" in one_line(result)
    assert dump(data) == before

    # The first keeps serving, and its memory is still the truth.
    reply = await push(first, "twin2", "C")
    assert reply["messageCount"] == 2 and reply["messages"][0]["seq"] == 2, reply
    client = await first.client()
    try:
        got = await client.result("session/get", {"sessionId": "twin2"})
        history = await client.result("session/history", {"sessionId": "twin2"})
    finally:
        await client.close()
    assert got["messageCount"] == 2, got
    assert [m["seq"] for m in history["messages"]] == [1, 2]


async def test_lock_of_a_killed_daemon_does_not_block(base_dir, daemons):
    data = base_dir / "data"
    first = start(Daemon(data, socket_path=base_dir / "a.sock"), daemons)
    await push(first, "s", "A", create=True)
    first.kill()
    lock = data / LOCK
    assert lock.read_text().split()[0] == str(first.pid)  # left behind, with a dead pid
    second = start(Daemon(data, socket_path=base_dir / "b.sock"), daemons)
    await push(second, "s", "B")
    assert lock.read_text().split()[0] == str(second.pid)
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600


async def test_lock_file_is_private_and_says_who_holds_it(base_dir, daemons):
    data = base_dir / "data"
    data.mkdir(mode=0o700)
    lock = data / LOCK
    lock.write_text("old\n")
    os.chmod(lock, 0o644)  # left by hand, readable by others: made private
    daemon = start(Daemon(data, socket_path=base_dir / "a.sock", tcp=True, umask=0), daemons)
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600
    assert lock.read_text().splitlines() == [str(daemon.pid), "running", f"unix:{base_dir / 'a.sock'}",
                                             f"tcp:127.0.0.1:{daemon.port}"]  # the port bound


def test_lock_file_that_is_a_symlink_is_not_followed(base_dir):
    data = base_dir / "data"
    data.mkdir(mode=0o700)
    victim = base_dir / "precious.txt"
    victim.write_text("precious\n")
    (data / LOCK).symlink_to(victim)
    result = run_ctxd(["--socket", str(base_dir / "a.sock"), "--data-dir", str(data), "--idle-exit", "1"])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data / LOCK) in line and "symbolic link" in line
    assert victim.read_text() == "precious\n"
    assert os.path.islink(data / LOCK)
    assert not (data / "ctxd.db").exists()  # refused before the database was opened


async def test_a_daemon_started_while_the_holder_stops_waits_for_it(base_dir, daemons):
    """The next client's autostart can take the socket a stopping daemon let go of while
    that one still closes the database: the new daemon waits instead of refusing."""
    data = base_dir / "data"
    data.mkdir(mode=0o700)
    lock = data / LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\nstopping\nunix:{base_dir / 'old.sock'}\n".encode())
        daemon = start(Daemon(data, socket_path=base_dir / "a.sock"), daemons, wait=False)
        await asyncio.sleep(1.5)
        assert daemon.proc is not None and daemon.proc.poll() is None, daemon.stderr_text()
        assert not (data / "ctxd.db").exists()
    finally:
        os.close(fd)
    daemon.wait_ready()
    await push(daemon, "s", "A", create=True)


def test_postgres_storage_takes_no_lock(base_dir, pg_server):
    """Several daemons on one PostgreSQL database is the point of it (docs/deployment.md):
    two on the same data directory both start, and nothing is locked there."""
    data = base_dir / "data"
    url = pg_server.create_database()
    procs = []
    try:
        for name in ("a", "b"):
            daemon = Daemon(data, socket_path=base_dir / f"{name}.sock", args=["--set", f"storage.url={url}"])
            procs.append(daemon)
            daemon.start()
        assert not (data / LOCK).exists()
    finally:
        for daemon in procs:
            daemon.stop()


def test_stdio_daemon_after_the_first_exits(base_dir):
    """Editors spawn one stdio daemon after another on the default data directory: each
    one's lock is gone with it, and a daemon that exits removes its lock file."""
    data = base_dir / "data"
    for _ in range(2):
        result = run_ctxd(["--data-dir", str(data)], stdin=request_frame(1, "initialize", {"processId": None}))
        assert "Traceback" not in result.stderr.decode()
        assert [a["id"] for a in parse_frames(result.stdout)] == [1]
        assert sorted(p.name for p in data.iterdir() if not p.name.startswith("ctxd.db-")) == ["ctxd.db"]
