"""``ctxd-cli doctor``'s check: what is wrong with a ctxd database file, if anything.

Works on the file directly (plain ``sqlite3``, no daemon, no asyncio), so it helps
exactly when the daemon cannot: a file it refuses to open.

:func:`check` opens the file read-only and runs SQLite's integrity check, compares
the schema version with this build's migrations, checks the full-text index (on a
temporary copy: FTS5's check is a write statement), compares each session's stored
totals with its messages, and decodes every stored record as the daemon decodes it
(``store/payloads.py``). Recovery is ``recover.py``.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxd.store.dialect import is_postgres
from ctxd.store.payloads import decodes, payload_decoders

SQLITE_HEADER = b"SQLite format 3\x00"
DB_NAME = "ctxd.db"
# Copied in this order (sessions first: the others belong to one).
TABLES = ("sessions", "messages", "checkpoints", "compressions", "snapshots", "session_events")
OWNED = ("checkpoints", "compressions", "snapshots", "session_events")
MAX_LISTED = 10  # problems of one kind listed before "... and N more"
INTEGRITY_ROWS = 50


class DoctorError(Exception):
    """The file cannot be worked on at all; the message says why in plain words."""


@dataclass
class Problem:
    check: str  # file (server) | integrity | schema | search | consistency | payloads
    message: str


@dataclass
class Report:
    path: str
    exists: bool = False
    size: int | None = None
    sqlite: bool = False
    schema_version: int | None = None
    expected_schema_version: int | None = None
    checks: dict[str, str] = field(default_factory=dict)  # check -> ok | problems | skipped | failed
    newer_schema: bool = False
    """Written by a newer ctxd: upgrading is the way, not recovering."""
    integrity: list[str] = field(default_factory=list)
    sessions: int | None = None
    messages: int | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exists and not self.problems

    def problem(self, check: str, message: str) -> None:
        self.problems.append(Problem(check, message))
        if self.checks.get(check) != "failed":
            self.checks[check] = "problems"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "exists": self.exists, "size": self.size, "sqlite": self.sqlite,
                "schemaVersion": self.schema_version, "expectedSchemaVersion": self.expected_schema_version,
                "checks": self.checks, "integrity": self.integrity, "sessions": self.sessions,
                "messages": self.messages, "problems": [asdict(p) for p in self.problems], "notes": self.notes}


def _uri(path: Path) -> str:
    resolved = path.resolve()
    uri = resolved.as_uri() + "?mode=ro"
    if not Path(str(resolved) + "-wal").exists():
        # Nothing waits in a write-ahead log: read the file as it is, without the -wal and
        # -shm files a read-only connection would otherwise create (and leave) beside it.
        uri += "&immutable=1"
    return uri


def open_readonly(path: Path) -> sqlite3.Connection:
    """The file opened read-only (nothing this connection does can change it), inside one
    read transaction: with a daemon writing meanwhile, every query still sees the same
    moment."""
    conn = sqlite3.connect(_uri(path), uri=True, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("BEGIN")
    return conn


def _describe_start(head: bytes) -> str:
    if not head:
        return "it is empty"
    text = head[:16]
    printable = "".join(chr(b) if 32 <= b < 127 else "." for b in text)
    return f"it starts with {text.hex(' ')} (\"{printable}\") instead of \"SQLite format 3\""


def sniff(path: Path, report: Report) -> bool:
    """Whether ``path`` exists and looks like an SQLite file; problems go into the report."""
    try:
        st = path.stat()
    except FileNotFoundError:
        report.problem("file", f"{path} does not exist")
        report.checks["file"] = "failed"
        return False
    except OSError as exc:
        report.problem("file", f"{path}: cannot read ({exc.strerror or exc})")
        report.checks["file"] = "failed"
        return False
    report.exists = True
    report.size = st.st_size
    if not path.is_file():
        report.problem("file", f"{path} is not a regular file")
        report.checks["file"] = "failed"
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        report.problem("file", f"{path}: cannot read ({exc.strerror or exc})")
        report.checks["file"] = "failed"
        return False
    if st.st_size == 0:  # SQLite's empty database: ctxd creates the schema in it when it starts
        report.sqlite = True
        report.checks["file"] = "ok"
        return True
    if not head.startswith(SQLITE_HEADER):
        report.problem("file", f"not an SQLite database: {_describe_start(head)}. It was overwritten or its "
                               "first page is damaged; SQLite cannot read anything in it")
        report.checks["file"] = "failed"
        return False
    report.sqlite = True
    report.checks["file"] = "ok"
    return True


def _listed(report: Report, check: str, items: list[str], total: int | None = None) -> None:
    for item in items[:MAX_LISTED]:
        report.problem(check, item)
    more = (total if total is not None else len(items)) - MAX_LISTED
    if more > 0:
        report.problem(check, f"... and {more} more")


def db_errors() -> tuple[type[Exception], ...]:
    """What a failed read raises: SQLite's errors, and psycopg's when it is installed (the
    checks below also run on PostgreSQL, ``check_pg.py``)."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.DatabaseError,)
    return (sqlite3.DatabaseError, psycopg.Error)


def table_names(conn: Any) -> set[str]:
    if is_postgres(conn):
        return {name for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def column_info(conn: Any, table: str) -> list[tuple[str, bool]]:
    """(name, is the rowid alias) of each column."""
    if is_postgres(conn):
        return [(name, False) for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
            "AND table_schema = current_schema() ORDER BY ordinal_position", (table,))]
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    pks = [r for r in info if r[5]]
    return [(r[1], len(pks) == 1 and r[5] == 1 and str(r[2]).upper() == "INTEGER") for r in info]


def check(path: str | os.PathLike[str]) -> Report:
    """Check the database at ``path`` without changing it (a missing, foreign or damaged
    file gives a report saying so, never an exception)."""
    from ctxd.store.db import schema_version

    path = Path(path)
    report = Report(path=str(path), expected_schema_version=schema_version())
    if not sniff(path, report):
        return report
    try:
        conn = open_readonly(path)
    except sqlite3.Error as exc:
        report.problem("file", f"SQLite cannot open it: {exc}")
        report.checks["file"] = "failed"
        return report
    try:
        _check_open(conn, path, report)
    finally:
        conn.close()
    return report


def _check_open(conn: sqlite3.Connection, path: Path, report: Report) -> None:
    # Integrity: every page, index and constraint SQLite can verify.
    try:
        # One row may hold several lines ("*** in database main ***\nPage 12: ..."): one problem each.
        rows = [line for r in conn.execute(f"PRAGMA integrity_check({INTEGRITY_ROWS})").fetchall()
                for line in str(r[0]).splitlines() if line.strip() and not line.startswith("***")]
    except sqlite3.DatabaseError as exc:
        # The whole-file check gave up: check table by table to say where the damage is.
        rows = _per_table_integrity(conn) or [f"the integrity check cannot run: {exc}"]
    report.integrity = rows
    if rows == ["ok"]:
        report.checks["integrity"] = "ok"
    else:
        _listed(report, "integrity", rows)

    # Schema version.
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = table_names(conn)
    except sqlite3.DatabaseError as exc:
        report.problem("schema", f"cannot read the schema: {exc}")
        report.checks["schema"] = "failed"
        report.checks.update(search="skipped", consistency="skipped")
        return
    report.schema_version = version
    expected = report.expected_schema_version or 0
    if version > expected:
        report.newer_schema = True
        report.problem("schema", f"schema version {version} was written by a newer ctxd (this one knows up to "
                                 f"{expected}): upgrade ctxd")
    elif version == 0 and not tables:
        report.notes.append("no schema yet (ctxd creates it when it starts)")
        report.checks["schema"] = "ok"
    elif version < expected:
        report.notes.append(f"schema version {version}: ctxd upgrades it to {expected} when it next starts")
        report.checks["schema"] = "ok"
    else:
        missing = [t for t in (*TABLES, "messages_fts", "search_state") if t not in tables]
        if missing:
            report.problem("schema", f"schema version {version} but tables are missing: {', '.join(missing)}")
        else:
            report.checks["schema"] = "ok"

    _check_search(conn, report, tables)
    _check_consistency(conn, report, tables)
    _check_payloads(conn, report, tables)


KEYS = {"sessions": "id", "messages": "session_id, seq", "checkpoints": "session_id, id",
        "compressions": "session_id, number", "snapshots": "session_id, id", "session_events": "session_id, at"}


def _check_payloads(conn: Any, report: Report, tables: set[str]) -> None:
    """Every stored JSON value decoded as the daemon decodes it: a page can be intact for
    SQLite and still hold bytes that are not the record that was written."""
    bad: list[str] = []
    try:
        for table, columns in payload_decoders().items():
            if table not in tables:
                continue
            present = {name for name, _ in column_info(conn, table)}
            names = [c for c in columns if c in present]
            if not names:
                continue
            for row in conn.execute(f"SELECT {KEYS[table]}, {', '.join(names)} FROM {table}"):
                key_n = len(KEYS[table].split(", "))
                for name, value in zip(names, row[key_n:]):
                    if not decodes(columns[name], value):
                        key = " ".join(str(k) for k in row[:key_n])
                        bad.append(f"{table} {key}: {name} cannot be read")
    except db_errors() as exc:
        report.problem("payloads", f"cannot read every stored record: {exc}")
        report.checks["payloads"] = "failed"
        return
    _listed(report, "payloads", bad)
    if not bad:
        report.checks["payloads"] = "ok"


def _per_table_integrity(conn: sqlite3.Connection) -> list[str]:
    try:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' ORDER BY name")]
    except sqlite3.DatabaseError:
        return []
    found: list[str] = []
    for table in tables:
        try:
            rows = [str(r[0]) for r in conn.execute(f'PRAGMA integrity_check("{table}")').fetchall()]
        except sqlite3.DatabaseError as exc:
            found.append(f"table {table}: {exc} (pages of it cannot be read)")
            continue
        found += [f"table {table}: {line}" for row in rows if row != "ok" for line in row.splitlines()
                  if line.strip() and not line.startswith("***")]
    return found


def _check_search(conn: sqlite3.Connection, report: Report, tables: set[str]) -> None:
    """FTS5's own integrity check, on a temporary copy (it is a write statement, and the
    original is only ever opened read-only)."""
    if "messages_fts" not in tables:
        report.checks["search"] = "skipped"
        return
    import shutil

    tmpdir = tempfile.gettempdir()
    try:
        needed = (report.size or 0) + sum(Path(report.path + s).stat().st_size for s in ("-wal",)
                                           if Path(report.path + s).exists())
        room = shutil.disk_usage(tmpdir).free
    except OSError:
        needed, room = 0, 1
    if needed * 1.1 > room:
        report.checks["search"] = "skipped"
        report.notes.append(f"search index not checked: it is checked on a copy, and {tmpdir} has no room for one "
                            "(set TMPDIR to a roomier directory)")
        return
    try:
        with tempfile.TemporaryDirectory(prefix="ctxd-doctor-") as tmp:
            copy = sqlite3.connect(Path(tmp) / "copy.db", isolation_level=None)
            try:
                conn.backup(copy)
                copy.execute("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")
            finally:
                copy.close()
    except sqlite3.DatabaseError as exc:
        report.problem("search", f"the full-text index is damaged ({exc}); a recovered database rebuilds it")
    except OSError as exc:
        report.checks["search"] = "skipped"
        report.notes.append(f"search index not checked: no room for a temporary copy ({exc.strerror or exc})")
    else:
        report.checks["search"] = "ok"
    try:
        through = conn.execute("SELECT indexed_through FROM search_state WHERE id = 1").fetchone()
        newest = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        if through is not None and newest is not None and newest > through[0]:
            waiting = conn.execute("SELECT count(*) FROM messages WHERE id > ?", (through[0],)).fetchone()[0]
            if waiting:
                report.notes.append(f"{waiting} messages are not in the search index yet (the daemon indexes them "
                                    "in the background)")
    except sqlite3.DatabaseError:
        pass


def _check_consistency(conn: Any, report: Report, tables: set[str]) -> None:
    """Each session's stored totals against its messages; rows whose session is gone."""
    if not {"sessions", "messages"} <= tables:
        report.checks["consistency"] = "skipped"
        return
    try:
        report.sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        report.messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        rows = conn.execute(
            "SELECT s.id, s.message_count, s.token_count, s.last_seq, "
            "(SELECT count(*) FROM messages m WHERE m.session_id = s.id AND m.seq <= s.last_seq), "
            "(SELECT coalesce(sum(tokens), 0) FROM messages m WHERE m.session_id = s.id AND m.seq <= s.last_seq), "
            "(SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = s.id), "
            "(SELECT count(*) FROM messages m WHERE m.session_id = s.id AND m.seq > s.last_seq), "
            "(SELECT coalesce(sum(tokens), 0) FROM messages m WHERE m.session_id = s.id AND m.seq > s.last_seq) "
            "FROM sessions s ORDER BY s.id").fetchall()
        # A staged push (store/messages.py) writes its rows above last_seq before its last
        # transaction, and marks the session: those rows are not damage (nor history yet).
        unfinished = ({sid for (sid,) in conn.execute("SELECT session_id FROM unfinished_pushes")}
                      if "unfinished_pushes" in tables else set())
        wrong: list[str] = []
        gaps: list[str] = []
        pending: list[str] = []
        for sid, count, tokens, last_seq, real_count, real_tokens, real_last, above, above_tokens in rows:
            if above and sid in unfinished:
                pending.append(f"{sid} ({above})")
            elif above:  # counted as the history, as they would be if they were
                real_count, real_tokens = real_count + above, real_tokens + above_tokens
            diffs = [f"{name} {stored} (messages say {real})" for name, stored, real in
                     (("message_count", count, real_count), ("token_count", tokens, real_tokens)) if stored != real]
            if last_seq < real_last and sid not in unfinished:  # the next push would collide with a stored message
                diffs.append(f"last_seq {last_seq} (messages go up to {real_last})")
            if diffs:
                wrong.append(f"session {sid}: " + ", ".join(diffs))
            elif real_count < last_seq:
                gaps.append(f"{sid} ({last_seq - real_count})")
        if gaps:
            report.notes.append("messages missing from the history (lost in a recovery; the rest is consistent): "
                                + ", ".join(gaps[:MAX_LISTED]) + (" ..." if len(gaps) > MAX_LISTED else ""))
        if pending:
            report.notes.append("message rows of an unfinished push or import, not part of any history (a large "
                                "push or import being written, or one a stopped daemon left; ctxd removes them when "
                                "it starts or before the session's next push): " + ", ".join(pending[:MAX_LISTED])
                                + (" ..." if len(pending) > MAX_LISTED else ""))
        orphans: list[str] = []
        for table in ("messages", *OWNED):
            if table not in tables:
                continue
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)"
                             ).fetchone()[0]
            if n:
                orphans.append(f"{n} {table} rows belong to no session")
    except db_errors() as exc:
        report.problem("consistency", f"cannot compare the totals with the messages: {exc}")
        report.checks["consistency"] = "failed"
        return
    _listed(report, "consistency", wrong)
    for item in orphans:
        report.problem("consistency", item)
    if not wrong and not orphans:
        report.checks["consistency"] = "ok"


def iter_problems(report: Report) -> Iterator[str]:
    for p in report.problems:
        yield f"{p.check}: {p.message}"
