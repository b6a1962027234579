"""ctxd's promise: ``context/prompt`` returns a prompt within ``maxPromptTokens`` whenever
the newest message fits (with the system part and pins: ``pipeline.irreducible``), under
the ``fold`` overflow policy; under ``error`` it may refuse, never hand out more.

The review's case first, then a seeded random loop over windows of 1K-16K, message
sizes, user and fold shares, policies, strategies, formats, reply reserves and loans,
system prompts, goals, pins and agents' tool outputs as the newest message: each case a
session driven through the service as the handlers drive it. ``CTXD_FIT_CASES`` runs
more of them (a few thousand to trust a change; the default keeps this near ten seconds)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ctxd.config import Config, DaemonConfig, StorageConfig
from ctxd.engine.context import ActiveContext
from ctxd.engine.pipeline import irreducible, newest_turn
from ctxd.protocol.compression import OverflowNotification
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service import controls, goals, ingest, prompt, sessions
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents
from ctxd.tokens import MESSAGE_OVERHEAD

from ._engine_helpers import WORDS, words
from .service_helpers import params, settle

CASES = int(os.environ.get("CTXD_FIT_CASES", "150"))
SEED = int(os.environ.get("CTXD_FIT_SEED", "20261206"))


async def _session(svc: Service, sid: str, window: int, **extra: Any) -> None:
    await sessions.create_session(svc, params("session/create", sessionId=sid, model="gpt-4o",
                                              contextWindow=window, **extra))


async def _push(svc: Service, sid: str, messages: list[dict[str, Any]]) -> None:
    await ingest.push(svc, params("session/push", sessionId=sid, messages=messages))


async def _prompt(svc: Service, sid: str, fmt: str = "openai") -> Any:
    return await prompt.prompt(svc, params("context/prompt", sessionId=sid, format=fmt))


def _chat(task: int, turns: int, answer: int) -> list[dict[str, Any]]:
    """A task of ``task`` tokens, then ``turns`` answers and short questions, then an answer."""
    out = [{"role": "user", "content": "task: " + words(task, "plan")}]
    for i in range(turns):
        out.append({"role": "assistant", "content": words(answer, "code")})
        out.append({"role": "user", "content": f"q{i} " + words(40, "note")})
    out.append({"role": "assistant", "content": words(answer, "code")})
    return out


async def test_a_newest_message_that_nearly_fills_the_window_gets_a_prompt_within_it(
        service: Service, events: CollectingEvents) -> None:
    """The review's case: the task (1500 tokens) and ten questions folded, the task as an
    excerpt of half of ``fold_share``, then a user message of 2800 tokens in a 4K window
    (3072 may be sent). The folded excerpt and the summaries' floor took more than the
    272 tokens left: ContextOverflow, though the newest message fits."""
    await _session(service, "s1", 4096)
    await _push(service, "s1", _chat(1500, 10, 100))
    await _push(service, "s1", [{"role": "user", "content": words(2800, "tree")}])
    await settle(service)
    result = await _prompt(service, "s1")
    assert result.tokens <= result.budget.max_prompt_tokens, (result.tokens, result.budget.max_prompt_tokens)
    texts = [m.content for m in result.messages]
    assert texts[-1] == words(2800, "tree")  # the newest message whole
    folded = next(t for t in texts if "folded out of the conversation to fit the window" in t)
    # The task stays, as a smaller excerpt, counted as such; the rest are counted as folded out.
    assert "[message 1] task: plan plan" in folded and "message 1 as an excerpt" in folded
    assert "tokens of this message left out by ctxd" in folded and "more (messages between" in folded
    # Re-cut from the task as stored: its notice counts what is really left out (most of it).
    left_out = int(folded.split("lines, ")[1].split(" tokens")[0])
    assert left_out > 1300
    said = [n.action for n in events.of(OverflowNotification, "s1")]
    assert any("quotes fewer of the user's words" in a for a in said), said
    checkpoints = (await controls.checkpoints(service, "s1")).checkpoints
    assert [c.kind for c in checkpoints].count("folded") == 1


async def test_with_room_for_nothing_but_the_newest_message_the_checkpoints_leave_the_prompt(
        service: Service, events: CollectingEvents) -> None:
    """A newest message that leaves less room than even a notice of what was left out:
    the prompt is that message alone (history keeps everything), and ``context/overflow``
    names the checkpoints that left."""
    await _session(service, "s1", 4096)
    await _push(service, "s1", _chat(600, 6, 100))
    await _push(service, "s1", [{"role": "user", "content": words(3050, "tree")}])
    await settle(service)
    result = await _prompt(service, "s1")
    assert result.tokens <= result.budget.max_prompt_tokens
    assert [m.content for m in result.messages] == [words(3050, "tree")]
    assert any("left the prompt" in n.action for n in events.of(OverflowNotification, "s1"))
    assert (await sessions.get_session(service, "s1")).message_count == len(_chat(600, 6, 100)) + 1  # history whole


# --- the property ------------------------------------------------------------------------


@dataclass
class Case:
    window: int
    user_share: float
    fold_share: float
    policy: str
    strategy: str
    fmt: str
    task: int
    turns: int
    answer: int
    ask: int
    newest: int
    output_tokens: int | None
    output_floor: int | None
    keep_recent: int | None
    tools: bool
    system: int
    goal: int
    pin: bool
    rounds: int
    agent: bool
    """Each turn ends in a tool call and its output (the newest message) instead of a user
    message: the newest turn is cut, widened into the room, lent the reply's reserve."""
    seed: int


def _case(rng: random.Random) -> Case:
    window = rng.randint(1024, 16384)
    return Case(
        window=window, user_share=rng.choice([0.1, 0.2, 0.35, 0.5, 0.7, 0.9]),
        fold_share=rng.choice([0.05, 0.12, 0.25]), policy=rng.choice(["fold", "fold", "fold", "error"]),
        strategy=rng.choice(["summarize", "summarize", "truncate"]), fmt=rng.choice(["openai", "anthropic", "ollama"]),
        task=rng.choice([10, 100, 500, 2000, window // 2]), turns=rng.randint(0, 12),
        answer=rng.choice([5, 50, 300, 1500]), ask=rng.choice([5, 40, 300]),
        newest=int(window * rng.uniform(0.3, 0.8)), output_tokens=rng.choice([None, None, window // 8, window // 4]),
        output_floor=rng.choice([None, None, 64]), keep_recent=rng.choice([None, 1, 5]), tools=rng.random() < 0.3,
        system=rng.choice([0, 0, 50, 400]), goal=rng.choice([0, 0, 30, 200]), pin=rng.random() < 0.2,
        rounds=rng.choice([1, 1, 2, 3]), agent=rng.random() < 0.3, seed=rng.randrange(1 << 30))


def _messages(case: Case) -> list[dict[str, Any]]:
    rng = random.Random(case.seed)
    out: list[dict[str, Any]] = [{"role": "user", "content": "task: " + words(case.task, rng.choice(WORDS))}]
    for i in range(case.turns):
        if case.tools and rng.random() < 0.5:
            call = f"call{i}"
            out.append({"role": "assistant", "content": None, "toolCalls": [{
                "id": call, "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "/src/f{rng.randint(0, 3)}.py"}}'}}]})
            out.append({"role": "tool", "toolCallId": call,
                        "content": words(rng.choice([20, 300, 2000]), rng.choice(WORDS))})
        out.append({"role": "assistant", "content": words(max(1, int(case.answer * rng.uniform(0.5, 1.5))),
                                                            rng.choice(WORDS))})
        out.append({"role": "user", "content": f"q{i} " + words(max(1, int(case.ask * rng.uniform(0.5, 1.5))),
                                                                 rng.choice(WORDS))})
    out.append({"role": "assistant", "content": words(case.answer, rng.choice(WORDS))})
    return out


def _floor(ctx: ActiveContext, fmt: str) -> int:
    """What must fit for the promise to hold: what no compression can take out
    (``irreducible``: the system part, the pins, a newest user message; in the Anthropic
    shape, the user turn it puts first when the conversation opens with the assistant);
    in an agent's turn, its newest step whole too (the call and its output, which could
    otherwise only go as an excerpt) and the user message it works on."""
    floor = irreducible(ctx) + (ctx.opener if fmt == "anthropic" else 0)
    if ctx.recent and not ctx.recent[-1].has_user_text:
        floor += sum(e.sent_tokens for e in newest_turn(ctx))
        asked = next((e for e in reversed(ctx.kept + ctx.recent) if e.has_user_text), None)
        if asked is not None:
            floor += asked.tokens.overhead + asked.tokens.text
    return floor


async def _check(svc: Service, sid: str, case: Case) -> str | None:
    """The invariant on one prompt: None, or what broke it."""
    try:
        result = await _prompt(svc, sid, case.fmt)
    except CtxdError as exc:
        state = await svc.cache.get(sid)
        floor = _floor(await svc.cache.context(state), case.fmt)
        budget = svc.cache.budget(state)
        if case.policy == "fold" and floor <= budget.max_prompt_tokens:
            return f"refused though the newest message fits ({floor} <= {budget.max_prompt_tokens}): {exc.message}"
        return None
    if result.tokens > result.budget.max_prompt_tokens:
        return f"{result.tokens} tokens handed out, {result.budget.max_prompt_tokens} at most"
    return None


async def _run(svc: Service, sid: str, case: Case) -> str | None:
    svc.config.compression.user_share = case.user_share
    svc.config.compression.fold_share = case.fold_share
    settings: dict[str, Any] = {"overflowPolicy": case.policy, "strategy": case.strategy}
    for key, value in (("outputTokens", case.output_tokens), ("outputFloor", case.output_floor),
                       ("keepRecent", case.keep_recent)):
        if value is not None:
            settings[key] = value
    extra = {"systemPrompt": words(case.system, "rule")} if case.system else {}
    await _session(svc, sid, case.window, settings=settings, **extra)
    if case.goal:
        try:
            await goals.set_goal(svc, params("goal/set", sessionId=sid, description=words(case.goal, "goal")))
        except CtxdError as exc:  # (a goal past its share of a small window is refused)
            assert exc.code == ErrorCode.InvalidParams, exc.message
    pushed = _messages(case)
    await _push(svc, sid, pushed)
    rng = random.Random(case.seed + 1)
    if case.pin:
        try:
            await controls.pin(svc, params("message/pin", sessionId=sid, seq=rng.randint(1, min(3, len(pushed)))))
        except CtxdError as exc:  # (pins past their share are refused: then the case goes on without)
            assert exc.code == ErrorCode.ContextOverflow, exc.message
    for turn in range(case.rounds):
        size = case.newest if turn == case.rounds - 1 else int(case.newest * rng.uniform(0.1, 1.0))
        if case.agent:
            call = f"read{turn}"
            await _push(svc, sid, [
                {"role": "assistant", "content": None, "toolCalls": [{"id": call, "type": "function", "function": {
                    "name": "read_file", "arguments": f'{{"path": "/src/big{turn}.py"}}'}}]},
                {"role": "tool", "toolCallId": call, "content": words(size, "tree")}])
        else:
            await _push(svc, sid, [{"role": "user", "content": words(size, "tree")}])
        await settle(svc)
        broken = await _check(svc, sid, case)
        if broken is not None:
            return f"turn {turn}: {broken}"
        await _push(svc, sid, [{"role": "assistant", "content": words(case.answer, "bird")}])
    return None


async def test_every_prompt_is_within_the_budget_when_the_newest_message_fits(tmp_path: Path) -> None:
    """The property over ``CASES`` random sessions (SQLite: the storage is not what this
    tests). A failure names the case, which ``_run`` replays alone."""
    config = Config(daemon=DaemonConfig(data_dir=str(tmp_path / "data")), storage=StorageConfig(url=""))
    svc = await Service.open(config, events=CollectingEvents())
    rng = random.Random(SEED)
    failures: list[str] = []
    try:
        for index in range(CASES):
            case = _case(rng)
            broken = await _run(svc, f"case{index}", case)
            if broken is not None:
                failures.append(f"{case}: {broken}")
            await sessions.delete_session(svc, f"case{index}")
    finally:
        await svc.close()
    assert not failures, f"{len(failures)} of {CASES} cases broke the promise:\n" + "\n".join(failures[:5])


def test_the_loop_draws_what_it_says() -> None:
    """(The generator covers both policies, every format, loans and the 1K-16K windows.)"""
    rng = random.Random(SEED)
    cases = [_case(rng) for _ in range(CASES)]
    assert {c.policy for c in cases} == {"fold", "error"} and {c.fmt for c in cases} == {"openai", "anthropic",
                                                                                        "ollama"}
    assert min(c.window for c in cases) < 3000 and max(c.window for c in cases) > 14000
    assert any(c.output_floor for c in cases) and any(c.rounds > 1 for c in cases)
    assert any(c.agent and c.output_floor for c in cases)


async def test_a_prompt_opening_with_the_assistant_fits_every_shape(service: Service) -> None:
    """A conversation that opens with the assistant (a pinned greeting here; a turn left
    alone once the checkpoints leave) goes to Anthropic behind a user turn ctxd adds: that
    turn was not counted, and a prompt filling the window went over in that shape (found
    by the property test). Counted for every shape, it then refused an OpenAI prompt that
    fit to the token: each shape is held to what it sends."""
    await _session(service, "s1", 4096)
    await _push(service, "s1", [{"role": "assistant", "content": "Hello! " + words(300, "code")}])
    await controls.pin(service, params("message/pin", sessionId="s1", seq=1))
    first = await _prompt(service, "s1")
    room = first.budget.max_prompt_tokens - first.tokens
    await _push(service, "s1", [{"role": "user", "content": words(room - MESSAGE_OVERHEAD, "tree")}])
    await settle(service)
    openai = await _prompt(service, "s1")
    assert openai.tokens == openai.budget.max_prompt_tokens  # to the token: the pin and the newest message
    assert [m.role for m in openai.messages] == ["assistant", "user"]
    # Anthropic needs the opening turn besides: more than may be sent, and nothing can go.
    with pytest.raises(CtxdError) as refused:
        await _prompt(service, "s1", "anthropic")
    assert refused.value.code == ErrorCode.ContextOverflow
