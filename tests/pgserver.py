"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` + ``pg_ctl`` in a
temporary directory, listening only on a Unix socket in that directory, trust
authentication for a temporary user. Nothing is mocked: it is the system's server.

The binaries are looked up on PATH, then where Debian's ``postgresql`` package puts
them (``/usr/lib/postgresql/<version>/bin``). PostgreSQL refuses to run as root, so
under root the server runs as the ``postgres`` user (or ``nobody``) via ``setpriv``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

USER = "ctxd_test"


def find_binaries() -> tuple[Path, Path] | None:
    """(initdb, pg_ctl), or None when PostgreSQL's server is not installed."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb), Path(pg_ctl)
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        i, p = Path(bindir, "initdb"), Path(bindir, "pg_ctl")
        if i.exists() and p.exists():
            return i, p
    return None


def missing_reason() -> str:
    return ("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin: "
            "install Debian's `postgresql` package to run the PostgreSQL tests")


def _run_as() -> tuple[list[str], int | None, int | None]:
    """A prefix running a command as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return [], None, None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return (["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"],
                pw.pw_uid, pw.pw_gid)
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


@dataclass
class PgServer:
    root: Path
    pg_ctl: Path
    prefix: list[str]

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, dbname: str) -> str:
        return f"postgresql://{USER}@/{dbname}?host={self.socket_dir}"

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.socket_dir} user={USER} dbname={dbname}"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database; its storage.url."""
        import psycopg

        name = name or "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def pg_ctl_cmd(self, *args: str) -> None:
        subprocess.run([*self.prefix, str(self.pg_ctl), "-D", str(self.root / "data"), *args],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def start(self) -> None:
        self.pg_ctl_cmd("-w", "-l", str(self.root / "server.log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl_cmd("-w", "-m", mode, "stop")


def start_server() -> PgServer:
    """Start a server in a new temporary directory (caller stops it and removes ``root``)."""
    found = find_binaries()
    if found is None:
        raise RuntimeError(missing_reason())
    initdb, pg_ctl = found
    prefix, uid, gid = _run_as()
    root = Path(tempfile.mkdtemp(prefix="ctxd-pg-"))
    (root / "sock").mkdir()
    if uid is not None:
        os.chmod(root, 0o755)
        for path in (root, root / "sock"):
            os.chown(path, uid, gid)  # type: ignore[arg-type]
    subprocess.run([*prefix, str(initdb), "-D", str(root / "data"), "-U", USER, "--auth=trust",
                    "--encoding=UTF8", "--locale=C", "--no-sync"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    with open(root / "data" / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{root / 'sock'}'\n"
                   "max_connections = 200\nfsync = on\nshared_buffers = 64MB\n")
    server = PgServer(root, pg_ctl, prefix)
    server.start()
    return server


def stop_server(server: PgServer) -> None:
    try:
        server.stop("immediate")
    finally:
        shutil.rmtree(server.root, ignore_errors=True)
