"""What ctxd-cli tells about data going away and space taken:

* ``sessions list`` ends with a line saying how many sessions retention removed and by
  which rule (nothing, by default: retention is off and the line is absent);
* ``doctor`` reports the disk use of the database, its write-ahead log and the total.
"""

from __future__ import annotations

import json
import os

from tests.cli.conftest import Cli


def test_list_says_what_retention_removed(cli: Cli) -> None:
    for name in ("a", "b", "c"):
        cli("push", name, "--create", "--content", f"session {name}")
    plain = cli("sessions", "list")
    assert "retention" not in plain.stdout + plain.stderr  # off by default: all three kept
    assert len(cli.json("sessions", "list")["sessions"]) == 3
    cli("daemon", "stop")

    cli.env["CTXD_SESSIONS_MAX_SESSIONS"] = "2"  # the daemon ctxd-cli starts next applies it at startup
    listed = cli("sessions", "list")
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ["c", "b"]
    assert lines[-1].startswith("1 session removed by retention (1 by sessions.max_sessions")
    assert "sessions.max_sessions = 2 keeps the most recently active" in lines[-1]
    result = cli.json("sessions", "list")
    assert result["retention"]["removed"] == 1 and result["retention"]["byReason"] == {"max_sessions": 1}

    # Every session gone: the count is still there, under "no sessions".
    cli("sessions", "clear", "--all", "--yes")
    empty = cli("sessions", "list")
    assert "no sessions" in empty.stdout and "1 session removed by retention" in empty.stdout


def test_push_create_says_what_retention_removed_and_the_log_shows_it(cli: Cli) -> None:
    """issue 23: retention's removals at max_sessions showed only in a list footer (the log
    line was below the default level; ``push --create`` said nothing)."""
    cli.env["CTXD_SESSIONS_MAX_SESSIONS"] = "2"
    for name in ("a", "b"):
        quiet = cli("push", name, "--create", "--content", f"session {name}")
        assert "retention" not in quiet.stderr
    made = cli("push", "c", "--create", "--content", "session c")
    assert "retention removed 1 session to make room for c (sessions.max_sessions; the least recently " \
           "active): a" in made.stderr, made.stderr
    as_json = cli("--json", "push", "d", "--create", "--content", "session d")
    assert json.loads(as_json.stdout)["sessionId"] == "d"  # stdout stays the result alone
    assert "retention removed 1 session to make room for d" in as_json.stderr
    log = cli.log.read_text()
    assert "WARNING" in log and "retention removed session 'a'" in log and "retention removed session 'b'" in log
    assert [s["sessionId"] for s in cli.json("sessions", "list")["sessions"]] == ["d", "c"]


def test_doctor_reports_disk_use(cli: Cli) -> None:
    batch = [{"role": "user", "content": f"message {i} " + "lorem ipsum " * 50} for i in range(50)]
    cli("push", "s", "--create", "--message-json", input=json.dumps(batch))
    db = cli.data_dir / "ctxd.db"

    def sizes() -> dict[str, int]:
        return {key: os.stat(str(db) + suffix).st_size if os.path.exists(str(db) + suffix) else 0
                for key, suffix in (("database", ""), ("wal", "-wal"), ("shm", "-shm"))}

    # The daemon still runs (its write-ahead log is there) and may still be writing (the
    # search index, a checkpoint of the log): the files only grow, so the report lies
    # between what they held before and after it.
    before = sizes()
    report = cli.json("doctor")
    after = sizes()
    use = report["diskUse"]
    assert 0 < before["database"] <= use["database"] <= after["database"]
    assert 0 < before["wal"] <= use["wal"] <= after["wal"]
    assert use["total"] == use["database"] + use["wal"] + use["shm"]
    assert use["free"] > 0
    text = cli("doctor").stdout
    line = next(line for line in text.splitlines() if "disk use" in line)
    assert "database" in line and "write-ahead log" in line and "free" in line
