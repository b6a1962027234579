"""``ctxd --remote``: the stdio forwarder against real daemons on real sockets.

An editor spawns ``ctxd --remote auto`` and speaks stdio; every frame must reach the
shared daemon and come back, notifications included; the daemon is started when none
runs and outlives the forwarder; a daemon that dies is reported on stderr with exit 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.helpers import (
    CTXD,
    REPLY_TIMEOUT,
    START_TIMEOUT,
    Daemon,
    RawClient,
    async_wait_for,
    daemon_env,
    frame,
    process_gone,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("storage_backend")]


class Forwarder(RawClient):
    """A ``ctxd --remote`` subprocess, driven as a framed client over its stdio."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None and process.stdin is not None
        super().__init__(process.stdout, process.stdin)
        self.process = process

    @classmethod
    async def start(cls, *args: str) -> Forwarder:
        process = await asyncio.create_subprocess_exec(
            *CTXD, "--remote", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=daemon_env(), limit=1 << 26)
        return cls(process)

    async def close_stdin(self) -> None:
        self.writer.close()

    async def finish(self, timeout: float = START_TIMEOUT) -> tuple[int, str]:
        """Its exit code and stderr once it exits by itself (closing nothing)."""
        assert self.process.stderr is not None
        stderr = await asyncio.wait_for(self.process.stderr.read(), timeout)
        code = await asyncio.wait_for(self.process.wait(), timeout)
        return code, stderr.decode("utf-8", "replace")

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


@pytest_asyncio.fixture
async def forwarders() -> AsyncIterator[list[Forwarder]]:
    """Forwarders to start; every one still running is killed after the test."""
    started: list[Forwarder] = []
    yield started
    for forwarder in started:
        forwarder.kill()
        await forwarder.process.wait()


async def forwarder(started: list[Forwarder], *args: str) -> Forwarder:
    fwd = await Forwarder.start(*args)
    started.append(fwd)
    return fwd


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_frames_and_notifications_are_relayed(daemon: Daemon, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, f"unix:{daemon.socket_path}")
    # An editor may send Content-Type too; the relay accepts it and passes the frame on.
    body = frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None}})
    header, _, rest = body.partition(b"\r\n\r\n")
    await fwd.send_raw(header + b"\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n" + rest)
    init = await fwd.response(1)
    assert init["result"]["serverInfo"]["name"] == "ctxd"
    await fwd.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})

    created = await fwd.result("session/create", {"sessionId": "relay", "model": "gpt-4"})
    assert created["sessionId"] == "relay"
    await fwd.result("session/subscribe", {"sessionId": "relay"})
    pushed = await fwd.result("session/push", {"sessionId": "relay", "messages": [user_message("from the editor")]})
    assert pushed["messageCount"] == 1

    # A push by another client of the same daemon comes back as a notification.
    direct = await daemon.client()
    await direct.result("session/push", {"sessionId": "relay", "messages": [user_message("from an agent")]})
    note = await fwd.next_message()
    while note.get("method") != "session/updated" or note["params"].get("messageCount") != 2:
        note = await fwd.next_message()
    assert note["params"]["sessionId"] == "relay"
    history = await direct.result("session/history", {"sessionId": "relay"})
    assert [m["message"]["content"] for m in history["messages"]] == ["from the editor", "from an agent"]
    await direct.close()

    # Errors are the daemon's, relayed unchanged.
    error = await fwd.error("session/get", {"sessionId": "nope"})
    assert error["code"] != 0 and "nope" in error["message"]

    await fwd.close_stdin()
    assert await fwd.finish() == (0, "")


async def test_auto_starts_the_daemon_which_outlives_the_forwarder(base_dir: Path,
                                                                     forwarders: list[Forwarder]) -> None:
    socket_path = base_dir / "run" / "ctxd.sock"
    args = ["auto", "--set", f"daemon.socket={socket_path}", "--data-dir", str(base_dir / "data")]
    daemon_pid: int | None = None
    try:
        fwd = await forwarder(forwarders, *args)
        await fwd.initialize()
        status = await fwd.result("daemon/status")
        daemon_pid = status["pid"]
        assert daemon_pid not in (fwd.process.pid, os.getpid())
        assert status["dataDir"] == str(base_dir / "data") and socket_path.exists()
        await fwd.result("session/create", {"sessionId": "kept", "model": "gpt-4"})
        await fwd.close_stdin()
        assert await fwd.finish() == (0, "")

        # The daemon is still there, with the session, for ctxd-cli or the next editor.
        assert not process_gone(daemon_pid)
        direct = await RawClient.unix(socket_path)
        await direct.initialize()
        assert (await direct.result("session/get", {"sessionId": "kept"}))["sessionId"] == "kept"
        await direct.close()

        again = await forwarder(forwarders, *args)
        await again.initialize()
        assert (await again.result("daemon/status"))["pid"] == daemon_pid
        await again.close_stdin()
        assert (await again.finish())[0] == 0
    finally:
        if daemon_pid is not None and not process_gone(daemon_pid):
            os.kill(daemon_pid, signal.SIGTERM)
            await async_wait_for(lambda: process_gone(daemon_pid), what="the autostarted daemon to stop")


async def test_requests_sent_before_stdin_closes_are_answered(daemon: Daemon, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, f"unix:{daemon.socket_path}")
    await fwd.initialize()
    await fwd.send_raw(b"".join([
        frame({"jsonrpc": "2.0", "id": 7, "method": "session/create",
               "params": {"sessionId": "last", "model": "gpt-4"}}),
        frame({"jsonrpc": "2.0", "id": 8, "method": "session/push",
               "params": {"sessionId": "last", "messages": [user_message("sent just before the editor quit")]}})]))
    await fwd.close_stdin()
    assert "result" in await fwd.response(7)
    assert "result" in await fwd.response(8)
    assert await fwd.finish() == (0, "")


async def test_exit_closes_cleanly(daemon: Daemon, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, f"unix:{daemon.socket_path}")
    await fwd.initialize()
    await fwd.result("shutdown")
    await fwd.send({"jsonrpc": "2.0", "method": "exit"})
    assert await fwd.finish() == (0, "")
    assert daemon.proc is not None and daemon.proc.poll() is None  # exit ends this connection only


async def test_a_dying_daemon_is_reported(daemon: Daemon, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, f"unix:{daemon.socket_path}")
    await fwd.initialize()
    daemon.kill()
    code, stderr = await fwd.finish()
    assert code == 1
    assert f"the daemon on {daemon.socket_path} closed the connection (it stopped or crashed" in stderr
    assert "daemon.log" in stderr


async def test_no_daemon_on_an_explicit_socket(base_dir: Path, forwarders: list[Forwarder]) -> None:
    path = base_dir / "none.sock"
    fwd = await forwarder(forwarders, f"unix:{path}")
    code, stderr = await fwd.finish()
    assert code == 2
    assert f"no ctxd daemon is running on {path}" in stderr and f"ctxd --socket {path}" in stderr
    assert not path.exists()  # unix:PATH never starts one


@pytest.mark.parametrize("args, expected", [
    (["nowhere"], "expected auto, unix:PATH or tcp:HOST:PORT"),
    (["tcp:localhost:http"], "'http' is not a port number"),
    (["auto", "--socket", "/tmp/x.sock"], "cannot be combined with --socket"),
])
async def test_bad_targets(args: list[str], expected: str, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, *args)
    code, stderr = await fwd.finish()
    assert code == 2 and expected in stderr, stderr


async def test_bad_framing_from_the_editor(daemon: Daemon, forwarders: list[Forwarder]) -> None:
    fwd = await forwarder(forwarders, f"unix:{daemon.socket_path}")
    await fwd.initialize()
    await fwd.send_raw(b"this is not a header\r\n\r\n")
    code, stderr = await fwd.finish()
    assert code == 1
    assert "the editor (stdin) sent b'this is not a header' where a frame header was expected" in stderr
    other = await daemon.client()  # the daemon is unaffected
    await other.result("session/list")
    await other.close()


async def test_tcp_gets_the_token_added(daemon_factory: Any, forwarders: list[Forwarder], base_dir: Path) -> None:
    daemon = daemon_factory(socket=False, tcp=True)
    fwd = await forwarder(forwarders, f"tcp:127.0.0.1:{daemon.port}", "--set", f"daemon.token_file={daemon.token_file}")
    await fwd.initialize()  # no token from the "editor": the forwarder adds the daemon's
    assert (await fwd.result("session/create", {"model": "gpt-4"}))["sessionId"]
    await fwd.close_stdin()
    assert (await fwd.finish())[0] == 0

    # Without the token file, initialize reaches the daemon as sent and is refused.
    missing = base_dir / "no-token"
    refused = await forwarder(forwarders, f"tcp:127.0.0.1:{daemon.port}", "--set", f"daemon.token_file={missing}")
    error = await refused.error("initialize", {"processId": None})
    assert "token" in error["message"]
    code, stderr = await refused.finish(REPLY_TIMEOUT)
    assert f"no TCP token from {missing}" in stderr
