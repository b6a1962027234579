"""Fixtures of the ``ctxd mcp`` tests: a temporary socket and data directory per test,
``ctxd mcp`` run as a real subprocess and spoken to with the ``mcp`` SDK's own client
session over stdio, and a real ctxd daemon (autostarted by ``ctxd mcp`` or by the
seeding client, exactly as ``ctxd-cli`` starts one). Nothing is mocked. Every daemon a
test started is stopped (``daemon/stop``, then by the pid in the socket's lock file).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import ctxd
from ctxd.client import Client, DaemonUnavailable, RpcError, connect_or_start
from ctxd.tokens import TokenCounter

REPO = str(Path(ctxd.__file__).parents[1])
_counter = TokenCounter.for_encoding("cl100k_base")


def tokens(text: str) -> int:
    return _counter.count(text)


@dataclass
class McpEnv:
    root: Path

    @property
    def socket(self) -> Path:
        return self.root / "s.sock"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def mcp_stderr(self) -> Path:
        return self.root / "mcp.stderr"

    def env(self, **extra: str) -> dict[str, str]:
        """What an MCP client's launcher would pass: the stdio client adds only a few safe
        variables (PATH, HOME...) of its own, so the socket and data dir are explicit."""
        env = {
            "CTXD_DAEMON_SOCKET": str(self.socket),
            "CTXD_DAEMON_DATA_DIR": str(self.data_dir),
            "XDG_CONFIG_HOME": str(self.root / "config"),  # never the developer's config.toml
            "PYTHONPATH": REPO,
            "PYTHONUNBUFFERED": "1",
        }
        env.update(extra)
        return env

    @asynccontextmanager
    async def session(self, *args: str, **env: str) -> AsyncIterator[ClientSession]:
        """``python -m ctxd mcp ARGS`` with the SDK's client session, initialized."""
        params = StdioServerParameters(command=sys.executable, args=["-m", "ctxd", "mcp", *args],
                                       env=self.env(**env), cwd=str(self.root))
        with open(self.mcp_stderr, "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

    def stderr_text(self) -> str:
        return self.mcp_stderr.read_text() if self.mcp_stderr.exists() else ""

    async def client(self) -> Client:
        """A ctxd client on the same socket (starting the daemon when none runs)."""
        return await connect_or_start(self.socket, data_dir=str(self.data_dir), client_name="tests-mcp")

    def daemon_pid(self) -> int | None:
        try:
            pid = int((self.root / "s.sock.lock").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self.socket).encode() in cmdline else None


async def _stop_daemon(path: Path) -> None:
    try:
        client = await Client.connect_unix(path)
    except (DaemonUnavailable, OSError):
        return
    try:
        await client.initialize(client_name="tests-mcp")
        await client.request("daemon/stop", timeout=10)
    except (TimeoutError, RpcError, DaemonUnavailable):
        pass
    finally:
        await client.close(shutdown=False)


def stop_everything(env: McpEnv) -> None:
    if env.socket.exists():
        asyncio.run(_stop_daemon(env.socket))
    deadline = time.monotonic() + 10
    while env.daemon_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = env.daemon_pid()
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def mcp_env() -> Iterator[McpEnv]:
    root = Path(tempfile.mkdtemp(prefix="ctxmcp-", dir="/tmp"))  # short: socket paths are limited
    instance = McpEnv(root)
    try:
        yield instance
    finally:
        stop_everything(instance)
        shutil.rmtree(root, ignore_errors=True)


# --- a realistic session --------------------------------------------------------------

BIG_OUTPUT_LINES = 400


def agent_messages(turns: int, *, topic: str = "urlvalidator") -> list[dict[str, Any]]:
    """A user task, then ``turns`` assistant tool calls (OpenAI and Anthropic style
    alternately) with their results, and a closing assistant message."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Fix the {topic} bug: URLs with a trailing newline are accepted."}]
    for i in range(turns):
        call_id = f"call_{topic}_{i}"
        if i % 2 == 0:
            messages.append({"role": "assistant", "content": f"Step {i}: looking at file{i}.py for {topic}.",
                             "toolCalls": [{"id": call_id, "type": "function", "function": {
                                 "name": "bash", "arguments": f'{{"cmd": "cat file{i}.py"}}'}}]})
            body = "\n".join(f"file{i}.py:{n}: line {n} of step {i} ({topic} marker{i})" for n in range(60))
            messages.append({"role": "tool", "toolCallId": call_id, "content": body})
        else:
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": f"Step {i}: running the tests of {topic}."},
                {"type": "tool_use", "id": call_id, "name": "bash", "input": {"cmd": f"pytest -k step{i}"}}]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "toolUseId": call_id, "content": f"step{i} passed: 12 tests, marker{i}"}]})
    messages.append({"role": "assistant", "content": f"The {topic} fix is done."})
    return messages


async def seed_session(client: Client, *, turns: int = 12, compress: bool = True, topic: str = "urlvalidator",
                       title: str = "seeded") -> dict[str, Any]:
    """A session with ``agent_messages(turns)`` and, when ``compress``, at least one
    checkpoint. Returns {"sessionId", "checkpointId" (or None), "lastSeq"}."""
    info = await client.request("session/create", {"model": "gpt-4o", "contextWindow": 16384, "title": title})
    sid = info["sessionId"]
    pushed = await client.request("session/push", {"sessionId": sid, "messages": agent_messages(turns, topic=topic)})
    checkpoint_id = None
    if compress:
        await client.request("context/compress", {"sessionId": sid}, timeout=60)
        checkpoints = (await client.request("context/checkpoints", {"sessionId": sid}))["checkpoints"]
        assert checkpoints, "context/compress made no checkpoint"
        checkpoint_id = checkpoints[0]["id"]
    return {"sessionId": sid, "checkpointId": checkpoint_id, "lastSeq": pushed["messageCount"]}
