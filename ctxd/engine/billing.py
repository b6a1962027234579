"""What a prompt costs where providers cache prompt prefixes, as pure functions.

A provider bills a request's input in up to three parts: tokens read from its prompt
cache (a fraction of the input price: ``read``), tokens written to it (Anthropic charges
``write`` = 1.25x for those), and the rest at the input price. What can be read is the
longest prefix the request shares with an earlier one whose cache entry still lives
(``ttl_seconds`` since it was last used), rounded down to the provider's step and only
from ``min_tokens`` on. A compression pass shortens the prompt but rewrites it from the
first token it changes: everything after that point is billed again as new input.

* :class:`CacheRules`: one provider's (or model's) rules, from ``[billing]``.
* :func:`split`: the bill of one prompt, knowing how much of its start was sent before.
* :func:`worth_a_pass` and :func:`cycle_turns`: whether compressing now pays, from the
  session's growth per request (``engine/trigger.py`` asks).

Units: a :class:`Bill`'s ``billed`` is in *uncached input tokens*: 1,000 tokens read from
an Anthropic cache bill like 100 uncached ones. ``input_price`` (USD per million input
tokens) turns that into money where it is known.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

CacheKind = Literal["none", "automatic", "breakpoints"]


@dataclass(frozen=True)
class CacheRules:
    """How one provider bills and caches a prompt (``config.BillingRules`` fills it)."""

    provider: str = "none"
    cache: CacheKind = "none"
    """``automatic``: every request's prefix is cached (OpenAI, DeepSeek); ``breakpoints``:
    up to the request's cache breakpoints (Anthropic); ``none``: nothing is cached."""
    min_tokens: int = 1024
    """The shortest prefix the provider caches."""
    step: int = 1
    """A cached prefix is a multiple of this many tokens (OpenAI: 128)."""
    read: float = 1.0
    """Price of a token read from the cache, as a multiple of the input price."""
    write: float = 1.0
    """Price of a token written to the cache (Anthropic: 1.25)."""
    ttl_seconds: float = 300.0
    """How long an unused cache entry lives."""
    max_breakpoints: int = 0
    input_price: float = 0.0
    """USD per million uncached input tokens (0: unknown, or free)."""

    @property
    def caches(self) -> bool:
        """Whether a kept prefix bills less than a new one (else passes cost no cache)."""
        return self.cache != "none" and self.read < self.write

    @property
    def rewrite(self) -> float:
        """What a token that was cached costs more once a pass moved it: written (or sent
        uncached) instead of read."""
        return max(0.0, self.write - self.read) if self.caches else 0.0


NO_CACHE = CacheRules()


@dataclass(frozen=True)
class ModelRules:
    """A model's exceptions to its provider's rules (``[billing.models]``): None keeps the
    provider's value; ``provider`` names whose rules the model follows (a DeepSeek model
    spoken to through the OpenAI API bills like DeepSeek)."""

    provider: str | None = None
    min_tokens: int | None = None
    read: float | None = None
    write: float | None = None
    input_price: float | None = None


@dataclass(frozen=True)
class BillingTable:
    """Every provider's rules and the models' exceptions."""

    providers: Mapping[str, CacheRules] = field(default_factory=dict)
    models: Mapping[str, ModelRules] = field(default_factory=dict)

    def rules(self, provider: str | None, model: str | None) -> CacheRules:
        """The rules of a session: its model's entry (longest matching prefix) on top of its
        provider's; a session whose provider is not in the table is matched by its model's
        name (``claude-*``: anthropic, ``gpt-*``/``o1``/``o3``/``o4``: openai, ``deepseek*``);
        anything else caches nothing and has no price."""
        name = (model or "").lower().split("/")[-1]
        entry = None
        best = -1
        for prefix, rules in self.models.items():
            if name.startswith(prefix.lower()) and len(prefix) > best:
                entry, best = rules, len(prefix)
        chosen = entry.provider if entry is not None and entry.provider else None
        if chosen is None:
            given = (provider or "").lower()
            chosen = given if given in self.providers else _provider_of(name)
        base = self.providers.get(chosen or "", None)
        if base is None:
            return NO_CACHE
        if entry is None:
            return base
        return CacheRules(
            provider=base.provider, cache=base.cache,
            min_tokens=base.min_tokens if entry.min_tokens is None else entry.min_tokens,
            step=base.step, read=base.read if entry.read is None else entry.read,
            write=base.write if entry.write is None else entry.write, ttl_seconds=base.ttl_seconds,
            max_breakpoints=base.max_breakpoints,
            input_price=base.input_price if entry.input_price is None else entry.input_price)


_BY_NAME = (("claude", "anthropic"), ("gpt-", "openai"), ("chatgpt", "openai"), ("o1", "openai"),
            ("o3", "openai"), ("o4", "openai"), ("deepseek", "deepseek"))


def _provider_of(model: str) -> str | None:
    return next((p for prefix, p in _BY_NAME if model.startswith(prefix)), None)


@dataclass(frozen=True)
class Bill:
    """One request's input (or a sum of them), in tokens as the provider counts them."""

    uncached: int = 0
    written: int = 0
    """Written to the cache (billed at ``write``)."""
    read: int = 0
    """Read from the cache (billed at ``read``)."""

    @property
    def tokens(self) -> int:
        return self.uncached + self.written + self.read

    def billed(self, rules: CacheRules) -> float:
        """In uncached input tokens."""
        return self.uncached + rules.write * self.written + rules.read * self.read

    def __add__(self, other: Bill) -> Bill:
        return Bill(self.uncached + other.uncached, self.written + other.written, self.read + other.read)


def cached_prefix(kept: int, rules: CacheRules) -> int:
    """Of a prefix of ``kept`` tokens sent before (while the cache lived), what the
    provider reads from its cache."""
    if rules.cache == "none" or kept < rules.min_tokens:
        return 0
    return kept - kept % max(1, rules.step)


def split(prompt: int, kept: int, rules: CacheRules) -> Bill:
    """The bill of a prompt of ``prompt`` tokens whose first ``kept`` were the start of an
    earlier request still in the cache (0 when the cache expired). With breakpoints the
    rest is written to the cache (ctxd and the proxy put one on the last message); a
    prompt too short to cache is all uncached."""
    read = cached_prefix(min(max(0, kept), prompt), rules)
    if rules.cache == "breakpoints" and prompt >= rules.min_tokens:
        return Bill(0, prompt - read, read)
    return Bill(prompt - read, 0, read)


def money(units: float, rules: CacheRules) -> float | None:
    """``units`` (uncached input tokens) in USD, when the price is known."""
    return units * rules.input_price / 1e6 if rules.input_price > 0 else None


# --- when a pass pays --------------------------------------------------------------------


def pass_cost(rewritten: int, summary_cost: float, rules: CacheRules) -> float:
    """What a pass costs beyond the requests it shortens, in uncached input tokens: the
    ``rewritten`` tokens of the prompt after it that the cache would otherwise have served
    (they are billed again as new input), plus the pass's own requests (an LLM summary)."""
    return rules.rewrite * max(0, rewritten) + max(0.0, summary_cost)


def cycle_turns(rewritten: int, summary_cost: float, growth: float, rules: CacheRules) -> float | None:
    """The conversation's growth between passes that costs least per request, ``sqrt(2 g C / r)``:
    passes every ``D`` tokens cost ``C`` each (:func:`pass_cost`) and let the prompt
    average ``D / 2`` more tokens, each read at ``r`` per request; ``g`` tokens come per
    request. In tokens; None when nothing is cached or the growth is unknown."""
    if not rules.caches or growth <= 0 or rules.read <= 0:
        return None
    cost = pass_cost(rewritten, summary_cost, rules)
    return math.sqrt(2.0 * growth * cost / rules.read)


def worth_a_pass(grown: int, rewritten: int, summary_cost: float, growth: float, rules: CacheRules) -> bool:
    """Whether compressing now costs less over the coming requests than waiting: the
    conversation is ``grown`` tokens above where a pass would leave it, and at ``growth``
    tokens per request the reads of those extra tokens until the next pass outweigh what
    the pass breaks and costs (:func:`cycle_turns`)."""
    best = cycle_turns(rewritten, summary_cost, growth, rules)
    return best is not None and grown >= best


# --- a session's running figures -----------------------------------------------------------


GROWTH_SAMPLES = 8
"""Requests over which a session's growth per request is measured."""


@dataclass
class Pending:
    """The estimate of the last prompt handed out, until the push that follows it (its
    reply, with the provider's usage when the client passes it on) adds it to the totals."""

    ctxd: Bill
    direct: Bill
    """Both as estimated when the prompt was handed out (what ``context/prompt`` says)."""
    rules: CacheRules
    after_pass: bool = False
    pass_cost: float = 0.0
    whole: bool = False
    """ctxd's prompt was the client's whole history (nothing compressed yet): direct's
    request is the same request, and so is its estimate."""
    cold: bool = False
    grown: int = 0
    """What the history grew by since the request ``Tracker.direct`` was taken at (the
    provider's count): a direct request grows by what is added to it."""
    history: int = 0
    """The history's size (ctxd's count) at this prompt."""


@dataclass
class Tracker:
    """What a session's billing remembers between prompts (in memory: after a restart the
    first prompt is priced as if nothing were cached, which is what the provider sees
    after five minutes anyway)."""

    pieces: list[tuple[object, int]] = field(default_factory=list)
    """The last prompt's pieces (``ActiveContext.prompt_pieces``)."""
    pieces_tokens: int = 0
    """Their tokens, summed as they are added (a turn's prompt does not walk them all)."""
    shape: tuple[object, ...] | None = None
    recent: int = 0
    """How many recent messages the last prompt had (pushes only append to them)."""
    prompt: int = 0
    """The last prompt's size (provider count)."""
    direct: int = 0
    """The size the client's own request had at the last request billed (provider count):
    ctxd's estimate of its own request while it sent the whole history, then grown by what
    was pushed since, at the budget's ratio (a direct request grows by what is added to it)."""
    direct_history: int = 0
    """The history's size (ctxd's count) when ``direct`` was taken."""
    direct_estimate: int = 0
    """The same size as estimated at the last prompt, for the next prompt's estimate (one
    scale: a report and an estimate can differ, e.g. before calibration learned)."""
    estimate_history: int = 0
    """The history's size (ctxd's count) when ``direct_estimate`` was taken: the next
    prompt's estimate grows by what was pushed since, not since the last reply."""
    at: float | None = None
    """When the last prompt was handed out (``time.monotonic``)."""
    passes: int = 0
    """Passes that changed the context so far (``service/compression.py`` counts them)."""
    passes_seen: int = 0
    """``passes`` at the last prompt."""
    history: list[int] = field(default_factory=list)
    """The history's size at the newest prompts (the growth per request)."""
    pending: Pending | None = None
    head: tuple[str | None, int] = (None, 0)
    """The system prompt last counted and its tokens."""

    def growth(self) -> float:
        """Tokens the history grew by per request, over the newest requests (0: not known yet)."""
        if len(self.history) < 3:
            return 0.0
        return (self.history[-1] - self.history[0]) / (len(self.history) - 1)

    def remember(self, history: int) -> None:
        self.history = (self.history + [history])[-(GROWTH_SAMPLES + 1):]

    def cold(self, now: float, rules: CacheRules) -> bool:
        """Whether the provider's cache of the last prompt has expired (unknown: not cold)."""
        return self.at is not None and now - self.at > rules.ttl_seconds


def common_prefix(before: list[tuple[object, int]], after: list[tuple[object, int]]) -> int:
    """Tokens of the pieces two prompts share from their start."""
    total = 0
    for (a, tokens), (b, _) in zip(before, after):
        if a != b:
            break
        total += tokens
    return total


def measured(usage: object, rules: CacheRules) -> Bill | None:
    """A request's bill from the usage its reply reported (``protocol.message.Usage``), or
    None when it does not say what was cached: Anthropic reports cache reads and writes
    beside ``input_tokens``, OpenAI and DeepSeek the cached part of theirs; a provider that
    caches nothing bills all its input uncached."""
    input_tokens = getattr(usage, "input_tokens", None)
    if input_tokens is None:
        return None
    read = getattr(usage, "cache_read_tokens", None)
    written = getattr(usage, "cache_write_tokens", None)
    if read is not None or written is not None:
        return Bill(input_tokens, written or 0, read or 0)
    cached = getattr(usage, "cached_input_tokens", None)
    if cached is not None:
        cached = min(cached, input_tokens)
        return Bill(input_tokens - cached, 0, cached)
    if rules.cache == "none":
        return Bill(input_tokens, 0, 0)
    return None
