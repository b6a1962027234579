"""A small asyncio client for ctxd: what ctxd-cli, the benchmarks and Python agents use.

    async with await Client.connect_unix(path) as client:
        info = await client.request("session/create", {"model": "llama3.2:3b"})

Params may be dicts or msgspec Structs; results come back as plain JSON values, or
as a Struct when ``result_type`` is given. Notifications are delivered to
``on_notification`` callbacks and to :meth:`notifications` iterators.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ctxd import __version__
from ctxd.loopback import server_uid
from ctxd.ownership import UnsafeDirectory, check_shared_dir, me, open_private_log, owner
from ctxd.protocol.errors import RpcError as RpcError  # (where clients have always found it)

T = TypeVar("T")
log = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class DaemonUnavailable(Exception):
    """No daemon could be reached (or started); the message says where and why."""


class ForeignDaemon(DaemonUnavailable):
    """The socket is served by another user's process: not a daemon to talk to, nor one to
    replace by starting ours."""


def _brief(value: Any, limit: int = 2000) -> str:
    """A value as JSON for the debug log, cut at ``limit`` characters."""
    try:
        text = _encode(value).decode("utf-8", "replace")
    except (TypeError, msgspec.EncodeError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def check_peer(writer: asyncio.StreamWriter, path: str | Path) -> None:
    """Talk only to a daemon of this user's: whoever serves a socket (one in a shared
    directory, or a stale path another user took over) would receive every request, pushed
    conversations included. The peer's uid comes from the kernel (``SO_PEERCRED``, Linux);
    elsewhere nothing is checked. Closes the connection and raises DaemonUnavailable."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except OSError:
        return
    if uid != os.geteuid():
        writer.close()
        raise ForeignDaemon(f"the socket {path} is served by a process of {owner(uid)}, not of this user "
                                f"({me()}): nothing was sent to it. Use a socket in a directory of your own "
                                f"(--socket, daemon.socket)")


async def check_server(writer: asyncio.StreamWriter, where: str, *, unchecked: bool = False) -> None:
    """Talk over TCP only to a server of this user's, before anything (the token) is sent:
    127.0.0.1 is every local user's, and whoever listens on the port first receives what
    the client sends. The kernel names the owner of the server's end of this connection
    (``loopback.server_uid``: sock_diag, else /proc/net/tcp). Closes the connection and
    raises ForeignDaemon when it is another user's, or when the kernel cannot say (not
    Linux; a server not on this machine) unless ``unchecked``."""
    sock = writer.get_extra_info("socket")
    try:
        mine, theirs = sock.getsockname()[:2], sock.getpeername()[:2]
        if not ipaddress.ip_address(theirs[0]).is_loopback:
            raise OSError(f"{theirs[0]} is not a loopback address: the kernel knows only this machine's sockets")
        uid = await server_uid(mine, theirs)
    except OSError as exc:
        if unchecked:
            log.warning("cannot tell which user serves %s (%s); daemon.tcp_allow_unchecked: connecting anyway",
                        where, exc)
            return
        writer.close()
        raise ForeignDaemon(f"cannot tell which user serves {where} ({exc}), so the token was not sent: another "
                            f"user could be listening there. Use the Unix socket, or set "
                            f"daemon.tcp_allow_unchecked = true to send it anyway") from None
    if uid != os.geteuid():
        writer.close()
        who = owner(uid) if uid is not None else "no process the kernel names"
        raise ForeignDaemon(f"{where} is served by {who}, not by this user ({me()}): nothing was sent to it "
                            f"(not the token). Another user may have taken the port: start ctxd --tcp on "
                            f"another port, or use the Unix socket")


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 process: asyncio.subprocess.Process | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self.process = process
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._callbacks: list[Callable[[str, Any], None]] = []
        self._queues: list[asyncio.Queue[tuple[str, Any] | None]] = []
        self._closed = False
        self.server_info: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.started_daemon: int | None = None
        """The pid of the daemon :func:`start_daemon` started for this connection, if it did."""
        self.daemon_log: Path | None = None
        """Where that daemon logs."""
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    # --- connecting -----------------------------------------------------------------

    @classmethod
    async def connect_unix(cls, path: str | Path) -> Client:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(f"no ctxd daemon at {path} ({exc.strerror})") from None
        check_peer(writer, path)
        log.info("connected to %s", path)
        return cls(reader, writer)

    @classmethod
    async def connect_tcp(cls, port: int, host: str = "127.0.0.1", *, unchecked: bool = False) -> Client:
        """A connection to a TCP daemon, once the kernel says its server is this user's
        (:func:`check_server`: the token goes only there). ``unchecked``
        (``daemon.tcp_allow_unchecked``): where the kernel cannot say, connect anyway."""
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        except OSError as exc:
            raise DaemonUnavailable(f"no ctxd daemon at {host}:{port} ({exc.strerror})") from None
        await check_server(writer, f"{host}:{port}", unchecked=unchecked)
        log.info("connected to %s:%d", host, port)
        return cls(reader, writer)

    @classmethod
    async def spawn_stdio(cls, args: list[str] | None = None, env: dict[str, str] | None = None) -> Client:
        """Start ``python -m ctxd`` (plus ``args``) as a child speaking stdio."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ctxd", *(args or []), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env, limit=1 << 24)
        assert process.stdout is not None and process.stdin is not None
        return cls(process.stdout, process.stdin, process)

    async def initialize(self, *, token: str | None = None, client_name: str = "ctxd-client",
                         process_id: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"processId": process_id, "clientInfo": {"name": client_name, "version": __version__}}
        if token is not None:
            params["initializationOptions"] = {"token": token}
        result = await self.request("initialize", params)
        self.notify("initialized", {})
        self.server_info = result.get("serverInfo", {})
        self.capabilities = result.get("capabilities", {})
        return result

    # --- requests -------------------------------------------------------------------

    async def request(self, method: str, params: Any = None, *, result_type: type[T] | None = None,
                      timeout: float | None = None) -> Any:
        if self._closed:
            raise DaemonUnavailable("connection to ctxd is closed")
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self._send(message)
        started = time.monotonic()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("-> %s #%d %s", method, msg_id, _brief(params))
        try:
            # Shielded: cancelling the caller must leave the future pending, so the
            # daemon is told to stop (a cancelled future would look answered).
            raw = await asyncio.wait_for(asyncio.shield(future), timeout)
        except (TimeoutError, asyncio.CancelledError):
            if not future.done():
                future.cancel()
                if not self._closed:
                    self.notify("$/cancelRequest", {"id": msg_id})
            raise
        except (RpcError, DaemonUnavailable) as exc:
            log.info("<- %s #%d failed after %.1f ms: %s", method, msg_id, (time.monotonic() - started) * 1000, exc)
            raise
        finally:
            self._pending.pop(msg_id, None)
        log.info("<- %s #%d answered in %.1f ms", method, msg_id, (time.monotonic() - started) * 1000)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("<- %s #%d %s", method, msg_id, _brief(raw))
        return msgspec.convert(raw, result_type) if result_type is not None else raw

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._send(message)

    def _send(self, message: dict[str, Any]) -> None:
        body = _encode(message)
        try:
            self._writer.write(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        except (ConnectionError, RuntimeError) as exc:
            raise DaemonUnavailable(f"connection to ctxd lost: {exc}") from None

    # --- notifications --------------------------------------------------------------

    def on_notification(self, callback: Callable[[str, Any], None]) -> None:
        self._callbacks.append(callback)

    async def notifications(self) -> AsyncIterator[tuple[str, Any]]:
        """Every notification from now on, until the connection closes."""
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
        self._queues.append(queue)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item
        finally:
            self._queues.remove(queue)

    # --- reading --------------------------------------------------------------------

    async def _read_frame(self) -> bytes | None:
        length = None
        while True:
            line = await self._reader.readline()
            if not line:
                return None
            line = line.strip()
            if not line:
                if length is not None:
                    break
                continue
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return await self._reader.readexactly(length)

    async def _read_loop(self) -> None:
        try:
            while True:
                body = await self._read_frame()
                if body is None:
                    break
                message = _decode(body)
                if "method" in message:
                    item = (message["method"], message.get("params"))
                    for callback in self._callbacks:
                        callback(*item)
                    for queue in self._queues:
                        queue.put_nowait(item)
                    continue
                future = self._pending.get(message.get("id"))
                if future is None or future.done():
                    if message.get("id") is None and "error" in message:
                        err = message["error"]
                        for callback in self._callbacks:
                            callback("$/error", err)
                    continue
                if "error" in message:
                    err = message["error"]
                    future.set_exception(RpcError(err.get("code", 0), err.get("message", ""), err.get("data")))
                else:
                    future.set_result(message.get("result"))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._closed = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(DaemonUnavailable("ctxd closed the connection"))
            for queue in self._queues:
                queue.put_nowait(None)

    # --- closing --------------------------------------------------------------------

    async def close(self, *, shutdown: bool = True) -> None:
        if not self._closed and shutdown:
            try:
                await self.request("shutdown", timeout=10)
                self.notify("exit")
            except (TimeoutError, RpcError, DaemonUnavailable):
                pass
        try:
            self._writer.close()
        except (ConnectionError, RuntimeError):
            pass
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self._reader_task.cancel()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def daemon_log_path(socket_path: Path, log_file: str | Path | None = None) -> Path:
    """Where a daemon started on ``socket_path`` logs: ``daemon.log_file`` when the
    configuration sets one (the daemon writes there itself), else ``daemon.log`` beside
    the socket (its stderr)."""
    return Path(log_file).expanduser() if log_file else socket_path.with_name("daemon.log")


def open_daemon_log(socket_path: Path, log_path: Path) -> int:
    """The daemon's stderr log, opened for appending only once the socket's directory is
    known to be safe as the daemon itself will judge it (``ownership.check_shared_dir``:
    ours or root's, nobody else's to write in unless sticky), and the file itself without
    following a link, ours and 0600 from its first byte (the log may name sessions): a
    ``daemon.log`` planted in another user's directory, or a link to one of this user's
    files, is never written through. Raises DaemonUnavailable saying why."""
    directory = socket_path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DaemonUnavailable(f"cannot create the socket directory {directory}: {exc.strerror or exc}") from None
    try:
        check_shared_dir(directory, "the socket directory", "choose another --socket path")
        if log_path.parent != directory:
            log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            check_shared_dir(log_path.parent, "the log's directory", "choose another --socket path")
        return open_private_log(log_path)
    except UnsafeDirectory as exc:
        raise DaemonUnavailable(f"ctxd was not started: {exc}") from None
    except OSError as exc:
        raise DaemonUnavailable(f"cannot create {log_path.parent}: {exc.strerror or exc}") from None


def spawn_daemon(socket_path: Path, *, data_dir: str | None = None, config_file: str | None = None,
                 idle_exit: float | None = None, autostarted: bool = True,
                 log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a detached socket daemon (what ``ctxd-cli`` does when none answers). Without
    ``idle_exit`` it exits when idle as the configuration says:
    ``daemon.autostart_idle_exit_seconds`` when ``autostarted``, else ``idle_exit_seconds``.
    Its stderr goes to ``daemon.log`` beside the socket (or ``log_path``)."""
    args = [sys.executable, "-m", "ctxd", "--socket", str(socket_path)]
    if idle_exit is not None:
        args += ["--idle-exit", str(idle_exit)]
    elif autostarted:
        args += ["--autostarted"]
    if data_dir:
        args += ["--data-dir", data_dir]
    if config_file:
        args += ["--config", config_file]
    stderr_path = socket_path.with_name("daemon.log") if log_path is None else log_path
    stderr = os.fdopen(open_daemon_log(socket_path, stderr_path), "ab")
    try:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True, close_fds=True)
    finally:
        stderr.close()


async def try_connect_unix(socket_path: Path) -> Client | None:
    """A connection to the daemon on ``socket_path`` (not initialized), or None when none answers."""
    try:
        return await Client.connect_unix(socket_path)
    except ForeignDaemon:
        raise
    except DaemonUnavailable:
        return None
    except OSError as exc:  # a permission problem, a path too long for a socket...
        raise DaemonUnavailable(f"cannot connect to {socket_path}: {exc.strerror or exc}") from None


async def wait_for_daemon(socket_path: Path, seconds: float, *, process: subprocess.Popen[bytes] | None = None,
                          log_path: Path | None = None, log_offset: int = 0) -> Client | None:
    """Poll the socket until a daemon answers (a connection, not initialized); None after ``seconds``.

    ``process`` is the daemon we spawned: if it exits because another ctxd already holds
    the socket (two clients autostarting at once), we keep waiting for that one; if it
    fails for any other reason, DaemonUnavailable names the socket, its last log line and
    the log.
    """
    deadline = time.monotonic() + seconds
    while True:
        client = await try_connect_unix(socket_path)
        if client is not None:
            return client
        if process is not None and process.poll() not in (None, 0):
            process = None
            reason = _log_tail(log_path, log_offset) if log_path else ""
            if "already serving" not in reason:
                await asyncio.sleep(0.2)  # a daemon that won the socket may have just begun listening
                client = await try_connect_unix(socket_path)
                if client is not None:
                    return client
                where = f" (log: {log_path})" if log_path else ""
                raise DaemonUnavailable(f"ctxd could not start on {socket_path}: {reason or 'it exited'}{where}")
            # Another ctxd holds the socket and is starting up: keep waiting for it.
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)


async def start_daemon(socket_path: Path, *, data_dir: str | None = None, config_file: str | None = None,
                       idle_exit: float | None = None, autostarted: bool = True, log_file: str | None = None,
                       wait_seconds: float = 15.0) -> Client:
    """Start a detached daemon on ``socket_path`` and connect to it (not initialized).
    When another client starts one at the same moment, this connects to whichever won."""
    log_path = daemon_log_path(socket_path, log_file)
    stderr_path = socket_path.with_name("daemon.log")
    # Startup errors are on stderr (they come before logging is set up): read that file.
    try:
        offset = os.lstat(stderr_path).st_size
    except OSError:
        offset = 0
    try:
        process = spawn_daemon(socket_path, data_dir=data_dir, config_file=config_file, idle_exit=idle_exit,
                               autostarted=autostarted, log_path=stderr_path)
    except OSError as exc:
        raise DaemonUnavailable(f"cannot start ctxd for {socket_path}: {exc.strerror or exc}") from None
    log.info("started ctxd (pid %d) for %s; it logs to %s", process.pid, socket_path, log_path)
    client = await wait_for_daemon(socket_path, wait_seconds, process=process, log_path=stderr_path,
                                   log_offset=offset)
    if client is None:
        raise DaemonUnavailable(f"ctxd did not open {socket_path} within {wait_seconds:.0f} s (log: {log_path})")
    client.started_daemon = process.pid if process.poll() is None else None
    client.daemon_log = log_path
    return client


async def connect_or_start(socket_path: Path, *, autostart: bool = True, data_dir: str | None = None,
                           config_file: str | None = None, client_name: str = "ctxd-client",
                           wait_seconds: float = 15.0, log_file: str | None = None) -> Client:
    """Connect to the daemon on ``socket_path``, starting one when none answers (like
    ``gopls -remote=auto``; it exits after ``daemon.autostart_idle_exit_seconds`` idle);
    returns an initialized client. ``client.started_daemon`` is the pid of the daemon this
    call started (None when one was running), ``client.daemon_log`` where it logs."""
    client = await try_connect_unix(socket_path)
    if client is None:
        if not autostart:
            raise DaemonUnavailable(f"no ctxd daemon is running on {socket_path}")
        client = await start_daemon(socket_path, data_dir=data_dir, config_file=config_file, log_file=log_file,
                                    wait_seconds=wait_seconds)
    await client.initialize(client_name=client_name, process_id=os.getpid())
    return client


def _log_tail(path: Path, offset: int) -> str:
    """The last non-blank line written to ``path`` after ``offset`` ("" when none)."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            f.seek(offset)
            lines = [line for line in f.read(1 << 20).decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
