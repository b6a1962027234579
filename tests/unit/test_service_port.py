"""The service port served in process (``service/local.py``): the service's Structs in and
out, refusals as a socket client gets them, a session's requests in the order made, and a
cancelled caller's request withdrawn or carried through as ``$/cancelRequest`` does. The
same port over a daemon's socket (``ctxd/remote_port.py``) is compared with this one in
``tests/proxy/test_in_process.py``."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxd.config import Config
from ctxd.protocol.context import AnthropicPrompt
from ctxd.protocol.errors import ErrorCode, RpcError
from ctxd.protocol.session import PushResult, SessionInfo
from ctxd.service.core import Service
from ctxd.service.local import LocalPort

from .service_helpers import chat, params


async def _contents(port: LocalPort, session_id: str) -> list[str]:
    page = await port.session_history(params("session/history", sessionId=session_id, limit=500))
    return [entry.message.content for entry in page.messages]  # type: ignore[misc]


async def test_each_operation_answers_with_the_services_structs(service: Service) -> None:
    port = LocalPort(service)
    info = await port.session_create(params("session/create", sessionId="s", contextWindow=4096))
    assert isinstance(info, SessionInfo) and info.session_id == "s" and info.message_count == 0
    pushed = await port.session_push(params("session/push", sessionId="s", messages=chat(0, 2)))
    assert isinstance(pushed, PushResult) and [m.seq for m in pushed.messages] == [1, 2, 3, 4]
    assert (await port.session_get(params("session/get", sessionId="s"))).message_count == 4
    page = await port.session_history(params("session/history", sessionId="s", limit=3))
    assert [e.seq for e in page.messages] == [1, 2, 3] and page.next_seq == 4
    updated = await port.session_update(params("session/update", sessionId="s", systemPrompt="Be brief."))
    assert updated.system_prompt == "Be brief."
    prompt = await port.context_prompt(params("context/prompt", sessionId="s", format="anthropic",
                                              push=[{"role": "user", "content": "and one more"}]))
    assert isinstance(prompt, AnthropicPrompt) and prompt.last_seq == 5 and prompt.system
    assert (await _contents(port, "s"))[-1] == "and one more"
    assert port.busy_sessions() == []  # nothing kept once a session's requests are over


async def test_refusals_are_rpc_errors_with_the_protocol_codes(service: Service) -> None:
    port = LocalPort(service)
    with pytest.raises(RpcError) as missing:
        await port.session_get(params("session/get", sessionId="nope"))
    assert missing.value.code == ErrorCode.SessionNotFound
    assert missing.value.data == {"field": "sessionId", "sessionId": "nope"}
    await port.session_create(params("session/create", sessionId="s"))
    with pytest.raises(RpcError) as exists:
        await port.session_create(params("session/create", sessionId="s"))
    assert exists.value.code == ErrorCode.SessionExists and "already exists" in exists.value.message
    with pytest.raises(RpcError) as unknown:
        await port.session_push(params("session/push", sessionId="other", messages=chat(0, 1)))
    assert unknown.value.code == ErrorCode.SessionNotFound
    assert port.busy_sessions() == []


async def test_a_sessions_requests_run_in_the_order_made_others_alongside(service: Service) -> None:
    """Pushes made one after another without waiting for answers (as the proxy sends a
    reply's push and then the next turn) are stored in that order, each session's own."""
    port = LocalPort(service)
    for sid in ("a", "b"):
        await port.session_create(params("session/create", sessionId=sid))
    calls = [port.session_push(params("session/push", sessionId=sid,
                                      messages=[{"role": "user", "content": f"{sid} {n} " + "word " * (n % 7) * 400}]))
             for n in range(12) for sid in ("a", "b")]
    results = await asyncio.gather(*calls)
    assert [r.messages[0].seq for r in results] == [n + 1 for n in range(12) for _ in ("a", "b")]
    for sid in ("a", "b"):
        assert [c.split(" ")[1] for c in await _contents(port, sid)] == [str(n) for n in range(12)]
    assert port.busy_sessions() == []


async def test_a_session_created_and_used_without_waiting_for_answers(service: Service) -> None:
    """A new session's create, push, update, prompt and get made at once (as a client
    sends them pipelined on one connection) run in that order: each sees what the one
    before it did, for every session alike."""
    port = LocalPort(service)
    calls: list[Any] = []
    for k in range(5):
        sid = f"p{k}"
        calls += [port.session_create(params("session/create", sessionId=sid)),
                  port.session_push(params("session/push", sessionId=sid, messages=[{"role": "user", "content": sid}])),
                  port.session_update(params("session/update", sessionId=sid, systemPrompt="Short answers.")),
                  port.context_prompt(params("context/prompt", sessionId=sid, format="openai")),
                  port.session_get(params("session/get", sessionId=sid))]
    calls.append(port.session_list(params("session/list")))  # after every one made before it
    calls.append(port.context_stats(params("context/stats", sessionId="p4")))
    out = await asyncio.gather(*calls)
    for k in range(5):
        prompt, info = out[5 * k + 3], out[5 * k + 4]
        assert [m.content for m in prompt.messages] == ["Short answers.", f"p{k}"]
        assert (info.message_count, info.system_prompt) == (1, "Short answers.")
    listed, stats = out[-2:]
    assert sorted((i.session_id, i.message_count, i.system_prompt) for i in listed.sessions) == [
        (f"p{k}", 1, "Short answers.") for k in range(5)]
    assert stats.session_id == "p4" and stats.message_count == 1
    assert port.busy_sessions() == []


@contextlib.contextmanager
def _writes_held(database: Path) -> Iterator[None]:
    """Another writer holds the SQLite file: a push's transaction waits until the block ends."""
    lock = sqlite3.connect(database, timeout=10, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        yield
    finally:
        lock.execute("ROLLBACK")
        lock.close()


async def test_a_cancelled_caller_is_a_cancelled_request(service: Service, service_config: Config,
                                                         storage_url: str) -> None:
    """Cancelled once its write has begun: carried through (memory and storage agree,
    the next prompt holds it). Cancelled while waiting for its session's previous
    request: withdrawn, never stored."""
    if storage_url:
        pytest.skip("holds SQLite's write lock")
    port = LocalPort(service)
    await port.session_create(params("session/create", sessionId="s"))
    with _writes_held(service_config.database_path):
        begun = asyncio.ensure_future(port.session_push(params("session/push", sessionId="s", messages=[
            {"role": "user", "content": "begun, then left"}])))
        await asyncio.sleep(0.3)
        queued = asyncio.ensure_future(port.session_push(params("session/push", sessionId="s", messages=[
            {"role": "user", "content": "never begun"}])))
        await asyncio.sleep(0.1)
        assert port.busy_sessions() == ["s"]
        queued.cancel()
        begun.cancel()
        for call in (queued, begun):
            with pytest.raises(asyncio.CancelledError):
                await call
    await port.drain()  # (what the daemon's close waits for)
    assert port.busy_sessions() == []
    assert await _contents(port, "s") == ["begun, then left"]
    prompt = await port.context_prompt(params("context/prompt", sessionId="s"))
    assert [m.content for m in prompt.messages] == ["begun, then left"]  # type: ignore[union-attr]


async def test_stored_data_that_cannot_be_read_is_a_storage_error(service: Service, service_config: Config,
                                                                  storage_url: str) -> None:
    """What storage raises is mapped by the service (``service/errors.py``), as for a
    socket client: a stored message that no longer decodes is a StorageError naming the
    session and the way out, and the port goes on serving."""
    if storage_url:
        pytest.skip("edits the SQLite file underneath")
    port = LocalPort(service)
    await port.session_create(params("session/create", sessionId="s"))
    await port.session_push(params("session/push", sessionId="s", messages=chat(0, 1)))
    damage = sqlite3.connect(service_config.database_path, timeout=10)
    with damage:
        damage.execute("UPDATE messages SET body = ? WHERE seq = 2", (b"{not json",))
    damage.close()
    with pytest.raises(RpcError) as refused:
        await port.session_history(params("session/history", sessionId="s"))
    assert refused.value.code == ErrorCode.StorageError and "ctxd-cli doctor" in refused.value.message
    assert refused.value.data == {"sessionId": "s", "database": str(service_config.database_path)}
    assert (await port.session_get(params("session/get", sessionId="s"))).message_count == 2
