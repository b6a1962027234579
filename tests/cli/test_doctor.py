"""ctxd-cli doctor: healthy, damaged (check and --recover), garbage and missing databases.

Doctor never needs a daemon: after the databases are made, every check here runs with
none running, and none may be started.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from pathlib import Path

from ctxd import doctor
from tests.cli.conftest import Cli

PAGE = 4096


def make_database(cli: Cli, sessions: int = 3, messages: int = 40) -> Path:
    """A real ctxd database with sessions and messages, the daemon stopped afterwards."""
    for s in range(sessions):
        batch = [{"role": "user" if i % 2 == 0 else "assistant",
                  "content": f"session {s} message {i} marker{s}x{i} " + "lorem ipsum dolor sit amet " * 12}
                 for i in range(messages)]
        cli("push", f"s{s}", "--create", "--message-json", input=json.dumps(batch))
    cli("snapshot", "create", "s0", "--label", "kept")
    cli("daemon", "stop")
    assert not cli.socket.exists()
    return cli.data_dir / "ctxd.db"


def all_messages(path: Path) -> dict[tuple[str, int], bytes]:
    with sqlite3.connect(path) as conn:
        return {(sid, seq): body for sid, seq, body in conn.execute("SELECT session_id, seq, body FROM messages")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damage(path: Path, pages: list[int]) -> None:
    rnd = random.Random(1234)
    with open(path, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * PAGE)
            f.write(bytes(rnd.randrange(256) for _ in range(PAGE)))


def test_healthy_database(cli: Cli) -> None:
    db = make_database(cli, sessions=2, messages=6)
    before = sha256(db)
    report = cli.json("doctor")
    assert report["ok"] and report["database"] == str(db)
    assert report["check"]["checks"] == {"file": "ok", "integrity": "ok", "schema": "ok", "search": "ok",
                                         "consistency": "ok", "payloads": "ok"}
    assert report["check"]["sessions"] == 2 and report["check"]["messages"] == 12
    assert report["check"]["schemaVersion"] == report["check"]["expectedSchemaVersion"]
    text = cli("doctor", "--data-dir", str(cli.data_dir))
    assert "healthy: no problems found" in text.stdout and "2 sessions, 12 messages" in text.stdout
    assert not cli.socket.exists() and cli.daemon_pid() is None  # doctor never starts a daemon
    assert sha256(db) == before
    assert sorted(p.name for p in cli.data_dir.iterdir()) == ["ctxd.db"]  # nothing created beside it


def test_damaged_database_check_and_recover(cli: Cli) -> None:
    db = make_database(cli)
    pristine = all_messages(db)
    with sqlite3.connect(db) as conn:
        leaves = [p for (p,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno")]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        cells = dict(conn.execute("SELECT pageno, ncell FROM dbstat WHERE name = 'messages'").fetchall())
    assert len(leaves) >= 6
    # Garbage over two message pages in the middle, and over the middle page of the file.
    hit = [leaves[len(leaves) // 3], leaves[2 * len(leaves) // 3], pages // 2]
    damage(db, hit)
    before = sha256(db)
    at_most_lost = sum(cells.get(p, 0) for p in hit)

    checked = cli("--json", "doctor", expect=1)
    report = checked.json()
    assert not report["ok"] and report["check"]["problems"]
    assert report["check"]["checks"]["integrity"] != "ok"
    text = cli("doctor", expect=1)
    assert "problem" in text.stdout and "ctxd-cli doctor --recover" in text.stdout
    assert "Traceback" not in text.stderr

    recovered = cli("--json", "doctor", "--recover")
    out = recovered.json()["recovery"]
    new = Path(out["path"])
    assert new.parent == db.parent and new.name.startswith("ctxd.recovered-") and new.suffix == ".db"
    assert sha256(db) == before  # the old file is byte for byte what it was
    messages = out["tables"][1]
    assert messages["table"] == "messages" and 0 < messages["lost"] <= at_most_lost
    assert messages["copied"] == len(pristine) - messages["lost"] and messages["unreadable"]

    survived = all_messages(new)
    assert len(survived) == messages["copied"]
    for key, body in survived.items():
        assert pristine[key] == body  # everything copied is exactly what was stored
    with sqlite3.connect(new) as conn:
        totals = conn.execute("SELECT id, message_count, last_seq FROM sessions ORDER BY id").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert {sid for sid, _ in survived} <= {sid for sid, _, _ in totals}
    for sid, count, last_seq in totals:
        assert count == sum(1 for s, _ in survived if s == sid)  # recomputed from the survivors
        assert last_seq == 40  # never lowered: a new message never reuses a lost one's number

    plain = cli("doctor", "--recover", expect=0).stdout
    assert "Recovery (the old file was not changed)" in plain and "lost" in plain
    assert "ctxd-cli daemon stop" in plain and "mv ctxd.db ctxd.damaged-" in plain
    assert sha256(db) == before
    assert cli.json("doctor", "--database", str(new))["ok"]  # the new file checks clean
    assert not cli.socket.exists()

    # Switch to it as doctor says: a daemon serves what survived, and search is rebuilt.
    other = cli.root / "switched"
    other.mkdir()
    shutil.copy(new, other / "ctxd.db")
    listed = cli.json("--data-dir", str(other), "sessions", "list")["sessions"]
    assert sum(s["messageCount"] for s in listed) == len(survived)
    sid, seq = sorted(survived)[-1]
    hits = cli.json("--data-dir", str(other), "search", f"marker{sid[1:]}x{seq - 1}")["hits"]
    assert [(h["sessionId"], h["seq"]) for h in hits] == [(sid, seq)]
    cli("daemon", "stop")


def test_recover_api_and_unreadable_ranges(tmp_path: Path) -> None:
    """The store module on its own: a damaged table loses only the rows on the damaged page."""
    db = tmp_path / "ctxd.db"
    conn = sqlite3.connect(db)
    from ctxd.store.db import _split_sql, migrations

    for _, _, sql in migrations():
        for statement in _split_sql(sql):
            conn.execute(statement)
    conn.execute("INSERT INTO sessions (id, created_at, last_activity, encoding, tokens_estimated, message_count, "
                 "token_count, last_seq) VALUES ('a', 't', 't', 'cl100k_base', 1, 300, 3000, 300)")
    body = '{"role":"user","content":"%s"}'
    conn.executemany("INSERT INTO messages (session_id, seq, role, created_at, tokens, tok_overhead, tok_text, "
                     "tok_tool_call, tok_tool_result, tok_thinking, body) VALUES ('a', ?, 'user', 't', 10, 3, 7, 0, 0, "
                     "0, ?)", [(i, body % (f"message {i} " + "x" * 200)) for i in range(1, 301)])
    conn.commit()
    leaves = [p for (p,) in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno")]
    last_leaf_cells = conn.execute("SELECT ncell FROM dbstat WHERE pageno = ?", (leaves[-1],)).fetchone()[0]
    conn.close()
    damage(db, [leaves[0], leaves[-1]])  # the first and the last page of the table

    report = doctor.check(db)
    assert not report.ok and report.checks["file"] == "ok"
    result = doctor.recover(db)
    messages = result.table("messages")
    assert messages.expected == 300 and 0 < messages.lost < 40 and messages.copied == 300 - messages.lost
    assert messages.unreadable[0][0] == 1 and messages.unreadable[-1][1] == doctor.MAX_ROWID  # the ends
    assert messages.to_json()["unreadable"][-1][1] is None
    assert result.sessions_recomputed == ["a"]
    with sqlite3.connect(result.path) as new:
        seqs = [s for (s,) in new.execute("SELECT seq FROM messages ORDER BY seq")]
        assert new.execute("SELECT message_count, token_count, last_seq FROM sessions").fetchone() == \
            (len(seqs), 10 * len(seqs), 300)
        assert new.execute("SELECT indexed_through FROM search_state").fetchone() == (0,)
    assert seqs == list(range(seqs[0], seqs[-1] + 1)) and 300 - seqs[-1] <= last_leaf_cells
    assert doctor.check(result.path).ok


def test_garbage_missing_and_empty_files(cli: Cli) -> None:
    garbage = cli.root / "garbage"
    garbage.mkdir()
    (garbage / "ctxd.db").write_bytes(random.Random(5).randbytes(20000))
    result = cli("doctor", "--data-dir", str(garbage), expect=1)
    assert "not an SQLite database" in result.stdout and "Traceback" not in result.stderr + result.stdout
    report = cli("--json", "doctor", "--data-dir", str(garbage), expect=1).json()
    assert report["check"]["checks"] == {"file": "failed"} and report["check"]["sqlite"] is False
    failed = cli("doctor", "--data-dir", str(garbage), "--recover", expect=1)
    assert "recovery failed" in failed.stdout and "nothing can be recovered" in failed.stdout
    assert [p.name for p in garbage.iterdir()] == ["ctxd.db"]  # no half-made recovered file

    missing = cli("doctor", "--data-dir", str(cli.root / "nothing-here"), expect=2).error_line()
    assert "no ctxd database" in missing
    empty = cli.root / "empty"
    empty.mkdir()
    (empty / "ctxd.db").write_bytes(b"")
    assert cli("--json", "doctor", "--data-dir", str(empty)).json()["ok"]  # SQLite's empty database
    assert not cli.socket.exists()


def test_messages_whose_session_row_was_lost_get_a_rebuilt_session(tmp_path: Path) -> None:
    db = tmp_path / "ctxd.db"
    conn = sqlite3.connect(db)
    from ctxd.store.db import _split_sql, migrations

    for _, _, sql in migrations():
        for statement in _split_sql(sql):
            conn.execute(statement)
    for sid in ("a", "b"):
        conn.execute("INSERT INTO sessions (id, created_at, last_activity, encoding, tokens_estimated, message_count, "
                     "token_count, last_seq, title) VALUES (?, 't0', 't9', 'o200k_base', 0, 3, 30, 3, 'kept title')",
                     (sid,))
        conn.executemany("INSERT INTO messages (session_id, seq, role, created_at, tokens, tok_overhead, tok_text, "
                         "tok_tool_call, tok_tool_result, tok_thinking, body) "
                         "VALUES (?, ?, ?, ?, 10, 3, 7, 0, 0, 0, ?)",
                         [(sid, i, "user" if i % 2 else "assistant", f"2026-01-0{i}",
                           f'{{"role":"{"user" if i % 2 else "assistant"}","content":"{sid} {i}"}}')
                          for i in (1, 2, 3)])
    info = json.dumps({"snapshotId": "snap_1", "sessionId": "gone", "createdAt": "t", "trigger": "manual",
                       "lastSeq": 1, "messageCount": 1, "tokenCount": 10, "contextTokens": 10, "checkpointCount": 0,
                       "compressionCount": 0, "userMessageCount": 1, "contextWindow": 8192, "compressionRatio": 1.0})
    conn.execute("INSERT INTO snapshots (session_id, id, created_at, trigger_kind, last_seq, info, state, checkpoints) "
                 "VALUES ('gone', 'snap_1', 't', 'manual', 1, ?, '{}', '[]')", (info,))
    conn.commit()
    (sessions_page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'sessions'").fetchone()
    conn.close()
    damage(db, [sessions_page])

    result = doctor.recover(db)
    assert result.table("sessions").copied == 0 and result.table("messages").copied == 6
    assert result.sessions_rebuilt == ["a", "b"]
    assert result.table("snapshots").orphans == 1  # a snapshot of a session that is gone is left out
    with sqlite3.connect(result.path) as new:
        rows = new.execute("SELECT id, created_at, last_activity, message_count, token_count, last_seq, tags, stats "
                           "FROM sessions ORDER BY id").fetchall()
    assert [r[:6] for r in rows] == [("a", "2026-01-01", "2026-01-03", 3, 30, 3), ("b", "2026-01-01", "2026-01-03", 3,
                                                                                     30, 3)]
    assert json.loads(rows[0][6]) == ["recovered"]
    stats = json.loads(rows[0][7])
    assert stats["by_role"] == {"user": {"messages": 2, "tokens": 20}, "assistant": {"messages": 1, "tokens": 10}}
    assert doctor.check(result.path).ok


def test_records_sqlite_can_read_but_ctxd_cannot(cli: Cli) -> None:
    """Bytes damaged inside a row leave SQLite's pages intact: the daemon answers a
    StorageError naming the session (not an internal error), doctor finds the record,
    and a recovery drops it and starts that session's context afresh, history whole."""
    db = make_database(cli, sessions=2, messages=30)
    cli("compress", "s1")
    cli("daemon", "stop")
    with sqlite3.connect(db) as conn:
        [(cp_id,)] = conn.execute("SELECT id FROM checkpoints WHERE session_id = 's1'").fetchall()
        conn.execute("UPDATE checkpoints SET body = ? WHERE id = ?", (b'{"id":"caf\xe9', cp_id))
        conn.execute("UPDATE messages SET body = ? WHERE session_id = 's0' AND seq = 7", (b'{"role": 5}',))

    refused = cli("prompt", "s1", expect=1)
    assert "(-33005)" in refused.stderr and "'s1'" in refused.stderr and "ctxd-cli doctor" in refused.stderr
    assert "Traceback" not in refused.stderr and "Internal error" not in refused.stderr
    assert cli.json("sessions", "list")["sessions"]  # the daemon still serves the rest
    cli("daemon", "stop")

    report = cli("--json", "doctor", expect=1).json()["check"]
    assert report["checks"]["integrity"] == "ok" and report["checks"]["payloads"] == "problems"
    problems = " ".join(p["message"] for p in report["problems"])
    assert f"checkpoints s1 {cp_id}: body cannot be read" in problems and "messages s0 7: body" in problems

    out = cli.json("doctor", "--recover")["recovery"]
    new = Path(out["path"])
    assert any("s1: its compression state was unreadable and was reset" in n for n in out["notes"])
    assert cli.json("doctor", "--database", str(new))["ok"]
    other = cli.root / "switched"
    other.mkdir()
    shutil.copy(new, other / "ctxd.db")
    prompt = cli.json("--data-dir", str(other), "prompt", "s1", "--format", "openai")
    assert prompt["messageCount"] == 30 and prompt["checkpointCount"] == 0
    history = cli.json("--data-dir", str(other), "history", "s1")
    assert len(history["messages"]) == 30
    cli("--data-dir", str(other), "daemon", "stop")


def test_a_newer_schema_is_upgraded_not_recovered(cli: Cli) -> None:
    db = make_database(cli, sessions=1, messages=4)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 99")
    before = sha256(db)
    text = cli("doctor", expect=1).stdout
    assert "newer ctxd" in text and "upgrade ctxd" in text and "doctor --recover" not in text
    refused = cli("doctor", "--recover", expect=1)
    assert "newer ctxd" in refused.stdout + refused.stderr
    assert sha256(db) == before
    assert not [p for p in db.parent.iterdir() if "recovered" in p.name]  # no downgraded copy written


def test_a_daemon_serving_another_database_is_not_blamed(cli: Cli) -> None:
    db = make_database(cli, sessions=1, messages=4)
    other = cli.root / "other"
    other.mkdir()
    cli("--data-dir", str(other), "sessions", "list")  # a daemon on the same socket, another database
    report = cli.json("doctor", "--database", str(db))
    assert report["ok"] and report["daemonRunning"] is False
    mine = cli.json("doctor", "--data-dir", str(other))
    assert mine["daemonRunning"] is True
    cli("daemon", "stop")


def test_postgresql_database_checked_and_damage_reported(cli: Cli, pg_server) -> None:
    """doctor on the database storage.url names (or --url): the same checks in one read-only
    transaction, damage named; no --recover (ctxd-cli migrate --to FILE instead)."""
    import psycopg

    url = pg_server.create_database()
    cli.env["CTXD_STORAGE_URL"] = url
    make_database(cli, sessions=2, messages=6)
    report = cli.json("doctor")
    assert report["ok"] and report["database"] == url, report
    assert report["check"]["checks"] == {"file": "ok", "integrity": "skipped", "schema": "ok", "search": "ok",
                                         "consistency": "ok", "payloads": "ok"}
    assert report["check"]["sessions"] == 2 and report["check"]["messages"] == 12
    assert report["check"]["schemaVersion"] == report["check"]["expectedSchemaVersion"]
    assert report["diskUse"]["database"] > 0
    text = cli("doctor", "--url", url).stdout
    assert "healthy" in text and url in text

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("UPDATE sessions SET message_count = 99 WHERE id = 's0'")
        pg.execute("UPDATE sessions SET context_state = '{\"not\": ' WHERE id = 's1'")
        for table in ("messages_fts", "search_pending"):  # (indexed or still queued: lost either way)
            pg.execute(f"DELETE FROM {table} WHERE id = (SELECT min(id) FROM messages)")
    damaged = cli("--json", "doctor", "--url", url, expect=1).json()
    problems = {p["check"]: p["message"] for p in damaged["check"]["problems"]}
    assert "message_count 99 (messages say 6)" in problems["consistency"]
    assert "sessions s1: context_state cannot be read" in problems["payloads"]
    assert "1 messages are neither in the search index nor queued" in problems["search"]

    refused = cli("doctor", "--url", url, "--recover", expect=2).error_line()
    assert "ctxd-cli migrate --to FILE" in refused
    gone = cli("--json", "doctor", "--url", url.replace("/t_", "/missing_"), expect=1).json()
    assert gone["check"]["checks"]["file"] == "failed" and "cannot reach" in gone["check"]["problems"][0]["message"]
    secret = cli("doctor", "--url", url.replace("ctxd_test@", "ctxd_test:hunter2@"), expect=2)
    assert "hunter2" not in secret.stderr + secret.stdout
