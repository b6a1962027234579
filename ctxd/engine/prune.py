"""Layer 1: tool-output pruning (three-layer compaction's first layer, opencode's prune). Free, no LLM.

Walking back from the newest message, tool outputs are protected until they add up to
``protect`` tokens (the newest always, whatever its size); every older output is replaced by
a placeholder that says it was cleared and when. Outputs of protected tools are never
cleared. Pruning happens only when it frees at least ``minimum`` tokens (opencode's reading
of the minimum: clearing a few small outputs would change the prompt, and break providers'
prompt caches, for nothing). The result is a new pruning horizon
(``PruneEvent``); history is untouched.

A pass that needs only part of the output at its horizon (2k tokens of a 12k-token
log) sends that output as a head/tail excerpt of what it can keep (``engine/clip.py``)
instead of clearing it whole: clearing would leave the prompt below the low-water mark
by the rest, up to half the window. An excerpt smaller than ``MIN_EXCERPT`` is not
worth keeping: the output is cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxd.engine.context import ActiveContext, ClipEvent, PruneEvent

MIN_EXCERPT = 256
"""The smallest part of an output worth keeping as an excerpt rather than clearing it."""
CLIP_SLACK = 64
"""An excerpt's notice and cut points are measured after the fact: aim this much lower,
or a pass lands a few tokens above its goal and summarizes to free them."""


@dataclass(frozen=True)
class PrunePlan:
    through_seq: int
    results: int
    """Tool outputs newly cleared."""
    tokens: int
    """Tool-output tokens they held (and what the excerpt below leaves out)."""
    clip: tuple[int, int] | None = None
    """``(seq, max_tokens)``: the next output, bigger than what was still to free, sent
    as an excerpt of ``max_tokens`` instead of being cleared."""


def plan_prune(ctx: ActiveContext, minimum: int, protect: int, protected: tuple[str, ...] = (),
               need: int | None = None) -> PrunePlan | None:
    """Where the pruning horizon should move, or None when pruning would not help.

    With ``need`` (tokens the pass must free), the horizon stops at the oldest outputs
    that free that much (at least ``minimum``): a large window keeps its newer outputs
    whole instead of clearing everything outside the protected tail."""
    horizon = ctx.state.prune_horizon()
    recent = ctx.recent
    names = ctx.call_names
    seen = 0
    cut = -1
    newest = True
    for index in range(len(recent) - 1, -1, -1):
        entry = recent[index]
        if not entry.result_ids:
            continue
        seen += entry.tokens.tool_result
        # The newest output is what the model just asked for: never cleared, however big
        # (when it is too big for the prompt it is sent as an excerpt, engine/clip.py).
        if seen > protect and not newest:
            cut = index
            break
        newest = False
    if cut < 0:
        return None
    through = recent[cut].seq
    if through <= horizon:
        return None
    results = tokens = 0
    clip = None
    through = horizon
    pinned = ctx.pinned_set
    enough = None if need is None else max(need, minimum)
    for entry in recent[: cut + 1]:
        if not entry.result_ids or entry.seq <= horizon or entry.seq in pinned:
            continue
        if entry.seq < ctx.state.watermark_seq:
            continue  # already filtered out by the watermark
        if protected and any(names.get(i, "") in protected for i in entry.result_ids):
            continue
        size = entry.tokens.tool_result
        if enough is not None:
            rest = enough - tokens
            if size - rest >= MIN_EXCERPT and ctx.state.clip_for(entry.seq) is None:
                clip = (entry.seq, entry.tokens.context - rest - CLIP_SLACK)
                tokens += rest
                break
        results += len(entry.result_ids)
        tokens += size
        through = entry.seq
        if enough is not None and tokens >= enough:
            break
    if (results == 0 and clip is None) or tokens < minimum:
        return None
    return PrunePlan(through, results, tokens, clip)


def apply_prune(ctx: ActiveContext, plan: PrunePlan, at: str) -> None:
    """Record the new horizon (and the excerpt); the caller refreshes the views."""
    if plan.through_seq > ctx.state.prune_horizon():
        ctx.state.prunes = [*ctx.state.prunes, PruneEvent(plan.through_seq, at)]
    if plan.clip is not None:
        seq, max_tokens = plan.clip
        ctx.state.clips = [c for c in ctx.state.clips if c.seq != seq] + [ClipEvent(seq, max_tokens, at)]
