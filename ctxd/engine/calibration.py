"""Budgets that match the provider: learning how the provider counts tokens.

ctxd counts with tiktoken; the provider counts with its own tokenizer, and adds what
the client sent beside the pushed messages (tool schemas, a system prompt it never
pushed, its own framing). When a pushed message carries provider usage, the input
tokens the provider reported are paired with ctxd's count of what was sent for that
call. ctxd cannot know whether the client sent ctxd's prompt or its whole history, so
the pair uses whichever of the two the current fit (or, before there is one, the bare
ratio) says the report is nearer to; when ctxd handed out a prompt since the last reply,
that prompt's size is ctxd's side instead (a pass may have run in between).

From the newest pairs a line is fitted, ``reported = ratio * counted + overhead`` (its slope
robust to a report off the others: ``_slope``), and
the budget gives the conversation the provider's room less the overhead, divided by the
ratio (``Budget.tokenRatio``, ``tokenOverhead``). The overhead is what the provider counts
beside ctxd's count: the client's system prompt and tool schemas (Claude Code's ~18k),
its framing of every message. It is measured at the newest calls, so the prediction for
the next call is close whatever the line's slope. The ratio (what one more token of
ctxd's count costs at the provider) is only learned from counts that spread over a share
of the window (``LEARN_SPAN``): a slope measured over a few thousand tokens beside an 18k
constant, extrapolated over a 200k window, mostly measures the client's per-call framing,
and halved the window. Until then the ratio is 1 and the overhead carries the difference
at the newest calls, which is exact there; it is learned as the conversation grows,
long before the prompt nears the window. A provider that counts less than ctxd (a more
efficient tokenizer) gets a ratio below 1 and no overhead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

SAMPLES = 8
"""Pairs kept: the newest few follow a change of model or client within a few turns."""
MIN_COUNTED = 1
"""Calls with less than this counted teach nothing (an empty prompt: no ratio in it)."""
LOW, HIGH = 0.8, 2.0
"""Bounds of the ratio: a wild report never halves the window more than this."""
MAX_OVERHEAD_SHARE = 0.5
"""The overhead never takes more than this share of the window: an agent's tool
definitions can take over a third of a small one (Claude Code's ~20k at a 48k window)."""
LEARN_SPAN = 0.1
"""The counts of the pairs must spread over this share of the window before a ratio other
than 1 is fitted (or ``MIN_LEARN_SPAN`` tokens in a small window)."""
MIN_LEARN_SPAN = 512
LEVEL = 3
"""The overhead is the median over the newest this many pairs of what the line leaves."""
PARTIAL = 0.5
"""A report of less than this share of ctxd's count is not the prompt's size: a runtime
that counted only what its cache did not hold (older Ollama versions)."""


@dataclass(frozen=True)
class Fit:
    ratio: float = 1.0
    overhead: int = 0

    def predict(self, counted: int) -> float:
        return self.ratio * counted + self.overhead


def teaches(counted: int, reported: int, window: int = 0) -> bool:
    """Whether a ``(counted, reported)`` pair says anything about what the provider counts
    (the rules of :func:`pair`, for pairs learned elsewhere: ``session/create``'s
    ``usageSamples``)."""
    return (counted >= MIN_COUNTED and reported > 0 and not (window > 0 and reported > window)
            and reported >= PARTIAL * counted)


def pair(reported: int, candidates: tuple[int, ...], current: Fit | None, window: int = 0) -> tuple[int, int] | None:
    """``(counted, reported)`` for one usage report, or None when it teaches nothing: also
    when it reports more input than the session's ``window`` holds, which no provider
    accepts for this window (a transcript recorded with a larger window, replayed or
    imported into a smaller one: its reports are about other prompts), or much less
    than ctxd counted (``PARTIAL``)."""
    usable = [c for c in candidates if c >= MIN_COUNTED]
    if reported <= 0 or not usable or (window > 0 and reported > window):
        return None
    if current is not None and current != Fit():
        best = min(usable, key=lambda c: abs(math.log(reported / max(1.0, current.predict(c)))))
    else:
        best = min(usable, key=lambda c: abs(math.log(reported / c)))
    return (best, reported) if teaches(best, reported, window) else None


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


def _slope(samples: tuple[tuple[int, int], ...], window: int) -> float:
    """The fitted ratio over pairs whose counts spread enough (see the module doc),
    bounded; else 1. The median of the slopes between every two pairs, each weighted by
    how far apart their counts are (a weighted Theil-Sen line): one report off the others
    (paired with another prompt than the one it was for, a provider's odd count) moves it
    little, where a least-squares line followed it, up to the bound that halves the
    window; on a line, the same slope."""
    counted = [c for c, _ in samples]
    if len(samples) < 3 or max(counted) - min(counted) < max(MIN_LEARN_SPAN, LEARN_SPAN * window):
        return 1.0
    slopes: list[tuple[float, int]] = []
    for i, (c1, r1) in enumerate(samples):
        for c2, r2 in samples[i + 1:]:
            if c2 != c1:
                slopes.append(((r2 - r1) / (c2 - c1), abs(c2 - c1)))
    slopes.sort()
    half, seen = sum(w for _, w in slopes) / 2, 0
    for slope, weight in slopes:
        seen += weight
        if seen >= half:
            return min(HIGH, max(LOW, slope))
    return 1.0  # (unreachable: the counts spread, so some two differ)


@lru_cache(maxsize=256)
def _fit(samples: tuple[tuple[int, int], ...], window: int) -> Fit:
    ratio = _slope(samples, window)
    newest = samples[-LEVEL:]
    overhead = _median([r - ratio * c for c, r in newest])
    if overhead < 0:
        # The provider counts less than ctxd at the newest calls: a leaner tokenizer, read
        # as a ratio below 1 (a negative constant would give more room the smaller the prompt).
        return Fit(round(min(HIGH, max(LOW, _median([r / c for c, r in newest]))), 4), 0)
    return Fit(round(ratio, 4), int(min(int(window * MAX_OVERHEAD_SHARE), overhead)))
