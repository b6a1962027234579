"""Fewer sends per request: a whole HTTP message goes out in one ``send``, both ways.

uvicorn writes a response's status line and headers, then its body, each with its own
``transport.write``; httpcore writes a request's headers, then its body. On sockets with
Nagle's algorithm off (as they must be: docs/performance.md, "Proxy benchmark") each
write is a segment of its own and wakes the peer, which can do nothing with headers
alone; on a busy machine every send is also where the kernel may hand the CPU to the
woken peer (cProfile of the proxy on a loaded 2-core machine: ~1 ms of wall time per
``send``, five sends per request). Here the pieces of one message are joined:

* :class:`CoalescingTransport` (the client side): what uvicorn writes during one turn of
  the event loop goes out together at the start of the next.
* :class:`CoalescingStream` (the upstream side, an httpcore network stream): a request's
  writes are held until httpcore reads the answer (HTTP/1.1 reads only after the whole
  request is written), or until ``FLUSH_BYTES`` are held; :class:`UpstreamTransport` is
  httpx's transport over httpcore's connection pool with that stream's backend.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpcore
import httpx

FLUSH_BYTES = 256 * 1024
"""An upstream request body is sent on once this much of it is held (a large upload is
not held whole)."""

SEND_WAIT_SECONDS = 0.005
"""How long :func:`sending`'s ``sent`` waits for the write: a request on a kept-alive
connection is written within a fraction of a millisecond; a new connection's handshake
takes tens (a connect that hangs, up to its timeout)."""

_SENT: contextvars.ContextVar[asyncio.Future[None] | None] = contextvars.ContextVar("ctxd_upstream_sent",
                                                                                   default=None)


def sending(coro: Any, sent: asyncio.Future[None], within: float = SEND_WAIT_SECONDS) -> asyncio.Task[Any]:
    """``coro`` (an upstream exchange) as a task that resolves ``sent`` as its request is
    written, once it ends (sent or not), or after ``within`` seconds, whichever is first.
    What else runs on the loop can wait for that: the task's first steps (httpcore's pool,
    h11) yield several times before the write, and each yield let another task's CPU go
    before the request; a connection being made (a handshake, a connect that hangs) is
    not waited for."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    context.run(_SENT.set, sent)
    task = loop.create_task(coro, context=context)
    task.add_done_callback(partial(_resolve, sent))
    timer = loop.call_later(within, _resolve, sent)
    sent.add_done_callback(lambda _: timer.cancel())
    return task


def _resolve(future: asyncio.Future[None], *_: Any) -> None:
    if not future.done():
        future.set_result(None)


class CoalescingTransport:
    """A connection's transport whose writes of one event-loop turn go out as one send:
    a whole response is one send; a relayed stream's chunks go out as they come, one
    turn later. Everything else is the real transport's."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._pending)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalescing(protocol: type[Any]) -> type[Any]:
    """uvicorn's HTTP protocol class, writing through a :class:`CoalescingTransport`."""

    class Coalescing(protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport))

    Coalescing.__name__ = f"Coalescing{protocol.__name__}"
    return Coalescing


# --- the upstream side (httpcore) ---------------------------------------------------------


class CoalescingStream(httpcore.AsyncNetworkStream):
    """An httpcore connection's stream holding what is written until the answer is
    read (or ``FLUSH_BYTES`` are held), then sending it in one write."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None

    async def _flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            sent = _SENT.get()
            if sent is not None:
                # (Its waiter runs after this step, which hands the bytes to the socket
                # before its first yield: anyio's send writes, then checkpoints.)
                _resolve(sent)
            await self._stream.write(data, self._timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._pending.append(bytes(buffer))
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= FLUSH_BYTES:
            await self._flush()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            await self._flush()
        except httpcore.WriteError:
            # As httpcore does when a request's write fails: the answer is read
            # anyway (a server may have answered early and closed; else the read
            # fails, "Server disconnected without sending a response").
            pass
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._stream.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> Any:
        await self._flush()
        return CoalescingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, its connections' streams made :class:`CoalescingStream`."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> Any:
        return CoalescingStream(await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> Any:
        return CoalescingStream(await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def httpx_error(exc: Exception) -> httpx.HTTPError | None:
    """httpx's exception for one of httpcore's, None for any other exception. The two
    libraries document the same exception hierarchy under the same names (httpx's
    ``ConnectError``, ``ReadTimeout``, ... are httpcore's, raised again), so the most
    specific httpcore class whose name httpx also has gives it: a rule over both public
    hierarchies, not a copy of the table inside httpx's own transport."""
    for cls in type(exc).__mro__:
        if cls.__module__.partition(".")[0] != "httpcore":
            continue
        ours = getattr(httpx, cls.__name__, None)
        if isinstance(ours, type) and issubclass(ours, httpx.HTTPError):
            return ours(str(exc))
    return None


class AnswerStream(httpx.AsyncByteStream):
    """An upstream answer's body as httpx reads it, httpcore's errors made httpx's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as exc:
            mapped = httpx_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        await self._stream.aclose()


class UpstreamTransport(httpx.AsyncBaseTransport):
    """httpx's transport for the upstreams: httpx's transport interface over httpcore's
    connection pool, whose connections write each request in one send
    (:class:`CoalescingBackend`). Both libraries' public APIs: httpx offers no way to give
    its ``AsyncHTTPTransport`` a network backend, httpcore's pool takes one. It does what
    ``AsyncHTTPTransport`` does for what a proxy needs: HTTP/1.1, the limits, TLS with the
    system's certificates, no proxy settings taken from the environment."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext | None = None) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=CoalescingBackend(httpcore.AnyIOBackend()))

    async def __aenter__(self) -> UpstreamTransport:
        await self.pool.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(method=request.method, url=httpcore.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        try:
            answer = await self.pool.handle_async_request(core)
        except Exception as exc:
            mapped = httpx_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return httpx.Response(status_code=answer.status, headers=answer.headers,
                              stream=AnswerStream(answer.stream), extensions=answer.extensions)

    async def aclose(self) -> None:
        await self.pool.aclose()
