"""Snapshots over the protocol, against a real daemon.

* The automatic snapshot: with the default ``snapshots.auto_threshold`` and a small
  window, the first ``context/compressed`` is preceded by a ``snapshot/created``
  (trigger auto), and restoring that snapshot gives back the context as it was before
  compression: no checkpoints, the very prompt a never-compressed twin session sends.
  With ``snapshots.before_compression`` every compression pass is preceded by a
  snapshot of the state it started from; without it, passes are not.
* Restore, continue, restore again: the prompt after a restore is the snapshot's, new
  messages join it and the rolled-back ones stay out, history keeps everything (the
  rolled-back messages marked), and restoring the backup snapshot the restore took
  undoes the restore.
* Consistency under concurrent pushes: snapshots taken from a second connection while
  the first pushes batches of 50 never see half a batch, and what ``snapshot/get``
  returns agrees with history at the snapshot's ``lastSeq``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.compression_helpers import CtxdProc, Driver, is_auto_pass, remove_root, short_root
from tests.e2e.history_helpers import (
    canonical,
    chat_turns,
    flatten,
    full_history,
    prompt_text,
    prompts,
    push,
    rpc_error,
    running,
)

# Every test here runs on SQLite and on PostgreSQL (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("storage_backend")

WINDOW = 2048
SYSTEM = "You are a terse coding agent."


def first_index(notes: list[tuple[str, Any]], pred: Any) -> int:
    return next(i for i, (m, p) in enumerate(notes) if pred(m, p))


async def test_auto_snapshot_precedes_the_first_compression_and_restores_the_uncompressed_context():
    async with running() as d:
        conn = await d.connect("*")
        for sid, settings in (("s", {}), ("twin", {"autoCompress": False})):
            await conn.call("session/create", {"sessionId": sid, "contextWindow": WINDOW, "systemPrompt": SYSTEM,
                                               "settings": settings})
        drive = Driver(conn, "s")
        twin_prompts: dict[int, dict[str, Any]] = {}
        for turn in chat_turns(11, 200):
            result = await drive.push(turn.messages)
            twin = await push(conn, "twin", turn.messages)
            assert twin["messages"][-1]["seq"] == result["messages"][-1]["seq"]
            twin_prompts[twin["messages"][-1]["seq"]] = await prompts(conn, "twin")
            if drive.runs:
                break
        else:
            raise AssertionError("no compression happened")

        notes = [(m, p) for m, p in conn.notes if p.get("sessionId") == "s"]
        compressed_at = first_index(notes, lambda m, p: m == "context/compressed")
        assert is_auto_pass(notes[compressed_at][1])
        created = [(i, p["snapshot"]) for i, (m, p) in enumerate(notes) if m == "snapshot/created"]
        assert created and created[0][0] < compressed_at, [m for m, _ in notes]
        index, snap = created[0]
        assert snap["trigger"] == "auto" and snap["sessionId"] == "s"
        assert snap["checkpointCount"] == 0 and snap["compressionCount"] == 0
        assert snap["lastSeq"] in twin_prompts, "an automatic snapshot in the middle of a push"
        before = twin_prompts[snap["lastSeq"]]
        assert before["openai"]["checkpointCount"] == 0

        # The snapshot's content: everything up to lastSeq, in context, no checkpoints.
        content = await conn.call("snapshot/get", {"sessionId": "s", "snapshotId": snap["snapshotId"]})
        assert content["checkpoints"] == []
        seqs = sorted(m["seq"] for m in content["userMessages"] + content["messages"])
        assert seqs == list(range(1, snap["lastSeq"] + 1))
        assert all(m["inContext"] for m in content["userMessages"])

        compressed_prompt = await prompts(conn, "s")
        assert compressed_prompt["openai"]["messages"] != before["openai"]["messages"]
        mark = conn.mark()
        restored = await conn.call("snapshot/restore", {"sessionId": "s", "snapshotId": snap["snapshotId"]})
        assert restored["snapshotId"] == snap["snapshotId"]
        note = (await conn.wait_note(lambda m, p: m == "snapshot/restored", since=mark))[1]
        assert note["backupSnapshotId"] == restored["backupSnapshotId"]
        after = await prompts(conn, "s")
        assert after == before, "the restored context is not the pre-compression one"
        stats = await conn.call("context/stats", {"sessionId": "s"})
        assert stats["checkpointCount"] == 0 and stats["checkpointTokens"] == 0


async def _passes_and_snapshots(conn: Any, session_id: str, passes: int, seed: int) -> tuple[list[int], list[Any]]:
    """Push until ``passes`` automatic compressions; for each, history's last seq when it
    ran, and the notifications."""
    ends: list[int] = []
    pass_ends: list[int] = []
    drive = Driver(conn, session_id)
    for turn in chat_turns(seed, 400):
        result = await drive.push(turn.messages)
        ends.append(result["messages"][-1]["seq"])
        while len(pass_ends) < len(drive.runs):
            pass_ends.append(ends[drive.runs[len(pass_ends)].push])
        if len(drive.runs) >= passes:
            return pass_ends, [(m, p) for m, p in conn.notes if p.get("sessionId") == session_id]
    raise AssertionError(f"only {len(drive.runs)} compressions")


async def test_before_compression_every_pass_starts_from_a_snapshot():
    async with running("snapshots.keep=50") as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s", "contextWindow": WINDOW, "systemPrompt": SYSTEM})
        pass_ends, notes = await _passes_and_snapshots(conn, "s", 6, seed=5)
        passes = [i for i, (m, p) in enumerate(notes) if m == "context/compressed" and is_auto_pass(p)]
        assert len(passes) >= 6
        for n, (at, last_seq) in enumerate(zip(passes, pass_ends)):
            since = passes[n - 1] if n else 0
            before = [p["snapshot"] for m, p in notes[since:at] if m == "snapshot/created"]
            assert before, f"compression {n + 1} (history at {last_seq}) without a snapshot before it"
            snap = before[-1]
            assert snap["trigger"] == "auto" and snap["lastSeq"] == last_seq
            previous = notes[passes[n - 1]][1]["compressionNumber"] if n else 0
            assert snap["compressionCount"] == previous, "the snapshot is not of the state the pass started from"
        listed = (await conn.call("snapshot/list", {"sessionId": "s"}))["snapshots"]
        assert len([s for s in listed if s["trigger"] == "auto"]) >= 6
        assert [s["createdAt"] for s in listed] == sorted((s["createdAt"] for s in listed), reverse=True)


async def test_a_pass_that_changes_nothing_takes_no_snapshot():
    """Snapshots are restore points: a compression that finds nothing to compress, or a
    context that a snapshot (a manual one included) already holds, adds none."""
    async with running() as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s", "contextWindow": WINDOW})
        await push(conn, "s", [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
        manual = await conn.call("snapshot/create", {"sessionId": "s", "label": "mine"})
        result = await conn.call("context/compress", {"sessionId": "s"})
        assert not result["compressed"]
        listed = (await conn.call("snapshot/list", {"sessionId": "s"}))["snapshots"]
        assert [s["snapshotId"] for s in listed] == [manual["snapshotId"]]


async def test_a_restart_does_not_make_an_unchanged_context_look_new():
    """Loading a session's context after a restart changes nothing: the first
    compression then needs no restore point of its own when a snapshot holds it."""
    root = short_root()
    try:
        first = CtxdProc(root).start()
        conn = await first.connect()
        await conn.call("session/create", {"sessionId": "s", "contextWindow": 32768})
        await push(conn, "s", [m for t in chat_turns(3, 30) for m in t.messages])
        manual = await conn.call("snapshot/create", {"sessionId": "s", "label": "mine"})
        await conn.close()
        first.stop()
        again = CtxdProc(root).start()
        conn = await again.connect()
        result = await conn.call("context/compress", {"sessionId": "s"})
        assert result["compressed"]
        listed = (await conn.call("snapshot/list", {"sessionId": "s"}))["snapshots"]
        assert [s["snapshotId"] for s in listed] == [manual["snapshotId"]]
        await conn.close()
        again.stop()
    finally:
        remove_root(root)


async def test_without_before_compression_passes_take_no_snapshot_of_their_own():
    async with running("snapshots.before_compression=false", "snapshots.keep=50") as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s", "contextWindow": WINDOW, "systemPrompt": SYSTEM})
        pass_ends, notes = await _passes_and_snapshots(conn, "s", 4, seed=5)
        created = [p["snapshot"] for m, p in notes if m == "snapshot/created"]
        # Only the threshold snapshots (prompt at 85% of the largest prompt) remain: at most one
        # per rise, so no more than passes (the trigger, 90% of available, is near that mark).
        assert len(created) <= len(pass_ends)
        largest = (await conn.call("context/stats", {"sessionId": "s"}))["budget"]["maxPromptTokens"]
        assert all(s["contextTokens"] >= int(0.85 * largest) for s in created), created


async def test_auto_snapshot_at_the_threshold_when_one_push_jumps_past_it():
    async with running() as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s", "contextWindow": WINDOW})
        await push(conn, "s", [{"role": "user", "content": "short question"}])
        assert not conn.of("snapshot/created")
        # Well past 85% of the usable window in one push, in messages compression can take.
        batch = flatten(chat_turns(3, 40, tools=False, sizes=(40, 50)))
        mark = conn.mark()
        result = await push(conn, "s", batch)
        assert result["budget"]["promptTokens"] >= 0.85 * result["budget"]["usable"]
        note = (await conn.wait_note(lambda m, p: m == "snapshot/created", since=mark))[1]["snapshot"]
        assert note["trigger"] == "auto" and note["lastSeq"] == result["messages"][-1]["seq"] == 1 + len(batch)
        assert note["contextTokens"] == result["contextTokens"]
        await conn.wait_note(lambda m, p: m == "context/compressed", since=mark)
        methods = [m for m, _ in conn.notes[mark:]]
        assert methods.index("snapshot/created") < methods.index("context/compressed")
        created = [p for p in conn.of("snapshot/created", mark)]
        # One snapshot for this rise: the compression right after it had nothing new to save.
        assert len(created) == 1, created


async def test_restore_continue_restore_again():
    async with running() as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s", "contextWindow": WINDOW, "systemPrompt": SYSTEM})
        turns = chat_turns(21, 400)
        drive = Driver(conn, "s")
        await conn.call("goal/set", {"sessionId": "s", "description": "Fix the flaky importer",
                                     "decisions": [{"description": "Keep the CSV dialect", "locked": True}]})
        for turn in turns[:8]:
            await drive.push(turn.messages)
        assert not drive.runs
        snap_a = await conn.call("snapshot/create", {"sessionId": "s", "label": "A"})
        goal_a = (await conn.call("goal/get", {"sessionId": "s"}))["goal"]
        a_seq = snap_a["lastSeq"]
        assert snap_a["trigger"] == "manual" and snap_a["label"] == "A" and a_seq == len(drive.pushed)
        prompt_a = await prompts(conn, "s")
        history_a = await full_history(conn, "s")

        # A new goal, and more messages, with compressions.
        await conn.call("goal/set", {"sessionId": "s", "description": "Rewrite the exporter instead"})
        n = 8
        while len(drive.runs) < 3:
            await drive.push(turns[n].messages)
            n += 1
        l1 = max(drive.pushed)
        prompt_before = await prompts(conn, "s")
        history_before = await full_history(conn, "s")
        goal_before = (await conn.call("goal/get", {"sessionId": "s"}))["goal"]
        assert goal_before["description"] == "Rewrite the exporter instead"
        assert prompt_before["openai"]["checkpointCount"] > 0
        assert history_before["messageCount"] == l1

        # Restore A.
        mark = conn.mark()
        first = await conn.call("snapshot/restore", {"sessionId": "s", "snapshotId": snap_a["snapshotId"]})
        assert (first["rolledBackFrom"], first["rolledBackTo"]) == (a_seq + 1, l1)
        backup_id = first["backupSnapshotId"]
        restored_note = (await conn.wait_note(lambda m, p: m == "snapshot/restored", since=mark))[1]
        assert restored_note == {"sessionId": "s", "snapshotId": snap_a["snapshotId"], "backupSnapshotId": backup_id,
                                 "rolledBackFrom": a_seq + 1, "rolledBackTo": l1}
        order = [m for m, p in conn.notes[mark:] if m in ("snapshot/created", "snapshot/restored")]
        assert order[:2] == ["snapshot/created", "snapshot/restored"]
        backup_note = conn.of("snapshot/created", mark)[0]["snapshot"]
        assert backup_note["snapshotId"] == backup_id and backup_note["trigger"] == "restore"
        assert backup_note["lastSeq"] == l1
        await conn.wait_note(lambda m, p: m == "session/updated" and p["reason"] == "restored", since=mark)
        assert first["contextTokens"] == (await conn.call("session/get", {"sessionId": "s"}))["contextTokens"]

        assert await prompts(conn, "s") == prompt_a
        assert (await conn.call("goal/get", {"sessionId": "s"}))["goal"] == goal_a
        content_a = await conn.call("snapshot/get", {"sessionId": "s", "snapshotId": snap_a["snapshotId"]})
        assert content_a["goal"] == goal_a and content_a["checkpoints"] == []
        history = await full_history(conn, "s")
        assert history["messageCount"] == l1 and len(history["messages"]) == l1
        for entry in history["messages"]:
            if entry["seq"] > a_seq:
                assert entry["status"] == "rolled_back", entry["seq"]
            else:
                assert entry["status"] == history_a["messages"][entry["seq"] - 1]["status"]
            assert canonical(entry["message"]) == canonical(drive.pushed[entry["seq"]])
        events = [e for e in history["events"] if e["kind"] == "restore"]
        assert len(events) == 1 and events[0]["detail"]["snapshotId"] == snap_a["snapshotId"]
        assert events[0]["detail"]["backupSnapshotId"] == backup_id and events[0]["lastSeq"] == l1

        # Continue from A.
        rolled_markers = [m for t in turns[8:n] for m in t.markers]
        new_turns = chat_turns(22, 3, tag="new")
        new_messages = flatten(new_turns)
        pushed = await push(conn, "s", new_messages)
        l2 = pushed["messages"][-1]["seq"]
        assert pushed["messages"][0]["seq"] == l1 + 1 and l2 == l1 + len(new_messages)
        now = await prompts(conn, "s")
        assert now["openai"]["messages"][: len(prompt_a["openai"]["messages"])] == prompt_a["openai"]["messages"]
        text = prompt_text(now["openai"])
        for marker in (m for t in new_turns for m in t.markers):
            assert marker in text, f"new message {marker} is not in the prompt"
        for fmt, p in now.items():
            sent_text = prompt_text(p)
            back = [m for m in rolled_markers if m in sent_text]
            assert not back, f"{fmt}: rolled-back messages are sent again: {back[:5]}"
        history = await full_history(conn, "s")
        assert history["messageCount"] == l2
        statuses = {e["seq"]: e["status"] for e in history["messages"]}
        assert all(statuses[s] == "rolled_back" for s in range(a_seq + 1, l1 + 1))
        assert all(statuses[s] == "context" for s in range(l1 + 1, l2 + 1))

        # Restore the backup: the state just before the first restore.
        mark = conn.mark()
        second = await conn.call("snapshot/restore", {"sessionId": "s", "snapshotId": backup_id})
        assert (second["rolledBackFrom"], second["rolledBackTo"]) == (l1 + 1, l2)
        await conn.wait_note(lambda m, p: m == "snapshot/restored" and p["snapshotId"] == backup_id, since=mark)
        assert await prompts(conn, "s") == prompt_before
        assert (await conn.call("goal/get", {"sessionId": "s"}))["goal"] == goal_before
        history = await full_history(conn, "s")
        assert history["messageCount"] == l2 and len(history["messages"]) == l2
        for entry in history["messages"]:
            if entry["seq"] > l1:
                assert entry["status"] == "rolled_back", entry["seq"]
            else:
                assert entry["status"] == history_before["messages"][entry["seq"] - 1]["status"], entry["seq"]
                assert canonical(entry["message"]) == canonical(drive.pushed[entry["seq"]])
        assert [e["detail"]["snapshotId"] for e in history["events"] if e["kind"] == "restore"] == [
            snap_a["snapshotId"], backup_id]
        listed = {s["snapshotId"]: s for s in (await conn.call("snapshot/list", {"sessionId": "s"}))["snapshots"]}
        assert snap_a["snapshotId"] in listed and backup_id in listed
        assert listed[second["backupSnapshotId"]]["trigger"] == "restore"
        counts = [p["messageCount"] for p in conn.of("session/updated") if p["sessionId"] == "s"]
        assert counts == sorted(counts) and counts[-1] == l2, "history shrank at some point"


async def test_snapshot_errors_and_delete():
    async with running() as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "s"})
        await push(conn, "s", [{"role": "user", "content": "hello"}])
        await rpc_error(conn, "snapshot/create", {"sessionId": "nope"}, -33001)
        await rpc_error(conn, "snapshot/list", {"sessionId": "nope"}, -33001)
        for method in ("snapshot/get", "snapshot/restore", "snapshot/delete"):
            err = await rpc_error(conn, method, {"sessionId": "s", "snapshotId": "snap_missing"}, -33020)
            assert "snap_missing" in err.message
        snap = await conn.call("snapshot/create", {"sessionId": "s"})
        mark = conn.mark()
        result = await conn.call("snapshot/delete", {"sessionId": "s", "snapshotId": snap["snapshotId"]})
        assert result["deleted"] == [snap["snapshotId"]]
        note = (await conn.wait_note(lambda m, p: m == "snapshot/deleted", since=mark))[1]
        assert note == {"sessionId": "s", "snapshotIds": [snap["snapshotId"]], "reason": "request"}
        await rpc_error(conn, "snapshot/get", {"sessionId": "s", "snapshotId": snap["snapshotId"]}, -33020)
        # A snapshot belongs to its session.
        await conn.call("session/create", {"sessionId": "other"})
        other = await conn.call("snapshot/create", {"sessionId": "other"})
        await rpc_error(conn, "snapshot/get", {"sessionId": "s", "snapshotId": other["snapshotId"]}, -33020)
        await rpc_error(conn, "snapshot/restore", {"sessionId": "s", "snapshotId": other["snapshotId"]}, -33020)


BATCH = 50


def _users(message: dict[str, Any]) -> bool:
    """The user's own message: not one that only carries Anthropic-style tool results."""
    content = message["content"]
    return message["role"] == "user" and not (isinstance(content, list)
                                              and all(b["type"] == "tool_result" for b in content))


async def test_snapshots_never_see_half_a_batch():
    async with running() as d:
        pusher = await d.connect()
        taker = await d.connect()
        await pusher.call("session/create", {"sessionId": "c", "contextWindow": 8192})
        messages = flatten(chat_turns(31, 1200, tag="c"))
        batches = [messages[i:i + BATCH] for i in range(0, len(messages) - BATCH + 1, BATCH)][:24]
        done = asyncio.Event()

        async def push_all() -> None:
            try:
                for batch in batches:
                    await push(pusher, "c", batch)
            finally:
                done.set()

        snaps: list[dict[str, Any]] = []

        async def snapshot_all() -> None:
            while not done.is_set():  # bursts of requests in flight together, while pushes go on
                snaps.extend(await asyncio.gather(*(taker.call("snapshot/create", {"sessionId": "c"})
                                                    for _ in range(3))))

        await asyncio.gather(push_all(), snapshot_all())
        total = BATCH * len(batches)
        assert len(snaps) >= 3
        seqs = [s["lastSeq"] for s in snaps]
        assert any(0 < s < total for s in seqs), seqs
        for s in seqs:
            assert s % BATCH == 0, f"a snapshot at seq {s}: half a batch"

        history = {e["seq"]: e for e in (await full_history(taker, "c"))["messages"]}
        assert len(history) == total
        for snap in snaps:
            last = snap["lastSeq"]
            assert snap["messageCount"] == last
            assert snap["tokenCount"] == sum(history[q]["tokens"] for q in range(1, last + 1))
            users = [q for q in range(1, last + 1) if _users(history[q]["message"])]
            assert snap["userMessageCount"] == len(users)
            content = await taker.call("snapshot/get", {"sessionId": "c", "snapshotId": snap["snapshotId"]})
            assert content["info"] == snap
            user_seqs = [m["seq"] for m in content["userMessages"]]
            assert user_seqs == users
            for m in content["userMessages"] + content["messages"]:
                assert m["seq"] <= last
                assert m["message"] == history[m["seq"]]["message"]
                assert m["tokens"] == history[m["seq"]]["tokens"]
            assert all(not _users(m["message"]) for m in content["messages"])
            in_context = {m["seq"] for m in content["messages"]} | {
                m["seq"] for m in content["userMessages"] if m["inContext"]}
            if last:
                assert last in in_context, "the newest message is not in the snapshot's context"
            if snap["compressionCount"] == 0:
                assert in_context == set(range(1, last + 1))
