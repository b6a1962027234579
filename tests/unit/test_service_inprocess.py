"""The service layer in process: a Service on a temporary database with a collecting
event sink (``conftest.py``), driven as the handlers drive it. A failure here is the
service's or storage's; the same scenarios over a transport are in ``tests/e2e/``."""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec
import pytest

from ctxd.config import Config
from ctxd.engine.checkpoints import SECTION_HEADER
from ctxd.engine.pipeline import STAGES
from ctxd.protocol.compression import (
    CheckpointCreatedNotification,
    CompressedNotification,
    CompressingNotification,
    ThresholdNotification,
)
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.notifications import SessionDeleted, SessionUpdated
from ctxd.protocol.snapshot import SnapshotCreated, SnapshotRestored
from ctxd.service import controls, ingest, prompt, sessions, snapshots, stats
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents

from .service_helpers import chat, params, settle

SID = "s1"


async def _create(svc: Service, session_id: str = SID, window: int = 4096, **extra: Any) -> None:
    await sessions.create_session(svc, params("session/create", sessionId=session_id, model="gpt-4o",
                                              contextWindow=window, **extra))


async def _push(svc: Service, messages: list[dict[str, Any]], session_id: str = SID) -> Any:
    return await ingest.push(svc, params("session/push", sessionId=session_id, messages=messages))


async def _prompt(svc: Service, session_id: str = SID) -> Any:
    return await prompt.prompt(svc, params("context/prompt", sessionId=session_id, format="openai"))


def _texts(result: Any) -> list[str]:
    return [m["content"] if isinstance(m, dict) else m.content for m in result.messages]


def _sent(text: str, texts: list[str]) -> bool:
    """``text`` is a message of the prompt, or one of the kept user messages sent as one
    (behind the boundary, consecutive ones go out together, a blank line apart)."""
    return any(text == t or text in t.split("\n\n") for t in texts if not t.startswith(SECTION_HEADER))


async def test_a_push_is_stored_counted_and_announced(service: Service, events: CollectingEvents) -> None:
    await _create(service)
    result = await _push(service, chat(0, 2))
    assert [m.seq for m in result.messages] == [1, 2, 3, 4]
    assert result.message_count == 4 and result.token_count == sum(m.tokens for m in result.messages)
    assert [u.reason for u in events.of(SessionUpdated, SID)] == ["push"]
    update = events.of(SessionUpdated, SID)[0]
    assert (update.last_seq, update.message_count, update.pushed) == (4, 4, 2 * 2)
    assert update.token_count == result.token_count and update.context_tokens == result.context_tokens
    # Below the trigger: nothing else happens, nothing runs in the background.
    assert events.methods(SID) == ["session/updated"]
    assert not service.tasks
    info = await sessions.get_session(service, SID)
    assert (info.message_count, info.token_count) == (4, result.token_count)


async def test_the_prompt_is_every_message_verbatim_while_it_fits(service: Service) -> None:
    await _create(service)
    pushed = chat(0, 3)
    await _push(service, pushed)
    result = await _prompt(service)
    assert _texts(result) == [m["content"] for m in pushed]
    assert result.last_seq == 6 and result.tokens <= result.budget.max_prompt_tokens
    assert result.compression_count == 0 and result.checkpoint_count == 0


async def test_over_the_trigger_a_push_starts_a_pass_announced_stage_by_stage(
        service: Service, events: CollectingEvents) -> None:
    await _create(service)
    first = await _push(service, chat(0, 12, answer_words=60))
    assert first.budget.used > first.budget.trigger_at  # the push passed the trigger
    await settle(service)

    methods = events.methods(SID)
    assert events.of(SessionUpdated, SID)[0].reason == "push"
    threshold = events.of(ThresholdNotification, SID)[0]  # passing the trigger is announced with the figures
    assert threshold.level in ("warning", "critical") and threshold.used == first.budget.used
    stages = [c.stage for c in events.of(CompressingNotification, SID)]
    assert stages[0] == "identification"
    assert [STAGES[s] for s in stages] == sorted(STAGES[s] for s in stages)  # in the six stages' order
    assert methods.index("snapshot/created") < methods.index("checkpoint/created")  # the restore point first
    (done,) = events.of(CompressedNotification, SID)
    (created,) = events.of(CheckpointCreatedNotification, SID)
    assert done.trigger == "auto" and done.checkpoint_ids == [created.checkpoint.id]
    assert done.after_tokens < done.before_tokens
    assert events.of(SessionUpdated, SID)[-1].reason == "compressed"

    # The user's words stay verbatim in the prompt; the checkpoint is a message after them.
    result = await _prompt(service)
    texts = _texts(result)
    assert result.checkpoint_count == 1 and result.tokens <= result.budget.max_prompt_tokens
    note = next(i for i, t in enumerate(texts) if t.startswith(SECTION_HEADER))
    assert created.checkpoint.summary[:40] in texts[note] and result.messages[note].role == "user"
    assert texts[note - 1].startswith("question 0:")  # after the words it kept
    for message in chat(0, 12, answer_words=60):
        if message["role"] == "user":
            assert _sent(message["content"], texts)


async def test_a_requested_compression(service: Service, events: CollectingEvents) -> None:
    await _create(service)
    await _push(service, chat(0, 6))
    before = await _prompt(service)
    events.clear()
    result = await controls.compress(service, params("context/compress", sessionId=SID), None)
    assert result.compressed and result.summarizer == "extractive" and len(result.checkpoint_ids) == 1
    assert result.after_tokens < result.before_tokens == before.tokens
    (done,) = events.of(CompressedNotification, SID)
    assert done.trigger == "request" and done.checkpoint_ids == result.checkpoint_ids
    assert (done.before_tokens, done.after_tokens) == (result.before_tokens, result.after_tokens)
    assert [c.checkpoint.id for c in events.of(CheckpointCreatedNotification, SID)] == result.checkpoint_ids
    listed = await controls.checkpoints(service, SID)
    assert [c.id for c in listed.checkpoints] == result.checkpoint_ids
    # What the checkpoint stands for is still in history, whole.
    expanded = await controls.expand(service, params("checkpoint/expand", sessionId=SID,
                                                      checkpointId=result.checkpoint_ids[0]))
    assert expanded.messages and all(m.message.content for m in expanded.messages)


async def test_snapshot_and_restore(service: Service, events: CollectingEvents) -> None:
    await _create(service)
    await _push(service, chat(0, 3))
    before = await _prompt(service)
    snap = await snapshots.create(service, params("snapshot/create", sessionId=SID, label="before more"))
    (created,) = events.of(SnapshotCreated, SID)
    assert created.snapshot.snapshot_id == snap.snapshot_id and created.snapshot.trigger == "manual"
    assert created.snapshot.last_seq == 6

    await _push(service, chat(3, 2))
    assert (await _prompt(service)).last_seq == 10
    events.clear()
    restored = await snapshots.restore(service, params("snapshot/restore", sessionId=SID,
                                                        snapshotId=snap.snapshot_id))
    assert (restored.rolled_back_from, restored.rolled_back_to) == (7, 10)
    # The current context is snapshotted first, then restored, then the session is updated.
    assert events.methods(SID) == ["snapshot/created", "snapshot/restored", "session/updated"]
    backup = events.of(SnapshotCreated, SID)[0].snapshot
    assert backup.trigger == "restore" and backup.snapshot_id == restored.backup_snapshot_id
    (note,) = events.of(SnapshotRestored, SID)
    assert (note.snapshot_id, note.backup_snapshot_id) == (snap.snapshot_id, restored.backup_snapshot_id)
    assert events.of(SessionUpdated, SID)[0].reason == "restored"
    after = await _prompt(service)
    assert _texts(after) == _texts(before)
    # History keeps everything.
    assert (await sessions.get_session(service, SID)).message_count == 10


async def test_state_survives_a_restart(service_config: Config) -> None:
    events = CollectingEvents()
    svc = await Service.open(service_config, events=events)
    try:
        await _create(svc)
        await _push(svc, chat(0, 12, answer_words=60))
        await settle(svc)
        before = await _prompt(svc)
        assert before.compression_count >= 1
    finally:
        await svc.close()
    again = await Service.open(service_config, events=CollectingEvents())
    try:
        after = await _prompt(again)
        assert msgspec.json.encode(after.messages) == msgspec.json.encode(before.messages)
        assert (after.tokens, after.checkpoint_count) == (before.tokens, before.checkpoint_count)
    finally:
        await again.close()


async def test_stats_and_delete(service: Service, events: CollectingEvents) -> None:
    await _create(service)
    pushed = await _push(service, chat(0, 2))
    result = await stats.stats(service, SID)
    assert result.message_count == 4 and result.token_count == pushed.token_count
    deleted = await sessions.delete_session(service, SID)
    assert deleted.deleted_messages == 4
    (gone,) = events.of(SessionDeleted, SID)
    assert gone.reason == "request"
    with pytest.raises(CtxdError) as info:
        await _prompt(service)
    assert info.value.code == ErrorCode.SessionNotFound


async def test_sessions_do_not_hear_each_other(service: Service, events: CollectingEvents) -> None:
    await _create(service, "a")
    await _create(service, "b")
    await _push(service, chat(0, 1), "a")
    assert events.methods("a") == ["session/updated"] and events.methods("b") == []


# --- handlers get narrow dependencies -------------------------------------------------


class _Control:
    """A DaemonControl without a daemon."""

    started_at = "2026-01-01T00:00:00.000Z"
    tcp_token = "secret"

    def __init__(self) -> None:
        self.stops = 0
        self.watched: list[int] = []

    def transport_names(self) -> list[str]:
        return ["unix:/tmp/x.sock"]

    def watch_parent(self, pid: int) -> None:
        self.watched.append(pid)

    def stop_later(self) -> None:
        self.stops += 1


async def test_daemon_status_and_stop_need_no_daemon(service: Service, service_config: Config) -> None:
    from ctxd.protocol.common import Empty
    from ctxd.server.app import Request
    from ctxd.server.handlers import lifecycle
    from ctxd.server.subscriptions import Hub

    await _create(service)
    control = _Control()
    req = Request(conn=None, service=service, hub=Hub(), config=service_config, control=control)  # type: ignore[arg-type]
    status = await lifecycle.status(req, Empty())
    assert status.pid == os.getpid() and status.sessions == 1 and status.connections == 0
    assert status.started_at == control.started_at and status.transports == ["unix:/tmp/x.sock"]
    assert status.database == service_config.database and status.summarizer == "extractive"
    assert status.database.startswith("postgresql://") == service_config.storage.url.startswith("postgresql://")
    assert await lifecycle.stop(req, Empty()) is None and control.stops == 1


async def test_a_user_heavy_chat_leaves_a_step_of_room_after_each_pass(service: Service,
                                                                      events: CollectingEvents) -> None:
    """The user's words stay verbatim and fill the conversation; a pass must still free a
    loop guard's step, or every few turns compress again (each pass freeing a few tokens
    and breaking the prompt cache)."""
    await _create(service, window=8192)
    for i in range(150):
        await _push(service, [
            {"role": "user", "content": f"note {i}: " + " ".join(f"w{i}x{k}" for k in range(20))},
            {"role": "assistant", "content": f"reply {i}: " + " ".join(f"r{i}y{k}" for k in range(20))}])
        await settle(service)
    passes = [n for n in events.of(CompressedNotification, SID) if n.layers != ["watermark"]]
    budget = (await _prompt(service)).budget
    step = Config().compression.min_growth_fraction * budget.available
    assert len(passes) >= 10
    assert all(n.after_tokens <= budget.max_prompt_tokens for n in passes)
    tiny = [n for n in passes if n.before_tokens - n.after_tokens < step]
    assert len(tiny) <= len(passes) // 10, [(n.layers, n.before_tokens, n.after_tokens) for n in tiny]


async def test_stats_report_how_many_prompts_kept_the_previous_prefix(service: Service) -> None:
    await _create(service, window=8192)
    await _push(service, chat(0, 6))
    await _prompt(service)
    await _push(service, chat(6, 2))
    await _prompt(service)
    await _prompt(service)
    cache = (await stats.stats(service, SID)).prompt_cache
    assert (cache.prompts, cache.compared, cache.prefix_kept, cache.prefix_kept_share) == (3, 2, 2, 1.0)
    assert (await controls.compress(service, params("context/compress", sessionId=SID))).compressed
    await settle(service)
    await _prompt(service)
    cache = (await stats.stats(service, SID)).prompt_cache
    assert (cache.prompts, cache.compared, cache.prefix_kept, cache.prefix_kept_share) == (4, 3, 2, 0.6667)


async def test_a_whole_conversation_pushed_at_once_fills_the_window(service: Service) -> None:
    """A long chat pushed in one batch (an import, an agent's first request through the
    proxy): its user words are far past their share. The pass folds what it must of
    them and summarizes only as far as the low-water mark needs, so the prompt is
    filled to about that mark with the newest turns verbatim, assistant ones included;
    before, it summarized everything but the newest message, crushed the summaries to a
    line and left most of the window empty. (A provider that caches nothing: where one
    caches, passes go deeper, ``compression.cached_low_water_fraction``.)"""
    await _create(service, window=8192, provider="local")
    pushed = [m for i in range(300) for m in (
        {"role": "user", "content": f"note {i}: " + " ".join(f"u{i}x{k}" for k in range(12))},
        {"role": "assistant", "content": f"reply {i}: " + " ".join(f"a{i}y{k}" for k in range(12))})]
    await _push(service, pushed)
    await settle(service)
    result = await _prompt(service)
    budget = result.budget
    policy = Config().compression
    assert budget.used > policy.low_water_fraction * budget.available * 0.85
    assert result.tokens > 0.7 * budget.max_prompt_tokens
    texts = _texts(result)
    newest_replies = [m["content"] for m in pushed[-20:] if m["role"] == "assistant"]
    assert all(reply in texts for reply in newest_replies)
    users = [m["content"] for m in pushed if m["role"] == "user"]
    assert _sent(users[-1], texts) and _sent(users[0], texts)  # the newest and the first (the task) verbatim


def _step(i: int, args_lines: int, output_lines: int) -> list[dict[str, Any]]:
    """An agent step: a call whose arguments hold ``args_lines`` lines and its output."""
    content = "\n".join(f"def f{i}_{k}(): return {k}" for k in range(args_lines))
    call = {"role": "assistant", "content": f"step {i}",
            "toolCalls": [{"id": f"c{i}", "function": {
                "name": "write_file", "arguments": json.dumps({"path": f"m{i}.py", "content": content})}}]}
    output = "\n".join(f"test_{i}_{k} PASSED in {k}.0{i}s" for k in range(output_lines))
    return [call, {"role": "tool", "toolCallId": f"c{i}", "content": output}]


async def test_a_newest_step_too_big_together_still_gets_a_prompt(service: Service) -> None:
    """An agent's newest call and its output, each under the excerpt limit (half the
    budget) but too big together with the rest: the prompt carries excerpts of both and
    is handed out. Before, the pass ended over the maximum and context/prompt answered
    ContextOverflow: the agent was stuck (issue 8, "a prompt always")."""
    await _create(service, window=8192)
    task = "Rewrite the module and run its tests. " + " ".join(f"requirement{k} holds" for k in range(500))
    await _push(service, [{"role": "user", "content": task}])
    big = _step(99, 270, 200)
    pushed = await _push(service, big)
    await settle(service)
    result = await _prompt(service)
    budget = result.budget
    assert pushed.context_tokens > budget.max_prompt_tokens  # the step did not fit as pushed
    assert all(m.tokens < 0.5 * budget.available for m in pushed.messages), \
        ([m.tokens for m in pushed.messages], budget.available)
    assert result.tokens <= budget.max_prompt_tokens
    texts = json.dumps([msgspec.to_builtins(m) for m in result.messages])
    assert "left out by ctxd" in texts and "def f99_0()" in texts and "test_99_0 PASSED" in texts
    assert json.dumps(task)[1:-1] in texts  # the task verbatim, not folded to make room



async def test_a_sessions_default_title_is_not_a_demonstration(service: Service) -> None:
    """SWE-agent opens with a worked example of another task (``metadata.demonstration``):
    its sessions were all titled "Here is a demonstration of how to correctly accomplish
    this task." The title is the first line of the first user message that is the user's."""
    await sessions.create_session(service, params("session/create", sessionId="demo", model="gpt-4o"))
    await ingest.push(service, params("session/push", sessionId="demo", messages=[
        {"role": "user", "content": "Here is a demonstration of how to correctly accomplish this task.\n...",
         "metadata": {"demonstration": True}},
        {"role": "user", "content": "Fix the TimeDelta rounding in fields.py\nSteps: ..."}]))
    assert (await sessions.get_session(service, "demo")).title == "Fix the TimeDelta rounding in fields.py"


async def test_every_fold_of_the_users_words_is_announced(service: Service, events: CollectingEvents) -> None:
    """Folding past ``compression.user_share`` said nothing: user messages left the prompt
    with no ``context/overflow`` (issue 24). Every fold now names the messages, the
    checkpoint that holds them and how to get them back."""
    from ctxd.protocol.compression import OverflowNotification

    await _create(service, window=8192)
    pushed = [m for i in range(300) for m in (
        {"role": "user", "content": f"note {i}: " + " ".join(f"u{i}x{k}" for k in range(12))},
        {"role": "assistant", "content": f"reply {i}: " + " ".join(f"a{i}y{k}" for k in range(12))})]
    await _push(service, pushed)
    await settle(service)
    result = await _prompt(service)
    folds = [c for c in (await controls.checkpoints(service, SID)).checkpoints if c.kind == "folded"]
    assert len(folds) == 1
    notes = events.of(OverflowNotification, SID)
    assert notes and all(n.reason == "user_share" and n.checkpoint_id == folds[0].id for n in notes)
    named = sorted(s for n in notes for s in n.folded_seqs)
    assert named == folds[0].message_seqs  # every folded message named, once
    assert all(f"checkpoint/expand {folds[0].id}" in n.action and "message/pin" in n.action for n in notes)
    assert sum(n.folded_messages for n in notes) == len(named)
    # The checkpoint says what it quotes exactly and what it left out; no "verbatim" above it.
    folded = next(t for t in _texts(result) if "[User messages quoted exactly below: " in t)
    assert "verbatim" not in folded


async def test_a_task_bigger_than_the_room_left_is_sent_as_an_excerpt(service: Service,
                                                                      events: CollectingEvents) -> None:
    """A mini-swe-agent task of ~2,700 tokens under a long system prompt at an 8k window:
    every prompt was refused (-33010 "the prompt needs 5380 tokens but at most 4915 may be
    sent"), because the task, the session's only user message, could be neither folded nor
    cut. It is not the newest message (the agent's steps follow it): it is sent as an
    excerpt with a notice, history keeps it whole, and the prompt is handed out."""
    from ctxd.protocol.compression import OverflowNotification

    system = "You are a helpful assistant that can interact with a computer shell. " + " ".join(
        f"rule{k} applies always" for k in range(500))
    await sessions.create_session(service, params("session/create", sessionId=SID, model="deepseek-chat",
                                                  contextWindow=8192, systemPrompt=system))
    task = "<pr_description>Fix the linter. " + " ".join(f"requirement{k} holds" for k in range(900)) + \
        " The END of the task.</pr_description>"
    await _push(service, [{"role": "user", "content": task}])
    for i in range(6):
        await _push(service, _step(i, 20, 30))
        await settle(service)
        result = await _prompt(service)
        assert result.tokens <= result.budget.max_prompt_tokens
        texts = json.dumps([msgspec.to_builtins(m) for m in result.messages])
        assert "<pr_description>Fix the linter. requirement0 holds" in texts and "The END of the task." in texts
        assert "tokens of this message left out by ctxd" in texts
    from ctxd.service import history

    page = await history.history(service, params("session/history", sessionId=SID))
    assert page.messages[0].message.content == task  # history keeps it whole
    notes = events.of(OverflowNotification, SID)
    assert notes and notes[-1].excerpted_seqs == [1] and "message 1" in notes[-1].action
    # A newest user message that alone is bigger than any prompt still gets the error.
    with pytest.raises(CtxdError) as refused:
        await _push(service, [{"role": "user", "content": " ".join(f"huge{k} word" for k in range(3000))}])
        await settle(service)
        await _prompt(service)
    assert refused.value.code == ErrorCode.ContextOverflow and "newest user message alone" in str(refused.value)

async def test_a_session_starts_from_usage_samples_learned_elsewhere(service: Service) -> None:
    """``usageSamples`` at create: the budget leaves room for what the provider counts
    beside the messages from the first prompt on, and ``context/stats`` shows the pairs
    (what a client passes on to the next session of the same client and model)."""
    learned = [(c, int(c * 1.1) + 6_000) for c in (2_000, 4_000, 6_000, 8_000)]
    await _create(service, "fresh", window=24_000)
    # Pairs that teach nothing: nothing counted, a report under half the count (a runtime
    # that counted only what its cache missed), a report larger than the window.
    useless = [(0, 5), (4_000, 1_000), (8_000, 30_000)]
    await _create(service, "seeded", window=24_000, usageSamples=[list(p) for p in learned + useless])
    fresh = await stats.stats(service, "fresh")
    seeded = await stats.stats(service, "seeded")
    assert fresh.usage_drift.samples == [] and fresh.budget.token_overhead == 0
    assert seeded.usage_drift.samples == learned
    assert 5_000 <= seeded.budget.token_overhead <= 6_000 and seeded.budget.token_ratio > 1.05
    assert seeded.budget.max_prompt_tokens < fresh.budget.max_prompt_tokens - 5_000
    with pytest.raises(msgspec.ValidationError):
        params("session/create", sessionId="bad", usageSamples=[[-1, 5]])


async def test_superseded_copies_leave_the_prompt_and_stay_in_history(service: Service) -> None:
    """A client's working context it sends anew each turn (the files in its chat): the
    older copy, named by its idempotency key in ``context/prompt`` ``supersede``, leaves
    the active context (prompt and budget), stays in history as ``superseded``, and stays
    out after the context is read again from storage."""
    from ctxd.service import history

    files = "Here are the files:\nsrc/app.py\n" + "def handler(): return 1\n" * 40
    await _create(service, window=32_000)
    await _push(service, [
        {"role": "user", "content": files, "idempotencyKey": "files-1"},
        {"role": "assistant", "content": "Ok, I will edit those files.", "idempotencyKey": "ack"},
        {"role": "user", "content": "Rename handler.", "idempotencyKey": "ask-1"},
        {"role": "assistant", "content": "Renamed.", "idempotencyKey": "reply-1"}])
    await controls.pin(service, params("message/pin", sessionId=SID, seq=1, pinned=True))
    before = await prompt.prompt(service, params("context/prompt", sessionId=SID))
    edited = files.replace("handler", "renamed")
    after = await prompt.prompt(service, params("context/prompt", sessionId=SID, supersede=["files-1", "nope"], push=[
        {"role": "user", "content": edited, "idempotencyKey": "files-2"},
        {"role": "user", "content": "Now test it.", "idempotencyKey": "ask-2"}]))
    contents = [m.content for m in after.messages]
    assert files not in contents and edited in contents and contents.count(edited) == 1
    assert after.tokens < before.tokens + 40  # the old copy's tokens are no longer counted
    assert after.budget.pinned_tokens == 0  # its pin went with it
    page = await history.history(service, params("session/history", sessionId=SID))
    assert [e.status for e in page.messages] == ["superseded", "context", "context", "context", "context",
                                                 "context"]
    # Superseding again changes nothing; the state is stored: a context read afresh agrees.
    again = await prompt.prompt(service, params("context/prompt", sessionId=SID, supersede=["files-1"]))
    assert [m.content for m in again.messages] == contents
    state = await service.cache.get(SID)
    state.drop_context()
    service.cache.forget(SID)
    reloaded = await prompt.prompt(service, params("context/prompt", sessionId=SID))
    assert [m.content for m in reloaded.messages] == contents and reloaded.tokens == after.tokens


async def test_the_clients_current_context_is_pinned_while_it_is_current(service: Service) -> None:
    """``context/prompt`` ``current``: stored messages the client shows the model again
    (its files, unchanged since stored) are pinned, so compression sends them verbatim;
    unpinned once no longer named; a pin of the user's own is left alone."""
    files = "Here are the files:\nsrc/app.py\n" + "def handler(): return 1\n" * 30
    await _create(service, window=4096)
    await _push(service, [{"role": "user", "content": files, "idempotencyKey": "files"},
                          {"role": "assistant", "content": "Ok.", "idempotencyKey": "ack"}])
    await _push(service, chat(0, 3))
    await controls.pin(service, params("message/pin", sessionId=SID, seq=2, pinned=True))  # the user's own
    await prompt.prompt(service, params("context/prompt", sessionId=SID, current=["files", "ack", "nope"]))
    state = await service.cache.get(SID)
    assert state.cstate.pinned == [1, 2] and state.cstate.current == [1]
    # Pushed far past the window: compression leaves the current context verbatim.
    for n in range(6):
        await _push(service, chat(10 + 4 * n, 4, answer_words=120))
    await settle(service)
    out = await prompt.prompt(service, params("context/prompt", sessionId=SID, current=["files", "ack"]))
    assert out.compression_count >= 1 and files in [m.content for m in out.messages]
    # No longer current: unpinned; the user's pin stays.
    await prompt.prompt(service, params("context/prompt", sessionId=SID, current=[]))
    assert state.cstate.pinned == [2] and state.cstate.current == []


def _call(call_id: str, name: str, arguments: dict[str, Any], output: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "toolCallId": call_id, "content": output}]


async def test_an_agents_working_set_stays_whole_and_yields_to_the_users_words(service_config: Config) -> None:
    """The file an agent read (with a shell call) and later patched stays whole in every
    prompt after its read, while the command outputs around it are summarized; and it never
    costs the task its words, even when the task alone takes a third of the prompt. (A
    quarter of the prompt for the working set, so a 4K window holds the file.)"""
    config = msgspec.structs.replace(
        service_config, compression=msgspec.structs.replace(service_config.compression, working_share=0.25))
    service = await Service.open(config, events=CollectingEvents())
    try:
        await _working_set_scenario(service)
    finally:
        await service.close()


async def _working_set_scenario(service: Service) -> None:
    await _create(service, window=4096)
    task = "Fix the rounding in src/app.py (task RND-9). " + " ".join(f"constraint{i} holds" for i in range(350))
    source = "\n".join(f"def f{i}(x):\n    return round(x * {i}, 2)  # f{i}" for i in range(25))
    await _push(service, [{"role": "user", "content": task}])
    await _push(service, _call("r0", "exec_command", {"cmd": "cat src/app.py"}, source))
    for n in range(1, 12):
        log = " ".join(f"step{n}x{k} ok" for k in range(120))
        await _push(service, _call(f"c{n}", "exec_command", {"cmd": f"make t{n}"}, log))
        await settle(service)
        texts = _texts(await _prompt(service))
        assert task in texts and source in texts, (n, [str(t)[:60] for t in texts])
    patch = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return round(x * 3, 2)  # f3\n+    return x\n"
    await _push(service, _call("p", "apply_patch", {"input": patch}, "Success."))
    await settle(service)
    result = await _prompt(service)
    texts = _texts(result)
    assert task in texts and source in texts and result.compression_count >= 1
    assert not any("step1x0 ok" in (t or "") for t in texts[1:])  # (older outputs: summarized)


async def test_a_working_set_read_the_user_unpins_stays_unpinned(service_config: Config) -> None:
    """``message/unpin`` of a read the working set pinned is the user's choice: later passes,
    and a change of the working set, do not pin it again (they did: it was still listed)."""
    config = msgspec.structs.replace(
        service_config, compression=msgspec.structs.replace(service_config.compression, working_share=0.25))
    service = await Service.open(config, events=CollectingEvents())
    try:
        await _working_set_scenario(service)
        ctx_state = (await service.cache.context(await service.cache.get(SID))).state
        assert 3 in ctx_state.working, ctx_state.working  # (the read of src/app.py)
        await controls.pin(service, params("message/pin", sessionId=SID, seq=3, pinned=False))
        for n in range(20, 24):  # more passes, and new reads that change the working set
            await _push(service, _call(f"r{n}", "exec_command", {"cmd": f"cat src/mod{n}.py"}, f"x{n} = {n}\n"))
            log = " ".join(f"step{n}x{k} ok" for k in range(120))
            await _push(service, _call(f"c{n}", "exec_command", {"cmd": f"make t{n}"}, log))
            await settle(service)
        ctx_state = (await service.cache.context(await service.cache.get(SID))).state
        assert 3 not in ctx_state.pinned and 3 not in ctx_state.working, \
            (ctx_state.pinned, ctx_state.working)
    finally:
        await service.close()


async def test_a_long_user_message_that_fits_without_the_working_set_is_sent(service_config: Config) -> None:
    """The working set is ctxd's pin: a newest user message that fits only without the files
    pinned for the agent is sent, and the files yield. Before, the pass counted them as
    what no compression can remove, changed nothing, and ``context/prompt`` refused: "the
    newest user message alone needs N tokens with the system part and pinned messages"."""
    config = msgspec.structs.replace(
        service_config, compression=msgspec.structs.replace(service_config.compression, working_share=0.25))
    service = await Service.open(config, events=CollectingEvents())
    try:
        await _working_set_scenario(service)
        state = await service.cache.get(SID)
        ctx = await service.cache.context(state)
        budget = service.cache.budget(state)
        assert ctx.state.working, ctx.state.working
        pinned = ctx.pinned_tokens
        words = "Now also check these cases: " + " ".join(f"case{i}" for i in range(1200))
        pushed = await _push(service, [{"role": "user", "content": words}])
        size = pushed.messages[-1].tokens
        assert size + pinned > budget.max_prompt_tokens > size + 200, (size, pinned, budget.max_prompt_tokens)
        await settle(service)
        result = await _prompt(service)
        assert _texts(result)[-1] == words and result.tokens <= result.budget.max_prompt_tokens
    finally:
        await service.close()


async def test_a_squeeze_has_the_working_set_yield_before_the_users_words(service: Service) -> None:
    """The squeeze's last step before the overflow policy: a prompt that summaries and
    excerpts cannot bring under the limit while the agent's files stay pinned (pinned
    before the user's long message came) sheds the file read once, keeps the one being
    patched, and leaves the user's words whole (``workset.plan_yield``)."""
    from ctxd.engine.workset import apply_working_set, plan_working_set
    from ctxd.service import compression

    await _create(service, window=4096, settings={"autoCompress": False})  # (no pass of its own meanwhile)
    task = "Fix the rounding in src/app.py (task RND-9). " + " ".join(f"constraint{i} holds" for i in range(100))
    source = "\n".join(f"def f{i}(x):\n    return round(x * {i}, 2)  # f{i}" for i in range(30))
    notes = "\n".join(f"- note {i}: the rounding of case {i} is checked by test_{i}" for i in range(50))
    patch = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return round(x * 3, 2)  # f3\n+    return x\n"
    words = "Also handle these: " + " ".join(f"case{i}" for i in range(800))
    await _push(service, [{"role": "user", "content": task}])
    await _push(service, _call("r0", "exec_command", {"cmd": "cat src/app.py"}, source))     # 2, 3
    await _push(service, _call("r1", "exec_command", {"cmd": "cat notes.md"}, notes))        # 4, 5
    await _push(service, _call("p", "apply_patch", {"input": patch}, "Success."))           # 6, 7
    await _push(service, [{"role": "user", "content": words}])                               # 8
    state = await service.cache.get(SID)
    ctx = await service.cache.context(state)
    async with state.lock:  # (as a pass pinned them while there was room)
        seqs, reads = plan_working_set(ctx, 100_000, 0.5)
        assert seqs == [2, 3, 4, 5]
        apply_working_set(ctx, seqs, reads)
        service.cache.refresh(state, system=True)
    budget = service.cache.budget(state)
    assert not service.tasks and ctx.prompt_tokens > budget.max_prompt_tokens, (ctx.prompt_tokens, budget)
    run = compression._Pass(trigger="test", started=0.0, before=ctx.prompt_tokens)
    await compression._squeeze(service, state, ctx, run, None)
    assert ctx.prompt_tokens <= service.cache.budget(state).max_prompt_tokens, run.detail
    assert ctx.state.working == [2, 3] and run.detail["workingSet"] == [2, 3]
    texts = [m.content for m in ctx.conversation()]
    assert texts[0] == task and texts[-1] == words and source in texts and notes not in texts, texts


async def test_the_newest_tool_output_stays_whole_while_it_fits_once_older_turns_go(service: Service) -> None:
    """An agent's newest tool output, bigger than half the room (the excerpt limit of a
    squeeze) but small enough to fit beside the system part and the task once the older
    steps are summarized, reaches the model whole: the older conversation goes first
    (issue 21: the client's newest turn intact). Before, it was the first thing cut."""
    await _create(service, window=8192)
    await _push(service, [{"role": "user", "content": "Find why the report is wrong (task RPT-3)."}])
    for n in range(4):
        log = "\n".join(f"row{n}_{k},item {k},{k * 7 % 13},ok" for k in range(110))
        await _push(service, _call(f"c{n}", "read", {"filePath": f"data/part{n}.csv"}, log))
        await settle(service)
    budget = (await _prompt(service)).budget
    newest = "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(300))
    pushed = await _push(service, _call("big", "read", {"filePath": "data/items.csv"}, newest))
    await settle(service)
    result = await _prompt(service)
    budget = result.budget
    size = pushed.messages[-1].tokens
    assert 0.5 * budget.available < size < budget.available - 200, (size, budget.available)
    assert result.tokens <= budget.max_prompt_tokens
    texts = _texts(result)
    assert texts[-1] == newest, str(texts[-1])[-300:]


async def test_a_newest_tool_output_too_big_for_the_prompt_gets_the_room_left(service: Service) -> None:
    """An agent's newest tool output bigger than the whole room: sent as an excerpt that
    takes the room the older, summarized steps left, not just its share of it (it was
    cut to half the room and the prompt went out half empty, issue 21)."""
    await _create(service, window=8192)
    await _push(service, [{"role": "user", "content": "Find why the report is wrong (task RPT-3)."}])
    for n in range(4):
        log = "\n".join(f"row{n}_{k},item {k},{k * 7 % 13},ok" for k in range(110))
        await _push(service, _call(f"c{n}", "read", {"filePath": f"data/part{n}.csv"}, log))
        await settle(service)
    newest = "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(900))
    pushed = await _push(service, _call("big", "read", {"filePath": "data/items.csv"}, newest))
    await settle(service)
    result = await _prompt(service)
    budget = result.budget
    assert pushed.messages[-1].tokens > budget.max_prompt_tokens
    # Widened up to one loop guard's step below the trigger, no further: the prompt went out
    # half empty before; filled to the limit, the next push forced a pass that dropped it.
    assert 0.75 * budget.max_prompt_tokens <= result.tokens <= budget.max_prompt_tokens, \
        (result.tokens, budget.max_prompt_tokens)
    assert budget.used <= budget.trigger_at, (budget.used, budget.trigger_at)
    last = _texts(result)[-1]
    assert "left out by ctxd" in last and last.startswith(newest[:200]) and last.endswith(newest[-200:])
    passes = result.compression_count
    step = "\n".join(f"next{k}: ok" for k in range(20))
    await _push(service, _call("after", "read", {"filePath": "data/notes.txt"}, step))
    await settle(service)
    after = await _prompt(service)
    assert after.compression_count == passes  # (no pass forced by a small step)
    assert any(newest[:200] in (t or "") for t in _texts(after))



async def _newest_read_of(service: Service, settings: dict[str, int], rows: int) -> tuple[Any, Any, str]:
    """A session at 8K reserving 2,000 tokens for the reply (the client's ``max_tokens``),
    four steps read, then a read of ``rows`` rows: its pushed copy, the prompt, the text."""
    await _create(service, window=8192, settings=settings)
    await _push(service, [{"role": "user", "content": "Find why the report is wrong (task RPT-3)."}])
    for n in range(4):
        log = "\n".join(f"row{n}_{k},item {k},{k * 7 % 13},ok" for k in range(110))
        await _push(service, _call(f"c{n}", "read", {"filePath": f"data/part{n}.csv"}, log))
        await settle(service)
    newest = "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(rows))
    pushed = await _push(service, _call("big", "read", {"filePath": "data/items.csv"}, newest))
    await settle(service)
    return pushed, await _prompt(service), newest


@pytest.mark.parametrize("floor", [None, 1000])
async def test_the_reply_reserve_lends_the_newest_turn_what_makes_it_whole(service: Service,
                                                                           floor: int | None) -> None:
    """A newest tool output a little too big for the room the reply's reserve leaves:
    with ``outputFloor`` the reserve lends it what makes it whole, no more and never below
    the floor; the next push gives the reserve back. Without a floor it stays an excerpt."""
    settings = {"outputTokens": 2000} | ({"outputFloor": floor} if floor else {})
    pushed, result, newest = await _newest_read_of(service, settings, 440)
    budget = result.budget
    last = _texts(result)[-1]
    if floor is None:
        assert "left out by ctxd" in last and budget.reserved_output == 2000
        return
    assert last == newest
    assert floor < budget.reserved_output < 2000, budget.reserved_output  # (only what it needed)
    assert result.tokens <= budget.max_prompt_tokens
    assert budget.max_prompt_tokens - result.tokens < 200  # (lent to the token it needed, about)
    step = "\n".join(f"next{k}: ok" for k in range(20))
    await _push(service, _call("after", "read", {"filePath": "data/notes.txt"}, step))
    await settle(service)
    after = await _prompt(service)
    assert after.budget.reserved_output == 2000 and after.tokens <= after.budget.max_prompt_tokens


async def test_no_loan_where_the_floor_cannot_make_the_newest_turn_whole(service: Service) -> None:
    """Too big even with the reserve at its floor: nothing lent (the reply keeps its room,
    the output is an excerpt as before)."""
    pushed, result, newest = await _newest_read_of(service, {"outputTokens": 2000, "outputFloor": 1000}, 500)
    assert "left out by ctxd" in _texts(result)[-1]
    assert result.budget.reserved_output == 2000



