"""Budgets that match the provider: learning how the provider counts tokens.

ctxd counts with tiktoken; the provider counts with its own tokenizer, and adds what
the client sent beside the pushed messages (tool schemas, its own framing). When a
pushed message carries provider usage, the input tokens the provider reported are
compared with ctxd's count of what was sent for that call. ctxd cannot know whether
the client sent ctxd's prompt or its whole history, so the sample uses whichever of
the two the reported figure is nearer to (by ratio). The budget then divides the
provider's room by the median of the newest samples (``Budget.tokenRatio``).
"""

from __future__ import annotations

import math

SAMPLES = 8
"""Samples kept: a median over the newest few follows a model change within a few turns."""
MIN_SAMPLE_TOKENS = 512
"""Smaller prompts are dominated by what the client adds (tool schemas): too noisy."""
LOW, HIGH = 0.8, 2.0
"""Bounds of the applied ratio: a wild sample (a client sending something else) never
halves the window, nor lets ctxd send much more than it counts."""


def sample(reported: int, candidates: tuple[int, ...]) -> float | None:
    """The ratio of one usage report to the nearest of ctxd's counts, or None."""
    usable = [c for c in candidates if c >= MIN_SAMPLE_TOKENS]
    if reported <= 0 or not usable:
        return None
    best = min(usable, key=lambda c: abs(math.log(reported / c)))
    return round(reported / best, 4)


def remember(recent: list[float], ratio: float | None) -> list[float]:
    if ratio is None:
        return recent
    return (recent + [ratio])[-SAMPLES:]


def applied(recent: list[float]) -> float:
    """The ratio the budget uses: the median of the newest samples, bounded."""
    if not recent:
        return 1.0
    ordered = sorted(recent)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return round(min(HIGH, max(LOW, median)), 4)
