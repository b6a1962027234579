"""Stdio, Unix-socket and TCP accept loops; each accepted client becomes a Connection.

The daemon accepts with asyncio and gives every connection its own JSON-RPC endpoint
(``connection.py``): one client leaving, crashing or misbehaving never touches another.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ctxd.descriptors import parking_room
from ctxd.ownership import (
    LockError,
    LockFile,
    LockHeld,
    PrivateFileError,
    UnsafeDirectory,
    check_shared_dir,
    foreign,
    owner,
    pid_of,
    read_private_file,
)
from ctxd.server.writer import Writer

log = logging.getLogger(__name__)

OnConnection = Callable[[asyncio.StreamReader, Writer, str], Awaitable[None]]
UNIX_PATH_MAX = 107


class TransportError(Exception):
    """A transport cannot start; the message says why and what to do."""


async def open_stdio() -> tuple[asyncio.StreamReader, Writer]:
    """Non-blocking stdin/stdout when they are pipes or sockets; threads otherwise.

    The protocol keeps the original stdout; ``sys.stdout`` is pointed at stderr so a
    stray print in any library can never corrupt the frame stream.
    """
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout = sys.stderr
    reader = asyncio.StreamReader(limit=1 << 20)
    try:
        if not _pollable(stdin.fileno()):
            raise ValueError("not pollable")
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    except (ValueError, OSError):
        loop.create_task(_pump_blocking(stdin, reader))
    try:
        if not _pollable(stdout.fileno()):
            raise ValueError("not pollable")
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
        writer: Any = asyncio.StreamWriter(transport, protocol, None, loop)
    except (ValueError, OSError):
        writer = stdout
    return reader, Writer(writer)


def _pollable(fd: int) -> bool:
    """Whether the event loop can wait on ``fd``: epoll refuses regular files and some
    devices (``ctxd </dev/null``, input redirected from a file), which then get a thread."""
    try:
        import select

        poller = select.epoll()
    except (ImportError, AttributeError, OSError):
        return True  # not Linux: let asyncio decide
    try:
        poller.register(fd, select.EPOLLIN)
    except OSError:
        return False
    finally:
        poller.close()
    return True


async def _pump_blocking(stream: Any, reader: asyncio.StreamReader) -> None:
    loop = asyncio.get_running_loop()
    while True:
        chunk = await loop.run_in_executor(None, stream.read1, 1 << 16)
        if not chunk:
            reader.feed_eof()
            return
        reader.feed_data(chunk)


class SocketLock:
    """One daemon per socket path: an flock held for the daemon's lifetime, taken the
    careful way of :class:`ctxd.ownership.LockFile` (the socket may live in a directory others can
    write to, such as /tmp). The file says the holder's pid."""

    def __init__(self, path: Path) -> None:
        self._lock = LockFile(path.with_name(path.name + ".lock"), elsewhere="another --socket path")
        self.path = self._lock.path

    def acquire(self) -> None:
        try:
            self._lock.acquire(str(os.getpid()))
        except LockHeld as exc:
            raise TransportError(f"another ctxd (pid {pid_of(exc.text)}) is already serving "
                                 f"{self.path.with_suffix('')}") from None
        except LockError as exc:
            raise TransportError(str(exc)) from None

    def release(self) -> None:
        self._lock.release()


def _private_dir(path: Path) -> None:
    """Create a missing directory as 0700. An existing one is left alone (it may be
    /tmp); the files ctxd puts in it are 0600 themselves."""
    try:
        path.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TransportError(f"cannot create the directory {path}: {exc.strerror}") from None


def _check_socket_dir(path: Path) -> None:
    """The socket's directory must be safe to share (``ownership.check_shared_dir``)."""
    try:
        check_shared_dir(path, "the socket directory", "choose another --socket path")
    except UnsafeDirectory as exc:
        raise TransportError(str(exc)) from None


def claim_socket(path: Path) -> SocketLock:
    """Take the socket's lock (first thing a socket daemon does); TransportError if taken,
    or if the directory or the lock file are not safe to use."""
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise TransportError(f"socket path is too long for a Unix socket ({len(str(path))} bytes): {path}")
    _private_dir(path.parent)
    _check_socket_dir(path.parent)
    lock = SocketLock(path)
    lock.acquire()
    return lock


async def serve_unix(path: Path, on_connection: OnConnection, lock: SocketLock) -> asyncio.Server:
    """Listen on ``path``, whose ``lock`` the caller holds (see :func:`claim_socket`)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        lock.release()
        raise TransportError(f"cannot use {path}: {exc.strerror}") from None
    else:
        if not stat.S_ISSOCK(st.st_mode):
            lock.release()
            raise TransportError(f"{path} exists and is not a socket: ctxd will not replace it "
                                 f"(choose another --socket path, or move it away)")
        if foreign(st):
            lock.release()
            raise TransportError(f"{path} is a socket of {owner(st.st_uid)}: ctxd will not replace it "
                                 f"(choose another --socket path)")
        try:
            path.unlink()  # a stale socket: we hold the lock, so whoever made it is gone
        except OSError as exc:
            lock.release()
            raise TransportError(f"cannot remove the stale socket {path}: {exc.strerror}") from None
    old_umask = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(
            lambda r, w: on_connection(r, Writer(w), "unix"), path=str(path), limit=1 << 20)
    except OSError as exc:
        lock.release()
        raise TransportError(f"cannot listen on {path}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return server


ACCEPT_BATCH = 64
"""Connections accepted per turn of the event loop: a flood of them (another user's,
reconnecting as fast as each is closed) must leave turns for the clients being served."""


class TcpServer:
    """The TCP listener on 127.0.0.1, which every local user can reach. Each connection is
    judged as it is accepted, before anything is made for it (``admit``: the daemon's
    waiting slots per uid; it answers the slot taken, or None and whether to park). One
    refused of another user is *parked*, held unread (its socket alone) until
    ``hold`` seconds later, while fewer than ``park`` are (a quarter of the descriptors
    beyond the first 1,024, at most 16,384); beyond, closed once this turn's accepting is
    over, so that its client cannot connect again into the same turn. Closed at once, a
    client that reconnects as soon as it is closed made a flood of it, and the owner's
    connections waited behind it in the accept queue. At most ``ACCEPT_BATCH`` are accepted
    per turn. An admitted one becomes a stream pair and ``on_connection``'s; should that
    fail, ``release`` gives its slot back."""

    def __init__(self, sock: socket.socket, on_connection: Any, admit: Callable[[Any, Any], tuple[str | None, bool]],
                 release: Callable[[str], None], *, hold: float = 10.0, park: int | None = None) -> None:
        self.sock = sock
        self.sockets = [sock]
        self._on_connection = on_connection
        self._admit = admit
        self._release = release
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._hold = hold
        self._park = parking_room() if park is None else park
        self._parked: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, client = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors...: the next turn tries again
                log.warning("cannot accept a TCP connection: %s", exc.strerror or exc)
                return
            try:
                group, park = self._admit(client, conn.getsockname())
            except OSError:
                group, park = None, True
            if group is None:
                if park and len(self._parked) < self._park:
                    self._parked.append((time.monotonic(), conn))
                    if self._sweep is None:
                        self._sweep = self._loop.call_later(1.0, self._unpark)
                else:
                    self._loop.call_soon(conn.close)
                continue
            task = self._loop.create_task(self._serve(conn, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _unpark(self) -> None:
        self._sweep = None
        now = time.monotonic()
        while self._parked and now - self._parked[0][0] > self._hold:
            self._parked.popleft()[1].close()
        if self._parked:
            self._sweep = self._loop.call_later(1.0, self._unpark)

    async def _serve(self, conn: socket.socket, group: str) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader, writer = await asyncio.open_connection(sock=conn, limit=1 << 20)
        except OSError:
            conn.close()
            self._release(group)
            return
        await self._on_connection(reader, Writer(writer), "tcp", group)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._parked:
            self._parked.popleft()[1].close()


async def serve_tcp(port: int, on_connection: Any, admit: Callable[[Any, Any], tuple[str | None, bool]],
                    release: Callable[[str], None], *, hold: float = 10.0) -> TcpServer:
    """Listen on 127.0.0.1:``port`` (see :class:`TcpServer`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise TransportError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    return TcpServer(sock, on_connection, admit, release, hold=hold)


def load_or_create_token(path: Path) -> str:
    """The TCP token: created (0600, in a 0700 directory) on first use; refused if others
    can read it, it is not this user's file, or it is a symbolic link (never followed)."""
    try:
        token = read_private_file(path, "token file")
    except FileNotFoundError:
        return _create_token(path)
    except PrivateFileError as exc:
        raise TransportError(str(exc)) from None
    if not token:
        raise TransportError(f"token file {path} is empty")
    return token


def _create_token(path: Path) -> str:
    _private_dir(path.parent)
    token = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TransportError(f"cannot create the token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token
