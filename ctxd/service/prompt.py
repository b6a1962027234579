"""``context/prompt``: the active context rendered for one provider, with its budget."""

from __future__ import annotations

from ctxd.engine.render import RENDERERS, PromptPlan
from ctxd.protocol.context import AnthropicPrompt, OllamaPrompt, OpenAIPrompt, PromptParams, PromptResult
from ctxd.service.core import Service


async def prompt(svc: Service, params: PromptParams) -> PromptResult:
    state = await svc.cache.get(params.session_id)
    async with state.lock:
        entries = await svc.cache.entries(state)
        system_parts = [state.row.system_prompt] if state.row.system_prompt else []
        plan = PromptPlan(system_parts=system_parts, messages=[e.message for e in entries])
        rendered = RENDERERS[params.format](plan, state.counter.count)
        budget = svc.cache.budget(state)
        row = state.row
    tokens = budget.prompt_tokens + rendered.extra_tokens
    common = dict(session_id=row.id, tokens=tokens, tokens_estimated=state.counter.estimated,
                  last_seq=row.last_seq, message_count=row.message_count, budget=budget)
    if params.format == "anthropic":
        return AnthropicPrompt(system=rendered.system, messages=rendered.messages, **common)
    if params.format == "ollama":
        return OllamaPrompt(messages=rendered.messages, **common)
    return OpenAIPrompt(messages=rendered.messages, **common)
