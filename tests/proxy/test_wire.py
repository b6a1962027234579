"""wire.py: a whole HTTP message in one send, both ways (docs/performance.md, "Proxy
benchmark"). In-process, with recording stand-ins for the transport and the stream; the
proxy tests exercise both through real sockets."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpcore
import httpx
import pytest

from ctxd.proxy import wire


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default


async def test_writes_of_one_loop_turn_are_one_send() -> None:
    real = RecordingTransport()
    transport = wire.CoalescingTransport(real)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(memoryview(b"{}"))
    transport.write(b"")
    assert real.writes == [] and transport.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"data: 1\n\n")  # a relayed stream's next chunk, a turn later
    await asyncio.sleep(0)
    assert real.writes[1:] == [b"data: 1\n\n"]
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1234)  # the rest is the real transport's


async def test_close_sends_what_is_held_and_abort_drops_it() -> None:
    real = RecordingTransport()
    transport = wire.CoalescingTransport(real)  # type: ignore[arg-type]
    transport.write(b"last")
    transport.close()
    assert real.writes == [b"last"] and real.closed
    await asyncio.sleep(0)
    assert real.writes == [b"last"]

    real = RecordingTransport()
    transport = wire.CoalescingTransport(real)  # type: ignore[arg-type]
    transport.write(b"never")
    transport.abort()
    await asyncio.sleep(0)
    assert real.writes == [] and real.aborted


class RecordingStream(httpcore.AsyncNetworkStream):
    def __init__(self, *, fail_writes: bool = False) -> None:
        self.events: list[tuple[str, bytes]] = []
        self.fail_writes = fail_writes

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self.fail_writes:
            raise httpcore.WriteError("broken pipe")
        self.events.append(("write", buffer))

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.events.append(("read", b""))
        return b"HTTP/1.1 200 OK\r\n"

    async def aclose(self) -> None:
        self.events.append(("close", b""))

    def get_extra_info(self, info: str) -> Any:
        return info == "is_readable"


async def test_a_request_is_written_once_when_its_answer_is_read() -> None:
    real = RecordingStream()
    stream = wire.CoalescingStream(real)
    await stream.write(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
    await stream.write(b'{"messages": []}')
    await stream.write(b"")
    assert real.events == []
    assert await stream.read(65536) == b"HTTP/1.1 200 OK\r\n"
    assert real.events == [("write", b'POST /v1/chat/completions HTTP/1.1\r\n\r\n{"messages": []}'), ("read", b"")]
    assert stream.get_extra_info("is_readable") is True


async def test_a_large_body_is_not_held_whole() -> None:
    real = RecordingStream()
    stream = wire.CoalescingStream(real)
    chunk = b"x" * (wire.FLUSH_BYTES // 2)
    for _ in range(3):
        await stream.write(chunk)
    assert [len(data) for kind, data in real.events] == [wire.FLUSH_BYTES]
    await stream.read(10)
    assert [len(data) for kind, data in real.events] == [wire.FLUSH_BYTES, len(chunk), 0]


async def test_a_failed_write_still_reads_the_answer_as_httpcore_does() -> None:
    real = RecordingStream(fail_writes=True)
    stream = wire.CoalescingStream(real)
    await stream.write(b"GET / HTTP/1.1\r\n\r\n")
    assert await stream.read(10) == b"HTTP/1.1 200 OK\r\n"
    assert real.events == [("read", b"")]


async def test_the_upstream_transport_writes_a_request_in_one_send_and_reads_its_answer() -> None:
    """A real server on 127.0.0.1: the request (head and body) arrives in one segment,
    and the answer comes back through httpx's interface."""
    got: list[bytes] = []
    arrived = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.read(65536))  # one read: what one send delivered
        arrived.set()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, wire.UpstreamTransport(limits=httpx.Limits()) as transport:
        request = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/chat/completions?x=1",
                                content=b'{"messages": []}', headers={"content-type": "application/json"})
        response = await transport.handle_async_request(request)
        assert response.status_code == 200 and response.headers["content-type"] == "text/plain"
        assert await response.aread() == b"hello"
        await arrived.wait()
    head, _, body = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n") and body == b'{"messages": []}'


async def test_sending_tells_when_the_request_has_left_not_when_the_answer_came() -> None:
    """``wire.sending``: ``sent`` resolves once the request is handed to the socket (the
    server holds its answer until then), and also when the exchange ends without sending."""
    got = asyncio.Event()
    answer = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        got.set()
        await answer.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, wire.UpstreamTransport(limits=httpx.Limits()) as transport:
        async def exchange(url: str) -> bytes:
            response = await transport.handle_async_request(httpx.Request("POST", url, content=b"{}"))
            return await response.aread()

        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = wire.sending(exchange(f"http://127.0.0.1:{port}/v1/messages"), sent)
        await asyncio.wait_for(sent, 5)
        assert not task.done()  # resolved by the write, not by the answer
        await asyncio.wait_for(got.wait(), 5)
        answer.set()
        assert await task == b"ok"

        # Nothing listens: the exchange fails before any write, and ``sent`` says so too.
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        closed.close()
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failing = wire.sending(exchange(f"http://127.0.0.1:{dead}/v1/messages"), refused)
        await asyncio.wait_for(refused, 5)
        with pytest.raises(httpx.ConnectError):
            await failing


async def test_sending_does_not_wait_for_a_connection_being_made() -> None:
    """An exchange that has not written its request ``within`` (a handshake, a connect that
    hangs) resolves ``sent`` anyway: whoever waits for it goes on; the exchange goes on too."""
    never = asyncio.Event()

    async def connecting() -> str:
        await never.wait()
        return "answered"

    sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = wire.sending(connecting(), sent, within=0.05)
    await asyncio.wait_for(sent, 5)
    assert not task.done()
    never.set()
    assert await task == "answered"


async def test_the_upstream_transport_raises_httpx_errors() -> None:
    """httpcore's exceptions come out as httpx's, the most specific one: what the proxy
    catches to answer 502/504 and to send a request again."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    async with wire.UpstreamTransport(limits=httpx.Limits()) as transport:
        with pytest.raises(httpx.ConnectError):
            await transport.handle_async_request(httpx.Request("GET", f"http://127.0.0.1:{port}/"))

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, wire.UpstreamTransport(limits=httpx.Limits()) as transport:
        request = httpx.Request("GET", f"http://127.0.0.1:{port}/",
                                extensions={"timeout": httpx.Timeout(0.2).as_dict()})
        with pytest.raises(httpx.ReadTimeout):
            await transport.handle_async_request(request)
    assert wire.httpx_error(ValueError("not httpcore's")) is None
    assert type(wire.httpx_error(httpcore.ConnectTimeout("x"))) is httpx.ConnectTimeout


def test_every_httpcore_error_becomes_the_httpx_error_of_its_name() -> None:
    """The rule holds for each of httpcore's public exceptions: the httpx class of the
    same name when httpx has one (timeouts stay timeouts, network errors stay network
    errors: what the proxy's 502/504 and retry decisions read), else None."""
    public = [c for c in vars(httpcore).values() if isinstance(c, type) and issubclass(c, Exception)]
    assert len(public) >= 14
    for cls in public:
        mapped = wire.httpx_error(cls("why"))
        expected = getattr(httpx, cls.__name__, None)
        if expected is None:
            assert mapped is None, cls
        else:
            assert type(mapped) is expected and str(mapped) == "why", cls

    class Subclass(httpcore.ReadTimeout):  # (a subclass httpcore may add: its nearest public name)
        pass

    assert type(wire.httpx_error(Subclass("x"))) is httpx.ReadTimeout
    assert wire.httpx_error(httpx.ReadTimeout("already httpx's")) is None


def test_the_event_loop_is_uvloop_when_installed() -> None:
    from ctxd.proxy.main import event_loop_factory

    factory = event_loop_factory()
    try:
        import uvloop
    except ImportError:
        assert factory is None
        pytest.skip("uvloop is not installed")
    assert factory is uvloop.new_event_loop
