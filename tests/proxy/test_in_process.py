"""The daemon inside the proxy's process (``proxy.in_process``): socket clients (ctxd-cli,
another proxy) reach it while the proxy serves, ``daemon/stop`` stops both, a shutdown
waits for a reply's push, and a request gets what a socket client gets (results and
errors) from the same daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from ctxd.client import Client, RpcError
from ctxd.config import load_config
from ctxd.embed import open_here
from ctxd.proxy.apis import split
from ctxd.proxy.inproc import PortLink
from ctxd.proxy.sessions import Sessions
from tests.e2e.helpers import daemon_env
from tests.proxy.conftest import ProxyProcess, both_modes, ctxd_client, history
from tests.proxy.upstream import MODEL


def sdk(proxy: ProxyProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)


def cli(socket_path: Path, *args: str) -> str:
    """``ctxd-cli --socket PATH ARGS``, a real process; its stdout."""
    done = subprocess.run([sys.executable, "-m", "ctxd.cli", "--socket", str(socket_path), *args],
                          capture_output=True, text=True, env=daemon_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("proxy_mode", ["in-process"], indirect=True)
async def test_socket_clients_reach_the_daemon_while_the_proxy_serves(start_proxy, ctxd_daemon) -> None:
    proxy = start_proxy()
    messages = [{"role": "user", "content": "Kept in one process."}]
    reply = await sdk(proxy).chat.completions.create(model=MODEL, messages=messages,
                                                     extra_headers={"x-ctxd-session": "one-process"})
    messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    # ctxd-cli, a process of its own, on the proxy's socket
    assert "one-process" in cli(ctxd_daemon.socket_path, "sessions", "list")
    client = await ctxd_client(ctxd_daemon)
    try:
        status = await client.request("daemon/status", {})
        assert proxy.proc is not None and status["pid"] == proxy.proc.pid
        # a socket client writes while the proxy serves
        await client.request("session/create", {"sessionId": "by-socket"})
        await client.request("session/push", {"sessionId": "by-socket",
                                              "messages": [{"role": "user", "content": "from the socket"}]})
    finally:
        await client.close()
    assert [m["content"] for m in await history(ctxd_daemon, "by-socket")] == ["from the socket"]
    # A second proxy finds the daemon running and connects to it instead of starting one.
    second = start_proxy("--port", "0")
    assert "in this process" not in second.log()
    messages.append({"role": "user", "content": "And through the other proxy."})
    await sdk(second).chat.completions.create(model=MODEL, messages=messages,
                                              extra_headers={"x-ctxd-session": "one-process"})
    stored = await history(ctxd_daemon, "one-process")
    assert [m["content"] for m in stored] == ["Kept in one process.", "Answer to: Kept in one process.",
                                              "And through the other proxy.",
                                              "Answer to: And through the other proxy."]


@pytest.mark.parametrize("proxy_mode", ["in-process"], indirect=True)
async def test_daemon_stop_stops_the_proxy(start_proxy, ctxd_daemon) -> None:
    proxy = start_proxy()
    client = await ctxd_client(ctxd_daemon)
    try:
        await client.request("daemon/stop", {})
    finally:
        await client.close()
    assert proxy.proc is not None
    assert await asyncio.to_thread(proxy.proc.wait, 20) == 0
    assert "the daemon was asked to stop" in proxy.log()
    assert not ctxd_daemon.socket_path.exists()


@both_modes
async def test_a_shutdown_waits_for_the_reply_push_in_flight(start_proxy, upstream, ctxd_daemon, proxy_mode) -> None:
    """The reply's push is held by a write lock on the database when the proxy is told
    to stop: the proxy waits for it (then exits 0), and the reply is stored with its usage."""
    proxy = start_proxy()
    messages = [{"role": "user", "content": "Stop after this."}]
    headers = {"x-ctxd-session": "stopping"}
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(proxy.url + "/v1/chat/completions", json={"model": MODEL, "messages": messages},
                                headers=headers)
        messages.append(first.json()["choices"][0]["message"])
        messages.append({"role": "user", "content": "A streamed one."})
        await asyncio.sleep(0.5)  # (the first reply's push is stored)
        upstream.mode = "slow"
        lock = sqlite3.connect(ctxd_daemon.data_dir / "ctxd.db", timeout=10, isolation_level=None)
        try:
            async with http.stream("POST", proxy.url + "/v1/chat/completions", headers=headers,
                                   json={"model": MODEL, "messages": messages, "stream": True,
                                         "stream_options": {"include_usage": True}}) as response:
                chunks = response.aiter_raw()
                await chunks.__anext__()  # the turn's push is stored; the reply is on its way
                lock.execute("BEGIN IMMEDIATE")  # no write gets through until the rollback
                async for _ in chunks:
                    pass
            assert proxy.proc is not None
            proxy.proc.terminate()
            await asyncio.sleep(1.0)
            assert proxy.proc.poll() is None, "the proxy exited with the reply's push unanswered"
        finally:
            lock.execute("ROLLBACK") if lock.in_transaction else None
            lock.close()
    assert await asyncio.to_thread(proxy.proc.wait, 20) == 0
    if proxy_mode == "in-process":
        ctxd_daemon.start()  # the daemon went with the proxy: read what it stored
    stored = await history(ctxd_daemon, "stopping")
    assert [m["content"] for m in stored] == ["Stop after this.", "Answer to: Stop after this.", "A streamed one.",
                                              "Answer to: A streamed one."]
    assert stored[-1]["usage"]["outputTokens"] > 0  # the proxy's push (the client's copy has no usage)


async def _both_ways(link: PortLink, client: Client, method: str, params: Any) -> tuple[Any, Any]:
    """The same request in process and over the socket: (result or error) each."""
    out = []
    for call in (lambda: link.request("s", method, params), lambda: client.request(method, params)):
        try:
            out.append(await call())
        except RpcError as exc:
            out.append(("error", exc.code, exc.message, exc.data))
    return out[0], out[1]


async def test_results_and_errors_are_the_socket_clients(base_dir) -> None:
    config = load_config(None, overrides={"daemon": {"data_dir": str(base_dir / "data"),
                                                     "socket": str(base_dir / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    client = await Client.connect_unix(Path(config.socket_path))
    await client.initialize(client_name="in-process-test")
    try:
        await link.request("s", "session/create", {"sessionId": "s"})
        push = {"sessionId": "s", "messages": [{"role": "user", "content": "hello"}]}
        assert (await link.request("s", "session/push", push))["messageCount"] == 1
        prompt = {"sessionId": "s", "format": "anthropic"}
        ours, theirs = await _both_ways(link, client, "context/prompt", prompt)
        assert ours == theirs and ours["messages"][0]["content"][0]["text"] == "hello"
        for method, params in [("session/get", {"sessionId": "nope"}),  # SessionNotFound
                               ("session/push", {"sessionId": "s", "messages": [{"role": "robot"}]}),
                               ("session/create", {"sessionId": "s"}),  # SessionExists
                               ("context/prompt", {"sessionId": "s", "format": "nope"}),
                               ("session/history", {"sessionId": "s", "limit": -1, "extra": 1})]:
            ours, theirs = await _both_ways(link, client, method, params)
            assert ours[0] == "error" and ours == theirs, (method, ours, theirs)
        with pytest.raises(ValueError):
            await link.request("s", "daemon/stop", {})  # not a method the proxy uses: never served in process
    finally:
        await client.close()
        await link.close()
    assert not Path(config.socket_path).exists()


def _untimed(value: Any) -> Any:
    """``value`` without session ids and times."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items()
                if k != "sessionId" and not k.endswith("At") and k not in ("lastActivity", "timestamp", "at")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


async def test_the_port_in_process_and_over_the_socket_answer_alike(base_dir) -> None:
    """The service port served by the daemon's service in this process and by the same
    daemon over its socket (``RemotePort``): equal Structs, equal refusals."""
    from ctxd.protocol.methods import METHODS
    from ctxd.remote_port import RemotePort
    from ctxd.service.params import decode_params
    from ctxd.service.port import PORT_METHODS

    config = load_config(None, overrides={"daemon": {"data_dir": str(base_dir / "data"),
                                                     "socket": str(base_dir / "run" / "ctxd.sock")}})
    here = await open_here(config)
    client = await Client.connect_unix(Path(config.socket_path))
    await client.initialize(client_name="port-test")
    ports = (here.port, RemotePort(client))
    try:
        calls = [("session/create", {"sessionId": "{}", "contextWindow": 4096}),
                 ("session/push", {"sessionId": "{}", "messages": [{"role": "user", "content": "hello"},
                                                                   {"role": "assistant", "content": "hi"}]}),
                 ("session/update", {"sessionId": "{}", "systemPrompt": "Be brief."}),
                 ("context/prompt", {"sessionId": "{}", "format": "anthropic",
                                     "push": [{"role": "user", "content": "again"}]}),
                 ("session/history", {"sessionId": "{}", "limit": 2}),
                 ("session/get", {"sessionId": "{}"}),
                 ("context/stats", {"sessionId": "{}"}),
                 ("session/list", {"tag": "nothing-has-this-tag"}),
                 ("session/get", {"sessionId": "nope"}),
                 ("session/create", {"sessionId": "{}"})]  # (SessionExists)
        for method, raw in calls:
            out = []
            for port, sid in zip(ports, ("local", "remote")):
                params = decode_params(METHODS[method], {k: (sid if v == "{}" else v) for k, v in raw.items()})
                try:
                    out.append(await getattr(port, PORT_METHODS[method])(params))
                except RpcError as exc:
                    out.append(("error", exc.code, exc.message.replace(sid, "S"), _untimed(exc.data)))
            ours, theirs = out
            if not isinstance(ours, tuple):
                assert type(ours) is type(theirs), method
                # (each its own session, written at its own time)
                ours, theirs = (_untimed(msgspec.to_builtins(x)) for x in (ours, theirs))
            assert ours == theirs, (method, ours, theirs)
    finally:
        await client.close()
        await here.close()


async def test_each_prompt_is_what_the_socket_answers(base_dir) -> None:
    """A prompt in process is converted from the previous one's plain messages for what
    the daemon rendered before (``_prompt_builtins``): after every turn, compression, pin
    and goal it equals what a socket client gets for the same prompt, in each format."""
    config = load_config(None, overrides={"daemon": {"data_dir": str(base_dir / "data"),
                                                     "socket": str(base_dir / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    client = await Client.connect_unix(Path(config.socket_path))
    await client.initialize(client_name="in-process-test")
    formats = [{"format": "openai"}, {"format": "ollama"}, {"format": "anthropic", "cacheControl": False},
               {"format": "anthropic", "cacheControl": True}]
    try:
        await link.request("s", "session/create", {"sessionId": "s", "contextWindow": 4096,
                                                   "systemPrompt": "You check modules."})
        for turn in range(40):
            call = f"call{turn}"
            push = [{"role": "user", "content": f"check module {turn}"},
                    {"role": "assistant", "content": f"checking {turn}",
                     "toolCalls": [{"id": call, "function": {"name": "check", "arguments": "{}"}}]},
                    {"role": "tool", "toolCallId": call, "content": f"module {turn}: " + "ok " * 60}]
            for n, shape in enumerate(formats):
                params = {"sessionId": "s", **shape, **({"push": push} if n == 0 else {})}
                for _ in range(3):
                    ours = await link.request("s", "context/prompt", params)
                    theirs = await client.request("context/prompt", {"sessionId": "s", **shape})
                    # A pass the push started may end between the two (and appendRoom is 0
                    # while it runs): asked again, both see its end.
                    if ours["compressionCount"] == theirs["compressionCount"]:
                        break
                    params = {"sessionId": "s", **shape}
                ours.pop("appendRoom"), theirs.pop("appendRoom")
                assert ours == theirs, (turn, shape)
            if turn == 10:
                await client.request("context/compress", {"sessionId": "s"})
            elif turn == 20:
                await client.request("message/pin", {"sessionId": "s", "seq": 3})
            elif turn == 25:
                await client.request("goal/set", {"sessionId": "s", "description": "Check them all."})
        stats = await client.request("context/stats", {"sessionId": "s"})
        assert stats["compressionCount"] > 1  # (passes ran on their own too)
    finally:
        await client.close()
        await link.close()


async def test_one_session_in_order_others_alongside(base_dir) -> None:
    """A session's requests run one after another in the order made (as on one daemon
    connection): a reply's push sent and not awaited is stored before the next turn."""
    config = load_config(None, overrides={"daemon": {"data_dir": str(base_dir / "data"),
                                                     "socket": str(base_dir / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    proxy_sessions = Sessions(link)
    try:
        async def conversation(name: str) -> list[str]:
            messages: list[dict[str, Any]] = []
            for turn in range(5):
                messages.append({"role": "user", "content": f"{name} {turn}"})
                body = {"model": MODEL, "messages": messages}
                conv = proxy_sessions.read("openai", body, split("openai", body), session=name, window=None)
                tracked, chain, prompt = await proxy_sessions.turn(conv, "openai")
                assert [m["content"] for m in prompt["messages"]] == [m["content"] for m in messages]
                reply = {"role": "assistant", "content": f"answer {name} {turn}"}
                assert await proxy_sessions.push_reply(tracked, chain, conv, [reply], {"inputTokens": 5,
                                                                                      "outputTokens": 2})
                messages.append(reply)
            await proxy_sessions.drain()
            page = await link.request(name, "session/history", {"sessionId": name, "limit": 100})
            return [entry["message"]["content"] for entry in page["messages"]]

        stored = await asyncio.gather(*(conversation(f"c{k}") for k in range(3)))
        for k, contents in enumerate(stored):
            assert contents == [x for t in range(5) for x in (f"c{k} {t}", f"answer c{k} {t}")]
        assert link.port.busy_sessions() == []  # nothing kept per session once its requests are done
    finally:
        await proxy_sessions.drain()
        await link.close()


def test_the_flag_keeps_the_daemon_apart(base_dir, upstream) -> None:
    """``--separate-daemon``: with no daemon running, one is started in its own process."""
    socket_path = base_dir / "run" / "ctxd.sock"
    proxy = ProxyProcess(socket_path, upstream, base_dir / "proxy.log",
                         ["--data-dir", str(base_dir / "data"), "--separate-daemon"])
    proxy.command.remove("--no-autostart")
    proxy.start()
    try:
        assert "in this process" not in proxy.log()
        pid = json.loads(cli(socket_path, "daemon", "status", "--json"))["pid"]
        assert proxy.proc is not None and pid != proxy.proc.pid
    finally:
        proxy.stop()
        try:
            cli(socket_path, "daemon", "stop")
        except AssertionError:
            pass
        deadline = time.monotonic() + 10
        while socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not socket_path.exists()


@contextlib.contextmanager
def _writes_held(database: str | Path) -> Iterator[None]:
    """Another writer holds the database: a push's transaction waits until the block ends."""
    lock = sqlite3.connect(database, timeout=10, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        yield
    finally:
        lock.execute("ROLLBACK")
        lock.close()


async def test_a_cancelled_caller_is_a_cancelled_request(base_dir) -> None:
    """The proxy stops waiting for a push whose write has begun (its client left): the
    push is carried through, as a socket request cancelled by its client is, so memory and
    storage agree (the next prompt holds the message); one whose write has not begun is
    withdrawn."""
    config = load_config(None, overrides={"daemon": {"data_dir": str(base_dir / "data"),
                                                     "socket": str(base_dir / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    try:
        await link.request("s", "session/create", {"sessionId": "s"})
        with _writes_held(config.database_path):  # the push's transaction waits for this one
            push = asyncio.ensure_future(link.request("s", "session/push", {
                "sessionId": "s", "messages": [{"role": "user", "content": "begun, then left"}]}))
            await asyncio.sleep(0.5)
            push.cancel()
            with pytest.raises(asyncio.CancelledError):
                await push
        prompt = await link.request("s", "context/prompt", {"sessionId": "s"})
        assert [m["content"] for m in prompt["messages"]] == ["begun, then left"]
        page = await link.request("s", "session/history", {"sessionId": "s"})
        assert [e["message"]["content"] for e in page["messages"]] == ["begun, then left"]
        # Cancelled while waiting its turn behind another push of the session: withdrawn.
        with _writes_held(config.database_path):
            first = asyncio.ensure_future(link.request("s", "session/push", {
                "sessionId": "s", "messages": [{"role": "user", "content": "waited for"}]}))
            queued = asyncio.ensure_future(link.request("s", "session/push", {
                "sessionId": "s", "messages": [{"role": "user", "content": "never begun"}]}))
            await asyncio.sleep(0.3)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
        await first
        page = await link.request("s", "session/history", {"sessionId": "s"})
        assert [e["message"]["content"] for e in page["messages"]] == ["begun, then left", "waited for"]
        prompt = await link.request("s", "context/prompt", {"sessionId": "s"})
        assert [m["content"] for m in prompt["messages"]] == ["begun, then left", "waited for"]
    finally:
        await link.close()


async def test_a_data_directory_another_socket_s_daemon_uses_is_served_by_it(upstream, base_dir: Path) -> None:
    """``ctxd proxy`` on a data directory a daemon on another socket uses (one daemon per
    SQLite file): no daemon of its own; that daemon serves the proxy's sessions."""
    from tests.e2e.helpers import Daemon

    daemon = Daemon(base_dir / "data", socket_path=base_dir / "run" / "a.sock")
    daemon.start()
    proxy = ProxyProcess(base_dir / "run" / "b.sock", upstream, base_dir / "proxy.log",
                         ["--data-dir", str(daemon.data_dir)])
    proxy.command.remove("--no-autostart")
    try:
        proxy.start()
        reply = await sdk(proxy).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Served by the other daemon."}],
            extra_headers={"x-ctxd-session": "elsewhere"})
        assert reply.choices[0].message.content == "Answer to: Served by the other daemon."
        assert "elsewhere" in cli(daemon.socket_path, "sessions", "list")
        assert not (base_dir / "run" / "b.sock").exists()
        # A normal start, said at INFO (it was a WARNING: nothing is wrong, nothing to do).
        said = [line for line in proxy.log().splitlines() if "used by the ctxd daemon on" in line]
        assert len(said) == 1 and " INFO " in said[0], proxy.log()
        assert " WARNING " not in proxy.log(), proxy.log()
    finally:
        proxy.stop()
        daemon.stop()
