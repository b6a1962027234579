"""Stdio, Unix-socket and TCP accept loops; each accepted client becomes a Connection.

pygls' own ``start_tcp`` serves a single client and has no Unix-socket transport, so
the daemon accepts with asyncio and gives every connection its own protocol object:
one client leaving, crashing or misbehaving never touches another.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import secrets
import socket
import stat
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

from ctxd.server.connection import Writer

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
    """One daemon per socket path: an flock held for the daemon's lifetime."""

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                other = self.path.read_text().strip() or "?"
                raise TransportError(f"another ctxd (pid {other}) is already serving {self.path.with_suffix('')}") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _private_dir(path: Path) -> None:
    """Create a missing directory as 0700. An existing one is left alone (it may be
    /tmp); the files ctxd puts in it are 0600 themselves."""
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)


def claim_socket(path: Path) -> SocketLock:
    """Take the socket's lock (first thing a socket daemon does); TransportError if taken."""
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise TransportError(f"socket path is too long for a Unix socket ({len(str(path))} bytes): {path}")
    _private_dir(path.parent)
    lock = SocketLock(path)
    lock.acquire()
    return lock


async def serve_unix(path: Path, on_connection: OnConnection, lock: SocketLock) -> asyncio.AbstractServer:
    """Listen on ``path``, whose ``lock`` the caller holds (see :func:`claim_socket`)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            lock.release()
            raise TransportError(f"{path} exists and is not a socket: ctxd will not replace it "
                                 f"(choose another --socket path, or move it away)")
        path.unlink()  # a stale socket: we hold the lock, so whoever made it is gone
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


async def serve_tcp(port: int, on_connection: OnConnection) -> asyncio.AbstractServer:
    try:
        return await asyncio.start_server(
            lambda r, w: on_connection(r, Writer(w), "tcp"), host="127.0.0.1", port=port,
            family=socket.AF_INET, limit=1 << 20, reuse_address=True)
    except OSError as exc:
        raise TransportError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def load_or_create_token(path: Path) -> str:
    """The TCP token: created (0600, in a 0700 directory) on first use; refused if others can read it."""
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise TransportError(f"token file {path} is readable by other users (mode {mode:o}); run: chmod 600 {path}")
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise TransportError(f"token file {path} is empty")
        return token
    _private_dir(path.parent)
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token
