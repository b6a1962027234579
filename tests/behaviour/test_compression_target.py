"""Compression that fills the window, end to end (a real daemon over its socket):

* a pass compresses to the low-water mark and no further: with a large window most of
  the conversation stays verbatim, and the prompt stays well used after compressions;
* the user's words stay verbatim while they take at most half of the largest prompt;
* between compressions each prompt starts with the previous one (prompt caches work);
* a message too big for any prompt (an assistant's answer, a tool call's arguments) is
  sent as an excerpt: there is always a prompt, and history keeps the message whole.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
from collections.abc import AsyncIterator

import pytest

from tests.e2e.compression_helpers import (
    Conn,
    CtxdProc,
    Driver,
    Turn,
    _prose,
    agent_session,
    check_prompt,
    remove_root,
    short_root,
    user_texts,
)

pytestmark = pytest.mark.usefixtures("storage_backend")


async def _session(conn: Conn, sid: str, window: int, **extra) -> Driver:
    await conn.call("session/create", {"sessionId": sid, "contextWindow": window, **extra})
    await conn.call("session/subscribe", {"sessionId": sid})
    return Driver(conn, sid)


def chat(seed: int, turns: int) -> list[Turn]:
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        out.append(Turn([{"role": "user", "content": f"[U{i:04d}] " + _prose(rng, rng.randint(3, 10))}]))
        out.append(Turn([{"role": "assistant", "content": _prose(rng, rng.randint(60, 120))}]))
    return out


@contextlib.asynccontextmanager
async def _daemon() -> AsyncIterator[Conn]:
    """A daemon on a temp socket and one connection to it, both gone afterwards."""
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        yield conn
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


def _prefix_kept(prev: dict, new: dict) -> bool:
    a, b = prev["messages"], new["messages"]
    return len(b) >= len(a) and b[:len(a)] == a


async def test_chat_keeps_its_prefix_uses_the_window_and_keeps_user_words():
    async with _daemon() as conn:
        drive = await _session(conn, "chat", window=8192)
        user_cost = 0
        previous = None
        kept = changed = 0
        fill_after_first: list[float] = []
        for turn in chat(seed=11, turns=600):
            result = await drive.push(turn)
            prompt = await drive.prompt("openai")
            max_prompt = prompt["budget"]["maxPromptTokens"]
            assert prompt["tokens"] <= max_prompt
            message = turn.messages[0]
            if message["role"] == "user":
                user_cost += result["messages"][0]["tokens"]
                if user_cost <= max_prompt // 2:
                    # Every user word is verbatim while they take at most half the prompt
                    # (behind the boundary, consecutive ones go out as one message, a blank
                    # line apart).
                    sent = {p for u in user_texts(prompt) for p in (u, *u.split("\n\n"))}
                    missing = [t for t in (m.get("content") for m in drive.pushed.values() if m["role"] == "user")
                               if t not in sent]
                    assert not missing, (len(missing), user_cost, max_prompt)
            if previous is not None:
                if _prefix_kept(previous, prompt):
                    kept += 1
                else:
                    changed += 1
            if drive.runs:
                fill_after_first.append(prompt["tokens"] / max_prompt)
            previous = prompt
        assert len(drive.runs) >= 3, "the chat never needed compressing: make it longer"
        assert user_cost > 2000  # (the share was approached)
        # The prefix changes only when a pass ran; most turns reuse the previous prompt.
        assert changed <= len(drive.runs)
        assert kept / (kept + changed) >= 0.9, (kept, changed)
        assert statistics.median(fill_after_first) >= 0.6, statistics.median(fill_after_first)


async def test_a_large_window_keeps_most_of_the_conversation_verbatim():
    """At 32k an agent session of several times the window compresses only its oldest
    part: the prompt after every pass is still at least half the largest prompt."""
    async with _daemon() as conn:
        drive = await _session(conn, "big", window=32768, model="llama3.1:70b")
        await drive.push_until(agent_session(seed=5, messages=1200), lambda d: len(d.runs) >= 4)
        assert len(drive.runs) >= 4
        for run in drive.runs:
            # Each pass stops near the low-water mark (60% of available), never far below it.
            assert run.used_after >= 0.45 * run.available, (run.push, run.used_after, run.available)
            assert run.used_before - run.used_after >= 0.1 * run.available
        prompt = await drive.prompt("openai")
        assert not check_prompt(prompt, 32768)


async def test_an_assistant_message_bigger_than_the_prompt_is_excerpted():
    """The newest assistant message alone is larger than the largest prompt (a long answer
    and a huge write_file call): the prompt carries excerpts of both with a notice, and
    history has them whole."""
    async with _daemon() as conn:
        drive = await _session(conn, "huge", window=4096)
        rng = random.Random(2)
        await drive.push([{"role": "user", "content": "Write the whole module, please."}])
        answer = "\n".join(f"line {i}: " + _prose(rng, 12) for i in range(400))
        content = "\n".join(f"def f{i}(): return {i}" for i in range(600))
        big = {"role": "assistant", "content": answer,
               "toolCalls": [{"id": "w1", "function": {
                   "name": "write_file", "arguments": json.dumps({"path": "m.py", "content": content})}}]}
        pushed = await drive.push([big])
        assert pushed["messages"][0]["tokens"] > 4096
        await drive.push([{"role": "tool", "toolCallId": "w1", "content": "written"}])
        for fmt in ("openai", "anthropic", "ollama"):
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 4096), check_prompt(prompt, 4096)
            assert prompt["tokens"] <= prompt["budget"]["maxPromptTokens"]
            text = json.dumps(prompt)
            assert "left out by ctxd to fit the context window" in text
            assert "line 0:" in text and "line 399:" in text  # head and tail of the answer
            assert "Write the whole module, please." in text
        openai = (await drive.prompt("openai"))["messages"]
        call = next(m for m in openai if m.get("tool_calls"))["tool_calls"][0]
        assert "ctxd_excerpt" in json.loads(call["function"]["arguments"])  # still a JSON object
        history = await conn.call("session/history", {"sessionId": "huge"})
        stored = next(m for m in history["messages"] if m["message"]["role"] == "assistant")["message"]
        assert stored["content"] == answer
        assert json.loads(stored["toolCalls"][0]["function"]["arguments"])["content"] == content


async def test_only_a_newest_user_message_bigger_than_the_prompt_is_refused():
    async with _daemon() as conn:
        drive = await _session(conn, "too-big", window=2048)
        await drive.push([{"role": "user", "content": "word " * 3000}])
        try:
            await drive.prompt("openai")
        except Exception as exc:  # RpcError with the figures
            assert getattr(exc, "code", None) == -33010
            assert exc.data["promptTokens"] > exc.data["maxPromptTokens"]  # type: ignore[attr-defined]
        else:
            raise AssertionError("a user message larger than the window was handed out")


async def test_a_huge_tool_result_beside_the_users_words_is_excerpted():
    """Claude Code sends tool results in a user message with a text block beside them:
    the results are excerpted, the user's words are not, and there is a prompt."""
    async with _daemon() as conn:
        drive = await _session(conn, "cc", window=8192)
        rng = random.Random(4)
        await drive.push([{"role": "user", "content": "Read the log."}])
        await drive.push([{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "cat big.log"}}]}])
        log = "\n".join(f"{i} " + _prose(rng, 14) for i in range(2500))
        await drive.push([{"role": "user", "content": [
            {"type": "tool_result", "toolUseId": "t1", "content": log},
            {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]}])
        for fmt in ("openai", "anthropic"):
            prompt = await drive.prompt(fmt)
            assert prompt["tokens"] <= prompt["budget"]["maxPromptTokens"]
            text = json.dumps(prompt)
            assert "<system-reminder>keep going</system-reminder>" in text
            assert "left out by ctxd to fit the context window" in text


async def test_a_user_message_bigger_than_any_prompt_changes_nothing():
    async with _daemon() as conn:
        drive = await _session(conn, "keep", window=4096)
        await drive.push_until(agent_session(seed=3, messages=200),
                               lambda d: any("summarize" in r.note["layers"] for r in d.runs))
        before = (await conn.call("context/checkpoints", {"sessionId": "keep"}))["checkpoints"]
        assert before
        await drive.push([{"role": "user", "content": "word " * 6000}])
        try:
            await drive.prompt("openai")
        except Exception as exc:
            assert getattr(exc, "code", None) == -33010
            assert "newest user message alone" in str(exc)
        else:
            raise AssertionError("a user message larger than the window was handed out")
        after = (await conn.call("context/checkpoints", {"sessionId": "keep"}))["checkpoints"]
        assert [c["id"] for c in after] == [c["id"] for c in before]  # nothing was compressed away
