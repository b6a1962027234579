"""ctxd over stdio, driven by pytest-lsp: the LSP lifecycle, exit codes and
cancellation. Each test spawns its own ``python -m ctxd --data-dir TMP`` through
pytest-lsp's ``ClientServerConfig``; params and results travel as plain dicts (see
``lsp.py``). The data-plane methods are in test_stdio_sessions.py.
"""

from __future__ import annotations

import asyncio

import pytest
from pygls.exceptions import JsonRpcException

from ctxd import __version__
from ctxd.client import Client, RpcError
from ctxd.protocol.methods import METHODS
from tests.e2e.helpers import daemon_env, db_rows, user
from tests.e2e.lsp import create, initialize, push, request, rpc_error

pytestmark = pytest.mark.usefixtures("storage_backend")

# --- lifecycle --------------------------------------------------------------------------


async def test_initialize_advertises_server_and_every_method(stdio_factory):
    client = await stdio_factory()
    result = await initialize(client)
    assert result["serverInfo"] == {"name": "ctxd", "version": __version__}
    caps = result["capabilities"]
    assert sorted(caps["methods"]) == sorted(METHODS)
    for method in ("initialize", "shutdown", "session/create", "session/push", "context/prompt",
                   "context/stats", "session/subscribe", "daemon/status", "daemon/stop"):
        assert method in caps["methods"]
    assert set(caps["promptFormats"]) == {"openai", "anthropic", "ollama"}
    assert "session/updated" in caps["notifications"]
    # Every advertised method is actually served (none answers "method not found").
    for method in caps["methods"]:
        if method in ("initialize", "shutdown", "daemon/stop"):
            continue
        try:
            await request(client, method, {"sessionId": "no-such-session"})
        except JsonRpcException as exc:
            assert exc.code != -32601, method


async def test_requests_before_initialize_are_refused(stdio_factory):
    client = await stdio_factory()
    err = await rpc_error(client, "session/list", {})
    assert err.code == -32002
    assert "initialize" in err.message
    err = await rpc_error(client, "session/create", {"sessionId": "early"})
    assert err.code == -32002
    await initialize(client)
    listed = await request(client, "session/list", {})
    assert listed["sessions"] == []  # the refused create stored nothing
    err = await rpc_error(client, "initialize", {})
    assert err.code == -32600


async def test_requests_after_shutdown_are_invalid_and_exit_is_clean(stdio_factory):
    client = await stdio_factory()
    await initialize(client)
    assert await request(client, "shutdown") is None
    err = await rpc_error(client, "session/list", {})
    assert err.code == -32600
    assert "shutdown" in err.message
    client.protocol.notify("exit", None)
    assert await asyncio.wait_for(client._server.wait(), 30) == 0


async def test_exit_without_shutdown_exits_1(stdio_factory):
    client = await stdio_factory()
    await initialize(client)
    await create(client, sessionId="s")
    client.protocol.notify("exit", None)
    assert await asyncio.wait_for(client._server.wait(), 30) == 1


# --- cancellation -------------------------------------------------------------------------


async def test_cancel_slow_push(stdio_factory):
    """A push of many large messages is slow (tokens are counted on a worker thread
    before anything is written). ``$/cancelRequest`` sent right behind it reaches the
    daemon long before that work is done, so the push ends with -32800 and stores
    nothing; the connection keeps serving."""
    client = await stdio_factory("--set", "limits.max_batch_messages=100000")
    await initialize(client)
    await create(client, sessionId="s")
    body = " ".join(f"word{i}" for i in range(300))
    messages = [user(f"{i} {body}") for i in range(5000)]
    msg_id = "slow-push"
    # send_request (not the coroutine send_request_async) writes the request now, so
    # the cancel is certain to follow it on the pipe.
    pending = client.protocol.send_request("session/push", {"sessionId": "s", "messages": messages},
                                           msg_id=msg_id)
    client.protocol.notify("$/cancelRequest", {"id": msg_id})
    with pytest.raises(JsonRpcException) as info:
        await asyncio.wait_for(asyncio.wrap_future(pending), 120)
    assert info.value.code == -32800
    info_after = await request(client, "session/get", {"sessionId": "s"})
    assert (info_after["messageCount"], info_after["lastSeq"]) == (0, 0)
    assert db_rows(client.data_dir, "s") == []
    # The connection is fine: a push after the cancelled one lands at seq 1.
    after = await push(client, "s", [user("after the cancel")])
    assert after["messages"][0]["seq"] == 1


async def test_cancelling_a_request_waiting_its_turn_does_not_stall_the_ones_after_it(stdio_factory):
    """Requests run in the order sent. One cancelled while it waits behind a slow one
    ends with -32800, and the requests behind it still run, in order."""
    client = await stdio_factory("--set", "limits.max_batch_messages=100000")
    await initialize(client)
    await create(client, sessionId="s")
    body = " ".join(f"word{i}" for i in range(300))
    slow = client.protocol.send_request("session/push", {"sessionId": "s", "messages": [
        user(f"{i} {body}") for i in range(3000)]}, msg_id="slow")
    waiting = client.protocol.send_request("session/get", {"sessionId": "s"}, msg_id="waiting")
    client.protocol.notify("$/cancelRequest", {"id": "waiting"})
    behind = client.protocol.send_request("session/push", {"sessionId": "s", "messages": [user("behind")]},
                                          msg_id="behind")
    with pytest.raises(JsonRpcException) as info:
        await asyncio.wait_for(asyncio.wrap_future(waiting), 120)
    assert info.value.code == -32800
    first = await asyncio.wait_for(asyncio.wrap_future(slow), 120)
    last = await asyncio.wait_for(asyncio.wrap_future(behind), 120)
    assert first["messages"][-1]["seq"] == 3000 and last["messages"][0]["seq"] == 3001


async def test_a_failed_initialize_may_be_sent_again(stdio_factory):
    client = await stdio_factory()
    pending = client.protocol.send_request("initialize", {"processId": "not a pid"}, msg_id="bad")
    with pytest.raises(JsonRpcException) as info:
        await asyncio.wait_for(asyncio.wrap_future(pending), 30)
    assert info.value.code == -32602
    await initialize(client)
    await create(client, sessionId="s")


# --- the client library over stdio ---------------------------------------------------------


async def test_client_library_spawn_stdio(tmp_path):
    """``ctxd.client.Client.spawn_stdio`` (what agents embed) speaks to the same daemon."""
    client = await Client.spawn_stdio(["--data-dir", str(tmp_path / "d")], env=daemon_env())
    try:
        result = await client.initialize()
        assert result["serverInfo"]["name"] == "ctxd"
        await client.request("session/create", {"sessionId": "s"})
        with pytest.raises(RpcError) as info:
            await client.request("session/create", {"sessionId": "s"})
        assert info.value.code == -33002
        pushed = await client.request("session/push", {"sessionId": "s", "messages": [user("hi")]})
        assert pushed["messages"][0]["seq"] == 1
    finally:
        await client.close()
    assert client.process is not None and client.process.returncode == 0
