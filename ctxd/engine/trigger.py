"""When to compress: the trigger, the loop guard, and what a pass costs (layer 3's first question).

:func:`decide` is asked after every change that grows the conversation (a push, an
import) and before a prompt is rendered. A pass runs when the window forces it (the
conversation is over the trigger, or the prompt no longer fits) and, where the session's
provider caches prompts (:class:`Economy`), also earlier when it pays: the provider's
cache has expired (the next request is billed whole anyway), or the tokens it saves
over the coming requests outweigh what it breaks (``engine/billing.py``). Every pass but
one the prompt needs to fit waits for the loop guard: the conversation grew by
``compression.min_growth_fraction`` of available since the last pass. Pure: figures in,
a decision out; the service schedules the pass (``service/compression.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ctxd.engine.billing import CacheRules, worth_a_pass
from ctxd.engine.context import CompressionState
from ctxd.engine.policy import CompressionPolicy
from ctxd.protocol.context import Budget


@dataclass(frozen=True)
class Decision:
    compress: bool
    reason: str
    skip_kind: str | None = None
    """Set when the trigger was passed but compression may not run: worth telling clients."""


@dataclass(frozen=True)
class Economy:
    """What a session's prompts cost, for a provider that caches them (``service/billing.py``)."""

    rules: CacheRules
    growth: float = 0.0
    """Tokens (ctxd's count) the conversation grows by per request; 0 while unknown."""
    summary_price: float = 0.0
    """What a pass's own requests cost per token they summarize (an LLM summary reads what
    it summarizes), in the session's uncached input tokens; 0 for ctxd's own summarizer."""
    cold: bool = False
    """The provider's cache of the last prompt has expired."""
    floor: int = 0
    """What a pass cannot take the conversation below (ctxd's count): the user's words it
    keeps verbatim (within their share). Where they exceed the low-water mark, a pass
    frees only what is above them."""


def low_water(policy: CompressionPolicy, budget: Budget, economy: Economy | None = None) -> int:
    """Where a pass leaves the conversation: the low-water mark, kept a loop guard's step
    below the trigger (a session whose own trigger is set lower than the mark would
    otherwise have passes that free nothing). Where the provider caches, as deep as passes
    pay (:func:`cached_depth`), between ``policy.low_water_fraction`` (the deepest) and
    ``policy.room_fraction`` (the quality-first mark)."""
    ceiling = budget.trigger_fraction - policy.min_growth_fraction
    share = min(policy.low_water_fraction, ceiling)
    if economy is not None and economy.rules.caches:
        share = cached_depth(policy, budget, economy)
    return math.floor(max(0.0, share) * budget.available)


def cached_depth(policy: CompressionPolicy, budget: Budget, economy: Economy) -> float:
    """The low-water mark where the provider caches, as a share of available. A pass that
    leaves ``L`` tokens below the trigger ``T`` bills the ``L`` it rewrites again (``w'``
    more than reading them) once per ``(T - L) / g`` requests, and the prompt averages
    ``(T + L) / 2``, read at ``r`` per request: per request ``r (T + L) / 2 + g w' L / (T - L)``.
    Deeper is always cheaper, but past ``T - L = sqrt(2 g w' T / r)`` a pass's share falls
    under what reading the extra tokens costs, and only the reads are left to save: that
    is the depth, no shallower than the quality-first mark and no deeper than the floor. A
    chat growing 30 tokens a request at 32k stays at the quality-first mark; an agent
    growing a thousand goes to the floor. Unknown growth: the quality-first mark."""
    ceiling = min(policy.room_fraction, budget.trigger_fraction - policy.min_growth_fraction)
    floor = min(policy.low_water_fraction, ceiling)
    rules = economy.rules
    if economy.growth <= 0 or rules.read <= 0 or budget.available <= 0:
        return ceiling
    trigger = budget.trigger_fraction * budget.available
    step = math.sqrt(2.0 * economy.growth * rules.rewrite * trigger / rules.read)
    return min(ceiling, max(floor, (trigger - step) / budget.available))


def room_to_make(policy: CompressionPolicy, budget: Budget, economy: Economy | None) -> int:
    """Tokens a pass that summarized all it could must still free from the summaries so the
    next pass is ``policy.pass_interval`` requests away, where the provider caches: each
    pass rewrites the prompt from the oldest thing it changes, and a schedule bounded by
    what the user's words and the newest turns leave (an agent growing by a few percent
    of the window a request) compresses every few requests. Only growth that large binds:
    a chat of tens of tokens a request already has that room after any pass (a loop
    guard's step). 0: no cache, unknown growth, or the room is there."""
    if economy is None or not economy.rules.caches or policy.pass_interval <= 0 or economy.growth <= 0:
        return 0
    wanted = math.ceil(policy.pass_interval * economy.growth)
    return max(0, wanted - (budget.trigger_at - budget.used))


def append_room(budget: Budget, policy: CompressionPolicy, *, caches: bool) -> int:
    """Tokens (ctxd's count) the conversation can grow by, in pushes, while :func:`decide`
    cannot start a pass and the prompt still fits: the trigger, an early pass where the
    provider caches (none below ``policy.room_fraction`` of available) and the prompt's
    room all allow it. Until then the next prompt is this one with the new messages
    appended, which lets a client that sends the conversation itself send its next
    request before ctxd answers (``ctxd proxy``). The loop guard only delays passes: it
    is not counted. Pins taken from the growth (``current``) lower available by what
    they hold and the trigger by less, so the same bound holds for them."""
    room = budget.max_prompt_tokens - budget.prompt_tokens
    if policy.auto:
        room = min(room, budget.trigger_at - budget.used)
        if caches:
            room = min(room, math.floor(policy.room_fraction * budget.available) - 1 - budget.used)
    return max(0, room)


def decide(state: CompressionState, budget: Budget, policy: CompressionPolicy,
           economy: Economy | None = None) -> Decision:
    """Whether automatic compression should run now."""
    fits = budget.prompt_tokens <= budget.max_prompt_tokens
    if budget.used <= budget.trigger_at and fits:
        if economy is None or not policy.auto:
            return Decision(False, "below the trigger")
        return _early(state, budget, policy, economy)
    if not policy.auto:
        return Decision(False, "automatic compression is off for this session", "auto-off")
    last = state.last_after_used
    if fits and last is not None:
        needed = last + math.ceil(policy.min_growth_fraction * budget.available)
        if budget.used < needed:
            return Decision(False, f"the conversation grew to {budget.used} tokens since the last compression "
                                   f"left {last}; waiting for {needed} (no compaction loops)", "growth")
    return Decision(True, "over the trigger" if fits else "the prompt no longer fits")


def weighs_economy(state: CompressionState, budget: Budget, policy: CompressionPolicy) -> bool:
    """Whether :func:`decide` looks at an :class:`Economy` here: below the trigger, with
    automatic compression on, a loop guard's step past the last pass and past the
    quality-first mark. Elsewhere it decides the same without one, so a push (every
    request's path, ``compression.schedule``) gathers none."""
    if budget.used > budget.trigger_at or budget.prompt_tokens > budget.max_prompt_tokens or not policy.auto:
        return False
    step = math.ceil(policy.min_growth_fraction * budget.available)
    last = state.last_after_used
    # (the conditions on which :func:`_early` answers before it reads the economy)
    return not ((last is not None and budget.used < last + step)
                or budget.used < math.floor(policy.room_fraction * budget.available))


def _early(state: CompressionState, budget: Budget, policy: CompressionPolicy, economy: Economy) -> Decision:
    """Below the trigger, for a provider that caches: a pass when it pays, never before the
    loop guard's step (from the last pass, and above where this pass would leave it), and
    only once the conversation fills the window to the quality-first mark
    (``policy.room_fraction``): cost alone never leaves a window mostly unused."""
    step = math.ceil(policy.min_growth_fraction * budget.available)
    # (where the pass really leaves the conversation: never below the user's kept words)
    target = max(low_water(policy, budget, economy), economy.floor)
    grown = budget.used - target
    last = state.last_after_used
    if grown < step or (last is not None and budget.used < last + step) or \
            budget.used < math.floor(policy.room_fraction * budget.available):
        return Decision(False, "below the trigger")
    if economy.cold:
        return Decision(True, "the provider's prompt cache has expired: a pass now breaks nothing cached")
    ratio = budget.token_ratio
    # The pass rewrites what follows the checkpoints already sent: the conversation it leaves.
    if worth_a_pass(round(grown * ratio), round(target * ratio), economy.summary_price * grown * ratio,
                    economy.growth * ratio, economy.rules):
        return Decision(True, f"compressing now ({budget.used} tokens, {grown} above where a pass leaves the "
                              f"conversation) costs less over the coming requests than the cache it breaks")
    return Decision(False, "below the trigger")
