"""Overflow and the notifications around compression, end to end.

* A long human chat (long user messages, which are never summarized away) in a 2048
  window: ``context/overflow`` with the figures, then (policy ``fold``) a folded
  checkpoint keeping the user's words, and a prompt that fits, every time; with
  ``overflow_policy=error`` ``context/prompt`` refuses with the figures instead.
* ``context/reliability`` as the level falls, ``context/threshold`` warning/critical,
  ``checkpoint/created|aged|merged``, ``context/compressionSkipped`` (loop guard).
"""

from __future__ import annotations

import math
import random
import re

import pytest

from ctxd.client import RpcError
from ctxd.tokens import PROMPT_PRIMING
from tests.e2e.compression_helpers import (
    FORMATS,
    Conn,
    CtxdProc,
    Driver,
    Turn,
    _prose,
    agent_session,
    check_prompt,
    checkpoint_text,
    long_chat,
    remove_root,
    seqs_of,
    short_root,
    user_texts,
)

pytestmark = pytest.mark.usefixtures("storage_backend")

CONTEXT_OVERFLOW = -33010
LEVELS = ["ultra", "compact", "moderate", "detailed"]


async def chat_session(conn: Conn, session_id: str, window: int = 2048, **extra) -> Driver:
    await conn.call("session/create", {"sessionId": session_id, "contextWindow": window, **extra})
    await conn.call("session/subscribe", {"sessionId": session_id})
    return Driver(conn, session_id)


def folded_of(checkpoints: list[dict]) -> dict | None:
    return next((c for c in checkpoints if c["kind"] == "folded"), None)


async def test_long_chat_folds_the_users_words_to_fit():
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "chat")
        said: dict[int, str] = {}  # seq -> the user's words
        for index, turn in enumerate(long_chat(seed=17, messages=120)):
            result = await drive.push(turn)
            if turn.instruction:
                said[result["messages"][0]["seq"]] = turn.instruction
            active = (await conn.call("context/checkpoints", {"sessionId": "chat"}))["checkpoints"]
            folded = folded_of(active)
            # Never more than the summaries, one folded and one truncation notice.
            assert len(active) <= 4 + 2, [(c["kind"], c["seqFrom"], c["seqTo"]) for c in active]
            for fmt in FORMATS:
                prompt = await drive.prompt(fmt)  # never refused under the fold policy
                assert not check_prompt(prompt, 2048), (index, fmt)
                users, system = user_texts(prompt), checkpoint_text(prompt)
                for seq, words in said.items():
                    if any(words in u for u in users):
                        continue
                    # Folded: the words are in the folded checkpoint, or (past its
                    # allowance) counted there as folded out; whole in history either way.
                    assert folded is not None and seq in seqs_of(folded), (index, fmt, seq)
                    assert words in system or "folded out of the prompt" in system, (index, fmt, seq)

        overflows = conn.of("context/overflow")
        assert overflows, "the chat never overflowed: make the user messages longer"
        for note in overflows:
            assert note["policy"] == "fold" and "fold" in note["action"]
            assert note["maxPromptTokens"] == drive.last_result["budget"]["maxPromptTokens"]
            # Every fold is announced: past the user's share (the prompt may still fit), or
            # because the prompt does not fit; naming the messages and how to get them back.
            assert note["reason"] in ("user_share", "prompt"), note
            if note["reason"] == "prompt":
                assert note["promptTokens"] > note["maxPromptTokens"], note
            if note["foldedMessages"]:
                assert note["foldedSeqs"] and note["checkpointId"], note
                assert f"checkpoint/expand {note['checkpointId']}" in note["action"], note
            assert note["userTokens"] > 0 and note["systemTokens"] >= 0 and note["checkpointTokens"] >= 0
            parts = sum(note.get(k, 0) for k in ("systemTokens", "pinnedTokens", "checkpointTokens",
                                                  "userTokens", "recentTokens"))
            assert 0 <= note["promptTokens"] - parts <= PROMPT_PRIMING, note
        assert any("fold" in r.note["layers"] for r in drive.runs)
        folds = [n["checkpoint"] for n in conn.of("checkpoint/created") if n["checkpoint"]["kind"] == "folded"]
        assert folds and len({c["id"] for c in folds}) == 1  # one folded checkpoint, grown in place
        folded = folds[-1]
        assert folded["summarizer"] == "fold"
        # Verbatim, whole or (the session's first message, the task, when it is bigger than
        # half the folded allowance) as a head-and-tail excerpt.
        kept_words = [w for s, w in said.items() if s in seqs_of(folded) and w[:80] in folded["summary"]]
        assert kept_words, "the folded checkpoint kept none of the user's words verbatim"
        # The loop guard held back passes that would not have freed enough, once per wait.
        skipped = conn.of("context/compressionSkipped")
        assert skipped and all("no compaction loops" in s["reason"] or s["reason"].startswith("nothing could be")
                               for s in skipped)
        assert all(s["used"] > s["triggerAt"] for s in skipped)
        # History: every message whole, the folded ones included.
        info = await conn.call("session/get", {"sessionId": "chat"})
        assert info["messageCount"] == len(drive.pushed)
        expanded = await drive.check_expand(folded["id"])
        assert {m["seq"] for m in expanded["messages"]} == set(seqs_of(folded))
        await drive.expand_all()
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


def user_heavy_chat(seed: int, turns: int) -> list[Turn]:
    """Short user messages, long answers: the user's words pile up verbatim before the
    boundary until summarizing the answers alone can no longer get under the trigger."""
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        out.append(Turn([{"role": "user", "content": f"[Q{i:03d}] " + _prose(rng, rng.randint(30, 40))}]))
        out.append(Turn([{"role": "assistant", "content": _prose(rng, rng.randint(110, 130))}]))
    return out


async def test_user_heavy_chat_does_not_compress_every_turn():
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "heavy", window=8192, model="llama3.2:3b")
        for turn in user_heavy_chat(seed=5, turns=300):
            await drive.push(turn)
        runs = drive.runs
        assert len(runs) >= 3, "the chat never needed compressing: make it longer"
        assert any("fold" in r.note["layers"] for r in runs)  # folded before it ever overflowed
        # Every fold said so (past the user's share), none because the prompt did not fit.
        notes = conn.of("context/overflow")
        assert notes and all(n["reason"] == "user_share" and n["foldedSeqs"] for n in notes)
        assert len(notes) == sum(r.note["layers"].count("fold") for r in runs)  # one per fold
        # The loop guard holds on every pass, the ones the user's words force
        # included: each pass waits for a tenth of the available budget of new conversation.
        for prev, nxt in zip(runs, runs[1:]):
            grew = nxt.used_before - prev.used_after
            assert grew >= math.ceil(0.10 * nxt.available), (prev.push, nxt.push, grew, nxt.available)
        # About one pass per 3 turns, not one per turn. (The user's words stay verbatim up to
        # half the largest prompt, so between two folds a pass can only summarize answers;
        # a pass stops at 70% of available, not 50%, so that the window is used; and older
        # checkpoints keep their detail until they pass their share. 102 passes today.)
        assert len(runs) <= 600 // 5, len(runs)
        for fmt in FORMATS:
            assert not check_prompt(await drive.prompt(fmt), 8192)
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_a_session_of_user_messages_only_still_gets_a_prompt():
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "notes", window=8192)
        rng = random.Random(3)
        for start in range(0, 1500, 50):
            await drive.push([{"role": "user", "content": f"[N{i:04d}] " + _prose(rng, 12)}
                              for i in range(start, start + 50)])
        for fmt in FORMATS:
            prompt = await drive.prompt(fmt)
            assert not check_prompt(prompt, 8192)
            assert "[N1499]" in " ".join(user_texts(prompt))  # the newest words, verbatim
        active = (await conn.call("context/checkpoints", {"sessionId": "notes"}))["checkpoints"]
        folded = folded_of(active)
        assert folded is not None
        # Everything not in the prompt is counted in the folded notice, none silently dropped.
        system = checkpoint_text(await drive.prompt("openai"))
        shown = len(re.findall(r"^\[message \d+\]", system, re.M))
        notice = re.search(r"\[User messages quoted exactly below: (\d+)(?:; (\d+) more \([^)]*\) are folded out)?",
                           system)
        assert notice is not None and int(notice.group(1)) == shown  # it says what it keeps
        assert shown + int(notice.group(2) or 0) == len(seqs_of(folded))  # and what it cut
        info = await conn.call("session/get", {"sessionId": "notes"})
        assert info["messageCount"] == 1500
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_every_automatic_pass_shrinks_the_prompt():
    root = short_root()
    daemon = CtxdProc(root).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "chat")
        for turn in long_chat(seed=1, messages=40):
            await drive.push(turn)
        passes = [r.note for r in drive.runs]
        assert len(passes) >= 3
        grew = [(p["layers"], p["beforeTokens"], p["afterTokens"]) for p in passes
                if p["afterTokens"] >= p["beforeTokens"]]
        assert not grew, grew
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_overflow_policy_error_refuses_with_the_figures():
    root = short_root()
    daemon = CtxdProc(root, sets=["compression.overflow_policy=error"]).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "strict")
        refused = None
        for turn in long_chat(seed=23, messages=80):
            await drive.push(turn)
            try:
                prompt = await drive.prompt("openai")
            except RpcError as exc:
                refused = exc
                break
            assert not check_prompt(prompt, 2048)
        assert refused is not None, "the chat never overflowed"
        assert refused.code == CONTEXT_OVERFLOW and "overflow policy is 'error'" in refused.message
        data = refused.data
        assert data["promptTokens"] > data["maxPromptTokens"] and data["contextWindow"] == 2048
        assert {"systemTokens", "pinnedTokens", "checkpointTokens", "used"} <= set(data)
        for fmt in ("anthropic", "ollama"):
            with pytest.raises(RpcError) as error:
                await drive.prompt(fmt)
            assert error.value.code == CONTEXT_OVERFLOW
        [note, *_] = conn.of("context/overflow")
        assert note["policy"] == "error" and "ContextOverflow" in note["action"]
        assert note["promptTokens"] > note["maxPromptTokens"] and note["userTokens"] > 0
        assert not [n for n in conn.of("checkpoint/created") if n["checkpoint"]["kind"] == "folded"]
        info = await conn.call("session/get", {"sessionId": "strict"})
        assert info["messageCount"] == len(drive.pushed)

        # A session's own overflowPolicy wins over the daemon's.
        other = await daemon.connect()
        lenient = await chat_session(other, "lenient", settings={"overflowPolicy": "fold"})
        for turn in long_chat(seed=23, messages=80):
            await lenient.push(turn)
            assert not check_prompt(await lenient.prompt("openai"), 2048)
        assert [n["policy"] for n in other.of("context/overflow")] and \
            {n["policy"] for n in other.of("context/overflow")} == {"fold"}
        await other.close()
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_reliability_thresholds_and_checkpoint_lifecycle():
    root = short_root()
    # Deeper, earlier passes than the defaults and a smaller share for the summaries (with
    # the defaults this session never ages one): the lifecycle is checked here, not the schedule.
    daemon = CtxdProc(root, sets=["budget.trigger_fraction=0.97", "compression.low_water_fraction=0.82",
                                  "compression.checkpoint_share=0.1"]).start()
    try:
        conn = await daemon.connect()
        drive = await chat_session(conn, "agent", window=4096, model="llama3.1:70b")
        first = await drive.prompt("openai")
        assert first["reliability"]["level"] == "high" and first["reliability"]["modelFactor"] == 0.95
        await drive.push_until(agent_session(seed=31, messages=900, markers=False),
                               lambda d: len(conn.of("checkpoint/merged")) >= 2
                               and any(n["reliability"]["level"] == "critical" for n in conn.of("context/reliability")))

        # Reliability: one notification per level change. It falls with each compression
        # (15% each) and with how full the prompt is (context confidence), so it may
        # come back up a level after a pass; never below where compressions alone put it.
        notes = conn.of("context/reliability")
        levels = [n["reliability"]["level"] for n in notes]
        assert levels[0] == "medium" and notes[0]["previousLevel"] == "high"
        assert "critical" in levels
        # Back to high only while no checkpoint was made (a pass that only pruned restores
        # the context's confidence, and pruning is not a compression).
        assert all(n["reliability"]["compressionPenalty"] == 1.0 for n in notes[1:]
                   if n["reliability"]["level"] == "high")
        for a, b in zip(notes, notes[1:]):
            assert b["previousLevel"] == a["reliability"]["level"] != b["reliability"]["level"]
        for n in notes:
            r = n["reliability"]
            assert (r["recommendations"] or r["level"] == "high") and r["modelSizeBillions"] == 70.0
            assert r["score"] == pytest.approx(r["modelFactor"] * r["compressionPenalty"] * r["contextConfidence"],
                                               abs=1e-3)
        critical = next(n["reliability"] for n in notes if n["reliability"]["level"] == "critical")
        assert critical["score"] < 0.40 and any("new conversation" in s for s in critical["recommendations"])
        last = await drive.prompt("openai")
        assert last["reliability"]["level"] == levels[-1]

        # Thresholds: a warning past the trigger, critical near the largest prompt.
        thresholds = conn.of("context/threshold")
        assert {t["level"] for t in thresholds} == {"warning", "critical"}
        for t in thresholds:
            if t["level"] == "warning":
                assert t["used"] > t["triggerAt"]
            else:
                assert t["promptTokens"] >= 0.95 * t["maxPromptTokens"]

        # Checkpoints: created, aged one level at a time (smaller each time), merged.
        created = {n["checkpoint"]["id"]: n["checkpoint"] for n in conn.of("checkpoint/created")}
        aged = conn.of("checkpoint/aged")
        assert aged
        for a in aged:
            assert a["checkpointId"] in created
            assert LEVELS.index(a["toLevel"]) == LEVELS.index(a["fromLevel"]) - 1
            assert a["afterTokens"] < a["beforeTokens"]
        known = set(created)
        for m in conn.of("checkpoint/merged"):
            assert len(m["mergedIds"]) == 2 and set(m["mergedIds"]) <= known
            known.add(m["intoId"])
        active = (await conn.call("context/checkpoints", {"sessionId": "agent"}))["checkpoints"]
        assert len([c for c in active if c["kind"] == "summary"]) <= 4
        assert any(c["level"] == "ultra" and c["mergedFrom"] for c in active)
        for cp in active:
            await drive.check_expand(cp["id"])
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)
