"""The daemon: configuration, service, transports, and how it stops.

Over stdio it serves the one client that spawned it and exits when that client
sends ``exit``, closes stdin, or (given ``processId``) dies. Over a Unix socket or
TCP it serves any number of clients until ``daemon/stop``, SIGTERM/SIGINT, or
``idle_exit_seconds`` without a connection. Socket clients that have not completed
``initialize`` are held to ``limits.max_pending_connections`` per transport, and over
TCP per uid (see ``Connection.guarded`` for what else applies to them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from ctxd.config import Config
from ctxd.llm.settings import SettingsError
from ctxd.loopback import peer_uid
from ctxd.server.app import App
from ctxd.server.connection import Connection, Writer
from ctxd.server.subscriptions import Hub
from ctxd.server.transports import (
    SocketLock,
    claim_socket,
    load_or_create_token,
    open_stdio,
    serve_tcp,
    serve_unix,
)
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.sessions import enforce_retention
from ctxd.store.backend import is_postgres_url
from ctxd.store.lock import DatabaseLock

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start for a reason its message gives (exit code 2)."""


class Daemon:
    def __init__(self, config: Config, *, stdio: bool = False, unix: bool = False, tcp_port: int | None = None):
        self.config = config
        self.stdio = stdio
        self.unix = unix
        self.tcp_port = tcp_port
        self.hub = Hub()
        self.app = App(config, self.hub, control=self)
        self.service: Service = None  # type: ignore[assignment]  # (set in run)
        self.tcp_token = ""
        self.started_at = now_iso()
        self._stop = asyncio.Event()
        self._servers: list[Any] = []
        self._lock: SocketLock | None = None
        self._data_lock: DatabaseLock | None = None
        """One daemon per SQLite file (store/lock.py); None on PostgreSQL."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._clean_exit = False
        self.bound: dict[str, str] = {}
        self._waiting: dict[str, int] = {}
        """Per socket transport (over TCP, per uid: ``_admit_tcp``), the connections whose
        ``initialize`` has not succeeded yet."""
        self._group_of: dict[Connection, str] = {}
        self._turned_away: dict[str, int] = {}

    # --- what handlers may ask (server.app.DaemonControl) --------------------------------

    def stop_later(self) -> None:
        """Stop after the current response has been written."""
        asyncio.get_running_loop().call_soon(self.stop)

    def stop(self) -> None:
        self._stop.set()

    async def stopped(self) -> None:
        """Until :meth:`stop` is called: what a process embedding the daemon (``ctxd proxy``,
        ``proxy.in_process``) waits on, so that ``daemon/stop`` stops it too."""
        await self._stop.wait()

    def transport_names(self) -> list[str]:
        return [f"{kind}:{where}" for kind, where in self.bound.items()]

    def _serving(self) -> list[str]:
        """Where this daemon serves, as its database's lock file says it: what is bound,
        else what it is about to bind."""
        names = self.transport_names() or [f"unix:{self.config.socket_path}"] * self.unix
        if "tcp" not in self.bound and self.tcp_port:
            names.append(f"tcp:127.0.0.1:{self.tcp_port}")
        return names + ["stdio"] * self.stdio

    def watch_parent(self, pid: int) -> None:
        """Exit when the process that spawned us over stdio goes away."""
        if not 0 < pid <= 0x7FFFFFFF:  # 0 and negatives name process groups; huge ones overflow kill()
            log.warning("initialize: processId %d is not a process id; not watching it", pid)
            return

        async def watch() -> None:
            while not self._stop.is_set():
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    log.warning("parent process %d is gone; exiting", pid)
                    self.stop()
                    return
                except PermissionError:
                    pass  # exists, owned by someone else
                await asyncio.sleep(1.0)

        self._spawn(watch())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- connections ----------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: Writer, transport: str,
                                group: str | None = None) -> None:
        """Serve one client. ``group``: the waiting slot a TCP connection took as it was
        accepted (``_admit_tcp``); a Unix-socket connection takes one here."""
        guarded = transport != "stdio"
        if guarded and group is None:
            group = transport
            if not self._take_slot(group):
                writer.close()
                return
        conn = Connection(self.app, reader, writer, transport=transport, requires_token=(transport == "tcp"),
                          guarded=guarded, on_initialized=self._initialized)
        if guarded:
            assert group is not None
            self._group_of[conn] = group
        self.hub.add(conn)
        log.info("connection %s opened (%s)", conn.id, transport)
        try:
            await conn.serve()
        except Exception:
            log.exception("connection %s failed", conn.id)
        finally:
            conn.close()
            self.hub.remove(conn)
            self._initialized(conn)
            log.info("connection %s closed", conn.id)
            if transport == "stdio":
                self._clean_exit = conn.shutdown_requested
                self.stop()

    def _admit_tcp(self, client: Any, server: Any) -> tuple[str | None, bool]:
        """A TCP connection just accepted, before anything is made for it: the waiting
        slot it takes; or None, and whether it is parked (another user's: held unread
        for a while, so that they cannot reconnect as fast as they are closed) rather
        than closed at once (this user's). Over TCP, which every local user can reach,
        each uid has its own ``limits.max_pending_connections`` (the kernel names the
        client socket's owner, ``loopback.peer_uid``), so another user who keeps
        connections open without the token fills only their own."""
        uid: int | None = os.geteuid()
        try:
            uid = peer_uid(client[:2], server[:2])
        except OSError:  # the kernel cannot say (not Linux): one group for all
            group = "tcp"
        else:
            group = f"tcp (uid {uid})" if uid is not None else "tcp (uid unknown)"
        if self._take_slot(group):
            return group, False
        return None, uid != os.geteuid()

    def _take_slot(self, group: str) -> bool:
        """One of ``group``'s slots for a connection waiting for ``initialize``; False (and
        one warning when it starts happening, one count when it stops) when all are taken."""
        taken = self._waiting.get(group, 0)
        if taken < self.config.limits.max_pending_connections:
            self._waiting[group] = taken + 1
            return True
        count = self._turned_away.get(group, 0) + 1
        self._turned_away[group] = count
        if count == 1:
            log.warning("%d %s connections are waiting for initialize (limits.max_pending_connections); "
                        "closing new ones at once until some initialize or time out", taken, group)
        return False

    def _free_slot(self, group: str) -> None:
        taken = self._waiting.get(group, 0) - 1
        if taken > 0:
            self._waiting[group] = taken
        else:
            self._waiting.pop(group, None)  # (one group per uid seen: none kept once empty)
        turned_away = self._turned_away.pop(group, 0)
        if turned_away > 1:
            log.warning("%d %s connection(s) were closed at once while %d waited for initialize",
                        turned_away, group, self.config.limits.max_pending_connections)

    def _initialized(self, conn: Connection) -> None:
        """``conn`` no longer waits for ``initialize`` (it succeeded, or the connection closed)."""
        group = self._group_of.pop(conn, None)
        if group is not None:
            self._free_slot(group)

    # --- run --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open storage and listeners; raises StoreOpenError/TransportError on failure."""
        if self.unix:
            # One daemon per socket, decided before the database is touched: a daemon that
            # lost a start race must not run migrations or retention next to the winner.
            self._lock = claim_socket(self.config.socket_path)
        try:
            if not is_postgres_url(self.config.storage.url):
                # One daemon per SQLite file (its sessions' state lives in this process's
                # memory), also decided before the database is touched; after the socket's,
                # so that two clients autostarting on one socket still meet there.
                self._data_lock = DatabaseLock(self.config.database_path)
                await self._data_lock.acquire(self._serving())
            try:
                self.service = await Service.open(self.config, events=self.hub)
            except SettingsError as exc:
                raise StartupError(f"configuration error: [summarizer] {exc}") from None
            self.app.service = self.service
            await enforce_retention(self.service)
            if self.unix:
                path = self.config.socket_path
                assert self._lock is not None
                server = await serve_unix(path, self._serve_connection, self._lock)
                self._servers.append(server)
                self.bound["unix"] = str(path)
            if self.tcp_port is not None:
                self.tcp_token = load_or_create_token(self.config.token_path)
                tcp = await serve_tcp(self.tcp_port, self._serve_connection, self._admit_tcp, self._free_slot,
                                      hold=self.config.limits.initialize_timeout_seconds)
                self._servers.append(tcp)
                port = tcp.sockets[0].getsockname()[1]
                self.bound["tcp"] = f"127.0.0.1:{port}"
            if self._data_lock is not None:
                self._data_lock.serving(self._serving())
        except BaseException:
            await self.close()
            raise

    async def run(self) -> int:
        """Serve until stopped; the exit code follows LSP (1 when exit came without shutdown).
        SIGTERM and SIGINT are ours before the first listener opens: one that comes the
        moment the socket serves stops the daemon cleanly instead of killing it."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):
                pass
        await self.start()
        for kind, where in self.bound.items():
            log.warning("ctxd %s listening on %s %s", os.getpid(), kind, where)
        if self.stdio:
            reader, writer = await open_stdio()
            self._spawn(self._serve_connection(reader, writer, "stdio"))
        if self.config.daemon.idle_exit_seconds > 0 and not self.stdio:
            self._spawn(self._idle_watch(self.config.daemon.idle_exit_seconds))
        await self._stop.wait()
        await self.close()
        if self.stdio:
            return 0 if self._clean_exit else 1
        return 0

    async def _idle_watch(self, seconds: float) -> None:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            await asyncio.sleep(min(seconds, 1.0))
            if self.hub.connections:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= seconds:
                log.warning("no connections for %.0f s; exiting", seconds)
                self.stop()

    async def close(self) -> None:
        if self._data_lock is not None:
            # Said before the socket is let go: a daemon the next client starts on it waits
            # for this one to close the database instead of refusing.
            self._data_lock.stopping()
        for server in self._servers:
            server.close()
        for conn in list(self.hub.connections):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self.unix and "unix" in self.bound:
            try:
                os.unlink(self.bound["unix"])
            except OSError:
                pass
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self.service is not None:
            await self.service.close()
            self.service = None  # type: ignore[assignment]
            self.app.service = None
        if self._data_lock is not None:  # after the database is closed, never before
            self._data_lock.release()
            self._data_lock = None
        self._servers.clear()
