"""Bad requests get an answer in one line, never a traceback (issue 23, 5 and the smaller
ones): a path that climbs out of the upstream's base, invalid Unicode, absurd nesting, a
window that is no number, a body past ``proxy.max_body_bytes`` (413 before it is read),
a client that hangs up mid-body or stalls its head or body. Other clients are served
meanwhile."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import psutil
import pytest

from tests.proxy.conftest import both_modes, sessions
from tests.proxy.upstream import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def _no_traceback(log: str) -> None:
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


async def _raw(url: str, data: bytes, *, read: bool = True, timeout: float = 10) -> bytes:
    """Send ``data`` on a new connection; what comes back until the proxy closes it."""
    host, port = url.split("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        if not read:
            await asyncio.sleep(0.5)  # accepted and being read (a socket closed before that is nobody's)
            return b""
        return await asyncio.wait_for(reader.read(1 << 20), timeout)
    finally:
        writer.close()


async def test_a_path_out_of_the_upstreams_base_is_refused(proxy, upstream) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        for path in ("/v1/..%2F..%2Fsecret", "/v1/%2E%2E/%2e%2e/secret", "/v1/..%5C..%5Csecret", "/api/%2e/tags"):
            answer = await client.get(path)
            assert answer.status_code == 400, (path, answer.text)
            assert "'.' or '..' segments" in answer.text
        raw = await _raw(proxy.url, b"GET /v1/../../secret HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 400"), raw
        assert (await client.get("/v1/models")).status_code == 200  # a dotless path is forwarded
    assert [r.path for r in upstream.received] == ["/v1/models"]
    _no_traceback(proxy.log())


@both_modes
async def test_invalid_bodies_and_windows_are_a_400_in_one_line(proxy, upstream, ctxd_daemon) -> None:
    deep = (b'{"model": "m", "messages": [{"role": "user", "content": "x", "extra": '
            + b"[" * 1000 + b"]" * 1000 + b"}]}")
    cases = [
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "a \\ud800 b"}]}', {},
         "lone surrogate"),
        # (the same, encoded in the bytes as UTF-8 would a character: not UTF-8, which json reads)
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "a \xed\xa0\x80 b"}]}',
         {}, "lone surrogate"),
        ("/v1/messages", b'{"model": "m", "max_tokens": 5, "system": "\\udc00", "messages": '
                         b'[{"role": "user", "content": "x"}]}', {"anthropic-version": "2023-06-01"},
         "lone surrogate"),
        ("/v1/chat/completions", deep, {}, "nested too deeply"),
        ("/v1/chat/completions", json.dumps(CHAT).encode(), {"x-ctxd-context-window": "9" * 5000},
         "X-Ctxd-Context-Window"),
        ("/v1/chat/completions", json.dumps(CHAT).encode(), {"x-ctxd-context-window": "lots"},
         "X-Ctxd-Context-Window"),
        ("/api/chat", json.dumps({**CHAT, "stream": False, "options": {"num_ctx": 1e20}}).encode(), {},
         "options.num_ctx"),
        ("/api/chat", json.dumps({**CHAT, "stream": False, "options": {"num_ctx": 10**20}}).encode(), {},
         "options.num_ctx"),
        ("/api/chat", json.dumps({**CHAT, "stream": False, "options": {"num_ctx": "big"}}).encode(), {},
         "options.num_ctx"),
    ]
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        for path, body, headers, said in cases:
            answer = await client.post(path, content=body, headers={"content-type": "application/json", **headers})
            assert answer.status_code == 400, (path, said, answer.status_code, answer.text[:300])
            text = answer.text
            assert said in text, text
        # Ollama's shape for Ollama, Anthropic's for Anthropic.
        ollama = await client.post("/api/chat", json={**CHAT, "options": {"num_ctx": 1e20}})
        assert list(ollama.json()) == ["error"]
        assert (await client.post("/api/chat", json={**CHAT, "stream": False, "options": {"num_ctx": 4096.0}})
                ).status_code == 200
    assert len(upstream.chats()) == 1
    assert len(await sessions(ctxd_daemon)) == 1
    log = proxy.log()
    _no_traceback(log)
    assert "a bad request for /v1/chat/completions: ctxd proxy: the request body is not valid" in log


async def test_a_body_over_the_limit_is_refused_before_it_is_read(start_proxy, upstream) -> None:
    proxy = start_proxy("--set", "proxy.max_body_bytes=1048576")
    # A Content-Length of 2 GiB: the 413 comes on the headers alone, while the other
    # clients are served.
    host, port = proxy.url.split("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"anthropic-version: 2023-06-01\r\ncontent-length: 2147483648\r\n\r\n" + b"[" * 65536)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(1 << 16), 10)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"request_too_large" in answer and b"proxy.max_body_bytes" in answer
    assert time.monotonic() - started < 5
    # The rest of the body is skipped as it comes, never buffered.
    before = psutil.Process(proxy.proc.pid).memory_info().rss
    for _ in range(256):
        writer.write(b" " * (1 << 20))
        await writer.drain()
    assert psutil.Process(proxy.proc.pid).memory_info().rss - before < 64 << 20
    writer.close()
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        # A body without a Content-Length is cut off once it passes the limit.

        async def chunks():
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(40):
                yield b"x" * 65536
            yield b'"}]}'

        cut = await client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert cut.status_code == 413 and "proxy.max_body_bytes" in cut.json()["error"]["message"]
        # Under the limit, with or without a length: served.
        big = {**CHAT, "messages": [{"role": "user", "content": "y" * 900_000}]}
        served = await client.post("/v1/chat/completions", json=big, headers={"x-ctxd-context-window": "2000000"})
        assert served.status_code == 200, served.text[:300]
    assert len(upstream.chats()) == 2
    _no_traceback(proxy.log())


async def test_a_client_that_hangs_up_mid_body_costs_one_line(proxy, upstream) -> None:
    for _ in range(3):
        await _raw(proxy.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"model\": ",
                   read=False)
    await asyncio.sleep(1.0)
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    log = proxy.log()
    _no_traceback(log)
    assert log.count("the client hung up while sending its request for /v1/chat/completions") == 3
    assert upstream.chats()[0].json["messages"][0]["content"] == "hello"


async def test_a_stalled_head_or_body_is_closed(start_proxy, upstream) -> None:
    proxy = start_proxy("--set", "proxy.client_timeout_seconds=1")
    host, port = proxy.url.split("//", 1)[1].split(":")

    async def stalled(first: bytes, drip: bytes) -> float:
        """Send ``first``, then a byte of ``drip`` every 0.3 s (never a whole request):
        how long until the proxy closes the connection."""
        reader, writer = await asyncio.open_connection(host, int(port))
        started = time.monotonic()
        writer.write(first)
        try:
            for byte in drip:
                await asyncio.sleep(0.3)
                writer.write(bytes([byte]))
                await writer.drain()
                if reader.at_eof():
                    break
            data = await asyncio.wait_for(reader.read(), 10)
        except ConnectionError:
            data = b""
        finally:
            writer.close()
        assert not data.startswith(b"HTTP/1.1 200"), data
        return time.monotonic() - started

    head = await stalled(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b"a" * 60)
    body = await stalled(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{", b"")
    assert head < 6, head   # a trickle of header bytes does not keep it open
    assert body < 6, body
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert "whose request head was not whole within 1 s" in proxy.log()
    _no_traceback(proxy.log())


@pytest.mark.parametrize("size", [300 * 1024 * 1024])
async def test_a_huge_declared_body_does_not_stall_others(proxy, upstream, size: int) -> None:
    """The default limit (64 MiB): a body declared at 300 MiB is refused at once; another
    client's requests meanwhile answer as fast as ever."""
    host, port = proxy.url.split("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % size)
    await writer.drain()

    async def pump() -> None:
        chunk = b" " * (1 << 20)
        try:
            for _ in range(size >> 20):
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass

    pumping = asyncio.ensure_future(pump())
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        started = time.monotonic()
        for _ in range(5):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert time.monotonic() - started < 5
    answer = await asyncio.wait_for(reader.read(1 << 16), 10)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    await asyncio.wait_for(pumping, 30)
    writer.close()
