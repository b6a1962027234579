"""``context/stats``: totals by role and kind, and counted-vs-reported drift."""

from __future__ import annotations

from ctxd.protocol.context import (
    ContextStatsResult,
    KindStats,
    PromptCacheStats,
    PromptFormat,
    RoleStats,
    UsageDrift,
)
from ctxd.service import billing, prompt
from ctxd.service.core import Service
from ctxd.service.notify import session_reliability


def _ratio(reported: int, counted: int) -> float | None:
    return round(reported / counted, 4) if counted else None


async def stats(svc: Service, session_id: str, fmt: PromptFormat | None = None) -> ContextStatsResult:
    """``fmt``: the prompt's figures in that provider's shape, read as ``context/prompt``
    reads them (caught up with shared storage) and counted as it counts them, without
    compressing or handing out a prompt."""
    served = await svc.cache.get(session_id)  # (the prompts this daemon handed out: its own count)
    if fmt is None:
        state = await svc.cache.current(session_id)
        budget = svc.cache.budget(state)
        context_tokens = state.row.context_tokens
    else:
        state = served
        if not state.compress_lock.locked():  # (as context/prompt: a pass mid-way leaves memory ahead)
            await svc.cache.catch_up(state)
        async with state.lock:
            ctx = await svc.cache.context(state)
            budget = prompt.in_shape(svc.cache.budget(state), prompt.rendered(state, ctx, fmt), ctx.opener)
        context_tokens = budget.prompt_tokens
    row = state.row
    cstate = state.cstate
    s = row.stats
    drift = s.drift
    return ContextStatsResult(
        session_id=row.id,
        message_count=row.message_count,
        token_count=row.token_count,
        context_tokens=context_tokens,
        encoding=row.encoding,
        tokens_estimated=row.tokens_estimated,
        by_role={role: RoleStats(t.messages, t.tokens) for role, t in s.by_role.items()},
        by_kind={kind: KindStats(t.blocks, t.tokens) for kind, t in s.by_kind.items()},
        usage_drift=UsageDrift(
            messages_with_usage=drift.messages,
            reported_output_tokens=drift.reported_output,
            counted_output_tokens=drift.counted_output,
            output_ratio=_ratio(drift.reported_output, drift.counted_output),
            reported_input_tokens=drift.reported_input,
            counted_input_tokens=drift.counted_input,
            input_ratio=_ratio(drift.reported_input, drift.counted_input),
            applied_ratio=budget.token_ratio,
            applied_overhead=budget.token_overhead,
            samples=[(c, r) for c, r in drift.usage_samples],
        ),
        budget=budget,
        reliability=session_reliability(state, budget),
        compression_count=cstate.compression_count,
        checkpoint_count=state.stored.figures.checkpoint_count,
        checkpoint_tokens=budget.checkpoint_tokens,
        watermark_seq=cstate.watermark_seq,
        pruned_through_seq=cstate.prune_horizon(),
        pinned=[seq for seq in cstate.pinned if seq not in set(cstate.working)],  # (the working set: ctxd's own)
        prompt_cache=PromptCacheStats(
            prompts=served.prompts, compared=served.prompts_followed, prefix_kept=served.prefix_kept,
            prefix_kept_share=round(served.prefix_kept / served.prompts_followed, 4)
            if served.prompts_followed else None),
        bill=billing.session_bill(svc, state),
    )
