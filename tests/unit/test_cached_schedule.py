"""Where the provider caches prompts, passes leave less behind that the next pass cannot
free: the user's words past their share fold as deep as the low-water mark asks, down
to ``compression.cached_fold_floor`` of their share (elsewhere half), so passes come
seldom. What stays the same: every user word verbatim while they take at most their
share. On a real Service."""

from __future__ import annotations

from typing import Any

from ctxd.service import ingest, prompt, sessions
from ctxd.service.core import Service
from ctxd.store import checkpoints as checkpoint_store
from tests.unit.service_helpers import params, settle


def _agent_turns(i: int) -> list[dict[str, Any]]:
    """A task (the user's words), a tool call, its output and the answer."""
    return [{"role": "user", "content": f"Task {i}: inspect module {i} and tell me what "
                                        + " ".join(f"changed{i}x{k}" for k in range(40))},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"c{i}", "name": "inspect",
                                               "input": {"module": i}}]},
            {"role": "tool", "toolCallId": f"c{i}",
             "content": " ".join(f"line{i}y{k} value{k}" for k in range(160))},
            {"role": "assistant", "content": f"Module {i} is fine."}]


async def _run(svc: Service, session_id: str, model: str, provider: str | None) -> list[dict[str, Any]]:
    # (five newest messages kept in both: what is compared is how deep a fold goes)
    fields: dict[str, Any] = {"model": model, "contextWindow": 8192, "settings": {"keepRecent": 5}}
    if provider:
        fields["provider"] = provider
    await sessions.create_session(svc, params("session/create", sessionId=session_id, **fields))
    for i in range(160):
        await ingest.push(svc, params("session/push", sessionId=session_id, messages=_agent_turns(i)))
        await settle(svc)
        # (the requests an agent makes: what the session's growth per request is learned from)
        await prompt.prompt(svc, params("context/prompt", sessionId=session_id, format="anthropic"))
    return await svc.db.read(checkpoint_store.list_compressions, session_id)


async def test_a_cached_session_folds_deeper_and_passes_seldom(service: Service) -> None:
    plain = await _run(service, "plain", "llama3.2:3b", None)
    cached = await _run(service, "cached", "claude-sonnet-4-5", "anthropic")

    def folds(runs: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(r["detail"]["beforeParts"]["userWords"], r["detail"]["parts"]["userWords"])
                for r in runs if "fold" in r["layers"]]

    def share(runs: list[dict[str, Any]]) -> int:
        return runs[-1]["detail"]["parts"]["maxPrompt"] // 2  # (user_share: half the largest prompt)

    assert folds(plain) and folds(cached), "the session never folded: make it longer"
    # Every pass records the prompt's parts before and after it.
    for r in plain + cached:
        parts = r["detail"]["parts"]
        assert parts["prompt"] <= parts["maxPrompt"] and r["detail"]["why"]
        assert parts["prompt"] == parts["prefix"] + parts["userWords"] + parts["checkpoints"] + \
            parts["working"] + parts["recent"]
    # A fold comes only past the share; without a cache it leaves at least half of it,
    # where the provider caches down to a quarter, as deep as the low-water mark asks.
    assert min(after for _, after in folds(plain)) >= share(plain) // 2 - 64
    assert min(after for _, after in folds(cached)) < share(cached) // 2
    # Passes come seldom where they break a cache.
    assert len(cached) < len(plain), (len(cached), len(plain))
