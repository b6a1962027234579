"""An acknowledged push survives the daemon being SIGKILLed right after the ack:
restart on the same data dir and every acknowledged message is there, with its seq
and its exact content, and the session totals agree with the rows."""

from __future__ import annotations

import asyncio
import random

import pytest

from ctxd.client import Client, DaemonUnavailable, RpcError
from tests.e2e.helpers import db_rows, db_session

pytestmark = pytest.mark.usefixtures("storage_backend")

# Content that would not survive a careless round trip: multi-byte UTF-8, escapes,
# quotes, control characters, lone-surrogate-free emoji, JSON-looking text.
TRICKY = ["é ✓ 漢字 \U0001F600", 'say "hi"\\n', "tab\there\r\nnewline", '{"role": "system"}', "\u2028\u2029",
          "x" * 3000]


WINDOW = 1_000_000


def content(n: int, tag: str) -> str:
    return f"{tag} #{n}: {TRICKY[n % len(TRICKY)]}"


async def connect(daemon) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="durability")
    return client


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_acknowledged_pushes_survive_sigkill(daemon_factory, durability):
    daemon = daemon_factory(name="d", args=["--durability", durability])
    client = await connect(daemon)
    assert (await client.request("daemon/status"))["durability"] == durability
    # A window large enough that compression never changes the context under the test.
    await client.request("session/create", {"sessionId": "s", "systemPrompt": "keep me",
                                            "contextWindow": WINDOW})
    acked: list[tuple[int, int, str]] = []
    n = 0
    for batch in (1, 5, 1, 20, 3, 1, 50, 1):
        texts = [content(n + i, "seq") for i in range(batch)]
        n += batch
        result = await client.request("session/push", {"sessionId": "s",
                                                        "messages": [{"role": "user", "content": t} for t in texts]})
        acked += [(m["seq"], m["tokens"], t) for m, t in zip(result["messages"], texts)]
    last = result
    daemon.kill()  # right after the last acknowledgement
    await client.close(shutdown=False)

    daemon.start()
    client = await connect(daemon)
    try:
        info = await client.request("session/get", {"sessionId": "s"})
        assert info["messageCount"] == len(acked) == last["messageCount"]
        assert info["lastSeq"] == acked[-1][0]
        assert info["tokenCount"] == sum(t for _, t, _ in acked) == last["tokenCount"]
        assert info["contextTokens"] == last["contextTokens"]
        assert info["systemPrompt"] == "keep me"
        prompt = await client.request("context/prompt", {"sessionId": "s", "format": "openai"})
        assert [m["content"] for m in prompt["messages"][1:]] == [t for _, _, t in acked]
        # A push after the restart continues the sequence.
        more = await client.request("session/push", {"sessionId": "s", "messages": [{"role": "user",
                                                                                      "content": "after"}]})
        assert more["messages"][0]["seq"] == acked[-1][0] + 1
    finally:
        await client.close()
    rows = db_rows(daemon.data_dir, "s")
    assert [(seq, body["content"]) for seq, body, _ in rows[:-1]] == [(seq, t) for seq, _, t in acked]
    # Byte-equal: the stored JSON decodes to exactly the UTF-8 that was sent.
    assert all(body["content"].encode() == t.encode() for (_, body, _), (_, _, t) in zip(rows, acked))


async def test_concurrent_pushers_killed_mid_flight(daemon_factory):
    """Six connections push into a shared session and their own sessions; the daemon is
    SIGKILLed while pushes are still in flight. After a restart every acknowledged
    message is stored under its acknowledged seq, sequences have no holes, and each
    session's totals equal the sum over its rows (unacknowledged pushes may or may not
    have landed, but never partially)."""
    daemon = daemon_factory(name="c")
    setup = await connect(daemon)
    sessions = ["shared"] + [f"own{i}" for i in range(6)]
    for sid in sessions:
        await setup.request("session/create", {"sessionId": sid, "contextWindow": WINDOW})
    await setup.close()

    acked: dict[str, dict[int, str]] = {sid: {} for sid in sessions}
    pushes_done = 0
    enough = asyncio.Event()
    rng = random.Random(1234)

    async def pusher(index: int) -> None:
        nonlocal pushes_done
        client = await connect(daemon)
        try:
            n = 0
            while True:
                sid = "shared" if n % 2 == 0 else f"own{index}"
                texts = [content(n * 100 + i, f"p{index}") for i in range(rng.randint(1, 8))]
                n += 1
                try:
                    result = await client.request("session/push", {"sessionId": sid, "messages": [
                        {"role": "user", "content": t} for t in texts]}, timeout=60)
                except (DaemonUnavailable, RpcError, ConnectionError):
                    return  # the daemon is gone: this push was never acknowledged
                for ack, text in zip(result["messages"], texts):
                    acked[sid][ack["seq"]] = text
                pushes_done += 1
                if pushes_done >= 150:
                    enough.set()
        finally:
            await client.close(shutdown=False)

    tasks = [asyncio.create_task(pusher(i)) for i in range(6)]
    await asyncio.wait_for(enough.wait(), 120)
    daemon.kill()  # others are still pushing
    await asyncio.wait_for(asyncio.gather(*tasks), 60)

    daemon.start()
    client = await connect(daemon)
    try:
        for sid in sessions:
            info = await client.request("session/get", {"sessionId": sid})
            rows = db_rows(daemon.data_dir, sid)
            stored = {seq: body["content"] for seq, body, _ in rows}
            assert list(stored) == list(range(1, len(rows) + 1)), f"{sid}: holes in the sequence"
            for seq, text in acked[sid].items():
                assert stored.get(seq) == text, f"{sid}: acknowledged seq {seq} lost or changed"
            row = db_session(daemon.data_dir, sid)
            assert row["message_count"] == row["rows"] == info["messageCount"] == info["lastSeq"]
            assert row["token_count"] == row["row_tokens"] == info["tokenCount"]
    finally:
        await client.close()
    assert sum(len(v) for v in acked.values()) > 0
