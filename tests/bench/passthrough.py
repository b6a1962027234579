"""A pass-through HTTP proxy on the stack ``ctxd proxy`` is built on, doing none of its
work: the floor of what a proxy of this design adds to a request, measured beside it.

    python -m tests.bench.passthrough UPSTREAM_URL

uvicorn on uvloop with httptools, the proxy's listening socket (TCP_NODELAY) and its
one-send writes both ways (``ctxd.proxy.wire``), httpx's interface over httpcore for the
upstream; a raw ASGI callable that forwards each request's method, path, query, headers
and body, and relays the answer (a stream chunk by chunk, anything else whole). No
session, no push, no prompt, no JSON decoding. Prints ``listening on URL`` as ``ctxd
proxy`` does (``tests.proxy.conftest.ProxyProcess`` reads it).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx

from ctxd.proxy import wire
from ctxd.proxy.main import event_loop_factory, listening_socket

_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"}
_STREAMED = (b"text/event-stream", b"application/x-ndjson")


def app_for(upstream: str, transport: wire.UpstreamTransport) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        target = upstream + scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
        request = httpx.Request(scope["method"], target, content=bytes(body),
                                headers=[(k, v) for k, v in scope["headers"] if k not in _HOP])
        response = await transport.handle_async_request(request)
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
        if response.headers.get("content-type", "").encode().startswith(_STREAMED):
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            await response.aclose()
            return
        content = await response.aread()
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    return app


async def serve(upstream: str) -> None:
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    sock = listening_socket(0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
    async with wire.UpstreamTransport(limits=limits) as transport:
        server = uvicorn.Server(uvicorn.Config(app_for(upstream.rstrip("/"), transport),
                                               http=wire.coalescing(AutoHTTPProtocol), log_level="warning",
                                               access_log=False, lifespan="off", proxy_headers=False,
                                               server_header=False, date_header=False))
        print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
        await server.serve(sockets=[sock])


def main() -> int:
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
