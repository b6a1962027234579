"""``ctxd-cli migrate --to postgresql://...``: a SQLite database copied into a real
PostgreSQL (tests/conftest.py), verified, and then served by a daemon on PostgreSQL as
it was on SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ctxd.config import Config, DaemonConfig, StorageConfig
from ctxd.protocol.methods import METHODS
from ctxd.service import history, ingest, sessions, snapshots
from ctxd.service.core import Service


def _params(method: str, **raw: Any) -> Any:
    return msgspec.convert(raw, METHODS[method].params)


async def _fill(config: Config) -> dict[str, Any]:
    svc = await Service.open(config)
    try:
        for sid in ("m1", "m2"):
            await sessions.create_session(svc, _params("session/create", sessionId=sid, contextWindow=1_000_000,
                                                       tags=["moved"], title=f"title {sid}"))
            for i in range(5):
                await ingest.push(svc, _params("session/push", sessionId=sid, messages=[
                    {"role": "user", "content": f"{sid} question {i} about pelicans"},
                    {"role": "assistant", "content": f"{sid} answer {i} é ✓ \u2028"}]))
            await snapshots.create(svc, _params("snapshot/create", sessionId=sid, label="before the move"))
        page = await history.history(svc, _params("session/history", sessionId="m1", limit=100))
        return {"m1": [(e.seq, e.message.content) for e in page.messages]}
    finally:
        await svc.close()


async def _check(config: Config, expected: dict[str, Any]) -> None:
    svc = await Service.open(config)
    try:
        listed = await sessions.list_sessions(svc, _params("session/list", tag="moved"))
        assert sorted((s.session_id, s.message_count, s.title) for s in listed) == \
            [("m1", 10, "title m1"), ("m2", 10, "title m2")]
        page = await history.history(svc, _params("session/history", sessionId="m1", limit=100))
        assert [(e.seq, e.message.content) for e in page.messages] == expected["m1"]
        snaps = await snapshots.list_snapshots(svc, "m2")
        assert [s.label for s in snaps.snapshots] == ["before the move"]
        found = await history.search(svc, _params("session/search", query="pelicans", limit=50))
        assert len(found.hits) == 10  # the search index was rebuilt from the copied messages
        result = await ingest.push(svc, _params("session/push", sessionId="m1", messages=[
            {"role": "user", "content": "after the move"}]))
        assert result.messages[0].seq == 11
    finally:
        await svc.close()


def test_migrate_copies_sqlite_into_postgresql_verified(cli, pg_server) -> None:
    sqlite_config = Config(daemon=DaemonConfig(data_dir=str(cli.data_dir)))
    expected = asyncio.run(_fill(sqlite_config))
    url = pg_server.create_database()
    report = cli.json("migrate", "--to", url, "--database", str(sqlite_config.database_path))
    assert report["tables"]["sessions"]["rows"] == 2 and report["tables"]["messages"]["rows"] == 20
    assert report["tables"]["snapshots"]["rows"] == 2
    asyncio.run(_check(Config(daemon=DaemonConfig(data_dir=str(cli.root / "pg")), storage=StorageConfig(url=url)),
                       expected))
    again = cli("migrate", "--to", url, "--database", str(sqlite_config.database_path), expect=1)
    assert "already holds sessions" in again.error_line()
    with_password = cli("migrate", "--to", url.replace("ctxd_test@", "ctxd_test:secret@"), expect=2)
    assert "secret" not in with_password.stderr and "password" in with_password.stderr


def test_migrate_back_from_postgresql_into_a_new_sqlite_file_verified(cli, pg_server) -> None:
    """SQLite -> PostgreSQL -> SQLite: every table's count and checksum the same both ways,
    and the file served as the original was (history, snapshots, search, the next seq)."""
    sqlite_config = Config(daemon=DaemonConfig(data_dir=str(cli.data_dir)))
    expected = asyncio.run(_fill(sqlite_config))
    url = pg_server.create_database()
    there = cli.json("migrate", "--to", url, "--database", str(sqlite_config.database_path))
    back_dir = cli.root / "back"
    back_dir.mkdir(mode=0o700)
    target = back_dir / "ctxd.db"
    back = cli.json("migrate", "--from", url, "--to", str(target))
    assert back["tables"] == there["tables"]  # the same rows, value for value
    assert back["tables"]["messages"]["rows"] == 20 and back["tables"]["snapshots"]["rows"] == 2
    assert target.stat().st_mode & 0o077 == 0
    asyncio.run(_check(Config(daemon=DaemonConfig(data_dir=str(back_dir))), expected))

    again = cli("migrate", "--from", url, "--to", str(target), expect=2)
    assert "exists" in again.error_line()
    elsewhere = cli.root / "other.db"
    empty = pg_server.create_database()
    refused = cli("migrate", "--from", empty, "--to", str(elsewhere), expect=1)
    assert "no ctxd database" in refused.error_line() and not elsewhere.exists()
    nothing = cli("migrate", "--to", str(elsewhere), expect=2)  # no PostgreSQL named anywhere
    assert "nothing to copy from" in nothing.error_line()


def _copy_messages(raw: Any, sid: str, into: str, add: int) -> None:
    """Rows as a staged write leaves them: ``sid``'s messages again, in ``into`` at seq + ``add``."""
    raw.execute("INSERT INTO messages (session_id, seq, role, created_at, tokens, tok_overhead, tok_text, "
                "tok_tool_call, tok_tool_result, tok_thinking, idempotency_key, body) "
                "SELECT ?, seq + ?, role, created_at, tokens, tok_overhead, tok_text, tok_tool_call, "
                "tok_tool_result, tok_thinking, idempotency_key, body FROM messages WHERE session_id = ?",
                (into, add, sid))


def test_migrate_leaves_out_the_rows_of_an_unfinished_push(cli, pg_server) -> None:
    """Rows a staged push wrote above its session's last_seq before the daemon stopped
    (service/ingest.py) were never acknowledged: they are not copied."""
    import sqlite3

    sqlite_config = Config(daemon=DaemonConfig(data_dir=str(cli.data_dir)))
    expected = asyncio.run(_fill(sqlite_config))
    raw = sqlite3.connect(sqlite_config.database_path)
    with raw:
        raw.execute("INSERT INTO unfinished_pushes (session_id, after_seq, started_at) VALUES ('m1', 10, 'now')")
        _copy_messages(raw, "m1", "m1", 10)
    raw.close()
    url = pg_server.create_database()
    report = cli.json("migrate", "--to", url, "--database", str(sqlite_config.database_path))
    assert report["tables"]["messages"]["rows"] == 20
    asyncio.run(_check(Config(daemon=DaemonConfig(data_dir=str(cli.root / "pg")), storage=StorageConfig(url=url)),
                       expected))


def test_migrate_leaves_out_an_unfinished_import(cli, pg_server) -> None:
    """A large import on SQLite writes its session first, hidden and with no messages, then
    its rows above last_seq 0 (service/transfer.py); one the daemon never finished was
    never acknowledged nor shown: neither the session nor its rows are copied."""
    import sqlite3

    sqlite_config = Config(daemon=DaemonConfig(data_dir=str(cli.data_dir)))
    expected = asyncio.run(_fill(sqlite_config))
    raw = sqlite3.connect(sqlite_config.database_path)
    with raw:
        raw.execute("INSERT INTO sessions (id, created_at, last_activity, encoding, tokens_estimated, tags, "
                    "metadata) SELECT 'imp', created_at, last_activity, encoding, tokens_estimated, tags, metadata "
                    "FROM sessions WHERE id = 'm1'")
        raw.execute("INSERT INTO unfinished_pushes (session_id, after_seq, started_at) VALUES ('imp', -1, 'now')")
        _copy_messages(raw, "m1", "imp", 0)
    raw.close()
    url = pg_server.create_database()
    report = cli.json("migrate", "--to", url, "--database", str(sqlite_config.database_path))
    assert report["tables"]["sessions"]["rows"] == 2
    assert report["tables"]["messages"]["rows"] == 20
    asyncio.run(_check(Config(daemon=DaemonConfig(data_dir=str(cli.root / "pg")), storage=StorageConfig(url=url)),
                       expected))
