"""Several daemons on one PostgreSQL database (a real server started by the tests,
tests/conftest.py): clients pushing to the same sessions through two daemons at once,
and a daemon SIGKILLed in the middle of pushes. What is checked is what PostgreSQL
holds, read with psycopg, besides what the daemons answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from ctxd.client import Client, DaemonUnavailable, RpcError
from tests.pgserver import PgServer

WINDOW = 1_000_000  # compression never changes the context under these tests


async def connect(daemon: Any) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="postgres-e2e")
    return client


@asynccontextmanager
async def two_daemons(pg_server: PgServer, daemon_factory: Any, session_id: str,
                      messages: int) -> AsyncIterator[tuple[Client, Client]]:
    """Clients of two daemons on one new database, and a session with ``messages``
    alternating user/assistant messages pushed through the first."""
    url = pg_server.create_database()
    args = ["--set", f"storage.url={url}"]
    a, b = daemon_factory(name="a", args=args), daemon_factory(name="b", args=args)
    ca, cb = await connect(a), await connect(b)
    try:
        await ca.request("session/create", {"sessionId": session_id, "contextWindow": WINDOW})
        await ca.request("session/push", {"sessionId": session_id, "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(messages)]})
        yield ca, cb
    finally:
        await ca.close()
        await cb.close()


def stored(server: PgServer, url: str, session_id: str) -> tuple[list[tuple[int, str]], tuple[Any, ...]]:
    """(seq, content) of every stored message of the session, and its row's totals."""
    import psycopg

    dbname = url.split("@/", 1)[1].split("?", 1)[0]
    with psycopg.connect(server.conninfo(dbname)) as conn:
        rows = conn.execute("SELECT seq, body FROM messages WHERE session_id = %s ORDER BY seq",
                            (session_id,)).fetchall()
        totals = conn.execute("SELECT message_count, last_seq, token_count, stats FROM sessions WHERE id = %s",
                              (session_id,)).fetchone()
    return [(seq, msgspec.json.decode(body)["content"]) for seq, body in rows], totals


async def test_two_daemons_one_database_clients_push_to_the_same_sessions(pg_server, daemon_factory):
    url = pg_server.create_database()
    args = ["--set", f"storage.url={url}"]
    a = daemon_factory(name="a", args=args)
    b = daemon_factory(name="b", args=args)
    setup = await connect(a)
    sessions = ["s1", "s2", "s3"]
    for sid in sessions:
        await setup.request("session/create", {"sessionId": sid, "contextWindow": WINDOW})
    await setup.close()
    batches, size = 10, 4

    async def client_run(daemon: Any, name: str) -> dict[str, list[tuple[int, str]]]:
        client = await connect(daemon)
        acked: dict[str, list[tuple[int, str]]] = {sid: [] for sid in sessions}
        try:
            for i in range(batches):
                for sid in sessions:
                    texts = [f"{name} {sid} {i}.{k}" for k in range(size)]
                    result = await client.request("session/push", {
                        "sessionId": sid, "messages": [{"role": "user", "content": t} for t in texts]})
                    acked[sid] += [(m["seq"], t) for m, t in zip(result["messages"], texts)]
        finally:
            await client.close()
        return acked

    runs = await asyncio.gather(client_run(a, "a1"), client_run(a, "a2"), client_run(b, "b1"), client_run(b, "b2"))
    per_session = 4 * batches * size
    for sid in sessions:
        acked = sorted(pair for run in runs for pair in run[sid])
        rows, (count, last_seq, _tokens, stats) = stored(pg_server, url, sid)
        # Exact totals, no duplicate or missing seq, what was acknowledged is what is stored.
        assert [seq for seq, _ in acked] == list(range(1, per_session + 1))
        assert rows == acked
        assert count == last_seq == per_session
        assert msgspec.json.decode(stats)["by_role"]["user"]["messages"] == per_session
        # Each client's messages in the order it pushed them.
        for run in runs:
            mine = run[sid]
            assert [seq for seq, _ in mine] == sorted(seq for seq, _ in mine)
    # Both daemons answer with the whole history (a daemon behind reloads it).
    for daemon in (a, b):
        client = await connect(daemon)
        try:
            for sid in sessions:
                page = await client.request("session/history", {"sessionId": sid, "limit": per_session + 10})
                assert [m["seq"] for m in page["messages"]] == list(range(1, per_session + 1))
            found = await client.request("session/search", {"query": "b2 s2 9.3"})
            assert [(h["sessionId"], h["seq"]) for h in found["hits"]] == \
                [("s2", next(seq for seq, t in runs[3]["s2"] if t == "b2 s2 9.3"))]
        finally:
            await client.close()


async def test_a_daemon_sigkilled_mid_push_loses_nothing_acknowledged(pg_server, daemon_factory):
    url = pg_server.create_database()
    args = ["--set", f"storage.url={url}"]
    a = daemon_factory(name="a", args=args)
    client = await connect(a)
    await client.request("session/create", {"sessionId": "k", "contextWindow": WINDOW})
    acked: list[tuple[int, str]] = []
    killed = asyncio.Event()

    async def pusher(tag: str) -> None:
        n = 0
        while not killed.is_set():
            texts = [f"{tag} {n}.{k}" for k in range(5)]
            n += 1
            try:
                result = await client.request("session/push", {
                    "sessionId": "k", "messages": [{"role": "user", "content": t} for t in texts]})
            except (DaemonUnavailable, RpcError, ConnectionError, OSError):
                return
            acked.extend((m["seq"], t) for m, t in zip(result["messages"], texts))

    tasks = [asyncio.create_task(pusher(tag)) for tag in ("p", "q", "r")]
    while len(acked) < 150:
        await asyncio.sleep(0.01)
    a.kill()  # pushes are in flight: some were sent and not answered
    killed.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close(shutdown=False)

    b = daemon_factory(name="b", args=args)  # another daemon on the same database
    rows, (count, last_seq, _tokens, _stats) = stored(pg_server, url, "k")
    assert set(acked) <= set(rows), "an acknowledged message is missing"
    # Whole batches or nothing: seqs 1..N without a gap, the totals agree with the rows.
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)) and count == last_seq == len(rows)
    assert len(rows) % 5 == 0
    again = await connect(b)
    try:
        result = await again.request("session/push", {"sessionId": "k", "messages": [
            {"role": "user", "content": "after the kill"}]})
        assert result["messages"][0]["seq"] == len(rows) + 1 and result["messageCount"] == len(rows) + 1
    finally:
        await again.close()


async def test_a_client_of_one_daemon_hears_what_is_done_through_another(pg_server, daemon_factory):
    """Cross-daemon notifications between two real daemon processes: a client subscribed on
    daemon A hears the pushes, the goal, the pin and the snapshot done through daemon B, in
    order (a snapshot label of 20 KB, larger than a NOTIFY, included), and A's next prompt
    holds what B changed."""
    url = pg_server.create_database()
    args = ["--set", f"storage.url={url}"]
    a = daemon_factory(name="a", args=args)
    b = daemon_factory(name="b", args=args)
    listener, worker = await connect(a), await connect(b)
    heard: list[tuple[str, dict[str, Any]]] = []
    listener.on_notification(lambda method, params: heard.append((method, params)))
    try:
        await worker.request("session/create", {"sessionId": "x", "contextWindow": WINDOW})
        await listener.request("session/subscribe", {"sessionId": "x"})
        before = await listener.request("context/prompt", {"sessionId": "x", "format": "anthropic"})
        assert before["messages"] == []
        for i in range(3):
            await worker.request("session/push", {"sessionId": "x", "messages": [
                {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]})
        await worker.request("goal/set", {"sessionId": "x", "description": "finish the relay"})
        await worker.request("message/pin", {"sessionId": "x", "seq": 1})
        label = "ünïcode label " * 1500
        await worker.request("snapshot/create", {"sessionId": "x", "label": label})
        for _ in range(3000):  # until A's client heard everything (no time limit asserted)
            if any(m == "snapshot/created" for m, _ in heard):
                break
            await asyncio.sleep(0.01)
        updates = [(p["reason"], p["lastSeq"]) for m, p in heard if m == "session/updated"]
        assert updates[:5] == [("push", 2), ("push", 4), ("push", 6), ("goal", 6), ("pin", 6)], updates
        assert [p["snapshot"]["label"] for m, p in heard if m == "snapshot/created"] == [label]
        prompt = await listener.request("context/prompt", {"sessionId": "x", "format": "anthropic"})
        assert "finish the relay" in str(prompt["system"]) and len(prompt["messages"]) == 6
        assert prompt["budget"]["pinnedTokens"] > 0
    finally:
        await listener.close()
        await worker.close()


async def test_pins_and_a_goal_made_through_two_daemons_at_once_all_hold(pg_server, daemon_factory):
    """Each pin saves the session's whole context state: two daemons pinning at the same
    moment would each save their own copy, and one pin would be lost, without taking
    turns on the session (SessionCache.changing)."""
    async with two_daemons(pg_server, daemon_factory, "p", 40) as (ca, cb):
        for round_ in range(3):
            seqs = list(range(1 + round_ * 12, 13 + round_ * 12))
            await asyncio.gather(
                *(client.request("message/pin", {"sessionId": "p", "seq": seq})
                  for client, seq in zip([ca, cb] * 6, seqs)),
                cb.request("goal/set", {"sessionId": "p", "description": f"goal {round_}"}))
            expected = set(range(1, 13 + round_ * 12))
            for client in (ca, cb):
                await client.request("context/prompt", {"sessionId": "p"})  # (catches up with the other daemon)
                stats = await client.request("context/stats", {"sessionId": "p"})
                assert set(stats["pinned"]) == expected, (round_, client is ca)
                goal = await client.request("goal/get", {"sessionId": "p"})
                assert goal["goal"]["description"] == f"goal {round_}"


async def test_a_push_through_one_daemon_keeps_a_pin_and_goal_made_through_another(pg_server, daemon_factory):
    """A push stores its daemon's copy of the session's context state and goal: one
    through daemon A right after a pin and a goal through B undid both (found as a new
    user would, with ctxd-cli against two daemons). The push now finds, in its
    transaction, that the stored context moved on, reloads it and pushes again."""
    async with two_daemons(pg_server, daemon_factory, "k", 6) as (ca, cb):
        await ca.request("context/prompt", {"sessionId": "k"})  # (A has the session's context in memory)
        for round_ in range(3):
            await cb.request("message/pin", {"sessionId": "k", "seq": round_ + 1})
            await cb.request("goal/set", {"sessionId": "k", "description": f"goal {round_}"})
            pushed = await ca.request("session/push", {"sessionId": "k", "messages": [
                {"role": "user", "content": f"after round {round_}"}]})
            assert pushed["messageCount"] == 7 + round_
            for client in (ca, cb):
                await client.request("context/prompt", {"sessionId": "k"})  # (catches up with the other daemon)
                stats = await client.request("context/stats", {"sessionId": "k"})
                assert stats["pinned"] == list(range(1, round_ + 2)), (round_, client is ca)
                goal = await client.request("goal/get", {"sessionId": "k"})
                assert goal["goal"]["description"] == f"goal {round_}", (round_, client is ca)


async def test_clients_pushing_into_one_session_through_two_daemons_all_succeed_and_agree(pg_server,
                                                                                          daemon_factory):
    """Eight clients, half on each daemon, push one message at a time into ONE session: every
    push succeeds (pushes through several daemons wait for each other: in 3 of 5 runs of
    8 x 150 one was refused with -33005 "kept changing through other daemons"), and each
    daemon answers session/get, context/stats, session/list and context/prompt with what is
    stored (one daemon counted 1,059-1,117 of 1,201 messages, still 3 s later)."""
    clients_n, messages = 8, 30
    url = pg_server.create_database()
    args = ["--set", f"storage.url={url}"]
    daemons = [daemon_factory(name="a", args=args), daemon_factory(name="b", args=args)]
    ca, cb = await connect(daemons[0]), await connect(daemons[1])
    refused: list[str] = []

    async def pusher(k: int) -> None:
        client = await connect(daemons[k % 2])
        try:
            for i in range(messages):
                try:
                    await client.request("session/push", {"sessionId": "one", "messages": [
                        {"role": "user" if i % 2 == 0 else "assistant", "content": f"client {k} message {i}"}]})
                except RpcError as exc:
                    refused.append(f"{exc.code} {exc.message}")
        finally:
            await client.close()

    try:
        await ca.request("session/create", {"sessionId": "one", "contextWindow": WINDOW})
        await ca.request("session/push", {"sessionId": "one", "messages": [{"role": "system", "content": "go"}]})
        await cb.request("session/get", {"sessionId": "one"})  # (B holds the session in memory too)
        await asyncio.gather(*(pusher(k) for k in range(clients_n)))
        assert refused == []
        # The last word through A: B's memory is behind, what is stored is not.
        await ca.request("session/push", {"sessionId": "one", "messages": [{"role": "user", "content": "last"}]})
        total = 1 + clients_n * messages + 1
        rows, (count, last_seq, _tokens, _stats) = stored(pg_server, url, "one")
        assert len(rows) == count == last_seq == total
        for client in (cb, ca):
            info = await client.request("session/get", {"sessionId": "one"})
            stats = await client.request("context/stats", {"sessionId": "one"})
            listed = await client.request("session/list", {})
            assert info["messageCount"] == stats["messageCount"] == total
            assert [s["messageCount"] for s in listed["sessions"] if s["sessionId"] == "one"] == [total]
            assert info["contextTokens"] == stats["budget"]["promptTokens"]
            prompt = await client.request("context/prompt", {"sessionId": "one"})
            assert prompt["messageCount"] == total and len(prompt["messages"]) == total
            assert prompt["tokens"] == stats["budget"]["promptTokens"]
    finally:
        await ca.close()
        await cb.close()
