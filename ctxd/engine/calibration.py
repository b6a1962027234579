"""Budgets that match the provider: learning how the provider counts tokens.

ctxd counts with tiktoken; the provider counts with its own tokenizer, and adds what
the client sent beside the pushed messages (tool schemas, a system prompt it never
pushed, its own framing). When a pushed message carries provider usage, the input
tokens the provider reported are paired with ctxd's count of what was sent for that
call. ctxd cannot know whether the client sent ctxd's prompt or its whole history, so
the pair uses whichever of the two the current fit (or, before there is one, the bare
ratio) says the report is nearer to; when ctxd handed out a prompt since the last reply,
that prompt's size is ctxd's side instead (a pass may have run in between).

From the newest pairs a line is fitted, ``reported = ratio * counted + overhead``
(least squares when the counts spread enough to tell the two apart, else the median
ratio and no overhead), and the budget gives the conversation the provider's room
less the overhead, divided by the ratio (``Budget.tokenRatio``, ``tokenOverhead``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

SAMPLES = 8
"""Pairs kept: the newest few follow a change of model or client within a few turns."""
MIN_COUNTED = 256
"""Calls with less than this counted are not used (mostly overhead, too noisy)."""
LOW, HIGH = 0.8, 2.0
"""Bounds of the ratio: a wild report never halves the window more than this."""
MAX_OVERHEAD_SHARE = 0.25
"""The overhead never takes more than this share of the window."""
MIN_SPREAD = 1.25
"""Counts must spread by this factor (largest / smallest) before an overhead is fitted."""


@dataclass(frozen=True)
class Fit:
    ratio: float = 1.0
    overhead: int = 0

    def predict(self, counted: int) -> float:
        return self.ratio * counted + self.overhead


def pair(reported: int, candidates: tuple[int, ...], current: Fit | None, window: int = 0) -> tuple[int, int] | None:
    """``(counted, reported)`` for one usage report, or None when it teaches nothing: also
    when it reports more input than the session's ``window`` holds, which no provider
    accepts for this window (a transcript recorded with a larger window, replayed or
    imported into a smaller one: its reports are about other prompts)."""
    usable = [c for c in candidates if c >= MIN_COUNTED]
    if reported <= 0 or not usable or (window > 0 and reported > window):
        return None
    if current is not None and current != Fit():
        best = min(usable, key=lambda c: abs(math.log(reported / max(1.0, current.predict(c)))))
    else:
        best = min(usable, key=lambda c: abs(math.log(reported / c)))
    return (best, reported)


def remember(samples: list[tuple[int, int]], new: tuple[int, int] | None) -> list[tuple[int, int]]:
    if new is None:
        return samples
    return (samples + [new])[-SAMPLES:]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fit(samples: Sequence[tuple[int, int]], window: int) -> Fit:
    """The line through the newest pairs, bounded (``Fit()`` without any). Computed once
    per set of pairs and window (a session's budget asks for it on every change of its
    figures; the pairs change only with a reply's usage)."""
    if not samples:
        return Fit()
    return _fit(tuple(map(tuple, samples)), window)


@lru_cache(maxsize=256)
def _fit(samples: tuple[tuple[int, int], ...], window: int) -> Fit:
    counted = [c for c, _ in samples]
    reported = [r for _, r in samples]
    max_overhead = int(window * MAX_OVERHEAD_SHARE)
    if len(samples) >= 3 and max(counted) >= MIN_SPREAD * min(counted):
        mean_c = sum(counted) / len(counted)
        mean_r = sum(reported) / len(reported)
        var = sum((c - mean_c) ** 2 for c in counted)
        slope = sum((c - mean_c) * (r - mean_r) for c, r in zip(counted, reported)) / var
        # A slope out of bounds says the pairs are not on one line (a client that sent
        # something else now and then): the bare ratio is the safer reading.
        if LOW <= slope <= HIGH:
            overhead = _median([r - slope * c for c, r in samples])
            if overhead > 0:
                return Fit(round(slope, 4), int(min(max_overhead, overhead)))
    ratio = min(HIGH, max(LOW, _median([r / c for c, r in samples])))
    return Fit(round(ratio, 4), 0)
