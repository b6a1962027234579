"""``ctxd-cli migrate``: copy a whole ctxd database between SQLite and PostgreSQL.

``--to postgresql://...``: the SQLite file (``--database``, default the configured one)
into an empty PostgreSQL database. ``--to FILE``: a PostgreSQL database (``--from``,
default the configured ``storage.url``) back into a new SQLite file. No daemon is
involved: the source is read in one consistent read (a daemon may keep running on it,
though what it stores afterwards is not copied) and everything is written in one
transaction, verified by row counts and checksums before it commits
(``store/copy.py``). Then point the daemons' ``storage.url`` at the copy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_REFUSED, EXIT_USAGE, CliError, _set_json, settings_of


async def _copy(path: Path, url: str, password_file: str) -> dict[str, Any]:
    from ctxd.store.copy import copy_job
    from ctxd.store.postgres import PostgresDatabase

    db = PostgresDatabase(url, password_file=password_file)
    await db.open()
    try:
        report = await db.write(copy_job, path)
    finally:
        await db.close()
    return {"source": str(path), "target": url, "tables": {t: {"rows": n, "checksum": report.checksums[t]}
                                                           for t, n in report.counts.items()}}


async def _create_sqlite(path: Path) -> None:
    """A new SQLite database with this build's schema (the daemon's own checks and modes)."""
    from ctxd.store.db import Database

    db = Database(path)
    await db.open()
    await db.close()


def _copy_back(url: str, path: Path, password_file: str) -> dict[str, Any]:
    import psycopg

    from ctxd.store.copy import copy_to_sqlite
    from ctxd.store.postgres import PostgresDatabase, migrations

    kwargs = PostgresDatabase(url, password_file=password_file).connect_kwargs()
    try:
        pg = psycopg.connect(url, autocommit=True, **kwargs)
    except psycopg.Error as exc:
        from ctxd.store.db import StoreOpenError

        raise StoreOpenError(f"{url}: cannot use the PostgreSQL database: {exc}") from None
    try:
        version = pg.execute("SELECT coalesce(max(version), 0) FROM ctxd_schema").fetchone()
        known = migrations()[-1][0]
        if version is None or version[0] != known:
            raise CliError(f"{url} has schema version {version[0] if version else 0}, this ctxd writes {known}: "
                           "start a daemon of this version on it first (it migrates the schema)", EXIT_REFUSED)
        asyncio.run(_create_sqlite(path))
        try:
            report = copy_to_sqlite(pg, path)
        except BaseException:
            for suffix in ("", "-wal", "-shm"):  # the file was created here: leave nothing half-made
                Path(str(path) + suffix).unlink(missing_ok=True)
            raise
    except psycopg.errors.UndefinedTable:
        raise CliError(f"{url} holds no ctxd database (no ctxd_schema table)", EXIT_REFUSED) from None
    finally:
        pg.close()
    return {"source": url, "target": str(path), "tables": {t: {"rows": n, "checksum": report.checksums[t]}
                                                           for t, n in report.counts.items()}}


@click.command("migrate")
@click.option("--to", "to", required=True, metavar="URL|FILE", help="Where to copy to: postgresql://user@host/db "
              "(no password in it: PGPASSWORD, ~/.pgpass or --password-file), or a new SQLite file.")
@click.option("--from", "source", default="", metavar="URL", help="With --to FILE: the PostgreSQL database to copy "
              "(default: the configured storage.url).")
@click.option("--database", "database", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --to URL: the SQLite file to copy (default: the configured one).")
@click.option("--password-file", "password_file", default="", metavar="FILE",
              help="A 0600 file holding the PostgreSQL password (default: storage.password_file).")
@click.option("--json", "json_", is_flag=True, expose_value=False, callback=_set_json,
              help="Print the report as JSON, and nothing else, on stdout.")
@click.pass_context
def migrate(ctx: click.Context, to: str, source: str, database: str | None, password_file: str) -> None:
    """Copy a ctxd database between SQLite and PostgreSQL, verified.

    \b
    --to postgresql://...   the SQLite database into an empty PostgreSQL one
    --to FILE               a PostgreSQL database back into a new SQLite file
    One transaction: the target gets everything or nothing. Each table's row
    count and checksum are compared before COMMIT. Needs ctxd[postgres].
    """
    from ctxd.config import StorageConfig
    from ctxd.store.backend import is_postgres_url
    from ctxd.store.db import StoreOpenError

    settings = settings_of(ctx)
    back = not is_postgres_url(to)
    url = (source or settings.config.storage.url) if back else to
    if back and database:
        raise CliError("--database names the SQLite source of a copy into PostgreSQL; with --to FILE give "
                       "--from URL", EXIT_USAGE)
    if not back and source:
        raise CliError("--from names the PostgreSQL source of a copy into a SQLite file (--to FILE)", EXIT_USAGE)
    if not is_postgres_url(url):
        raise CliError("nothing to copy from: --to FILE copies a PostgreSQL database (--from postgresql://... or "
                       "storage.url) into a new SQLite file; --to postgresql://... copies SQLite into PostgreSQL",
                       EXIT_USAGE)
    try:
        StorageConfig(url=url)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    password_file = password_file or settings.config.storage.password_file
    try:
        if back:
            path = Path(to).expanduser()
            if path.exists() or Path(str(path) + "-wal").exists():
                raise CliError(f"{path} exists: copy into a new file (the copy never overwrites one)", EXIT_USAGE)
            result = _copy_back(url, path, password_file)
        else:
            path = Path(database).expanduser() if database else settings.config.database_path
            if not path.is_file():
                raise CliError(f"no SQLite database at {path}", EXIT_USAGE)
            result = asyncio.run(_copy(path, url, password_file))
    except CliError:
        raise
    except ImportError as exc:
        raise CliError(f"the PostgreSQL driver is missing ({exc}): pip install 'ctxd[postgres]'",
                       EXIT_REFUSED) from None
    except StoreOpenError as exc:
        raise CliError(str(exc), EXIT_REFUSED) from None
    except Exception as exc:  # CtxdError from the copy: nothing was stored
        message = getattr(exc, "message", None) or str(exc)
        raise CliError(f"nothing was copied: {message}", EXIT_REFUSED) from None
    if settings.json:
        render.print_json(result)
        return
    for table, figures in result["tables"].items():
        click.echo(f"{table:20} {figures['rows']:>10} rows  checksum {figures['checksum']}")
    if back:
        click.echo(f"copied {url} into {result['target']}; to use it: storage.url = \"\" and that file as "
                   f"daemon.data_dir/ctxd.db (or --data-dir its directory)")
    else:
        click.echo(f"copied {path} into {to}; set storage.url to it on every daemon")
