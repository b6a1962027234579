"""An upstream that closes a keep-alive connection just as the proxy reuses it (the race
between httpx's pool and a server's idle timeout, seen once as a 502 under load): the
request never reached the upstream, so the proxy sends it again on a new connection.

A byte relay between the proxy and the fake upstream stands for that server: armed, it
closes the next connection on which the proxy sends a request after an answer, without
forwarding a byte of it. It reads no HTTP; it only knows which way bytes went."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import openai

from tests.proxy.conftest import history, sessions
from tests.proxy.upstream import MODEL, FakeUpstream


class DroppingRelay:
    def __init__(self, upstream: FakeUpstream) -> None:
        target = urlsplit(upstream.url)
        self.target = (target.hostname or "127.0.0.1", target.port or 80)
        self.armed = 0
        self.dropped = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> DroppingRelay:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        answered = asyncio.Event()  # the upstream has sent something back on this connection

        async def back() -> None:
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
                answered.set()
            writer.close()

        relay_back = asyncio.create_task(back())
        try:
            while chunk := await reader.read(65536):
                if answered.is_set() and self.armed:
                    self.armed -= 1
                    self.dropped += 1
                    break  # a reused connection: closed with the request unread, as a server's idle timeout does
                up_writer.write(chunk)
                await up_writer.drain()
        finally:
            relay_back.cancel()
            up_writer.close()
            writer.close()


async def test_a_reused_connection_the_upstream_closed_is_retried_on_a_new_one(start_proxy, upstream,
                                                                               ctxd_daemon) -> None:
    relay = await DroppingRelay(upstream).start()
    try:
        proxy = start_proxy("--set", f"proxy.openai_base_url={relay.url}/v1")
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
        messages = [{"role": "user", "content": "First."}]
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "Second."}]
        relay.armed = 1
        reply = await client.chat.completions.create(model=MODEL, messages=messages)  # whole
        assert reply.choices[0].message.content == "Answer to: Second."
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "Third."}]
        relay.armed = 1
        text = ""
        async for chunk in await client.chat.completions.create(model=MODEL, messages=messages, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        assert text == "Answer to: Third."
        assert relay.dropped == 2
        assert len(upstream.chats()) == 3  # the dropped requests never reached it
        [info] = await sessions(ctxd_daemon)
        assert [m["content"] for m in await history(ctxd_daemon, info["sessionId"])] == \
            ["First.", "Answer to: First.", "Second.", "Answer to: Second.", "Third.", "Answer to: Third."]
    finally:
        await relay.close()
