"""``context/prompt``: the active context rendered for one provider, with its budget.

A prompt that would not fit is never handed out: the session is compressed first
(when automatic compression is on), and if it still cannot fit the request fails with
ContextOverflow and the figures. What was rendered is kept per format: asked again
with no change, the prompt is a lookup; after a push only the new messages are
rendered (``engine.render.IncrementalRenderer``). A ``preview`` (an editor showing the
prompt) is the same prompt, but is not billed, counted as handed out or paired with the
next reply's usage: only a prompt that is sent is.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.engine.context import ActiveContext
from ctxd.engine.render import IncrementalRenderer, Rendered
from ctxd.formats.anthropic import cache_breakpoints
from ctxd.protocol.context import (
    AnthropicPrompt,
    Budget,
    OllamaPrompt,
    OpenAIPrompt,
    PromptParams,
    PromptResult,
)
from ctxd.protocol.errors import invalid_params
from ctxd.protocol.session import SessionPushParams
from ctxd.service import billing, compression, controls, ingest
from ctxd.service.core import Service
from ctxd.service.encoded import pre_encoded
from ctxd.service.notify import session_reliability
from ctxd.service.state import SessionState


def _shape(ctx: ActiveContext) -> tuple[object, ...]:
    """What a prompt is made of besides the messages pushed since: every change to the
    views (a compression, a pin, a goal, checkpoints, the system prompt) bumps
    ``revision``; a push only appends to ``recent`` (``ActiveContext.append``)."""
    return (id(ctx), ctx.state.revision, len(ctx.kept), ctx.system_text)


def _version(ctx: ActiveContext) -> tuple[object, ...]:
    """What a rendered prompt depends on: its shape and how far ``recent`` goes."""
    last = ctx.recent[-1].seq if ctx.recent else -1
    return (*_shape(ctx), len(ctx.recent), last)


def _count_prefix(state: SessionState, ctx: ActiveContext, fmt: str) -> None:
    """Whether this prompt starts with the previous one of its format: nothing but
    appends since (no compression, pin, goal or checkpoint change)."""
    shape = _shape(ctx)
    last = len(ctx.recent)
    before = state.handed_out.get(fmt)
    state.prompts += 1
    if before is not None:
        state.prompts_followed += 1
        if before[:-1] == shape and last >= before[-1]:  # type: ignore[operator]
            state.prefix_kept += 1
    state.handed_out[fmt] = (*shape, last)


def rendered(state: SessionState, ctx: ActiveContext, fmt: str) -> Rendered:
    """The prompt in ``fmt``, rendered once per version of the active context. When only
    pushes came since the last one (the same shape, ``recent`` longer and the same up to
    where it was), only the messages pushed since are handed to the renderer; otherwise
    the whole plan, which it compares with what it rendered before."""
    version = _version(ctx)
    cached = state.rendered.get(fmt)
    if cached is not None and cached[0] == version:
        return cached[1]
    renderer = state.renderers.get(fmt)
    count = state.counter.count
    try:
        if renderer is not None and cached is not None and _appended_to(cached[0], version, ctx):
            seen = cached[0][4]
            assert isinstance(seen, int)
            out = renderer.append([e.view for e in ctx.recent[seen:] if e.view is not None], count)
        else:
            if renderer is None:
                renderer = state.renderers[fmt] = IncrementalRenderer(fmt)
            out = renderer.render(ctx.prompt_plan(), count)
    except BaseException:
        # (A renderer stopped mid-way holds no state to build on.)
        state.renderers.pop(fmt, None)
        state.rendered.pop(fmt, None)
        raise
    state.rendered[fmt] = (version, out)
    return out


def in_shape(budget: Budget, out: Rendered, opener: int = 0) -> Budget:
    """One count: the budget's (the context counts the pairing repairs too, and the
    Anthropic shape's opening user turn, ``ActiveContext.opener``, for every shape), plus
    what the provider's shape of ``out`` alone adds or leaves out (``Rendered.format_tokens``,
    the opener again when it sends one), so a prompt's count, its budget and
    ``context/stats`` for that format say the same."""
    extra = out.format_tokens - opener
    if not extra:
        return budget
    tokens = budget.prompt_tokens + extra
    return msgspec.structs.replace(budget, prompt_tokens=tokens, free=budget.max_prompt_tokens - tokens)


def _appended_to(before: tuple[object, ...], now: tuple[object, ...], ctx: ActiveContext) -> bool:
    """Whether the context of version ``now`` is that of ``before`` with messages pushed
    after it: the same shape, and ``recent`` still ends, where it ended then, with the
    message it ended with."""
    if before[:4] != now[:4]:
        return False
    seen, last = before[4], before[5]
    assert isinstance(seen, int)
    if seen > len(ctx.recent):
        return False
    return (ctx.recent[seen - 1].seq if seen else -1) == last


async def prompt(svc: Service, params: PromptParams) -> PromptResult:
    return (await _prompt(svc, params))[1]


async def prompt_for_wire(svc: Service, params: PromptParams) -> PromptResult:
    """``prompt`` for a client on a transport: the same answer, its ``messages`` each
    already the JSON msgspec writes for it (``service/encoded.py``), so only what changed
    since the session's previous prompt in this format is encoded. For the encoder only:
    the messages are ``msgspec.Raw``, not the Structs the type names."""
    state, result = await _prompt(svc, params)
    if not result.messages:
        return result
    raws = pre_encoded(state.encoded, params.format, result.messages)
    return msgspec.structs.replace(result, messages=raws) if raws is not result.messages else result


def _refuse_changes_in_preview(params: PromptParams) -> None:
    """A preview only looks: the fields that change the session before the prompt have no
    place in it (a client sending both means one of them by mistake)."""
    for name, value in (("push", params.push), ("supersede", params.supersede), ("current", params.current)):
        if value is not None:
            raise invalid_params(f"Invalid params: context/prompt with preview takes no {name} (a preview only "
                                 f"looks at the prompt; send {name} without preview)", name)


async def _prompt(svc: Service, params: PromptParams) -> tuple[SessionState, PromptResult]:
    if params.preview:
        _refuse_changes_in_preview(params)
    if params.supersede:  # the client's older copies of what it sends anew
        await controls.supersede(svc, params.session_id, params.supersede)
    pushed: dict[str, tuple[int, int]] = {}
    if params.push:  # one round trip for a turn: the push, then the prompt that includes it
        result = await ingest.push(svc, SessionPushParams(session_id=params.session_id, messages=params.push))
        pushed = {m.idempotency_key: (r.seq, r.tokens) for m, r in zip(params.push, result.messages)
                  if m.idempotency_key is not None}
    if params.current is not None:  # what the client shows the model now (this push's included)
        await controls.keep_current(svc, params.session_id, params.current, known=pushed)
    state = await svc.cache.get(params.session_id)
    if not state.compress_lock.locked():  # (a pass of this daemon is mid-way: memory is ahead, not behind)
        await svc.cache.catch_up(state)  # shared storage: another daemon may have changed it
    await compression.ensure_fits(svc, state, params.format)
    async with state.lock:
        ctx = await svc.cache.context(state)
        out = rendered(state, ctx, params.format)
        budget = in_shape(svc.cache.budget(state), out, ctx.opener)
        row = state.row
        tokens = budget.prompt_tokens
        bill = None
        if not params.preview:  # (a preview is never sent: nothing to bill, count or pair with a reply)
            _count_prefix(state, ctx, params.format)
            bill = billing.on_prompt(svc, state, ctx, tokens, _shape(ctx))
    if not params.preview:
        state.last_prompt_tokens = tokens
    room = compression.append_room_of(svc, state, budget)
    common: dict[str, Any] = dict(session_id=row.id, tokens=tokens, tokens_estimated=state.counter.estimated,
                  last_seq=row.last_seq, message_count=row.message_count, budget=budget,
                  reliability=session_reliability(state, budget),
                  compression_count=ctx.state.compression_count, checkpoint_count=len(ctx.checkpoints), bill=bill,
                  append_room=room)
    if params.format == "anthropic":
        if params.cache_control:
            system, messages = cache_breakpoints(out.system, out.messages, out.system_head)
            return state, AnthropicPrompt(system=system, messages=messages, **common)
        return state, AnthropicPrompt(system=out.system, messages=out.messages, **common)
    if params.format == "ollama":
        return state, OllamaPrompt(messages=out.messages, **common)
    return state, OpenAIPrompt(messages=out.messages, **common)
