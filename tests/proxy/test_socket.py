"""The proxy's listening socket: every connection asyncio accepts on it has Nagle's
algorithm off (with it on, uvicorn's body write waited for the client's delayed ACK:
~40 ms per request, docs/performance.md "Proxy benchmark")."""

from __future__ import annotations

import asyncio
import socket

from ctxd.proxy.main import listening_socket


async def test_accepted_connections_have_tcp_nodelay() -> None:
    sock = listening_socket(0)
    seen: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("socket")
        seen.append(peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
        for _ in range(3):
            reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            await reader.read()  # the server closed it: its callback ran
            writer.close()
        assert len(seen) == 3 and all(seen), seen
    finally:
        server.close()
        await server.wait_closed()


def test_a_port_in_use_is_refused_with_oserror() -> None:
    first = listening_socket(0)
    try:
        port = first.getsockname()[1]
        try:
            second = listening_socket(port)
        except OSError:
            return
        second.close()
        raise AssertionError("two listeners on one port")
    finally:
        first.close()
