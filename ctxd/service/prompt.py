"""``context/prompt``: the active context rendered for one provider, with its budget.

A prompt that would not fit is never handed out: the session is compressed first
(when automatic compression is on), and if it still cannot fit the request fails with
ContextOverflow and the figures. What was rendered is kept per format: asked again
with no change, the prompt is a lookup; after a push only the new messages are
rendered (``engine.render.IncrementalRenderer``).
"""

from __future__ import annotations

from ctxd.engine.context import ActiveContext
from ctxd.engine.render import IncrementalRenderer, Rendered, cache_breakpoints
from ctxd.protocol.context import AnthropicPrompt, OllamaPrompt, OpenAIPrompt, PromptParams, PromptResult
from ctxd.protocol.session import SessionPushParams
from ctxd.service import compression, ingest
from ctxd.service.core import Service
from ctxd.service.notify import session_reliability
from ctxd.service.state import SessionState


def _version(ctx: ActiveContext) -> tuple[object, ...]:
    """What a rendered prompt depends on: every change to the views bumps ``revision``;
    pushes only append."""
    last = ctx.recent[-1].seq if ctx.recent else -1
    return (id(ctx), ctx.state.revision, len(ctx.kept), len(ctx.recent), last, ctx.system_text)


def _count_prefix(state: SessionState, ctx: ActiveContext, fmt: str) -> None:
    """Whether this prompt starts with the previous one of its format: nothing but
    appends since (no compression, pin, goal or checkpoint change)."""
    shape = (id(ctx), ctx.state.revision, len(ctx.kept), ctx.system_text)
    last = len(ctx.recent)
    before = state.handed_out.get(fmt)
    state.prompts += 1
    if before is not None:
        state.prompts_followed += 1
        if before[:-1] == shape and last >= before[-1]:  # type: ignore[operator]
            state.prefix_kept += 1
    state.handed_out[fmt] = (*shape, last)


def rendered(state: SessionState, ctx: ActiveContext, fmt: str) -> Rendered:
    """The prompt in ``fmt``, rendered once per version of the active context."""
    version = _version(ctx)
    cached = state.rendered.get(fmt)
    if cached is not None and cached[0] == version:
        return cached[1]
    renderer = state.renderers.get(fmt)
    if renderer is None:
        renderer = state.renderers[fmt] = IncrementalRenderer(fmt)
    out = renderer.render(ctx.prompt_plan(), state.counter.count)
    state.rendered[fmt] = (version, out)
    return out


async def prompt(svc: Service, params: PromptParams) -> PromptResult:
    if params.push:  # one round trip for a turn: the push, then the prompt that includes it
        await ingest.push(svc, SessionPushParams(session_id=params.session_id, messages=params.push))
    state = await svc.cache.get(params.session_id)
    if not state.compress_lock.locked():  # (a pass of this daemon is mid-way: memory is ahead, not behind)
        await svc.cache.catch_up(state)  # shared storage: another daemon may have changed it
    await compression.ensure_fits(svc, state)
    async with state.lock:
        ctx = await svc.cache.context(state)
        out = rendered(state, ctx, params.format)
        _count_prefix(state, ctx, params.format)
        budget = svc.cache.budget(state)
        row = state.row
    tokens = budget.prompt_tokens + out.extra_tokens
    state.last_prompt_tokens = tokens
    common = dict(session_id=row.id, tokens=tokens, tokens_estimated=state.counter.estimated,
                  last_seq=row.last_seq, message_count=row.message_count, budget=budget,
                  reliability=session_reliability(state, budget),
                  compression_count=ctx.state.compression_count, checkpoint_count=len(ctx.checkpoints))
    if params.format == "anthropic":
        if params.cache_control:
            system, messages = cache_breakpoints(out.system, out.messages, out.system_head)
            return AnthropicPrompt(system=system, messages=messages, **common)
        return AnthropicPrompt(system=out.system, messages=out.messages, **common)
    if params.format == "ollama":
        return OllamaPrompt(messages=out.messages, **common)
    return OpenAIPrompt(messages=out.messages, **common)
