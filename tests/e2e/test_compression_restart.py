"""A daemon SIGKILLed mid-session, after compressions, comes back with the same
active context: the prompt in every format is identical (checkpoints, watermark,
pins and goal restored), and compression carries on from where it was."""

from __future__ import annotations

import pytest

from tests.e2e.compression_helpers import (
    FORMATS,
    CtxdProc,
    Driver,
    agent_session,
    check_prompt,
    remove_root,
    short_root,
    system_text,
)

# Every test here runs on SQLite and on PostgreSQL (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("storage_backend")

WINDOW = 4096


async def snapshot(drive: Driver) -> dict:
    conn, sid = drive.conn, drive.session_id
    stats = await conn.call("context/stats", {"sessionId": sid})
    return {
        "prompts": {fmt: await drive.prompt(fmt) for fmt in FORMATS},
        "checkpoints": await conn.call("context/checkpoints", {"sessionId": sid}),
        "goal": await conn.call("goal/get", {"sessionId": sid}),
        "stats": {k: stats[k] for k in ("messageCount", "tokenCount", "contextTokens", "budget", "compressionCount",
                                        "checkpointCount", "checkpointTokens", "watermarkSeq", "prunedThroughSeq",
                                        "pinned")},
        "info": {k: v for k, v in (await conn.call("session/get", {"sessionId": sid})).items() if k != "lastActivity"},
    }


@pytest.mark.parametrize("extras", [
    pytest.param(False, id="checkpoints"),
    pytest.param(True, id="watermark-pins-goal"),
])
async def test_sigkill_after_compressions_then_same_prompt_and_compression_goes_on(extras):
    root = short_root()
    daemon = CtxdProc(root, process=True).start()  # SIGKILLed below
    try:
        conn = await daemon.connect()
        await conn.call("session/create", {"sessionId": "s", "model": "llama3.1:70b", "contextWindow": WINDOW,
                                           "systemPrompt": "You are an agent."})
        await conn.call("session/subscribe", {"sessionId": "s"})
        drive = Driver(conn, "s")
        turns = agent_session(seed=77, messages=700, markers=extras, checkpoint_calls=(150,) if extras else ())
        pinned_seq = None
        done = 0
        for turn in turns:
            result = await drive.push(turn)
            done += 1
            if extras and pinned_seq is None and turn.messages[0]["role"] == "assistant":
                pinned_seq = result["messages"][0]["seq"]
                await conn.call("message/pin", {"sessionId": "s", "seq": pinned_seq})
            made = [r for r in drive.runs if {"summarize", "truncate", "fold"} & set(r.note["layers"])]
            if len(made) >= 3 and (not extras or done > 200):
                break
        if extras:
            await conn.call("goal/update", {"sessionId": "s", "nextSteps": ["ship it"],
                                            "decisions": [{"description": "Never restart prod on Fridays",
                                                           "locked": True}]})
        before = await snapshot(drive)
        stats = before["stats"]
        assert stats["compressionCount"] >= 3 and before["checkpoints"]["checkpoints"]
        if extras:
            assert stats["watermarkSeq"] > 0 and stats["pinned"] == [pinned_seq]
            assert "Never restart prod on Fridays" in system_text(before["prompts"]["anthropic"])
        daemon.kill()
        await conn.drop()

        daemon.start()
        conn = await daemon.connect()
        await conn.call("session/subscribe", {"sessionId": "s"})
        drive.conn = conn
        after = await snapshot(drive)
        for fmt in FORMATS:
            assert after["prompts"][fmt] == before["prompts"][fmt], fmt
        assert after == before
        await drive.expand_all()

        # Compression carries on: the next automatic passes continue the numbering.
        number = stats["compressionCount"]
        runs = len(drive.runs)
        for turn in turns[done:]:
            await drive.push(turn)
            if len([r for r in drive.runs[runs:] if "summarize" in r.note["layers"]]) >= 1:
                break
        new = [r.note for r in drive.runs[runs:] if "summarize" in r.note["layers"]]
        assert new and new[0]["compressionNumber"] == number + 1
        for fmt in FORMATS:
            assert not check_prompt(await drive.prompt(fmt), WINDOW)
        info = await conn.call("session/get", {"sessionId": "s"})
        assert info["messageCount"] == len(drive.pushed)
        if extras:
            final = await conn.call("context/stats", {"sessionId": "s"})
            assert final["pinned"] == [pinned_seq] and final["watermarkSeq"] == stats["watermarkSeq"]
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)
