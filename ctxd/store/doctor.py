"""``ctxd-cli doctor``: check a ctxd database file, and recover what can be read.

Works on the file directly (plain ``sqlite3``, no daemon, no asyncio), so it helps
exactly when the daemon cannot: a file it refuses to open.

:func:`check` opens the file read-only and runs SQLite's integrity check, compares
the schema version with this build's migrations, checks the full-text index (on a
temporary copy: FTS5's check is a write statement) and compares each session's
stored totals with its messages.

:func:`recover` never changes the old file. It creates a new database next to it
(``ctxd.recovered-<UTC time>.db``) with ctxd's own migrations, then copies every row
it can read, table by table, walking each table in rowid order: when a page cannot
be read it skips ahead to where reading works again and then narrows the skipped
range down, so one bad page costs the rows on that page, not the table. Messages
whose session row was lost get a rebuilt session; session totals are recomputed from
the messages that survived; the search index is left empty for the daemon to rebuild.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec

from ctxd.store.files import fsync_directory

SQLITE_HEADER = b"SQLite format 3\x00"
DB_NAME = "ctxd.db"
# Copied in this order (sessions first: the others belong to one).
TABLES = ("sessions", "messages", "checkpoints", "compressions", "snapshots", "session_events")
OWNED = ("checkpoints", "compressions", "snapshots", "session_events")
MAX_LISTED = 10  # problems of one kind listed before "... and N more"
INTEGRITY_ROWS = 50
# Read attempts one table's damaged ranges may cost before the rest of a range is given up.
RESCUE_BUDGET = 200_000
MAX_ROWID = (1 << 63) - 1
JSON_DEFAULTS = {"tags": "[]", "metadata": "{}", "stats": "{}", "context_state": "{}", "settings": "{}",
                 "model_info": "{}"}


class DoctorError(Exception):
    """The file cannot be worked on at all; the message says why in plain words."""


# --- check ------------------------------------------------------------------------------


@dataclass
class Problem:
    check: str  # file | integrity | schema | search | consistency
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


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


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
        tables = _tables(conn)
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


def _check_payloads(conn: sqlite3.Connection, report: Report, tables: set[str]) -> None:
    """Every stored JSON value decoded as the daemon decodes it: a page can be intact for
    SQLite and still hold bytes that are not the record that was written."""
    bad: list[str] = []
    try:
        for table, columns in payload_decoders().items():
            if table not in tables:
                continue
            present = {name for name, _ in _columns(conn, table)}
            names = [c for c in columns if c in present]
            if not names:
                continue
            for row in conn.execute(f"SELECT {KEYS[table]}, {', '.join(names)} FROM {table}"):
                key_n = len(KEYS[table].split(", "))
                for name, value in zip(names, row[key_n:]):
                    if not _decodes(columns[name], value):
                        key = " ".join(str(k) for k in row[:key_n])
                        bad.append(f"{table} {key}: {name} cannot be read")
    except sqlite3.DatabaseError as exc:
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


def _check_consistency(conn: sqlite3.Connection, report: Report, tables: set[str]) -> None:
    """Each session's stored totals against its messages; rows whose session is gone."""
    if not {"sessions", "messages"} <= tables:
        report.checks["consistency"] = "skipped"
        return
    try:
        report.sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        report.messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        rows = conn.execute(
            "SELECT s.id, s.message_count, s.token_count, s.last_seq, "
            "(SELECT count(*) FROM messages m WHERE m.session_id = s.id), "
            "(SELECT coalesce(sum(tokens), 0) FROM messages m WHERE m.session_id = s.id), "
            "(SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = s.id) "
            "FROM sessions s ORDER BY s.id").fetchall()
        wrong: list[str] = []
        gaps: list[str] = []
        for sid, count, tokens, last_seq, real_count, real_tokens, real_last in rows:
            diffs = [f"{name} {stored} (messages say {real})" for name, stored, real in
                     (("message_count", count, real_count), ("token_count", tokens, real_tokens)) if stored != real]
            if last_seq < real_last:  # the next push would collide with a stored message
                diffs.append(f"last_seq {last_seq} (messages go up to {real_last})")
            if diffs:
                wrong.append(f"session {sid}: " + ", ".join(diffs))
            elif real_count < last_seq:
                gaps.append(f"{sid} ({last_seq - real_count})")
        if gaps:
            report.notes.append("messages missing from the history (lost in a recovery; the rest is consistent): "
                                + ", ".join(gaps[:MAX_LISTED]) + (" ..." if len(gaps) > MAX_LISTED else ""))
        orphans: list[str] = []
        for table in ("messages", *OWNED):
            if table not in tables:
                continue
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)"
                             ).fetchone()[0]
            if n:
                orphans.append(f"{n} {table} rows belong to no session")
    except sqlite3.DatabaseError as exc:
        report.problem("consistency", f"cannot compare the totals with the messages: {exc}")
        report.checks["consistency"] = "failed"
        return
    _listed(report, "consistency", wrong)
    for item in orphans:
        report.problem("consistency", item)
    if not wrong and not orphans:
        report.checks["consistency"] = "ok"


# --- recover ------------------------------------------------------------------------------


@dataclass
class TableRecovery:
    table: str
    copied: int = 0
    expected: int | None = None  # rows the old file held, when that could be known
    unreadable: list[tuple[int, int]] = field(default_factory=list)  # rowid ranges no read got through
    # (a range ending at MAX_ROWID, null in JSON, runs to the end of the table)
    damaged: int = 0  # rows read but unusable (broken JSON, a body ctxd cannot decode)
    orphans: int = 0  # rows whose session is gone
    error: str | None = None  # the table could not be read at all

    @property
    def lost(self) -> int | None:
        if self.expected is None:
            return None
        return max(self.expected - self.copied, 0)

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "copied": self.copied, "expected": self.expected, "lost": self.lost,
                "unreadable": [[lo, hi if hi < MAX_ROWID else None] for lo, hi in self.unreadable],
                "damaged": self.damaged, "orphans": self.orphans, "error": self.error}


@dataclass
class RecoveryResult:
    source: str
    path: str
    tables: list[TableRecovery] = field(default_factory=list)
    sessions_rebuilt: list[str] = field(default_factory=list)  # made from messages whose session row was lost
    sessions_recomputed: list[str] = field(default_factory=list)  # totals differed from the surviving messages
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Nothing was lost (as far as could be told)."""
        return all(not t.unreadable and not t.damaged and not t.orphans and not t.error and not t.lost
                   for t in self.tables) and not self.sessions_rebuilt

    def table(self, name: str) -> TableRecovery:
        return next(t for t in self.tables if t.table == name)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "path": self.path, "complete": self.complete,
                "tables": [t.to_json() for t in self.tables], "sessionsRebuilt": self.sessions_rebuilt,
                "sessionsRecomputed": self.sessions_recomputed,
                "notes": self.notes}


def recovered_name(directory: Path, now: datetime | None = None) -> Path:
    """``ctxd.recovered-<UTC time>.db`` in ``directory``, not taken yet."""
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate = directory / f"ctxd.recovered-{stamp}.db"
    n = 1
    while candidate.exists():
        candidate = directory / f"ctxd.recovered-{stamp}-{n}.db"
        n += 1
    return candidate


def _create(dest: Path) -> sqlite3.Connection:
    """A new, empty ctxd database at ``dest`` (0600, never an existing file), schema from the migrations."""
    from ctxd.store.db import _split_sql, migrations

    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    conn = sqlite3.connect(dest, isolation_level=None)
    conn.execute("BEGIN")
    latest = 0
    for version, _name, sql in migrations():
        for statement in _split_sql(sql):
            conn.execute(statement)
        latest = version
    conn.execute(f"PRAGMA user_version = {latest}")
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, bool]]:
    """(name, is the rowid alias) of each column."""
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    pks = [r for r in info if r[5]]
    return [(r[1], len(pks) == 1 and r[5] == 1 and str(r[2]).upper() == "INTEGER") for r in info]


class _Reader:
    """Reads every row of one table it can, in rowid order, around damaged pages.

    A scan that steps onto a damaged page fails; the rows it returned before are good
    (Python's cursor reads one row ahead, so the last good one is fetched again by a
    seek). After a failure the reader gallops forward to a rowid where reading works
    again, narrows that point down, then reads the skipped range in ever smaller
    pieces, so what is lost is (about) the rows on the damaged pages. ctxd's tables
    only have positive rowids; ``hint`` is where the table probably ends.
    """

    def __init__(self, conn: sqlite3.Connection, table: str, columns: list[str], result: TableRecovery,
                 hint: int) -> None:
        self.conn = conn
        self.sql = f"SELECT rowid, {', '.join(columns)} FROM {table}"
        self.result = result
        self.hint = hint
        self.budget = RESCUE_BUDGET

    def _rows(self, where: str, args: tuple[Any, ...], on_row: Callable[[tuple[Any, ...]], None]
              ) -> tuple[bool, int | None]:
        """Feed ``on_row`` the query's rows: (whether it finished, the last rowid read)."""
        last = None
        try:
            for row in self.conn.execute(f"{self.sql} WHERE {where} ORDER BY rowid", args):
                on_row(row)
                last = row[0]
        except sqlite3.DatabaseError:
            return False, last
        return True, last

    def _seek(self, start: int) -> tuple[bool, tuple[Any, ...] | None]:
        """The first row with rowid >= ``start``: (whether it could be read, the row or None at the end)."""
        self.budget -= 1
        try:
            return True, self.conn.execute(f"{self.sql} WHERE rowid >= ? ORDER BY rowid LIMIT 1", (start,)).fetchone()
        except sqlite3.DatabaseError:
            return False, None

    def _point(self, rowid: int, on_row: Callable[[tuple[Any, ...]], None]) -> bool:
        """Read the row ``rowid`` if there is one; False if it cannot be read."""
        self.budget -= 1
        try:
            row = self.conn.execute(f"{self.sql} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            return False
        if row is not None:
            on_row(row)
        return True

    def read(self, on_row: Callable[[tuple[Any, ...]], None]) -> None:
        after = 0  # every row with rowid > after is still to be read (ctxd's rowids are all positive)
        while True:
            finished, last = self._rows("rowid > ?", (after,), on_row)
            if finished:
                return
            if last is not None:
                after = last
            # Step on one row at a time (seeks), until a seek fails too: that is the damage.
            for _ in range(16):
                ok, row = self._seek(after + 1)
                if not ok:
                    break
                if row is None:
                    return
                on_row(row)
                after = row[0]
            else:
                continue  # reading works again: back to scanning
            # Gallop forward to where reading works again...
            bad, step, resume = after + 1, 1, None
            while bad < MAX_ROWID and self.budget > 0:
                start = min(bad + step, MAX_ROWID)
                if self._seek(start)[0]:
                    resume = start
                    break
                bad = start
                step = step * 2 if bad >= self.hint else min(step * 2, 1024)
            if resume is None:
                end = max(self.hint, after + 1)
                self._rescue(after + 1, end, on_row)
                self.result.unreadable.append((end + 1, MAX_ROWID))
                return
            # ...narrow down the first start that works...
            while resume - bad > 1 and self.budget > 0:
                mid = bad + (resume - bad) // 2
                if self._seek(mid)[0]:
                    resume = mid
                else:
                    bad = mid
            # ...and save what can still be read of the range skipped.
            self._rescue(after + 1, resume - 1, on_row)
            after = resume - 1

    def _rescue(self, lo: int, hi: int, on_row: Callable[[tuple[Any, ...]], None]) -> None:
        stack = [(lo, hi)] if lo <= hi else []
        while stack:
            lo, hi = stack.pop()
            if self.budget <= 0:
                self.result.unreadable.append((lo, hi))
                continue
            if lo == hi:
                if not self._point(lo, on_row):
                    self.result.unreadable.append((lo, hi))
                continue
            self.budget -= 1
            finished, last = self._rows("rowid BETWEEN ? AND ?", (lo, hi), on_row)
            if finished:
                continue
            if last is not None:
                lo = last + 1  # the rows before the failure were read
                if lo > hi:
                    continue
            mid = lo + (hi - lo) // 2
            stack.append((mid + 1, hi))
            stack.append((lo, mid))


def _hint(src: sqlite3.Connection, table: str) -> int:
    """Where the table's rowids probably end: its largest rowid, else what sqlite_sequence
    says, else a bound from the file's size."""
    try:
        found = src.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
        if found is not None:
            return int(found)
    except sqlite3.DatabaseError:
        pass
    try:
        found = src.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
        if found is not None:
            return int(found[0])
    except sqlite3.DatabaseError:
        pass
    try:
        return int(src.execute("PRAGMA page_count").fetchone()[0]) * 64
    except sqlite3.DatabaseError:
        return 1 << 20


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def payload_decoders() -> dict[str, dict[str, Callable[[Any], Any]]]:
    """table -> column -> a decoder raising on what the daemon could not read: each JSON
    column decoded into the type the daemon decodes it into (valid JSON of the wrong
    shape fails the daemon just the same). NULL passes where the column allows it."""
    from ctxd.protocol.compression import Checkpoint
    from ctxd.protocol.goal import Goal
    from ctxd.protocol.message import Message
    from ctxd.protocol.session import SessionSettings
    from ctxd.protocol.snapshot import SnapshotInfo
    from ctxd.service.state import StoredState
    from ctxd.store.sessions import SessionStats

    def typed(kind: Any, nullable: bool = False) -> Callable[[Any], Any]:
        decoder = msgspec.json.Decoder(kind)

        def decode(value: Any) -> Any:
            if value is None:
                if nullable:
                    return None
                raise ValueError("NULL")
            return decoder.decode(value)
        return decode

    return {
        "sessions": {"tags": typed(list[str]), "metadata": typed(dict[str, Any]), "stats": typed(SessionStats),
                     "context_state": typed(StoredState), "settings": typed(SessionSettings),
                     "model_info": typed(dict[str, Any]), "goal": typed(Goal, nullable=True)},
        "messages": {"body": typed(Message)},
        "checkpoints": {"body": typed(Checkpoint)},
        "compressions": {"layers": typed(list[str]), "checkpoint_ids": typed(list[str]),
                         "detail": typed(dict[str, Any], nullable=True)},
        "snapshots": {"info": typed(SnapshotInfo), "state": typed(StoredState),
                      "checkpoints": typed(list[Checkpoint]), "goal": typed(Goal, nullable=True)},
        "session_events": {"detail": typed(dict[str, Any], nullable=True)},
    }


PAYLOAD_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, ValueError, TypeError)


def _valid_json(text: Any) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True


def _message_decoder() -> Callable[[bytes], Any]:
    from ctxd.protocol.message import Message

    return msgspec.json.Decoder(Message).decode


def recover(path: str | os.PathLike[str], *, now: datetime | None = None) -> RecoveryResult:
    """Copy everything readable from the database at ``path`` into a new file next to it.

    The old file is only ever opened read-only. Raises :class:`DoctorError` when
    nothing can be read (not an SQLite file, or its schema is unreadable); a new file
    is then not left behind either.
    """
    source = Path(path)
    report = Report(path=str(source))
    if not sniff(source, report):
        if report.exists and report.checks.get("file") == "failed" and report.size:
            raise DoctorError(f"{source} is not an SQLite database (or its first page is damaged): nothing can be "
                              "recovered from it with SQLite. Restore a backup if you have one; to start afresh, "
                              "move the file away (ctxd then creates a new one)")
        raise DoctorError(report.problems[0].message)
    try:
        src = open_readonly(source)
        src_tables = _tables(src)
        version = int(src.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise DoctorError(f"{source}: SQLite cannot read its schema ({exc}); nothing can be recovered with "
                          "SQLite (a backup is the way back)") from None
    from ctxd.store.db import schema_version

    if version > schema_version():
        src.close()
        raise DoctorError(f"{source} has schema version {version}, written by a newer ctxd (this one knows up to "
                          f"{schema_version()}): upgrade ctxd instead; recovering with this one would drop what "
                          "it does not know")
    dest = recovered_name(source.parent, now)
    result = RecoveryResult(source=str(source), path=str(dest))
    try:
        out = _create(dest)
    except (OSError, sqlite3.Error) as exc:
        src.close()
        if dest.exists():
            dest.unlink()
        raise DoctorError(f"cannot create {dest}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        _copy_all(src, out, src_tables, result)
        _repair_sessions(out, result)
        out.execute("COMMIT")
        problems = [r[0] for r in out.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            raise DoctorError(f"the recovered copy failed its own integrity check: {problems[:3]}")
        out.close()
        _fsync(dest)
    except BaseException:
        out.close()
        dest.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    return result


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)


def _decodes(decode: Callable[[Any], Any], value: Any) -> bool:
    try:
        decode(value)
    except PAYLOAD_ERRORS:
        return False
    return True


def _copy_all(src: sqlite3.Connection, out: sqlite3.Connection, src_tables: set[str],
              result: RecoveryResult) -> None:
    decoders = payload_decoders()
    reset_context: set[str] = set()
    """Sessions whose compression state (or one of its checkpoints) was unreadable."""
    sessions: set[str] = set()
    for table in TABLES:
        rec = TableRecovery(table)
        result.tables.append(rec)
        if table not in src_tables:
            rec.expected = 0
            result.notes.append(f"the old file has no {table} table (an older schema)")
            continue
        try:
            src_cols = {name for name, _ in _columns(src, table)}
        except sqlite3.DatabaseError as exc:
            rec.error = f"cannot read its columns: {exc}"
            continue
        dest_cols = _columns(out, table)
        cols = [name for name, _ in dest_cols if name in src_cols]
        has_alias = any(alias for name, alias in dest_cols if name in cols)
        dropped = sorted(src_cols - {name for name, _ in dest_cols})
        if dropped:
            result.notes.append(f"{table}: columns this ctxd does not know were left out: {', '.join(dropped)}")
        try:
            rec.expected = int(src.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        except sqlite3.DatabaseError:
            rec.expected = None
        insert_cols = cols if has_alias else ["rowid", *cols]
        insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(insert_cols)}) "
                  f"VALUES ({', '.join('?' * len(insert_cols))})")
        idx = {name: i + 1 for i, name in enumerate(cols)}  # position in a read row (rowid first)

        checks = {name: fn for name, fn in decoders.get(table, {}).items() if name in idx}

        def on_row(row: tuple[Any, ...], table: str = table, rec: TableRecovery = rec,
                   idx: dict[str, int] = idx, insert: str = insert, has_alias: bool = has_alias,
                   checks: dict[str, Callable[[Any], Any]] = checks) -> None:
            values = list(row)
            bad = [name for name, decode in checks.items() if not _decodes(decode, values[idx[name]])]
            if table == "sessions":
                for name in bad:  # the row is the session: keep it, with that column reset
                    values[idx[name]] = JSON_DEFAULTS.get(name)
                    if name == "context_state":
                        reset_context.add(values[idx["id"]])
                    result.notes.append(f"session {values[idx['id']]}: its {name} was unreadable and was reset")
            elif bad:
                rec.damaged += 1
                if table == "checkpoints" and "session_id" in idx:
                    reset_context.add(values[idx["session_id"]])  # the context refers to it
                return
            cursor = out.execute(insert, values[1:] if has_alias else values)
            if cursor.rowcount:
                rec.copied += 1
                if table == "sessions":
                    sessions.add(values[idx["id"]])
            else:
                rec.damaged += 1  # a duplicate of a row already copied: garbage that parsed

        if rec.expected is None and table == "messages":
            try:  # what the sessions said they held
                rec.expected = src.execute("SELECT sum(message_count) FROM sessions").fetchone()[0]
            except sqlite3.DatabaseError:
                pass
        _Reader(src, table, cols, rec, _hint(src, table)).read(on_row)
        rec.unreadable = _merge_ranges(rec.unreadable)
    # The message ids: carried over so ids are never reused.
    try:
        seq = src.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    except sqlite3.DatabaseError:
        seq = None
    if seq is not None:
        out.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'messages'", (seq[0],))
    # A compression state that cannot be read, or that refers to a checkpoint that could
    # not be: start that session's context afresh (its history is whole; the daemon
    # compresses it again when it next needs to).
    for sid in sorted(reset_context):
        out.execute("DELETE FROM checkpoints WHERE session_id = ?", (sid,))
        out.execute("UPDATE sessions SET context_state = '{}', context_tokens = token_count WHERE id = ?", (sid,))
        result.notes.append(f"session {sid}: its compression state was unreadable and was reset (history is whole; "
                            "ctxd compresses it again when it needs to)")
    # Messages whose session row was lost: rebuild the session from them.
    _rebuild_sessions(out, result)
    for table in OWNED:
        cursor = out.execute(f"DELETE FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)")
        if cursor.rowcount:
            rec = result.table(table)
            rec.orphans += cursor.rowcount
            rec.copied -= cursor.rowcount


def _rebuild_sessions(out: sqlite3.Connection, result: RecoveryResult) -> None:
    rows = out.execute(
        "SELECT session_id, min(created_at), max(created_at) FROM messages "
        "WHERE session_id NOT IN (SELECT id FROM sessions) GROUP BY session_id ORDER BY session_id").fetchall()
    if not rows:
        return
    found = out.execute("SELECT encoding, tokens_estimated FROM sessions LIMIT 1").fetchone()
    encoding, estimated = found if found else ("cl100k_base", 1)
    for sid, first, last in rows:
        out.execute(
            "INSERT INTO sessions (id, created_at, last_activity, encoding, tokens_estimated, tags, metadata) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (sid, first, last, encoding, estimated, json.dumps(["recovered"]),
             json.dumps({"recovered": "ctxd-cli doctor rebuilt this session from its messages; its title, model, "
                                      "settings and compression state were lost"})))
        result.sessions_rebuilt.append(sid)


def _recompute_stats(out: sqlite3.Connection, session_id: str, old_stats: str) -> bytes:
    """by_role and by_kind from the surviving messages; the usage drift is kept as it was."""
    from ctxd.store.sessions import SessionStats
    from ctxd.tokens import MessageTokens

    decode = _message_decoder()
    try:
        stats = msgspec.json.decode(old_stats or "{}", type=SessionStats)
    except msgspec.DecodeError:
        stats = SessionStats()
    stats.by_role, stats.by_kind = {}, {}
    for total, overhead, text, call, result_tokens, thinking, body in out.execute(
            "SELECT tokens, tok_overhead, tok_text, tok_tool_call, tok_tool_result, tok_thinking, body "
            "FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)):
        stats.add_message(decode(body), MessageTokens(total, overhead, text, call, result_tokens, thinking))
    return msgspec.json.encode(stats)


def _repair_sessions(out: sqlite3.Connection, result: RecoveryResult) -> None:
    """Totals from the surviving messages. ``last_seq`` never goes down, so new messages
    never reuse the number of a lost one (snapshots and checkpoints refer to seqs). A
    session's compression state is kept: lost messages are simply absent from it, which
    the daemon handles (they were summarised in checkpoints, or are missing from the
    context like from the history)."""
    rows = out.execute(
        "SELECT s.id, s.message_count, s.token_count, s.last_seq, s.stats, "
        "(SELECT count(*) FROM messages m WHERE m.session_id = s.id), "
        "(SELECT coalesce(sum(tokens), 0) FROM messages m WHERE m.session_id = s.id), "
        "(SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = s.id) "
        "FROM sessions s ORDER BY s.id").fetchall()
    rebuilt = set(result.sessions_rebuilt)
    for sid, count, tokens, last_seq, stats, real_count, real_tokens, real_last in rows:
        new_last = max(last_seq, real_last)
        if (count, tokens, last_seq) == (real_count, real_tokens, new_last) and sid not in rebuilt:
            continue
        out.execute("UPDATE sessions SET message_count = ?, token_count = ?, last_seq = ?, stats = ? WHERE id = ?",
                    (real_count, real_tokens, new_last, _recompute_stats(out, sid, stats).decode(), sid))
        if sid in rebuilt:  # its whole history is its context until the daemon compresses it
            out.execute("UPDATE sessions SET context_tokens = ? WHERE id = ?", (real_tokens, sid))
        else:
            result.sessions_recomputed.append(sid)


# --- switching ----------------------------------------------------------------------------


def damaged_name(database: Path, now: datetime | None = None) -> str:
    """The name the old file is kept under after switching: ``ctxd.damaged-<UTC time>.db``."""
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{database.stem}.damaged-{stamp}{database.suffix}"


def switch_steps(database: Path, recovered: Path, now: datetime | None = None) -> list[str]:
    """Shell commands that put ``recovered`` in place of ``database``, keeping the old file
    (with its WAL and shared-memory files, which must never meet the new one)."""
    directory = database.parent
    kept = damaged_name(database, now)
    steps = [f"cd {_quote(str(directory))}"]
    for suffix in ("", "-wal", "-shm"):
        name = database.name + suffix
        if suffix == "" or (directory / name).exists():
            steps.append(f"mv {_quote(name)} {_quote(kept + suffix)}")
    steps.append(f"mv {_quote(recovered.name)} {_quote(database.name)}")
    return steps


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def iter_problems(report: Report) -> Iterator[str]:
    for p in report.problems:
        yield f"{p.check}: {p.message}"
