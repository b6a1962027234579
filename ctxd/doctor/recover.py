"""``ctxd-cli doctor --recover``: copy what can be read of a ctxd database into a new file.

:func:`recover` never changes the old file. It creates a new database next to it
(``ctxd.recovered-<UTC time>.db``) with ctxd's own migrations, then copies every row
it can read, table by table, walking each table in rowid order: when a page cannot
be read it skips ahead to where reading works again and then narrows the skipped
range down, so one bad page costs the rows on that page, not the table. Messages
whose session row was lost get a rebuilt session; session totals are recomputed from
the messages that survived; the search index is left empty for the daemon to rebuild.
Rows are kept only when they decode as the daemon decodes them (``store/payloads.py``).
:func:`switch_steps` says how to put the new file in place of the old one.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ctxd.doctor.check import OWNED, TABLES, DoctorError, Report, column_info, open_readonly, sniff, table_names
from ctxd.store.files import fsync_directory
from ctxd.store.messages import IMPORTING
from ctxd.store.payloads import decodes, payload_decoders

# Read attempts one table's damaged ranges may cost before the rest of a range is given up.
RESCUE_BUDGET = 200_000
MAX_ROWID = (1 << 63) - 1
JSON_DEFAULTS = {"tags": "[]", "metadata": "{}", "stats": "{}", "context_state": "{}", "settings": "{}",
                 "model_info": "{}"}


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
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
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
        src_tables = table_names(src)
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
            src_cols = {name for name, _ in column_info(src, table)}
        except sqlite3.DatabaseError as exc:
            rec.error = f"cannot read its columns: {exc}"
            continue
        dest_cols = column_info(out, table)
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
            bad = [name for name, decode in checks.items() if not decodes(decode, values[idx[name]])]
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
    _drop_unfinished(src, out, src_tables, result)
    # Messages whose session row was lost: rebuild the session from them.
    _rebuild_sessions(out, result)
    for table in OWNED:
        cursor = out.execute(f"DELETE FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)")
        if cursor.rowcount:
            rec = result.table(table)
            rec.orphans += cursor.rowcount
            rec.copied -= cursor.rowcount


def _drop_unfinished(src: sqlite3.Connection, out: sqlite3.Connection, src_tables: set[str],
                     result: RecoveryResult) -> None:
    """Rows of an unfinished push (``store/messages.py``, "Staged pushes") were never
    acknowledged: they are left out (else the totals below would take them in), and so is
    the session of an unfinished import, with all its rows."""
    if "unfinished_pushes" not in src_tables:
        return
    try:
        marks = src.execute("SELECT session_id, after_seq FROM unfinished_pushes").fetchall()
    except sqlite3.DatabaseError:
        return
    for sid, after in marks:
        if after == IMPORTING:
            cursor = out.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
        else:
            cursor = out.execute("DELETE FROM messages WHERE session_id = ? AND seq > "
                                 "(SELECT last_seq FROM sessions WHERE id = ?)", (sid, sid))
        if cursor.rowcount:
            rec = result.table("messages")
            rec.copied -= cursor.rowcount
            if rec.expected is not None:
                rec.expected -= cursor.rowcount
            result.notes.append(f"session {sid}: {cursor.rowcount} message rows of an unfinished "
                                f"{'import' if after == IMPORTING else 'push'} (never acknowledged) were left out")
        if after == IMPORTING and out.execute("DELETE FROM sessions WHERE id = ?", (sid,)).rowcount:
            rec = result.table("sessions")
            rec.copied -= 1
            if rec.expected is not None:
                rec.expected -= 1
            result.notes.append(f"session {sid}: an unfinished import (never acknowledged nor shown) was left out")


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


def damaged_name(database: Path, now: datetime | None = None) -> str:
    """The name the old file is kept under after switching: ``ctxd.damaged-<UTC time>.db``."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
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
