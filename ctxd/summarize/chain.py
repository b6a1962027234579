"""Try the model first, fall back to the extractive summarizer when it lets us down.

A model can be down, slow, or answer nonsense; compression must still happen. Each
summarizer but the last runs under an overall timeout and its answer is checked
(``garbage_reason``) before it is accepted; the first acceptable answer wins and
``fallback_reason`` records why earlier ones were passed over. The last summarizer
(normally the extractive one, which cannot fail) is trusted as is. A summarizer whose
backend is down (unreachable, timed out, refusing) is skipped for ``cooldown_seconds``:
one pass ages and merges several checkpoints, and each would otherwise wait out the
timeout again.
Cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from ctxd.llm.base import BackendError
from ctxd.protocol.message import message_text
from ctxd.summarize.base import Count, SummarizeError, Summarizer, SummaryRequest, SummaryResult

log = logging.getLogger("ctxd.summarize")


def garbage_reason(text: str, count: Count, *, input_tokens: int | None, target_tokens: int,
                   max_target_ratio: float = 2.0) -> str | None:
    """Why ``text`` is not a usable summary, or None when it is.

    Unusable: empty, not text-like, mostly repeated lines or words, no shorter than the
    input, or more than ``max_target_ratio`` times the target.
    """
    stripped = text.strip()
    if not stripped:
        return "empty answer"
    visible = [c for c in stripped if not c.isspace()]
    letters = sum(1 for c in visible if c.isalpha())
    if len(visible) >= 20 and letters / len(visible) < 0.35:
        return "not text-like"
    if "\ufffd" in stripped and stripped.count("\ufffd") * 20 > len(stripped):
        return "not text-like"
    lines = [line.strip() for line in stripped.splitlines() if line.strip()]
    if len(lines) >= 6 and len(set(lines)) / len(lines) < 0.5:
        return "mostly repeated lines"
    words = stripped.lower().split()
    if len(words) >= 40 and len(set(words)) / len(words) < 0.15:
        return "mostly repeated words"
    tokens = count(stripped)
    if input_tokens is not None and tokens >= input_tokens:
        return f"not shorter than its input ({tokens} >= {input_tokens} tokens)"
    if tokens > max_target_ratio * target_tokens:
        return f"{tokens} tokens, over {max_target_ratio:g}x the {target_tokens}-token target"
    return None


def _backend_down(exc: BackendError) -> bool:
    """Failures that will repeat for the next summary too: nothing listening, no answer
    in time, server errors that outlived the retries, a key or model the server refuses.
    A 400/413 or a bad answer is about one request; cancellation is ours."""
    if exc.kind in ("unreachable", "timeout"):
        return True
    if exc.kind == "http_status" and exc.status is not None:
        return exc.status >= 500 or exc.status in (401, 403, 404)
    return False


class SummarizerChain:
    """Summarizers tried in order; the last is the dependable fallback.

    ``timeout_seconds`` bounds each summarizer but the last (all its model calls,
    chunking included). ``max_target_ratio`` is the garbage limit on length.
    """

    def __init__(self, summarizers: Sequence[Summarizer], count: Count, *, timeout_seconds: float = 120.0,
                 max_target_ratio: float = 2.0, cooldown_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not summarizers:
            raise ValueError("a summarizer chain needs at least one summarizer")
        self.summarizers = list(summarizers)
        self.name = "chain(" + ",".join(s.name for s in self.summarizers) + ")"
        self._count = count
        self._timeout = timeout_seconds
        self._max_ratio = max_target_ratio
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._down: dict[int, tuple[float, str]] = {}
        """index -> (when it failed, why): skipped until the cool-down has passed."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        reasons: list[str] = []
        last = len(self.summarizers) - 1
        input_tokens: int | None = None
        for index, summarizer in enumerate(self.summarizers):
            if index == last:
                result = await summarizer.summarize(request)
                break
            down = self._down.get(index)
            if down is not None:
                ago = self._clock() - down[0]
                if ago < self._cooldown:
                    reasons.append(f"skipped: {summarizer.name} failed {ago:.0f}s ago ({down[1]}); "
                                   f"tried again {self._cooldown:g}s after")
                    continue
            try:
                async with asyncio.timeout(self._timeout):
                    result = await summarizer.summarize(request)
            except TimeoutError:
                reasons.append(f"timeout: {summarizer.name} gave no summary within {self._timeout:g}s")
                self._down[index] = (self._clock(), "timeout")
            except BackendError as exc:
                reasons.append(f"backend_error: {exc.kind}: {exc.message}")
                if _backend_down(exc):
                    self._down[index] = (self._clock(), exc.kind if exc.status is None else f"HTTP {exc.status}")
            except SummarizeError as exc:
                reasons.append(f"error: {exc}")
            except Exception as exc:  # a bug in one summarizer must not stop compression
                log.exception("summarizer %s failed", summarizer.name)
                reasons.append(f"error: {summarizer.name}: {type(exc).__name__}: {exc}")
            else:
                self._down.pop(index, None)
                if input_tokens is None:
                    input_tokens = self._input_tokens(request)
                why = garbage_reason(result.text, self._count, input_tokens=input_tokens,
                                     target_tokens=request.target_tokens, max_target_ratio=self._max_ratio)
                if why is None:
                    break
                reasons.append(f"garbage: {summarizer.name}: {why}")
            log.warning("summarizer %s not used: %s", summarizer.name, reasons[-1])
        if reasons:
            result.fallback_reason = "; ".join(reasons)
        return result

    def _input_tokens(self, request: SummaryRequest) -> int:
        return self._count("\n".join(message_text(m) for m in request.messages))
