"""``context/prompt``: the active context rendered for one provider, with its budget.

A prompt that would not fit is never handed out: the session is compressed first
(when automatic compression is on), and if it still cannot fit the request fails with
ContextOverflow and the figures.
"""

from __future__ import annotations

from ctxd.engine.render import RENDERERS
from ctxd.protocol.context import AnthropicPrompt, OllamaPrompt, OpenAIPrompt, PromptParams, PromptResult
from ctxd.service import compression
from ctxd.service.core import Service
from ctxd.service.notify import session_reliability


async def prompt(svc: Service, params: PromptParams) -> PromptResult:
    state = await svc.cache.get(params.session_id)
    await compression.ensure_fits(svc, state)
    async with state.lock:
        ctx = await svc.cache.context(state)
        rendered = RENDERERS[params.format](ctx.prompt_plan(), state.counter.count)
        budget = svc.cache.budget(state)
        row = state.row
    tokens = budget.prompt_tokens + rendered.extra_tokens
    common = dict(session_id=row.id, tokens=tokens, tokens_estimated=state.counter.estimated,
                  last_seq=row.last_seq, message_count=row.message_count, budget=budget,
                  reliability=session_reliability(state, budget),
                  compression_count=ctx.state.compression_count, checkpoint_count=len(ctx.checkpoints))
    if params.format == "anthropic":
        return AnthropicPrompt(system=rendered.system, messages=rendered.messages, **common)
    if params.format == "ollama":
        return OllamaPrompt(messages=rendered.messages, **common)
    return OpenAIPrompt(messages=rendered.messages, **common)
