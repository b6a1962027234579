"""Summarizing with a model, whatever the size of the input.

The summarizer model has its own window (``settings.context_window``, else what the
server reports, capped, else a conservative 8192). A prompt that does not fit (with
room left for the answer) is split into chunks of whole messages, each chunk is
summarized, and the chunk summaries are merged with one more call, recursively when
they do not fit together either. A single message too big for any chunk has its
middle cut out with a marker. So a summary can always be asked for.
"""

from __future__ import annotations

import logging
import math
import re

import msgspec

from ctxd.llm.base import BackendError, ChatBackend, ChatTurn
from ctxd.llm.settings import BackendSettings
from ctxd.protocol.message import Message
from ctxd.summarize.base import Count, SummarizeError, SummaryRequest, SummaryResult
from ctxd.summarize.prompt import build_prompt, cut_middle, render_messages
from ctxd.summarize.survive import MustSurvive, must_survive

log = logging.getLogger("ctxd.summarize")

DEFAULT_WINDOW = 8192
# A window learned from the server is capped: local servers allocate memory for the
# whole window they are asked for (Ollama's num_ctx), and smaller chunks summarize
# better anyway. A configured context_window is used as given.
MAX_AUTO_WINDOW = 32768
_TURN_OVERHEAD = 4          # tokens a chat template adds per turn
_SAFETY = 0.92              # our tokenizer is not the model's: keep a margin
MIN_ANSWER = 64             # a summary answer shorter than this is not worth a model call
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class _Stats:
    __slots__ = ("calls", "chunks", "input_tokens", "output_tokens")

    def __init__(self) -> None:
        self.calls = 0
        self.chunks = 0
        self.input_tokens = 0
        self.output_tokens = 0


class LLMSummarizer:
    """Summaries written by the model behind ``backend``.

    ``output_ratio`` sets ``max_tokens`` to ``target_tokens × output_ratio`` so a model
    that overshoots a little is not cut mid-sentence. ``max_depth`` bounds merge
    recursion (each level at least halves the number of summaries).
    """

    def __init__(self, backend: ChatBackend, settings: BackendSettings, count: Count, *,
                 output_ratio: float = 1.3, temperature: float = 0.2, max_auto_window: int = MAX_AUTO_WINDOW,
                 max_depth: int = 6) -> None:
        self.backend = backend
        self.settings = settings
        self.name = f"{settings.kind}:{settings.model}"
        self._count = count
        self._output_ratio = output_ratio
        self._temperature = temperature
        self._max_auto_window = max_auto_window
        self._max_depth = max_depth
        self._window: int | None = settings.context_window

    async def window(self) -> int:
        """The summarizer model's window in tokens (asked once from the server, then cached)."""
        if self._window is not None:
            return self._window
        try:
            info = await self.backend.model_info(self.settings.model)
        except BackendError as exc:
            log.warning("cannot ask %s for the window of %s (%s); assuming %d tokens",
                        self.settings.kind, self.settings.model, exc.message, DEFAULT_WINDOW)
            return DEFAULT_WINDOW  # not cached: ask again next time
        window = min(info.context_length, self._max_auto_window) if info.context_length else DEFAULT_WINDOW
        self._window = max(window, 512)
        return self._window

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        window = await self.window()
        stats = _Stats()
        text = await self._summarize(request, window, stats, depth=0)
        return SummaryResult(text=text, summarizer=self.name, input_tokens=stats.input_tokens,
                             output_tokens=stats.output_tokens, chunks=stats.chunks, calls=stats.calls)

    # ---- sizing ---------------------------------------------------------------------

    def max_output(self, target_tokens: int, window: int) -> int:
        """``max_tokens`` for a call: the target with headroom, never more than a quarter window."""
        return max(16, min(math.ceil(target_tokens * self._output_ratio), window // 4))

    def input_budget(self, window: int, max_output: int) -> int:
        """Prompt tokens a call may use, leaving room for the answer and a safety margin."""
        return int((window - max_output) * _SAFETY) - 16

    def prompt_tokens(self, turns: list[ChatTurn]) -> int:
        return sum(self._count(t.content) + _TURN_OVERHEAD for t in turns)

    # ---- work -------------------------------------------------------------------------

    async def _summarize(self, request: SummaryRequest, window: int, stats: _Stats, depth: int) -> str:
        if depth > self._max_depth:
            raise SummarizeError(f"summaries still do not fit the {window}-token window after {depth} merges")
        max_out = self.max_output(request.target_tokens, window)
        budget = self.input_budget(window, max_out)
        original = depth == 0
        # What must survive (the extractive summarizer's salient facts), found once and
        # listed in every call for this request; it counts in each call's overhead.
        must = must_survive(request)
        rendered = render_messages(request, chat=must.chat)
        turns = build_prompt(request, rendered=rendered, must=must)
        if self.prompt_tokens(turns) <= budget:
            return await self._call(turns, max_out, stats, original)
        fitted = self._fit_small_window(request, window, max_out, must)
        if fitted is not None:  # a small window (Ollama's 2048): shorter answers make chunking possible
            request, max_out = fitted
            budget = self.input_budget(window, max_out)
            rendered = render_messages(request, chat=must.chat)
        chunks = self._chunks(request, rendered, budget, max_out, window, must)
        summaries: list[str] = []
        for index, chunk in enumerate(chunks, start=1):
            part = (index, len(chunks))
            text = await self._call(build_prompt(request, rendered=chunk, part=part, must=must), max_out, stats,
                                    original)
            if text:
                summaries.append(text)
        if not summaries:
            return ""
        if len(summaries) == 1:
            return summaries[0]
        merge = SummaryRequest(
            messages=[Message(role="assistant", content=s) for s in summaries],
            level=request.level, target_tokens=request.target_tokens, goal=request.goal,
            focus=request.focus, kind="checkpoint_merge")
        log.debug("merging %d chunk summaries (depth %d)", len(summaries), depth + 1)
        return await self._summarize(merge, window, stats, depth + 1)

    def _fit_small_window(self, request: SummaryRequest, window: int, max_out: int,
                          must: MustSurvive | None = None) -> tuple[SummaryRequest, int] | None:
        """When chunks would not leave room for two answers of ``max_out`` (what merging
        needs), the largest answer size that does, with the target lowered to match; None
        when ``max_out`` already fits or nothing useful does (``_chunks`` says why)."""
        overhead = self.prompt_tokens(build_prompt(request, rendered=[], part=(99, 99), must=must))
        if self.input_budget(window, max_out) - overhead >= 2 * max_out + 64:
            return None
        # input_budget(w, m) - overhead >= 2m + 64, solved for m.
        best = math.floor(((window * _SAFETY) - 16 - overhead - 64) / (2 + _SAFETY))
        while best >= MIN_ANSWER and self.input_budget(window, best) - overhead < 2 * best + 64:
            best -= 1
        if best < MIN_ANSWER:
            return None
        target = max(1, min(request.target_tokens, math.floor(best / self._output_ratio)))
        log.debug("summarizer window %d: answers of at most %d tokens (target %d -> %d)", window, best,
                  request.target_tokens, target)
        return msgspec.structs.replace(request, target_tokens=target), best

    def _chunks(self, request: SummaryRequest, rendered: list[str], budget: int, max_out: int,
                window: int, must: MustSurvive | None = None) -> list[list[str]]:
        """Whole messages packed into chunks that fit ``budget`` with the instructions."""
        overhead = self.prompt_tokens(build_prompt(request, rendered=[], part=(99, 99), must=must))
        available = budget - overhead
        if available < 2 * max_out + 64:
            raise SummarizeError(
                f"the summarizer window ({window} tokens) is too small for a {request.target_tokens}-token "
                f"summary: the instructions take {overhead} tokens and each chunk needs room for two answers")
        chunks: list[list[str]] = []
        current: list[str] = []
        used = 0
        for text in rendered:
            cost = self._count(text) + 2
            if cost > available:
                text = self._shrink(text, available - 2)
                cost = self._count(text) + 2
            if current and used + cost > available:
                chunks.append(current)
                current, used = [], 0
            current.append(text)
            used += cost
        if current:
            chunks.append(current)
        return chunks

    def _shrink(self, text: str, limit: int) -> str:
        """``text`` with its middle cut out so it counts at most ``limit`` tokens."""
        chars = max(200, limit * 3)
        cut = cut_middle(text, chars)
        while self._count(cut) > limit and chars > 200:
            chars = int(chars * 0.8)
            cut = cut_middle(text, chars)
        return cut

    async def _call(self, turns: list[ChatTurn], max_out: int, stats: _Stats, original: bool) -> str:
        reply = await self.backend.chat(turns, max_tokens=max_out, temperature=self._temperature,
                                        context_window=await self.window())
        text = _clean(reply.text)
        stats.calls += 1
        if original:
            stats.chunks += 1
        stats.input_tokens += reply.input_tokens if reply.input_tokens is not None else self.prompt_tokens(turns)
        stats.output_tokens += reply.output_tokens if reply.output_tokens is not None else self._count(text)
        return text


def _clean(text: str) -> str:
    """The answer without reasoning blocks some models put in their content."""
    if "<think>" in text:
        text = _THINK.sub("", text)
        if "<think>" in text:  # unterminated: the answer was all reasoning
            text = text.split("<think>", 1)[0]
    return text.strip()
