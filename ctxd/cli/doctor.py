"""``ctxd-cli doctor``: check the database, and recover what can be read of a SQLite file.

Works without a daemon (and never starts one): it reads ``DATA_DIR/ctxd.db`` itself,
read-only, or the PostgreSQL database ``storage.url`` (or ``--url``) names, in one
read-only transaction (``doctor/check_pg.py``). ``--recover`` writes
``ctxd.recovered-<UTC time>.db`` next to a SQLite file and says how to switch; the old
file is never changed. PostgreSQL keeps its own pages, so it has no ``--recover``.
"""

from __future__ import annotations

import asyncio
import shutil
import socket as socketlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError, _set_json, settings_of

CHECK_LABELS = (("file", "file"), ("integrity", "integrity"), ("schema", "schema"), ("search", "search index"),
                ("consistency", "session totals"))


def daemon_listening(path: Path) -> bool:
    """Whether something accepts connections on the daemon's socket (no request is sent)."""
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    sock.settimeout(1)
    try:
        sock.connect(str(path))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def daemon_uses(socket: Path, database: Path) -> bool:
    """Whether a daemon answering on ``socket`` serves ``database`` (it says so in
    ``daemon/status``; one that will not say is assumed to)."""
    if not daemon_listening(socket):
        return False

    async def ask() -> str:
        from ctxd.client import Client

        client = await Client.connect_unix(socket)
        try:
            await client.initialize(client_name="ctxd-cli doctor")
            status = await client.request("daemon/status", timeout=5)
            return str(status["database"])
        finally:
            await client.close()

    try:
        served = asyncio.run(asyncio.wait_for(ask(), 10))
    except Exception:  # something listens but does not answer like ctxd: be careful
        return True
    return Path(served).expanduser().resolve() == database.expanduser().resolve()


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def disk_use(path: Path) -> dict[str, int | None]:
    """Bytes on disk of the database, its write-ahead log and shared-memory index (0 when
    absent), their total, and what is free on that file system."""
    sizes: dict[str, int | None] = {}
    for key, suffix in (("database", ""), ("wal", "-wal"), ("shm", "-shm")):
        try:
            sizes[key] = Path(str(path) + suffix).stat().st_size
        except OSError:
            sizes[key] = 0
    sizes["total"] = sum(v or 0 for v in sizes.values())
    try:
        sizes["free"] = shutil.disk_usage(path.parent).free
    except OSError:
        sizes["free"] = None
    return sizes


def disk_pair(sizes: dict[str, int | None]) -> tuple[str, Any]:
    text = (f"{_size(sizes['total'])} (database {_size(sizes['database'])}, write-ahead log {_size(sizes['wal'])}, "
            f"shared memory {_size(sizes['shm'])})")
    if sizes.get("free") is not None:
        text += f"; {_size(sizes['free'])} free"
    return ("disk use", text)


def check_pairs(report: Any) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [("database", f"{report.path} ({_size(report.size)})" if report.exists
                                     else report.path)]
    by_check: dict[str, list[str]] = {}
    for problem in report.problems:
        by_check.setdefault(problem.check, []).append(problem.message)
    for key, label in CHECK_LABELS:
        state = report.checks.get(key)
        if state is None:
            continue
        if state == "ok":
            value: Any = render.Styled("ok", "green")
            if key == "schema" and report.schema_version is not None:
                value = render.Styled(f"ok (version {report.schema_version}, this ctxd: "
                                      f"{report.expected_schema_version})", "green")
            if key == "consistency" and report.sessions is not None:
                value = render.Styled(f"ok ({render.count(report.sessions, 'session')}, "
                                      f"{render.count(report.messages, 'message')})", "green")
        elif state == "skipped":
            value = render.Styled("not checked", "dim")
        else:
            found = render.count(len(by_check.get(key, [])), "problem")
            value = render.Styled(found if state == "problems" else "failed", "bold red")
        pairs.append((label, value))
        for message in by_check.get(key, []):
            pairs.append(("", f"- {message}"))
    for note in report.notes:
        pairs.append(("note", note))
    return pairs


def recovery_pairs(result: Any) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [("new file", result.path)]
    for t in result.tables:
        parts = [f"{render.num(t.copied)} copied"]
        if t.error:
            parts.append(render.Styled(f"unreadable: {t.error}", "red").text)
        lost = t.lost
        if lost:
            parts.append(f"{render.num(lost)} lost (of {render.num(t.expected)})")
        elif t.expected is None and t.unreadable:
            parts.append("an unknown number lost")
        if t.unreadable:
            ranges = ", ".join(render.seq_range(lo, hi) if hi < (1 << 62) else f"{lo}-end"
                               for lo, hi in t.unreadable[:5])
            more = f" and {len(t.unreadable) - 5} more" if len(t.unreadable) > 5 else ""
            parts.append(f"unreadable rowids {ranges}{more}")
        if t.damaged:
            parts.append(f"{render.num(t.damaged)} damaged rows left out")
        if t.orphans:
            parts.append(f"{render.num(t.orphans)} left out (their session is gone)")
        bad = bool(lost or t.unreadable or t.damaged or t.orphans or t.error)
        pairs.append((t.table, render.Styled(", ".join(parts), "yellow" if bad else "green")))
    if result.sessions_rebuilt:
        pairs.append(("rebuilt", f"{render.count(len(result.sessions_rebuilt), 'session')} from their messages "
                                 f"(title, model, settings lost): {', '.join(result.sessions_rebuilt[:10])}"))
    if result.sessions_recomputed:
        pairs.append(("recomputed", f"totals of {render.count(len(result.sessions_recomputed), 'session')} from "
                                    f"the messages that survived: {', '.join(result.sessions_recomputed[:10])}"))
    pairs.append(("search index", "empty: the daemon rebuilds it when it starts"))
    for note in result.notes[:10]:
        pairs.append(("note", note))
    return pairs


def _postgres(url: str, password_file: str, recover: bool, json_output: bool) -> None:
    """The check of a PostgreSQL database: printed, and the exit code."""
    from ctxd.doctor.check_pg import check_postgres

    if recover:
        raise CliError("--recover copies what can be read of a damaged SQLite file; PostgreSQL keeps its own pages "
                       "(crash recovery, backups, pg_amcheck). For a verified SQLite copy of this database: "
                       "ctxd-cli migrate --to FILE", EXIT_USAGE)
    try:
        report = check_postgres(url, password_file)
    except ImportError as exc:
        raise CliError(f"the PostgreSQL driver is missing ({exc}): pip install 'ctxd[postgres]'",
                       EXIT_REFUSED) from None
    if json_output:
        render.print_json({"database": url, "ok": report.ok, "diskUse": {"database": report.size,
                                                                       "total": report.size},
                           "check": report.to_json(), "recovery": None, "recoveryError": None, "switch": [],
                           "daemonRunning": None})
    else:
        pairs = check_pairs(report)
        pairs[0] = ("database", url)
        pairs.insert(1, ("disk use", _size(report.size)))
        render.fields(pairs, title="ctxd doctor")
        render.line("")
        if report.ok:
            render.line(render.Styled("healthy: no problems found", "bold green"))
        else:
            render.line(render.Styled(f"{render.count(len(report.problems), 'problem')} found", "bold red"))
    if not report.ok:
        raise click.exceptions.Exit(EXIT_REFUSED)


@click.command("doctor")
@click.option("--data-dir", "data_dir", metavar="DIR", help="The data directory to check (default: from the "
              "configuration, like the rest of ctxd-cli).")
@click.option("--url", "url", metavar="URL", help="Check this PostgreSQL database (default: storage.url when it "
              "names one).")
@click.option("--database", "database", metavar="FILE", type=click.Path(dir_okay=False),
              help="Check this database file instead (e.g. a recovered one before switching to it).")
@click.option("--recover", is_flag=True, help="Copy everything readable into a new file next to the old one "
              "(ctxd.recovered-<UTC time>.db), which is left untouched, and say how to switch.")
@click.option("--json", "json_", is_flag=True, expose_value=False, callback=_set_json,
              help="Print the report (and the recovery's) as JSON, and nothing else, on stdout.")
@click.pass_context
def doctor(ctx: click.Context, data_dir: str | None, url: str | None, database: str | None, recover: bool) -> None:
    """Check ctxd's database without a daemon; with --recover, save what can be read.

    \b
    Checks: SQLite's integrity check, the schema version, the full-text search
    index, and each session's totals against its messages. The file is opened
    read-only; no daemon is started. On PostgreSQL (storage.url or --url) the
    same checks but the pages', in one read-only transaction; no --recover.

    \b
    Exit codes: 0 healthy (with --recover: the new file was written),
    1 problems found (with --recover: nothing could be recovered),
    2 no database there / bad options.
    """
    from ctxd import doctor as store_doctor
    from ctxd.store.backend import is_postgres_url

    settings = settings_of(ctx)
    if sum(map(bool, (database, data_dir, url))) > 1:
        raise click.UsageError("give one of --data-dir, --database and --url")
    if url is not None:
        from ctxd.config import StorageConfig

        if not is_postgres_url(url):
            raise click.UsageError("--url must be a postgresql:// URL (a SQLite file: --database FILE)")
        try:
            StorageConfig(url=url)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    if url or (not database and not data_dir and is_postgres_url(settings.config.storage.url)):
        _postgres(url or settings.config.storage.url, settings.config.storage.password_file, recover, settings.json)
        return
    if database:
        path = Path(database).expanduser()
    else:
        if data_dir:
            settings.use_data_dir(data_dir)
        path = settings.config.data_dir.expanduser() / store_doctor.DB_NAME
    if not path.exists():
        where = f"in {path.parent}" if not database else f"at {path}"
        raise CliError(f"no ctxd database {where} (give --data-dir DIR or --database FILE)", EXIT_USAGE)

    report = store_doctor.check(path)
    result = None
    failure: str | None = None
    if recover:
        try:
            result = store_doctor.recover(path)
        except store_doctor.DoctorError as exc:
            failure = str(exc)
    running = False
    if not database:
        try:
            running = daemon_uses(settings.socket_path, path)
        except Exception:  # a bad socket setting must not stop a check that does not need it
            running = False
    now = datetime.now(UTC)
    steps = store_doctor.switch_steps(path, Path(result.path), now) if result is not None else []

    sizes = disk_use(path)
    if settings.json:
        render.print_json({"database": str(path), "ok": report.ok, "diskUse": sizes, "check": report.to_json(),
                           "recovery": result.to_json() if result is not None else None,
                           "recoveryError": failure, "switch": steps, "daemonRunning": running})
    else:
        pairs = check_pairs(report)
        pairs.insert(1, disk_pair(sizes))
        render.fields(pairs, title="ctxd doctor")
        render.line("")
        if report.ok:
            render.line(render.Styled("healthy: no problems found", "bold green"))
        else:
            render.line(render.Styled(f"{render.count(len(report.problems), 'problem')} found", "bold red"))
        if failure is not None:
            render.line(render.Styled("recovery failed:", "bold red"), failure)
        elif result is not None:
            render.line("")
            render.fields(recovery_pairs(result), title="Recovery (the old file was not changed)")
            render.line("")
            render.line(render.Styled("To switch to the recovered database:", "bold"))
            stop = ("ctxd-cli daemon stop" + (f"   (a daemon is listening on {settings.socket_path})" if running
                                             else "   (if one is running)"))
            for i, step in enumerate([stop, *steps, "ctxd-cli daemon start   (or any command)"], start=1):
                render.line(f"  {i}. {step}")
            companions = [s for s in ("-wal", "-shm") if Path(str(path) + s).exists()]
            render.line(f"The old database is kept as {store_doctor.damaged_name(path, now)}"
                        + (f" (with its {' and '.join(companions)} files: they must move with it, never stay next to "
                           "the new one)" if companions else "") + "; delete it once you are happy.")
        elif report.newer_schema:
            render.line("This database was written by a newer ctxd: upgrade ctxd (pip install -U ctxd) rather "
                        "than recover it, which would drop what this version does not know.")
        elif not report.ok and report.sqlite:
            render.line("To copy what can be read into a new file (the old one is kept): "
                        "ctxd-cli doctor --recover" + (f" --data-dir {path.parent}" if not database else
                                                        f" --database {path}"))
        if running and not report.ok and result is None:
            render.note(f"a ctxd daemon is listening on {settings.socket_path}: it may be writing while this "
                        "check reads")
    if recover:
        code = EXIT_OK if result is not None else EXIT_REFUSED
    else:
        code = EXIT_OK if report.ok else EXIT_REFUSED
    if code:
        raise click.exceptions.Exit(code)
