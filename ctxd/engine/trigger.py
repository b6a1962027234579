"""When to compress: the trigger and the loop guard (layer 3's first question).

:func:`decide` is asked after every change that grows the conversation (a push, an
import) and before a prompt is rendered: over the trigger, and grown enough since the
last pass (``compression.min_growth_fraction`` of available, so a pass never follows
a pass that freed little), or the prompt no longer fits. Pure: figures in, a decision
out; the service schedules the pass (``service/compression.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ctxd.engine.context import CompressionState
from ctxd.engine.policy import CompressionPolicy
from ctxd.protocol.context import Budget


@dataclass(frozen=True)
class Decision:
    compress: bool
    reason: str
    skip_kind: str | None = None
    """Set when the trigger was passed but compression may not run: worth telling clients."""


def decide(state: CompressionState, budget: Budget, policy: CompressionPolicy) -> Decision:
    """Whether automatic compression should run now (past the trigger, within the loop guard)."""
    fits = budget.prompt_tokens <= budget.max_prompt_tokens
    if budget.used <= budget.trigger_at and fits:
        return Decision(False, "below the trigger")
    if not policy.auto:
        return Decision(False, "automatic compression is off for this session", "auto-off")
    last = state.last_after_used
    if fits and last is not None:
        needed = last + math.ceil(policy.min_growth_fraction * budget.available)
        if budget.used < needed:
            return Decision(False, f"the conversation grew to {budget.used} tokens since the last compression "
                                   f"left {last}; waiting for {needed} (no compaction loops)", "growth")
    return Decision(True, "over the trigger" if fits else "the prompt no longer fits")
