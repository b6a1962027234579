"""``ctxd-cli migrate --to postgresql://...``: copy the SQLite database into PostgreSQL.

No daemon is involved: the SQLite file is read (one consistent read, so a daemon may
keep running on it, though what it stores afterwards is not copied) and everything is
written in one PostgreSQL transaction, verified by row counts and checksums before it
commits (``store/copy.py``). Then point the daemons' ``storage.url`` at the database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_REFUSED, EXIT_USAGE, CliError, _set_json, settings_of


async def _copy(path: Path, url: str, password_file: str) -> dict[str, object]:
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


@click.command("migrate")
@click.option("--to", "to", required=True, metavar="URL", help="The PostgreSQL database: postgresql://user@host/db "
              "(no password in it: PGPASSWORD, ~/.pgpass or --password-file).")
@click.option("--database", "database", metavar="FILE", type=click.Path(dir_okay=False),
              help="The SQLite file to copy (default: the configured one).")
@click.option("--password-file", "password_file", default="", metavar="FILE",
              help="A 0600 file holding the PostgreSQL password.")
@click.option("--json", "json_", is_flag=True, expose_value=False, callback=_set_json,
              help="Print the report as JSON, and nothing else, on stdout.")
@click.pass_context
def migrate(ctx: click.Context, to: str, database: str | None, password_file: str) -> None:
    """Copy a SQLite database into an empty PostgreSQL one, verified.

    \b
    One transaction: the target gets everything or nothing. Each table's row
    count and checksum are compared before COMMIT. Needs ctxd[postgres].
    """
    from ctxd.config import StorageConfig
    from ctxd.store.backend import is_postgres_url
    from ctxd.store.db import StoreOpenError

    settings = settings_of(ctx)
    if not is_postgres_url(to):
        raise CliError("--to must be a postgresql:// URL", EXIT_USAGE)
    try:
        StorageConfig(url=to)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    path = Path(database).expanduser() if database else settings.config.database_path
    if not path.is_file():
        raise CliError(f"no SQLite database at {path}", EXIT_USAGE)
    try:
        result = asyncio.run(_copy(path, to, password_file))
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
    for table, figures in result["tables"].items():  # type: ignore[union-attr]
        click.echo(f"{table:20} {figures['rows']:>10} rows  checksum {figures['checksum']}")
    click.echo(f"copied {path} into {to}; set storage.url to it on every daemon")
