"""Real transcript formats replayed through a real daemon: every imported message is
stored as sent, and the prompt in each provider format pairs every tool result with
its call (and passes the provider validators)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxd.client import Client
from ctxd.importers import load_transcripts
from ctxd.protocol.message import Message, ToolResultBlock, ToolUseBlock
from tests.e2e.helpers import (
    Daemon,
    anthropic_pairing_problems,
    check_prompt,
    db_rows,
    openai_pairing_problems,
    short_dir,
)

pytestmark = pytest.mark.usefixtures("module_backend")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
FILES = sorted(p for p in FIXTURES.iterdir() if p.suffix != ".md")
MISSING = "[no result was recorded"


@pytest.fixture(scope="module")
def replay_daemon(module_backend):
    base = short_dir()
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    daemon.start()
    yield daemon
    daemon.stop()
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def tool_calls_of(messages: list[Message]) -> tuple[set[str], set[str]]:
    """(ids of every tool call, ids of every tool result) in a transcript."""
    calls, results = set(), set()
    for m in messages:
        calls.update(c.id for c in m.tool_calls or ())
        if m.role == "tool" and m.tool_call_id:
            results.add(m.tool_call_id)
        if isinstance(m.content, list):
            calls.update(b.id for b in m.content if isinstance(b, ToolUseBlock))
            results.update(b.tool_use_id for b in m.content if isinstance(b, ToolResultBlock))
    return calls, results


def test_fixtures_exist():
    assert len(FILES) >= 8, FILES


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
async def test_replay_transcript(replay_daemon, path):
    transcripts = load_transcripts(path)
    client = await Client.connect_unix(replay_daemon.socket_path)
    await client.initialize(client_name="replay")
    try:
        for index, transcript in enumerate(transcripts):
            sid = f"{path.name}#{index}"
            # The whole transcript is the prompt: no compression gets in the way of checking
            # how the renderer pairs every recorded call and result.
            await client.request("session/create", {"sessionId": sid, "title": transcript.title,
                                                    "contextWindow": 1_000_000})
            wire = [msgspec.to_builtins(m) for m in transcript.messages]
            # Replay as an agent would: a few messages per push, in order.
            acked: list[dict[str, Any]] = []
            for start in range(0, len(wire), 3):
                result = await client.request("session/push", {"sessionId": sid, "messages": wire[start:start + 3]})
                acked += result["messages"]
            assert [a["seq"] for a in acked] == list(range(1, len(wire) + 1))
            info = await client.request("session/get", {"sessionId": sid})
            assert info["messageCount"] == len(wire)
            assert info["tokenCount"] == sum(a["tokens"] for a in acked)

            # History: stored exactly as sent.
            rows = db_rows(replay_daemon.data_dir, sid)
            assert [body for _, body, _ in rows] == wire

            calls, results = tool_calls_of(transcript.messages)
            answered = calls & results
            for fmt in ("openai", "anthropic", "ollama"):
                prompt = await client.request("context/prompt", {"sessionId": sid, "format": fmt})
                assert check_prompt(prompt) == [], (fmt, check_prompt(prompt))
                assert prompt["messageCount"] == len(wire) and prompt["lastSeq"] == len(wire)
                if fmt == "openai":
                    messages = prompt["messages"]
                    assert openai_pairing_problems(messages) == []
                    rendered_calls = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
                    assert rendered_calls == calls
                    real = {m["tool_call_id"] for m in messages
                            if m["role"] == "tool" and not m["content"].startswith(MISSING)}
                    assert real == answered  # every recorded result is sent, next to its call
                elif fmt == "anthropic":
                    assert anthropic_pairing_problems(prompt["messages"]) == []
                    uses = {b["id"] for m in prompt["messages"] for b in m["content"] if b["type"] == "tool_use"}
                    assert uses == calls
                else:
                    ollama_calls = sum(len(m.get("tool_calls") or ()) for m in prompt["messages"])
                    assert ollama_calls == len(calls)
                    assert sum(1 for m in prompt["messages"] if m["role"] == "tool") == len(calls)
    finally:
        await client.close()
