"""The 1,000-message agent session against an 8K window, end to end.

A real daemon (default configuration: extractive summarizer, ``fold`` overflow policy)
is fed a synthetic coding-agent session one push at a time; after every push the
prompt is fetched in all three provider formats and checked: it fits the budget and
the window (also by an independent tiktoken recount), every provider would accept it,
every user instruction is there verbatim as a user message, the goal block and every
locked decision are in the system part. Compressions must keep happening, each one
only after the conversation grew by ``min_growth_fraction`` of the available budget
since the last, and history must stay complete: every compressed message can be read
back byte-equal through ``checkpoint/expand``.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.compression_helpers import (
    FORMATS,
    GOAL,
    CtxdProc,
    Driver,
    agent_session,
    check_prompt,
    remove_root,
    short_root,
    system_text,
    tool_ids_in,
    user_texts,
)

# Every test here runs on SQLite and on PostgreSQL (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("storage_backend")

WINDOW = 8192
MIN_GROWTH = 0.10  # compression.min_growth_fraction's default


async def test_thousand_message_agent_session_in_8k_window():
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        info = await conn.call("session/create", {
            "sessionId": "agent", "model": "llama3.1:70b", "contextWindow": WINDOW,
            "systemPrompt": "You are a careful coding agent. Use the tools; report what you changed."})
        assert info["contextWindow"] == WINDOW
        await conn.call("session/subscribe", {"sessionId": "agent"})
        drive = Driver(conn, "agent", min_growth=MIN_GROWTH)

        turns = agent_session(seed=20241121)
        assert 990 <= sum(len(t.messages) for t in turns) <= 1010
        instructions: list[str] = []
        decisions: list[str] = []
        checkpoint_calls: dict[str, int] = {}
        for index, turn in enumerate(turns):
            mark = conn.mark()
            result = await drive.push(turn)
            instructions += [turn.instruction] if turn.instruction else []
            decisions += [turn.decision] if turn.decision else []
            if turn.checkpoint_call:
                checkpoint_calls[turn.checkpoint_call] = result["messages"][0]["seq"]
            prompts = {fmt: await drive.prompt(fmt) for fmt in FORMATS}
            assert not drive.unexpected(mark), f"an automatic compression no push predicted, after push {index}"
            assert not conn.of("context/overflow"), conn.of("context/overflow")
            for fmt, prompt in prompts.items():
                problems = check_prompt(prompt, WINDOW)
                assert not problems, f"push {index}: {problems}"
                assert prompt["lastSeq"] == result["messages"][-1]["seq"]
                users = user_texts(prompt)
                missing = [t for t in instructions if not any(t in u for u in users)]
                assert not missing, f"push {index} {fmt}: user words missing from the prompt: {missing[:3]}"
                system = system_text(prompt)
                assert index < 3 or f"Goal: {GOAL}" in system, f"push {index} {fmt}: no goal block"
                lost = [d for d in decisions if f"[locked] {d}" not in system]
                assert not lost, f"push {index} {fmt}: locked decisions missing from the system part: {lost}"

        # Compressions kept happening all along, each after enough growth.
        runs = drive.runs
        assert len(runs) >= 20, len(runs)
        assert runs[-1].push > len(turns) * 0.9, "compression stopped happening"
        for before, after in zip(runs, runs[1:]):
            needed = math.ceil(MIN_GROWTH * after.available)
            assert not after.fits or after.used_before - before.used_after >= needed, (before, after)
        assert not [p for p in conn.of("context/compressed") if p.get("trigger") == "prompt"], \
            "context/prompt had to compress: an automatic pass left a prompt that does not fit"
        assert len(conn.of("checkpoint/created")) >= 10
        assert conn.of("checkpoint/aged") and conn.of("checkpoint/merged")
        assert len(decisions) >= 3 and len(checkpoint_calls) == 2

        # compress_to_checkpoint moved the watermark: tool blocks before it are gone.
        watermarks = [p for p in conn.of("context/compressed") if p["layers"] == ["watermark"]]
        assert len(watermarks) == len(checkpoint_calls)
        stats = await conn.call("context/stats", {"sessionId": "agent"})
        assert stats["watermarkSeq"] == max(checkpoint_calls.values())
        final = await drive.prompt("openai")
        calls_before_mark = {c["id"] for s, m in drive.pushed.items() if s < stats["watermarkSeq"]
                             for c in m.get("toolCalls") or ()}
        assert not calls_before_mark & tool_ids_in(final)

        # History is complete and intact.
        info = await conn.call("session/get", {"sessionId": "agent"})
        assert info["messageCount"] == len(drive.pushed) == info["lastSeq"]
        # compressionCount counts passes that made a checkpoint (pruning alone is not one).
        summarizing = [p for p in conn.of("context/compressed") if {"summarize", "truncate", "fold"} & set(p["layers"])]
        assert info["compressionCount"] == stats["compressionCount"] == len(summarizing)
        assert [p["compressionNumber"] for p in summarizing] == list(range(1, len(summarizing) + 1))
        expansions = await drive.expand_all()
        assert 1 <= len(expansions) <= 5
        covered = {m["seq"] for e in expansions for m in e["messages"]}
        boundary = max(e["checkpoint"]["seqTo"] for e in expansions)
        assert covered == set(range(1, boundary + 1)), "some compressed messages are in no checkpoint"
        # Checkpoints merged away since still expand to their originals.
        for note in conn.of("checkpoint/created")[:3]:
            await drive.check_expand(note["checkpoint"]["id"])
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)
