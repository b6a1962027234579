"""ctxd.client against a bare framed server on a real Unix socket: what it sends when
a caller gives up on a request."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import pytest

from ctxd.client import Client


async def _frames(reader: asyncio.StreamReader, out: asyncio.Queue) -> None:
    while True:
        header = await reader.readuntil(b"\r\n\r\n")
        length = int(header.split(b":")[1].strip())
        await out.put(json.loads(await reader.readexactly(length)))


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_giving_up_on_a_request_tells_the_daemon(how: str):
    received: asyncio.Queue = asyncio.Queue()
    tasks: list[asyncio.Task] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await _frames(reader, received)  # never answers
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.sock"
        server = await asyncio.start_unix_server(serve, path=str(path))
        client = await Client.connect_unix(path)
        try:
            if how == "cancel":
                task = asyncio.create_task(client.request("context/compress", {"sessionId": "s"}))
                first = await asyncio.wait_for(received.get(), 5)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                with pytest.raises(asyncio.TimeoutError):
                    await client.request("context/compress", {"sessionId": "s"}, timeout=0.2)
                first = await asyncio.wait_for(received.get(), 5)
            cancel = await asyncio.wait_for(received.get(), 5)
            assert first["method"] == "context/compress"
            assert cancel == {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": first["id"]}}
        finally:
            await client.close(shutdown=False)  # this server answers nothing, shutdown included
            server.close()
            for t in tasks:
                t.cancel()
