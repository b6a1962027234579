"""The dynamic budget (the room left once the system part and the checkpoints are paid
for, when compression triggers, the usable context), as one pure function.

    usable          = floor(window * usable_fraction)
    max_prompt      = (usable - reserved_output - token_overhead) / token_ratio
    available       = usable - reserved_output - safety_margin
                      - system - pinned - checkpoints
    trigger_at      = floor(available * trigger_fraction)

The checkpoint-ageing design's 8K example is ``usable_fraction=0.85`` of 8000 with nothing reserved
(6800 - 500 = 6300, trigger 5040); the six-stage design's is 8192 with 1000 reserved for the
reply and a 1000 margin (6963 - 500 - 1000 - 1000 = 4463, trigger at 0.75: 3347).
Both are tests in tests/unit/test_engine_budget.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ctxd.engine.calibration import Fit
from ctxd.protocol.context import Budget
from ctxd.tokens import PROMPT_PRIMING


@dataclass(frozen=True)
class BudgetPolicy:
    """The configuration half of a budget; ``config.BudgetConfig`` fills it."""

    usable_fraction: float = 0.85
    reserved_output_cap: int = 32_000
    reserved_output_fraction: float = 0.125
    safety_margin_fraction: float = 0.02
    trigger_fraction: float = 0.90
    output_tokens: int | None = None
    """The session's own reply size (``SessionSettings.outputTokens``: the client's
    ``max_tokens``), reserved in place of the model's limit or the default share."""
    output_lent: int = 0
    """Tokens of that reserve lent to the newest turn (``SessionSettings.outputFloor``)."""


MAX_RESERVED_SHARE = 0.25


def reserved_output(window: int, output_limit: int | None, policy: BudgetPolicy) -> int:
    """Tokens kept for the reply. The session's own ``output_tokens`` when set (what the
    client asks the provider for, so prompt + reply fits the window), not capped by
    ``reserved_output_cap``, which bounds a guess from the model, not a request. Else
    the model's output limit, capped (32k, as coding agents reserve). Either is held to a quarter of the window,
    so a huge ``max_tokens`` cannot leave the prompt no room. For a model whose limit is
    unknown, ``reserved_output_fraction`` of the window."""
    if policy.output_tokens is not None:
        full = max(0, min(policy.output_tokens, math.ceil(window * MAX_RESERVED_SHARE)))
    elif output_limit is not None:
        full = max(0, min(output_limit, policy.reserved_output_cap, math.ceil(window * MAX_RESERVED_SHARE)))
    else:
        full = max(0, min(policy.reserved_output_cap, math.ceil(window * policy.reserved_output_fraction)))
    return max(0, full - policy.output_lent)


def compute_budget(
    *,
    context_window: int,
    usable_fraction: float,
    reserved_output: int,
    safety_margin: int,
    trigger_fraction: float,
    system_tokens: int = 0,
    pinned_tokens: int = 0,
    checkpoint_tokens: int = 0,
    used: int = 0,
    token_ratio: float = 1.0,
    token_overhead: int = 0,
) -> Budget:
    usable = math.floor(context_window * usable_fraction)
    # The window is the provider's count; ctxd's figures are its own (engine/calibration.py).
    max_prompt = usable - reserved_output if (token_ratio, token_overhead) == (1.0, 0) else \
        max(0, math.floor((usable - reserved_output - token_overhead) / token_ratio))
    available = max(0, max_prompt - safety_margin - system_tokens - pinned_tokens - checkpoint_tokens)
    prompt_tokens = PROMPT_PRIMING + system_tokens + pinned_tokens + checkpoint_tokens + used
    return Budget(
        context_window=context_window,
        usable_fraction=usable_fraction,
        usable=usable,
        reserved_output=reserved_output,
        safety_margin=safety_margin,
        max_prompt_tokens=max_prompt,
        system_tokens=system_tokens,
        pinned_tokens=pinned_tokens,
        checkpoint_tokens=checkpoint_tokens,
        available=available,
        trigger_fraction=trigger_fraction,
        trigger_at=math.floor(available * trigger_fraction),
        used=used,
        prompt_tokens=prompt_tokens,
        free=max_prompt - prompt_tokens,
        token_ratio=token_ratio,
        token_overhead=token_overhead,
    )


def budget_for(
    policy: BudgetPolicy,
    *,
    context_window: int,
    output_limit: int | None,
    system_tokens: int = 0,
    pinned_tokens: int = 0,
    checkpoint_tokens: int = 0,
    used: int = 0,
    calibration: Fit | None = None,
) -> Budget:
    """The budget of a session under ``policy`` (and the provider's count, when learned)."""
    fit = calibration or Fit()
    return compute_budget(
        context_window=context_window,
        usable_fraction=policy.usable_fraction,
        reserved_output=reserved_output(context_window, output_limit, policy),
        safety_margin=math.ceil(context_window * policy.safety_margin_fraction),
        trigger_fraction=policy.trigger_fraction,
        system_tokens=system_tokens,
        pinned_tokens=pinned_tokens,
        checkpoint_tokens=checkpoint_tokens,
        used=used,
        token_ratio=fit.ratio,
        token_overhead=fit.overhead,
    )
