"""``ctxd-cli doctor`` on a PostgreSQL database (``storage.url = "postgresql://..."``).

The same report as a SQLite file's (``check.py``), read in one read-only REPEATABLE READ
transaction so daemons may keep writing meanwhile: the server answers, the schema version
against this build's ``migrations_pg``, the search index (every message indexed or queued
for it), each session's totals against its messages, and every stored record decoded as
the daemon decodes it. Pages are PostgreSQL's own business (its WAL, data checksums,
``pg_amcheck``): there is nothing for ctxd to check or recover in them, so there is no
``--recover`` here; ``ctxd-cli migrate --to FILE`` takes a verified SQLite copy instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxd.doctor.check import TABLES, Report, _check_consistency, _check_payloads, db_errors, table_names


def _connect(url: str, password_file: str) -> Any:
    import psycopg

    from ctxd.store.postgres import CONNECT_TIMEOUT_SECONDS, read_password_file

    kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "application_name": "ctxd-doctor"}
    if password_file:
        kwargs["password"] = read_password_file(Path(password_file).expanduser())
    return psycopg.connect(url, autocommit=True, **kwargs)


def check_postgres(url: str, password_file: str = "") -> Report:
    """Check the database at ``url`` without changing it (an unreachable server or a
    database that is not ctxd's gives a report saying so, never an exception)."""
    from ctxd.store.db import StoreOpenError
    from ctxd.store.dialect import PgConn
    from ctxd.store.postgres import migrations

    report = Report(path=url, expected_schema_version=migrations()[-1][0])
    unreachable: tuple[type[Exception], ...] = (StoreOpenError, *db_errors())
    try:
        raw = _connect(url, password_file)
    except unreachable as exc:
        report.problem("file", f"cannot reach the PostgreSQL database: {str(exc).strip()}")
        report.checks["file"] = "failed"
        return report
    report.exists = True
    report.checks["file"] = "ok"
    try:
        with raw.transaction():
            raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            _check_open(PgConn(raw), report)
    except db_errors() as exc:
        report.problem("file", f"the check stopped: {str(exc).strip()}")
    finally:
        raw.close()
    return report


def _check_open(conn: Any, report: Report) -> None:
    report.size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    report.checks["integrity"] = "skipped"
    checksums = conn.execute("SELECT current_setting('data_checksums')").fetchone()[0]
    report.notes.append("pages are PostgreSQL's to check (data checksums "
                        + ("on" if checksums == "on" else "off: initdb --data-checksums turns them on")
                        + "; pg_amcheck checks indexes)")
    tables = table_names(conn)
    if "ctxd_schema" not in tables:
        report.problem("schema", "not a ctxd database (no ctxd_schema table): a daemon creates the schema when it "
                                 "first starts on an empty database")
        report.checks.update(search="skipped", consistency="skipped")
        return
    version = conn.execute("SELECT coalesce(max(version), 0) FROM ctxd_schema").fetchone()[0]
    report.schema_version = version
    expected = report.expected_schema_version or 0
    if version > expected:
        report.newer_schema = True
        report.problem("schema", f"schema version {version} was written by a newer ctxd (this one knows up to "
                                 f"{expected}): upgrade ctxd")
    elif version < expected:
        report.notes.append(f"schema version {version}: ctxd upgrades it to {expected} when a daemon next starts")
        report.checks["schema"] = "ok"
    else:
        missing = [t for t in (*TABLES, "retention_removals", "messages_fts", "search_pending") if t not in tables]
        if missing:
            report.problem("schema", f"schema version {version} but tables are missing: {', '.join(missing)}")
        else:
            report.checks["schema"] = "ok"
    _check_search(conn, report, tables)
    _check_consistency(conn, report, tables)
    _check_payloads(conn, report, tables)


def _check_search(conn: Any, report: Report, tables: set[str]) -> None:
    """Every message is in the index or waiting in its queue (``store/search_pg.py``)."""
    if not {"messages", "messages_fts", "search_pending"} <= tables:
        report.checks["search"] = "skipped"
        return
    lost = conn.execute("SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM messages_fts f "
                        "WHERE f.id = m.id) AND NOT EXISTS (SELECT 1 FROM search_pending p WHERE p.id = m.id)"
                        ).fetchone()[0]
    if lost:
        report.problem("search", f"{lost} messages are neither in the search index nor queued for it: queue them "
                                 "with INSERT INTO search_pending SELECT id FROM messages ON CONFLICT DO NOTHING")
    else:
        report.checks["search"] = "ok"
    waiting = conn.execute("SELECT count(*) FROM search_pending").fetchone()[0]
    if waiting:
        report.notes.append(f"{waiting} messages are not in the search index yet (the daemons index them in the "
                            "background)")
