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
  request is written), or until ``FLUSH_BYTES`` are held.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

log = logging.getLogger("ctxd.proxy")

FLUSH_BYTES = 256 * 1024
"""An upstream request body is sent on once this much of it is held (a large upload is
not held whole)."""


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

    class Coalescing(protocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport))

    Coalescing.__name__ = f"Coalescing{protocol.__name__}"
    return Coalescing


# --- the upstream side (httpcore) ---------------------------------------------------------

try:
    import httpcore
except ImportError:  # pragma: no cover (httpx depends on it)
    httpcore = None  # type: ignore[assignment]


if httpcore is not None:
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

        def __init__(self, backend: Any) -> None:
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


def upstream_transport(**options: Any) -> Any:
    """httpx's transport for the upstreams (``options``: ``httpx.AsyncHTTPTransport``'s),
    its connections writing each request in one send. httpx offers no public way to give
    its connection pool a network backend (httpcore's own ``network_backend``), so the
    pool it made is given one; should a later httpx keep it elsewhere, the transport is
    used as it is (each request then takes two sends, as before)."""
    import httpx

    transport = httpx.AsyncHTTPTransport(**options)
    pool = getattr(transport, "_pool", None)
    if httpcore is not None and isinstance(pool, httpcore.AsyncConnectionPool) \
            and isinstance(getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend):
        pool._network_backend = CoalescingBackend(pool._network_backend)
    else:
        log.debug("httpx's connection pool not recognised: upstream requests are written as httpcore writes them")
    return transport
