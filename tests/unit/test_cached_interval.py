"""Where the provider caches prompts, a pass leaves room for ``compression.cached_pass_interval``
requests of the session's growth: an agent whose tool outputs grow the conversation by a
few percent of the window a request, with the user's words (kept verbatim) filling half
of it, compressed every few requests, each pass rewriting the prompt. The summaries are
shortened for that room (the newest kept whole, the older merged, never below the merged
level's cap), and only the newest message is sure to stay (``cached_keep_recent``). A chat
growing by tens of tokens a request has that room after any pass: nothing changes for it.
On plain figures (``room_to_make``) and on a real Service."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.config import Config
from ctxd.engine.billing import CacheRules
from ctxd.engine.budget import compute_budget
from ctxd.engine.context import CompressionState
from ctxd.engine.policy import LEVEL_CAP, CompressionPolicy
from ctxd.engine.trigger import Economy, decide, room_to_make, weighs_economy
from ctxd.service import ingest, prompt, sessions
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents
from ctxd.store import checkpoints as checkpoint_store
from tests.unit.service_helpers import params, settle

CACHES = CacheRules(provider="anthropic", cache="breakpoints", read=0.1, write=1.25)


def _budget(used: int) -> Any:
    return compute_budget(context_window=8192, usable_fraction=1.0, reserved_output=1024, safety_margin=164,
                          trigger_fraction=1.0, system_tokens=100, checkpoint_tokens=1500, used=used)


def test_room_is_made_only_for_growth_the_free_room_cannot_hold() -> None:
    policy = CompressionPolicy(pass_interval=10)
    budget = _budget(3500)
    free = budget.trigger_at - budget.used
    # An agent growing 250 tokens a request: ten requests need 2,500, the pass left ``free``.
    assert room_to_make(policy, budget, Economy(rules=CACHES, growth=250.0)) == 2500 - free
    # A chat growing 30 a request: the room is there.
    assert room_to_make(policy, budget, Economy(rules=CACHES, growth=30.0)) == 0
    # No cache, unknown growth, or no interval asked: nothing.
    assert room_to_make(policy, budget, None) == 0
    assert room_to_make(policy, budget, Economy(rules=CacheRules(cache="none"), growth=250.0)) == 0
    assert room_to_make(policy, budget, Economy(rules=CACHES, growth=0.0)) == 0
    assert room_to_make(CompressionPolicy(pass_interval=0), budget, Economy(rules=CACHES, growth=250.0)) == 0


def _task(i: int) -> list[list[dict[str, Any]]]:
    """The pushes of one task, a request after each: the user's ask (the user's words grow
    the conversation by ~25 tokens a task), then a tool call with its ~300-token output,
    then the answer."""
    return [[{"role": "user", "content": f"Task {i}: look at module {i} and say if "
                                         + " ".join(f"w{i}x{k}" for k in range(12))}],
            [{"role": "assistant", "content": [{"type": "tool_use", "id": f"c{i}", "name": "inspect",
                                                "input": {"module": i}}]},
             {"role": "tool", "toolCallId": f"c{i}",
              "content": " ".join(f"line{i}y{k} value{k}" for k in range(110))}],
            [{"role": "assistant", "content": f"Module {i} is fine."}]]


async def _passes(config: Config, events: CollectingEvents, sid: str) -> tuple[int, int, list[dict[str, Any]]]:
    """Requests made and the passes recorded of one agent session at 8k (Anthropic)."""
    svc = await Service.open(config, events=events)
    requests = 0
    try:
        await sessions.create_session(svc, params("session/create", sessionId=sid, model="claude-sonnet-4-5",
                                                  provider="anthropic", contextWindow=8192,
                                                  settings={"outputTokens": 1024}))
        for i in range(200):
            for messages in _task(i):
                await ingest.push(svc, params("session/push", sessionId=sid, messages=messages))
                await settle(svc)
                if messages[-1]["role"] != "assistant" or i == 199:
                    await prompt.prompt(svc, params("context/prompt", sessionId=sid, format="anthropic"))
                    requests += 1
        return requests, len(await svc.db.read(checkpoint_store.list_compressions, sid)), \
            await svc.db.read(checkpoint_store.list_compressions, sid)
    finally:
        await svc.close()


async def test_a_fast_growing_cached_session_passes_seldom(service_config: Config, events: CollectingEvents) -> None:
    before = msgspec.structs.replace(service_config, compression=msgspec.structs.replace(
        service_config.compression, cached_pass_interval=0, cached_keep_recent=5))
    requests, old, _ = await _passes(before, events, "before")
    requests_now, new, runs = await _passes(service_config, events, "now")
    assert requests == requests_now and old, "the session never compressed: make it longer"
    # Passes come a quarter less often at least (the bill benchmark's agent: 12.7% -> 9.5%).
    assert new * 4 <= old * 3, (new, old, requests)
    # The summaries made room, never below the merged level's cap, the newest kept whole.
    shrunk = [r for r in runs if "shrink" in r["layers"]]
    assert shrunk
    floor = int(LEVEL_CAP["ultra"] * runs[-1]["detail"]["parts"]["maxPrompt"])
    for r in shrunk:
        parts = r["detail"]["parts"]
        assert parts["checkpoints"] >= floor - 16, parts


def test_a_push_gathers_no_economy_where_the_decision_would_not_read_it() -> None:
    """``compression.schedule`` skips ``billing.economy`` where ``weighs_economy`` says so:
    there, the decision with a cold cache's economy (which, when read, can make a pass run)
    is the one without any."""
    cold = Economy(rules=CACHES, growth=250.0, cold=True)
    decided = 0
    for policy in (CompressionPolicy(), CompressionPolicy(auto=False), CompressionPolicy(room_fraction=0.2)):
        for last in (None, 1000, 3000):
            state = CompressionState(last_after_used=last)
            for used in range(0, 7000, 125):
                budget = _budget(used)
                with_it, without = decide(state, budget, policy, cold), decide(state, budget, policy, None)
                if weighs_economy(state, budget, policy):
                    decided += with_it != without  # (read, and it can decide)
                else:
                    assert with_it == without, (policy, last, used)
    assert decided > 0
