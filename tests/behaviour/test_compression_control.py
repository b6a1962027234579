"""Client control over compression, end to end, through a real daemon:

``context/compress`` (below the trigger, with ``$/progress`` for a ``workDoneToken`` and
``context/compressing`` for subscribers), automatic compression switched off in the
daemon's configuration or per session (always honoured: ContextOverflow instead),
``strategy=truncate``, ``context/checkpoints`` and ``checkpoint/expand``,
``context/watermark``, ``message/pin``, and goals (``goal/*`` and markers).
"""

from __future__ import annotations

import json
import os

import pytest

from ctxd.client import RpcError
from tests.e2e.compression_helpers import (
    FORMATS,
    Conn,
    CtxdProc,
    Driver,
    agent_session,
    check_prompt,
    checkpoint_text,
    predict_compression,
    remove_root,
    seqs_of,
    short_root,
    system_text,
    tool_ids_in,
    user_texts,
)

pytestmark = pytest.mark.usefixtures("module_backend")

CONTEXT_OVERFLOW = -33010
CHECKPOINT_NOT_FOUND = -33013
MESSAGE_NOT_FOUND = -33014
INVALID_PARAMS = -32602
# The six stages and their percentages (ctxd adds checkpoint ageing at 95%).
STAGES = {"identification": 0, "preparation": 15, "summarization": 25, "checkpoint": 70, "update": 80,
          "aging": 85, "validation": 90}


@pytest.fixture(scope="module")
def daemon(module_backend):
    """One daemon with the default configuration; every test uses its own sessions."""
    root = short_root()
    proc = CtxdProc(root).start()
    try:
        yield proc
    finally:
        proc.stop()
        remove_root(root)


async def session(conn: Conn, session_id: str, window: int = 8192, **extra) -> Driver:
    await conn.call("session/create", {"sessionId": session_id, "contextWindow": window, **extra})
    await conn.call("session/subscribe", {"sessionId": session_id})
    return Driver(conn, session_id, auto=(extra.get("settings") or {}).get("autoCompress", True))


# --- context/compress -------------------------------------------------------------------


async def test_compress_now_below_the_trigger_with_progress(daemon):
    watcher = await daemon.connect()
    requester = await daemon.connect()
    try:
        drive = await session(watcher, "now", window=16384)
        for turn in agent_session(seed=1, messages=30, markers=False, large_every=10_000):
            await drive.push(turn)
        budget = drive.last_result["budget"]
        assert budget["used"] < budget["triggerAt"] and not watcher.of("context/compressed")
        mark = watcher.mark()
        result = await requester.call("context/compress", {"sessionId": "now", "focus": "the retry scheduler",
                                                           "workDoneToken": "tok-7"})
        assert result["compressed"] and "summarize" in result["layers"], result
        assert result["afterTokens"] < result["beforeTokens"] and result["checkpointIds"]
        assert result["summarizer"] == "extractive"

        # $/progress goes to the requesting connection only: begin, reports, end.
        progress = [p for m, p in requester.notes if m == "$/progress"]
        assert progress and all(p["token"] == "tok-7" for p in progress)
        kinds = [p["value"]["kind"] for p in progress]
        assert kinds[0] == "begin" and kinds[-1] == "end" and set(kinds[1:-1]) == {"report"}
        assert progress[0]["value"]["title"] and progress[0]["value"].get("percentage") == 0
        reported = [p["value"]["percentage"] for p in progress[1:-1]]
        assert set(reported) <= set(STAGES.values())
        assert {0, 15, 25, 70, 80, 90} <= set(reported)
        assert not watcher.of("$/progress")

        # context/compressing goes to subscribers (and not to the unsubscribed requester).
        stages = watcher.of("context/compressing", mark)
        assert [s["stage"] for s in stages][:5] == ["identification", "preparation", "summarization",
                                                      "checkpoint", "update"]
        assert all(s["percentage"] == STAGES[s["stage"]] and s["sessionId"] == "now" for s in stages)
        assert {s["stage"] for s in stages} >= {"validation"}
        assert not requester.of("context/compressing")
        [note] = watcher.of("context/compressed", mark)
        assert note["trigger"] == "request" and note["checkpointIds"] == result["checkpointIds"]
        [created] = watcher.of("checkpoint/created", mark)
        assert created["checkpoint"]["id"] in result["checkpointIds"]

        # Nothing left to compress: an honest "no".
        again = await requester.call("context/compress", {"sessionId": "now"})
        assert not again["compressed"] and again["reason"]
        for fmt in FORMATS:
            assert not check_prompt(await drive.prompt(fmt), 16384)
        await drive.expand_all()
    finally:
        await watcher.close()
        await requester.close()


async def test_progress_percentages_only_rise(daemon):
    conn = await daemon.connect()
    try:
        drive = await session(conn, "rising", window=32768)
        turns = agent_session(seed=2, messages=90, markers=False, large_every=10_000)
        # Two compressions, so the second has a checkpoint to age.
        for turn in turns[:40]:
            await drive.push(turn)
        await conn.call("context/compress", {"sessionId": "rising"})
        for turn in turns[40:]:
            await drive.push(turn)
        mark = conn.mark()
        result = await conn.call("context/compress", {"sessionId": "rising", "workDoneToken": 42})
        assert result["compressed"]
        percentages = [p["value"].get("percentage") for m, p in conn.notes[mark:] if m == "$/progress"
                       and p["value"]["kind"] != "end"]
        assert 85 in percentages  # ageing ran
        assert percentages == sorted(percentages), percentages
    finally:
        await conn.close()


# --- automatic compression off ----------------------------------------------------------


async def check_auto_off(conn: Conn, drive: Driver) -> None:
    """Past the trigger and past the window without one automatic pass; context/prompt
    refuses with the figures; context/compress still works."""
    sid = drive.session_id
    turns = agent_session(seed=3, messages=300, markers=False)
    refused = None
    for index, turn in enumerate(turns):  # noqa: B007 - index is used after the loop
        await drive.push(turn)
        budget = drive.last_result["budget"]
        if budget["promptTokens"] > budget["maxPromptTokens"]:
            with pytest.raises(RpcError) as error:
                await drive.prompt("openai")
            refused = error.value
            break
        assert not check_prompt(await drive.prompt("anthropic"), budget["contextWindow"])
    assert refused is not None, "the prompt never outgrew the window"
    assert refused.code == CONTEXT_OVERFLOW
    data = refused.data
    assert data["promptTokens"] == budget["promptTokens"] > data["maxPromptTokens"] == budget["maxPromptTokens"]
    assert data["contextWindow"] == budget["contextWindow"] and data["used"] == budget["used"]
    assert "context/compress" in refused.message
    for fmt in ("anthropic", "ollama"):
        with pytest.raises(RpcError) as error:
            await drive.prompt(fmt)
        assert error.value.code == CONTEXT_OVERFLOW
    # Not one automatic pass; the skip was announced once, with its reason and figures.
    assert not conn.of("context/compressed") and not conn.of("checkpoint/created")
    [skipped] = conn.of("context/compressionSkipped")
    assert "off" in skipped["reason"] and skipped["used"] > skipped["triggerAt"]
    assert [t["level"] for t in conn.of("context/threshold")] == ["warning", "critical"]

    result = await conn.call("context/compress", {"sessionId": sid})
    assert result["compressed"] and result["afterTokens"] <= data["maxPromptTokens"]
    drive.last_after_used = (await conn.call("context/stats", {"sessionId": sid}))["budget"]["used"]
    for fmt in FORMATS:
        assert not check_prompt(await drive.prompt(fmt), budget["contextWindow"])
    # Still no automatic pass afterwards, however far the session goes.
    for turn in turns[index + 1:index + 60]:
        await drive.push(turn)
    assert [p["trigger"] for p in conn.of("context/compressed")] == ["request"]
    info = await conn.call("session/get", {"sessionId": sid})
    assert info["messageCount"] == len(drive.pushed)


async def test_auto_off_in_the_daemon_configuration_is_honoured():
    root = short_root()
    daemon = CtxdProc(root, sets=["compression.auto=false"]).start()
    try:
        conn = await daemon.connect()
        drive = await session(conn, "manual", window=4096)
        drive.auto = False
        await check_auto_off(conn, drive)
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_auto_off_for_one_session_is_honoured(daemon):
    conn = await daemon.connect()
    other = await daemon.connect()
    try:
        drive = await session(conn, "manual-session", window=4096, settings={"autoCompress": False})
        info = await conn.call("session/get", {"sessionId": "manual-session"})
        assert info["settings"]["autoCompress"] is False
        await check_auto_off(conn, drive)
        # Switched back on with session/update: the next push past the trigger compresses.
        mark = conn.mark()
        updated = await conn.call("session/update", {"sessionId": "manual-session",
                                                     "settings": {"autoCompress": True}})
        assert updated["settings"]["autoCompress"] is True
        drive.auto = True
        budget = (await conn.call("context/stats", {"sessionId": "manual-session"}))["budget"]
        if predict_compression(budget, drive.last_after_used, 0.10):
            await drive.await_pass(mark, -1, budget)  # the update itself starts the pass
        await drive.push_until(agent_session(seed=13, messages=300, markers=False), lambda d: bool(d.runs))
        assert drive.runs[0].note.get("trigger", "auto") == "auto"
        # Another session of the same daemon still compresses on its own.
        auto = await session(other, "auto-session", window=4096)
        await auto.push_until(agent_session(seed=3, messages=300, markers=False), lambda d: bool(d.runs))
    finally:
        await conn.close()
        await other.close()


@pytest.mark.process("ctxd over stdio, spawned by the client library")
async def test_compress_over_stdio_reports_progress(tmp_path):
    """The same through a daemon spawned on stdio (how editors and agents run it)."""
    from ctxd.client import Client
    from tests.e2e.compression_helpers import daemon_environ

    client = await Client.spawn_stdio(["--data-dir", str(tmp_path / "data")], env=daemon_environ())
    conn = Conn(client)
    try:
        await client.initialize(client_name="e2e-stdio", process_id=os.getpid())
        drive = await session(conn, "stdio", window=16384)
        for turn in agent_session(seed=12, messages=30, markers=False, large_every=10_000):
            await drive.push(turn)
        result = await conn.call("context/compress", {"sessionId": "stdio", "workDoneToken": "t"})
        assert result["compressed"] and result["afterTokens"] < result["beforeTokens"]
        kinds = [p["value"]["kind"] for m, p in conn.notes if m == "$/progress"]
        assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
        assert [s["stage"] for s in conn.of("context/compressing")][0] == "identification"
        for fmt in FORMATS:
            assert not check_prompt(await drive.prompt(fmt), 16384)
        await drive.expand_all()
    finally:
        await conn.close()


# --- truncation, checkpoints, expand -------------------------------------------------------


async def test_truncate_strategy_and_checkpoint_listing(daemon):
    conn = await daemon.connect()
    try:
        drive = await session(conn, "trunc", window=4096, settings={"strategy": "truncate"})
        turns = agent_session(seed=4, messages=300, markers=False)
        instructions = []
        for turn in turns:
            await drive.push(turn)
            instructions += [turn.instruction] if turn.instruction else []
            # (pruning comes first: old outputs may pay for the first passes)
            if sum("truncate" in r.note["layers"] for r in drive.runs) >= 2:
                break
        created = [n["checkpoint"] for n in conn.of("checkpoint/created")]
        assert created and all(c["kind"] == "truncated" and c["summarizer"] == "truncation" for c in created)
        assert all("summarize" not in r.note["layers"] for r in drive.runs)
        assert any("truncate" in r.note["layers"] for r in drive.runs)
        listing = await conn.call("context/checkpoints", {"sessionId": "trunc"})
        # (one truncation notice, grown in place: announced again with the same id)
        assert [c["id"] for c in listing["checkpoints"]] == list(dict.fromkeys(c["id"] for c in created))
        assert listing["tokens"] == (await conn.call("context/stats", {"sessionId": "trunc"}))["checkpointTokens"]
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 4096)
            assert all(any(t in u for u in user_texts(prompt)) for t in instructions)
            assert "were left out of the prompt" in checkpoint_text(prompt)
        await drive.expand_all()
        with pytest.raises(RpcError) as error:
            await conn.call("checkpoint/expand", {"sessionId": "trunc", "checkpointId": "ckpt_nosuchthing"})
        assert error.value.code == CHECKPOINT_NOT_FOUND
        assert error.value.data["checkpointId"] == "ckpt_nosuchthing"
    finally:
        await conn.close()


# --- watermark -----------------------------------------------------------------------------


async def test_watermark_by_tool_call_and_by_seq(daemon):
    conn = await daemon.connect()
    try:
        drive = await session(conn, "mark", window=32768)
        turns = agent_session(seed=5, messages=60, markers=False, large_every=10_000)
        for turn in turns:
            await drive.push(turn)
        calls = {}  # tool call id -> seq of its call
        for seq, message in drive.pushed.items():
            for call in message.get("toolCalls") or ():
                calls[call["id"]] = seq
            for block in message["content"] if isinstance(message.get("content"), list) else ():
                if block["type"] == "tool_use":
                    calls[block["id"]] = seq
        ordered = sorted(calls, key=calls.get)
        target = ordered[len(ordered) // 2]
        mark_seq = calls[target]
        before = await drive.prompt("openai")
        texts_before = [m["content"] for m in before["messages"] if m["role"] == "assistant" and m["content"]]

        result = await conn.call("context/watermark", {"sessionId": "mark", "toolUseId": target})
        assert result["changed"] and result["watermarkSeq"] == mark_seq and result["toolUseId"] == target
        assert result["blocksRemoved"] > 0 and result["tokensFreed"] > 0
        [note] = conn.of("context/compressed")
        assert note["layers"] == ["watermark"] and note["freedTokens"] == result["tokensFreed"]
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 32768)
            if fmt == "ollama":  # Ollama's tool calls carry no ids: count them
                sent = sum(len(m.get("tool_calls") or ()) for m in prompt["messages"])
                assert sent == len([c for c in ordered if calls[c] >= mark_seq])
                continue
            ids = tool_ids_in(prompt)
            assert not {c for c in ordered if calls[c] < mark_seq} & ids, fmt
            assert {c for c in ordered if calls[c] >= mark_seq} <= ids, fmt
        after = await drive.prompt("openai")
        assert after["tokens"] == before["tokens"] - result["tokensFreed"]
        # Conversational text before the watermark is still sent.
        texts_after = [m["content"] for m in after["messages"] if m["role"] == "assistant" and m["content"]]
        assert texts_after == texts_before

        # It only moves forward; unknown targets change nothing and say why.
        back = await conn.call("context/watermark", {"sessionId": "mark", "seq": mark_seq - 2})
        assert not back["changed"] and back["watermarkSeq"] == mark_seq and "forward" in back["reason"]
        unknown = await conn.call("context/watermark", {"sessionId": "mark", "toolUseId": "call_nope"})
        assert not unknown["changed"] and "not found" in unknown["reason"]
        beyond = await conn.call("context/watermark", {"sessionId": "mark", "seq": 10_000})
        assert not beyond["changed"] and beyond["reason"]
        with pytest.raises(RpcError) as error:
            await conn.call("context/watermark", {"sessionId": "mark"})
        assert error.value.code == INVALID_PARAMS
        forward = await conn.call("context/watermark", {"sessionId": "mark", "seq": calls[ordered[-1]]})
        assert forward["changed"] and forward["watermarkSeq"] == calls[ordered[-1]]
        stats = await conn.call("context/stats", {"sessionId": "mark"})
        assert stats["watermarkSeq"] == calls[ordered[-1]]
        assert len(conn.of("context/compressed")) == 2
    finally:
        await conn.close()


# --- pins ---------------------------------------------------------------------------------


async def test_pinned_message_stays_verbatim_across_compressions(daemon):
    conn = await daemon.connect()
    try:
        drive = await session(conn, "pins", window=4096)
        turns = agent_session(seed=6, messages=400, markers=False)
        for turn in turns[:4]:
            await drive.push(turn)
        # Pin an assistant message (a fact the agent must keep) and a tool output.
        pinned_text = "Remember: the staging database is db-staging-7, never touch prod-1."
        result = await drive.push([{"role": "assistant", "content": pinned_text}])
        text_seq = result["messages"][0]["seq"]
        output_seq = next(s for s, m in drive.pushed.items() if m["role"] == "tool"
                          or isinstance(m.get("content"), list) and m["content"][0]["type"] == "tool_result")
        pinned = set()
        for seq in (text_seq, output_seq):
            pin = await conn.call("message/pin", {"sessionId": "pins", "seq": seq})
            assert pin["pinned"] and pin["pinnedTokens"] > 0
            pinned |= set(pin.get("seqs") or [seq])  # a tool result is pinned with its call
        assert output_seq - 1 in pinned
        with pytest.raises(RpcError) as error:
            await conn.call("message/pin", {"sessionId": "pins", "seq": 99_999})
        assert error.value.code == MESSAGE_NOT_FOUND
        output = drive.pushed[output_seq]
        output_text = output["content"] if isinstance(output["content"], str) else output["content"][0]["content"]

        await drive.push_until(turns[4:], lambda d: len(d.runs) >= 4)
        stats = await conn.call("context/stats", {"sessionId": "pins"})
        assert stats["pinned"] == sorted(pinned)
        for cp in (await conn.call("context/checkpoints", {"sessionId": "pins"}))["checkpoints"]:
            assert not pinned & set(seqs_of(cp)), seqs_of(cp)
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 4096)
            contents = [m["content"] for m in prompt["messages"]]
            flat = [b.get("text") or b.get("content") for c in contents if isinstance(c, list) for b in c]
            everything = [c for c in contents if isinstance(c, str)] + flat
            assert pinned_text in everything, fmt
            assert any(output_text in (t or "") for t in everything), fmt

        # Unpinned, the message goes the way of its neighbours at the next compression.
        await conn.call("message/pin", {"sessionId": "pins", "seq": text_seq, "pinned": False})
        await conn.call("context/compress", {"sessionId": "pins"})
        prompt = await drive.prompt("openai")
        assert pinned_text not in [m["content"] for m in prompt["messages"]]
        # Pinning a message already compressed brings it back, verbatim.
        await conn.call("message/pin", {"sessionId": "pins", "seq": text_seq})
        prompt = await drive.prompt("openai")
        assert pinned_text in [m["content"] for m in prompt["messages"]]

        # A pin that could never be sent with room for the conversation is refused, with
        # the figures, and changes nothing.
        huge = await drive.push([{"role": "assistant", "content": "log line 42 failed\n" * 300}])
        huge_seq = huge["messages"][0]["seq"]
        with pytest.raises(RpcError) as error:
            await conn.call("message/pin", {"sessionId": "pins", "seq": huge_seq})
        assert error.value.code == CONTEXT_OVERFLOW and error.value.data["field"] == "seq"
        assert error.value.data["pinnedTokens"] > error.value.data["limit"]
        stats = await conn.call("context/stats", {"sessionId": "pins"})
        assert huge_seq not in stats["pinned"]
        assert not check_prompt(await drive.prompt("openai"), 4096)
    finally:
        await conn.close()


# --- goals ----------------------------------------------------------------------------------


async def test_goal_methods_and_markers_shape_the_system_part(daemon):
    conn = await daemon.connect()
    try:
        drive = await session(conn, "goal", window=8192, systemPrompt="You are terse.")
        assert (await conn.call("goal/get", {"sessionId": "goal"}))["goal"] is None
        with pytest.raises(RpcError) as error:
            await conn.call("goal/update", {"sessionId": "goal", "status": "paused"})
        assert error.value.code == INVALID_PARAMS
        got = await conn.call("goal/set", {
            "sessionId": "goal", "description": "Migrate the ledger to Postgres", "priority": "high",
            "checkpoints": [{"description": "schema designed"}, {"description": "data copied"}],
            "decisions": [{"description": "Use logical replication", "locked": True}]})
        assert got["goal"]["description"] == "Migrate the ledger to Postgres" and got["tokens"] > 0
        await conn.call("goal/update", {
            "sessionId": "goal", "checkpoints": [{"description": "schema designed", "status": "completed"}],
            "artifacts": [{"path": "migrations/001_ledger.sql", "action": "created"}],
            "nextSteps": ["copy the data"]})
        # Markers in a pushed assistant message update the goal too.
        await drive.push([{"role": "user", "content": "Go on."}])
        await drive.push([{"role": "assistant", "content": (
            "Copied.\n[CHECKPOINT] data copied - COMPLETED\n[DECISION] Keep the old ledger read-only - LOCKED\n"
            "[ARTIFACT] Created scripts/copy_ledger.py\n[NEXT] switch the writers")}])
        goal = (await conn.call("goal/get", {"sessionId": "goal"}))["goal"]
        assert goal["priority"] == "high"
        assert {c["description"]: c["status"] for c in goal["checkpoints"]} == {
            "schema designed": "completed", "data copied": "completed"}
        assert {d["description"] for d in goal["decisions"] if d["locked"]} == {
            "Use logical replication", "Keep the old ledger read-only"}
        assert {a["path"] for a in goal["artifacts"]} == {"migrations/001_ledger.sql", "scripts/copy_ledger.py"}
        assert goal["nextSteps"] == ["switch the writers"]
        # An explicit update may unlock.
        await conn.call("goal/update", {"sessionId": "goal",
                                        "decisions": [{"description": "Use logical replication", "locked": False}]})
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            system = system_text(prompt)
            assert system.startswith("You are terse."), fmt
            assert "Goal: Migrate the ledger to Postgres (priority high" in system
            assert "[locked] Keep the old ledger read-only" in system
            assert "[locked] Use logical replication" not in system and "- Use logical replication" in system
            assert "scripts/copy_ledger.py" in system and "switch the writers" in system
            assert "Keep the old ledger read-only" not in "".join(user_texts(prompt))
        # The goal survives compressions in the system part.
        for turn in agent_session(seed=8, messages=200, markers=False):
            await drive.push(turn)
        assert drive.runs
        system = system_text(await drive.prompt("anthropic"))
        assert "Goal: Migrate the ledger to Postgres" in system and "[locked] Keep the old ledger read-only" in system
    finally:
        await conn.close()


# --- an output bigger than the prompt -----------------------------------------------------


async def test_a_tool_output_bigger_than_the_prompt_is_sent_as_an_excerpt(daemon):
    """``cat big.log`` in a 4K window: the model gets the head and tail of what it just
    asked for (not a 'cleared' placeholder, not an error); history keeps all of it."""
    conn = await daemon.connect()
    try:
        drive = await session(conn, "biglog", window=4096)
        lines = [f"line {i:05d}: worker {i % 7} handled request {i * 31 % 997}" for i in range(1200)]
        lines[-1] = "line 01199: FATAL disk quota exceeded on /var/lib/app"
        await drive.push([{"role": "user", "content": "Why did the job die? Look at big.log."}])
        await drive.push([{"role": "assistant", "content": "Reading it.",
                           "toolCalls": [{"id": "cat1", "type": "function",
                                          "function": {"name": "bash", "arguments": '{"cmd": "cat big.log"}'}}]}])
        result = await drive.push([{"role": "tool", "toolCallId": "cat1", "content": "\n".join(lines)}])
        assert result["messages"][0]["tokens"] > 4096
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 4096), fmt
            text = json.dumps(prompt["messages"])
            assert "line 00000" in text and "FATAL disk quota exceeded" in text, fmt
            assert "left out by ctxd" in text and "cleared by ctxd" not in text, fmt
            if fmt != "ollama":  # (Ollama's shape has no call ids)
                assert "cat1" in tool_ids_in(prompt), fmt  # the call and its result stay paired
        passes = conn.of("context/compressed")
        assert passes and "clip" in passes[-1]["layers"]
        history = await conn.call("session/history", {"sessionId": "biglog"})
        assert history["messages"][-1]["message"]["content"] == "\n".join(lines)
    finally:
        await conn.close()
