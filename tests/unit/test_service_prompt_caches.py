"""What the service keeps between requests to make a turn cheap, checked against what it
would compute afresh after each kind of change: the budget (and the policy) kept with
what they were computed from (``SessionCache.budget``, ``SessionCache.policy``), and the
prompt rendered from only the messages pushed since the last one (``prompt.rendered``,
``IncrementalRenderer.append``)."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.engine.render import RENDERERS
from ctxd.service import controls, goals, ingest, prompt, sessions
from ctxd.service.core import Service
from ctxd.service.state import SessionState

from .service_helpers import chat, params, settle

SID = "memo"


async def _push(svc: Service, messages: list[dict[str, Any]]) -> Any:
    return await ingest.push(svc, params("session/push", sessionId=SID, messages=messages))


async def _update(svc: Service, **changes: Any) -> None:
    await sessions.update_session(svc, params("session/update", sessionId=SID, **changes))


def _afresh(svc: Service, state: SessionState) -> Any:
    """The budget computed now, nothing kept."""
    state.budget_memo = None
    return svc.cache.budget(state)


async def test_the_budget_and_policy_follow_what_they_are_made_of(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=32_768))
    cache = service.cache
    state = await cache.get(SID)
    await _push(service, chat(0, 10))
    kept = cache.budget(state)
    assert cache.budget(state) is kept  # nothing changed: the same budget
    assert kept == _afresh(service, state) and kept.token_ratio == 1.0

    # A push changes the figures (in place).
    await _push(service, chat(10, 2))
    after_push = cache.budget(state)
    assert after_push.used > kept.used and after_push == _afresh(service, state)

    # A reply's usage changes the calibration: the provider counts 30% more.
    for turn in range(3):
        counted = cache.budget(state).prompt_tokens
        await _push(service, [{"role": "user", "content": f"and then {turn}?"},
                              {"role": "assistant", "content": f"then {turn}.",
                               "usage": {"inputTokens": int(counted * 1.3), "outputTokens": 3}}])
        budget = cache.budget(state)
        assert budget == _afresh(service, state)
    assert budget.token_overhead > 0 and budget.max_prompt_tokens < after_push.max_prompt_tokens
    # The calibration alone (the figures as they were): as a reply's usage replaces the pairs.
    drift = state.row.stats.drift
    drift.usage_samples = [(c, int(c * 1.6)) for c, _ in drift.usage_samples]
    assert cache.budget(state).token_overhead > budget.token_overhead
    assert cache.budget(state) == _afresh(service, state)
    drift.usage_samples.append((budget.prompt_tokens, budget.prompt_tokens))  # (even in place)
    assert cache.budget(state) == _afresh(service, state)

    # The session's settings and window.
    before = cache.budget(state)
    await _update(service, settings={"outputTokens": 4_000})
    budget = cache.budget(state)
    assert budget.reserved_output == 4_000 != before.reserved_output and budget == _afresh(service, state)
    await _update(service, settings={"triggerFraction": 0.5})
    budget = cache.budget(state)
    assert budget.trigger_fraction == 0.5 and budget == _afresh(service, state)
    await _update(service, contextWindow=65_536)
    budget = cache.budget(state)
    assert budget.context_window == 65_536 and budget == _afresh(service, state)

    assert cache.policy(state).auto is True
    await _update(service, settings={"autoCompress": False})
    assert cache.policy(state).auto is False
    await _update(service, settings={"keepRecent": 3})
    assert cache.policy(state).keep_recent == 3 and cache.policy(state).auto is False


def _encoded(messages: Any) -> bytes:
    return msgspec.json.encode(messages)


async def _check_prompts(svc: Service, state: SessionState) -> None:
    """Each format's prompt, as the service hands it out (rendered from what it rendered
    before), equals a full render of the context as it is now."""
    for fmt in ("openai", "anthropic", "ollama"):
        got = await prompt.prompt(svc, params("context/prompt", sessionId=SID, format=fmt, cacheControl=False))
        ctx = await svc.cache.context(state)
        want = RENDERERS[fmt](ctx.prompt_plan(), state.counter.count)
        assert _encoded(got.messages) == _encoded(want.messages), fmt
        if fmt == "anthropic":
            assert got.system == want.system


def _tool_turn(i: int, words: int = 40) -> list[dict[str, Any]]:
    call = f"call{i}"
    return [{"role": "user", "content": f"check module {i}"},
            {"role": "assistant", "content": f"checking {i}",
             "toolCalls": [{"id": call, "function": {"name": "check", "arguments": f'{{"m": {i}}}'}}]},
            {"role": "tool", "toolCallId": call, "content": f"module {i}: " + " ".join(["ok"] * words)},
            {"role": "assistant", "content": f"module {i} is fine"}]


async def test_the_prompt_after_each_change_is_a_full_render(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=4096, systemPrompt="You check modules."))
    state = await service.cache.get(SID)
    # Pushes only: after the first prompt, each renders from the messages pushed since.
    for i in range(12):
        await _push(service, _tool_turn(i)[:2])  # a call still open
        await _check_prompts(service, state)
        await _push(service, _tool_turn(i)[2:])
        await _check_prompts(service, state)
    # A compression moves the boundary and adds a checkpoint.
    result = await controls.compress(service, params("context/compress", sessionId=SID), None)
    assert result.compressed
    await _check_prompts(service, state)
    await _push(service, _tool_turn(12))
    await _check_prompts(service, state)
    # A pin, a goal, a new system prompt: each changes the prompt before the new messages.
    ctx = await service.cache.context(state)
    await controls.pin(service, params("message/pin", sessionId=SID, seq=ctx.recent[1].seq))
    await _check_prompts(service, state)
    await goals.set_goal(service, params("goal/set", sessionId=SID, description="Check every module."))
    await _check_prompts(service, state)
    await _push(service, _tool_turn(13))
    await _update(service, systemPrompt="You check modules, carefully.")
    await _check_prompts(service, state)
    for i in range(14, 40):  # on to the automatic passes (old outputs cleared, summaries)
        await _push(service, _tool_turn(i, words=200))
        await settle(service)
        await _check_prompts(service, state)
    assert (await service.cache.context(state)).state.compression_count > 1
