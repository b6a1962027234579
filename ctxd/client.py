"""A small asyncio client for ctxd: what ctxd-cli, the benchmarks and Python agents use.

    async with await Client.connect_unix(path) as client:
        info = await client.request("session/create", {"model": "llama3.2:3b"})

Params may be dicts or msgspec Structs; results come back as plain JSON values, or
as a Struct when ``result_type`` is given. Notifications are delivered to
``on_notification`` callbacks and to :meth:`notifications` iterators.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, TypeVar

import msgspec

from ctxd import __version__

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class RpcError(Exception):
    """The daemon answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data


class DaemonUnavailable(Exception):
    """No daemon could be reached (or started); the message says where and why."""


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
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    # --- connecting -----------------------------------------------------------------

    @classmethod
    async def connect_unix(cls, path: str | Path) -> "Client":
        try:
            reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(f"no ctxd daemon at {path} ({exc.strerror})") from None
        return cls(reader, writer)

    @classmethod
    async def connect_tcp(cls, port: int, host: str = "127.0.0.1") -> "Client":
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        except OSError as exc:
            raise DaemonUnavailable(f"no ctxd daemon at {host}:{port} ({exc.strerror})") from None
        return cls(reader, writer)

    @classmethod
    async def spawn_stdio(cls, args: list[str] | None = None, env: dict[str, str] | None = None) -> "Client":
        """Start ``python -m ctxd`` (plus ``args``) as a child speaking stdio."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ctxd", *(args or []), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env, limit=1 << 24)
        assert process.stdout is not None and process.stdin is not None
        return cls(process.stdout, process.stdin, process)  # type: ignore[arg-type]

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
        try:
            # Shielded: cancelling the caller must leave the future pending, so the
            # daemon is told to stop (a cancelled future would look answered).
            raw = await asyncio.wait_for(asyncio.shield(future), timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            if not future.done():
                future.cancel()
                if not self._closed:
                    self.notify("$/cancelRequest", {"id": msg_id})
            raise
        finally:
            self._pending.pop(msg_id, None)
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
                future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
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
            except (RpcError, DaemonUnavailable, asyncio.TimeoutError):
                pass
        try:
            self._writer.close()
        except (ConnectionError, RuntimeError):
            pass
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        self._reader_task.cancel()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def spawn_daemon(socket_path: Path, *, data_dir: str | None = None, config_file: str | None = None,
                 idle_exit: float | None = None, autostarted: bool = True,
                 log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a detached socket daemon (what ``ctxd-cli`` does when none answers). Without
    ``idle_exit`` it exits when idle as the configuration says:
    ``daemon.autostart_idle_exit_seconds`` when ``autostarted``, else ``idle_exit_seconds``."""
    args = [sys.executable, "-m", "ctxd", "--socket", str(socket_path)]
    if idle_exit is not None:
        args += ["--idle-exit", str(idle_exit)]
    elif autostarted:
        args += ["--autostarted"]
    if data_dir:
        args += ["--data-dir", data_dir]
    if config_file:
        args += ["--config", config_file]
    log_path = log_path or socket_path.with_name("daemon.log")
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # 0600 from its first byte, whatever the caller's umask (the log may name sessions).
    log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600), "ab")
    try:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, close_fds=True)
    finally:
        log.close()


async def connect_or_start(socket_path: Path, *, autostart: bool = True, data_dir: str | None = None,
                           config_file: str | None = None, client_name: str = "ctxd-cli",
                           wait_seconds: float = 15.0) -> Client:
    """Connect to the daemon on ``socket_path``, starting one when none answers
    (like ``gopls -remote=auto``); returns an initialized client."""
    try:
        client = await Client.connect_unix(socket_path)
    except DaemonUnavailable:
        if not autostart:
            raise
        log_path = socket_path.with_name("daemon.log")
        start_size = log_path.stat().st_size if log_path.exists() else 0
        process = spawn_daemon(socket_path, data_dir=data_dir, config_file=config_file, log_path=log_path)
        deadline = time.monotonic() + wait_seconds
        while True:
            await asyncio.sleep(0.05)
            try:
                client = await Client.connect_unix(socket_path)
                break
            except DaemonUnavailable:
                code = process.poll() if process is not None else None
                if code is not None and code != 0:
                    reason = _log_tail(log_path, start_size)
                    if "already serving" not in reason:
                        raise DaemonUnavailable(f"ctxd could not start: {reason} (log: {log_path})") from None
                    # Another client's daemon won the socket and is still starting: wait for it.
                    process = None
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(f"ctxd did not open {socket_path} within {wait_seconds:.0f} s; "
                                            f"see {log_path}") from None
    await client.initialize(client_name=client_name, process_id=os.getpid())
    return client


def _log_tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return f"see {path}"
    return lines[-1] if lines else f"see {path}"
