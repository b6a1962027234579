"""What a session's requests cost where providers cache prompts, through ctxd and as the
client's own requests would have cost (``engine/billing.py`` for the rules and sums).

A request is a prompt handed out (``context/prompt``) and the push that follows it: the
reply, whose usage (when the client passes the provider's on, as ``ctxd proxy`` does) is
kept beside ctxd's estimate of it. Both sides of the comparison are estimated by one rule
(a provider reports ctxd's requests only: one side reported against the other estimated
would count a cache miss, or a provider's own block rules, against ctxd alone). ctxd's: the pieces of the prompt it
shares from the start with the previous prompt (the system part, checkpoints, messages
as sent) were cached while the provider's entry lives (``ttl_seconds``); the rest is
written (Anthropic) or sent uncached. Direct's: the client resends its whole history,
whose previous request is its cached prefix. Both are in the provider's count (the
budget's calibration, ``ratio x ctxd's count + overhead``).

Also here: the figures a pass decision needs (:func:`economy`: the session's growth per
request, whether the cache has expired) and what ``context/stats`` shows (:func:`session_bill`).
"""

from __future__ import annotations

import math
import time

from ctxd.engine.billing import Bill, CacheRules, Pending, Tracker, common_prefix, measured, money, split
from ctxd.engine.context import ActiveContext
from ctxd.engine.trigger import Economy
from ctxd.models import model_facts
from ctxd.protocol.context import Budget, InputBill, RequestBill, SessionBill
from ctxd.protocol.message import Usage
from ctxd.service.core import Service
from ctxd.service.state import SessionState
from ctxd.store.sessions import BillTotals
from ctxd.tokens import PROMPT_PRIMING


def _provider(count: int, budget: Budget) -> int:
    """ctxd's count as the provider counts it (the budget's calibration)."""
    if count <= 0:
        return 0
    return round(budget.token_ratio * count) + budget.token_overhead


def _input(bill: Bill, rules: CacheRules) -> InputBill:
    billed = bill.billed(rules)
    usd = money(billed, rules)
    return InputBill(uncached=bill.uncached, cache_write=bill.written, cache_read=bill.read,
                     billed=round(billed, 1), usd=None if usd is None else round(usd, 6))


def _head_tokens(state: SessionState) -> int:
    """The client's system prompt alone (direct sends no goal block or checkpoints)."""
    tracker = state.billing
    text = state.row.system_prompt
    if tracker.head[0] != text:
        tracker.head = (text, state.counter.count(text) + 3 if text else 0)
    return tracker.head[1]


def on_prompt(svc: Service, state: SessionState, ctx: ActiveContext, tokens: int,
              shape: tuple[object, ...]) -> RequestBill:
    """A prompt of ``tokens`` (ctxd's count) is handed out: its expected bill and direct's,
    kept until the push that follows it. The caller holds the session lock."""
    tracker = state.billing
    rules = svc.cache.rules(state)
    budget = svc.cache.budget(state)
    now = time.monotonic()
    cold = tracker.at is None or tracker.cold(now, rules)
    if tracker.shape == shape and len(ctx.recent) >= tracker.recent and tracker.pieces:
        # Only pushes since: the previous prompt is this one's start.
        kept = tracker.pieces_tokens
        added = [(("recent", e.seq, e.view_tokens), e.view_tokens)
                 for e in ctx.recent[tracker.recent:] if e.view is not None]
        tracker.pieces += added
        tracker.pieces_tokens += sum(t for _, t in added)
    else:
        pieces = ctx.prompt_pieces()
        kept = common_prefix(tracker.pieces, pieces)
        tracker.pieces = pieces
        tracker.pieces_tokens = sum(t for _, t in pieces)
    history = state.row.stats.drift.history_context
    prompt = _provider(tokens, budget)
    ctxd = split(prompt, 0 if cold else min(prompt, _provider(kept, budget)), rules)
    # Direct: the client's whole history. While ctxd sends all of it (nothing compressed),
    # the same request as ctxd's; after, the previous direct request grown by what was
    # pushed since (anchored on what the provider reported, not on a fresh estimate).
    left_out = PROMPT_PRIMING + _head_tokens(state) + history - tokens
    whole = left_out <= 0 and state.cstate.boundary == 0 and not state.cstate.prunes and not state.cstate.clips
    grown = max(0, round(budget.token_ratio * (history - tracker.direct_history)))
    since = max(0, round(budget.token_ratio * (history - tracker.estimate_history)))
    if whole or not tracker.direct_estimate:
        direct_size = prompt + (0 if whole else _provider(left_out, budget) - budget.token_overhead)
    else:
        direct_size = tracker.direct_estimate + since
    # (the same request while whole: the same estimate, whatever calibration learned since)
    direct = ctxd if whole else split(direct_size, 0 if cold else min(direct_size, tracker.direct_estimate), rules)
    passed = tracker.passes != tracker.passes_seen and tracker.at is not None
    cost = 0.0
    if passed and not cold:
        # What the previous request had cached and this one bills again (new messages aside).
        cost = rules.rewrite * max(0, min(tracker.prompt, prompt - since) - ctxd.read)
    tracker.pending = Pending(ctxd, direct, rules, after_pass=passed, pass_cost=cost, whole=whole, cold=cold,
                              grown=grown, history=history)
    tracker.shape, tracker.recent, tracker.prompt = shape, len(ctx.recent), prompt
    tracker.direct_estimate, tracker.estimate_history = direct_size, history
    tracker.at, tracker.passes_seen = now, tracker.passes
    tracker.remember(history)
    totals = state.row.stats.bill
    return RequestBill(ctxd=_input(ctxd, rules), direct=_input(direct, rules),
                       session_billed=round(totals.ctxd_billed + ctxd.billed(rules), 1),
                       session_direct=round(totals.direct_billed + direct.billed(rules), 1),
                       session_requests=totals.requests + 1, session_measured=totals.measured,
                       session_reported=round(totals.reported_billed, 1),
                       session_reported_estimate=round(totals.reported_estimate, 1))


def accrue(state: SessionState, bill: BillTotals, usage: Usage | None) -> None:
    """The push after a prompt: that request's bill joins the session's totals (``bill``,
    the copy the push's transaction stores), both sides as estimated; the provider's
    report of ctxd's side, when ``usage`` says what was cached, beside them. Runs in the
    push's write job."""
    pending = state.billing.pending
    if pending is None:
        return
    state.billing.pending = None
    rules = pending.rules
    reported = measured(usage, rules) if usage is not None else None
    ctxd = pending.ctxd
    direct = _direct(state.billing, pending)
    bill.requests += 1
    bill.ctxd = _add(bill.ctxd, ctxd)
    bill.direct = _add(bill.direct, direct)
    bill.ctxd_billed += ctxd.billed(rules)
    bill.direct_billed += direct.billed(rules)
    if reported is not None:
        bill.measured += 1
        bill.reported = _add(bill.reported, reported)
        bill.reported_billed += reported.billed(rules)
        bill.reported_estimate += ctxd.billed(rules)
    if pending.after_pass:
        bill.passes += 1
        bill.pass_cost += pending.pass_cost
    bill.last = (_triple(ctxd), _triple(direct), reported is not None)
    bill.last_reported = None if reported is None else _triple(reported)


def _direct(tracker: Tracker, pending: Pending) -> Bill:
    """Direct's bill for the totals: ctxd's own request while it was the client's whole
    history (the same request, the same estimate), else the previous direct request grown
    by what was pushed; its cached prefix the previous direct request (the next one's, had
    it gone direct)."""
    if pending.whole:
        size = pending.ctxd.tokens
        bill = pending.ctxd
    else:
        size = tracker.direct + pending.grown if tracker.direct else pending.direct.tokens
        bill = split(size, 0 if pending.cold else min(size, tracker.direct), pending.rules)
    tracker.direct, tracker.direct_history = size, pending.history
    return bill


def _triple(bill: Bill) -> tuple[int, int, int]:
    return (bill.uncached, bill.written, bill.read)


def _add(total: tuple[int, int, int], bill: Bill) -> tuple[int, int, int]:
    return (total[0] + bill.uncached, total[1] + bill.written, total[2] + bill.read)


def economy(svc: Service, state: SessionState) -> Economy | None:
    """What a pass decision weighs for this session (None: its provider caches nothing, so a
    pass breaks no cache and the quality-first schedule applies)."""
    rules = svc.cache.rules(state)
    if not rules.caches:
        return None
    tracker = state.billing
    return Economy(rules=rules, growth=tracker.growth(), summary_price=summary_price(svc, state, rules),
                   cold=tracker.cold(time.monotonic(), rules), floor=_kept_words(svc, state))


def _kept_words(svc: Service, state: SessionState) -> int:
    """The user's words a pass keeps verbatim behind the boundary (within
    ``compression.user_share`` of the largest prompt): what no pass frees (0 while the
    context is not loaded)."""
    ctx = state.ctx
    if ctx is None:
        return 0
    share = svc.cache.policy(state).user_share
    return min(ctx.user_tokens, math.floor(share * svc.cache.budget(state).max_prompt_tokens))


def summary_price(svc: Service, state: SessionState, rules: CacheRules) -> float:
    """What an LLM summary costs per token it reads, in the session's uncached input tokens:
    its model's input price over the session's (1 when either is unknown and the summary
    model is billed at all); 0 for the extractive summarizer and local servers."""
    settings = svc.summarizers.settings
    if settings is None:
        return 0.0
    theirs = svc.cache.billing.rules(settings.kind, settings.model or state.row.model)
    if theirs.cache == "none" and theirs.input_price == 0:
        return 0.0
    if theirs.input_price > 0 and rules.input_price > 0:
        return theirs.input_price / rules.input_price
    return 1.0


def session_bill(svc: Service, state: SessionState) -> SessionBill:
    """The session's bill for ``context/stats`` (requests whose push came; the newest
    prompt's estimate is added while its reply has not)."""
    rules = svc.cache.rules(state)
    totals = state.row.stats.bill
    ctxd_triple, direct_triple = totals.ctxd, totals.direct
    ctxd_billed, direct_billed, requests = totals.ctxd_billed, totals.direct_billed, totals.requests
    pending = state.billing.pending
    if pending is not None:
        ctxd_triple, direct_triple = _add(ctxd_triple, pending.ctxd), _add(direct_triple, pending.direct)
        ctxd_billed += pending.ctxd.billed(rules)
        direct_billed += pending.direct.billed(rules)
        requests += 1
    last = None
    if totals.last is not None:
        c, d, was_measured = totals.last
        said = None if totals.last_reported is None else _input(Bill(*totals.last_reported), rules)
        last = RequestBill(ctxd=_input(Bill(*c), rules), direct=_input(Bill(*d), rules), measured=was_measured,
                           reported=said)
    return SessionBill(
        provider=rules.provider, cache=rules.cache, requests=requests, measured=totals.measured,
        ctxd=_sum(ctxd_triple, ctxd_billed, rules), direct=_sum(direct_triple, direct_billed, rules),
        ratio=round(ctxd_billed / direct_billed, 4) if direct_billed else None,
        reported=_sum(totals.reported, totals.reported_billed, rules) if totals.measured else None,
        reported_estimate=round(totals.reported_estimate, 1) if totals.measured else None,
        passes=totals.passes, pass_cost=round(totals.pass_cost, 1), last_request=last,
        budget_note=budget_note(svc, state, rules, totals, ctxd_billed))


def _sum(triple: tuple[int, int, int], billed: float, rules: CacheRules) -> InputBill:
    usd = money(billed, rules)
    return InputBill(uncached=triple[0], cache_write=triple[1], cache_read=triple[2], billed=round(billed, 1),
                     usd=None if usd is None else round(usd, 6))


def budget_note(svc: Service, state: SessionState, rules: CacheRules, totals: BillTotals,
                billed: float) -> str | None:
    """What a window set below the model's own costs: the passes it forces, and what they
    billed again of what the provider had cached."""
    config = svc.cache.config.models
    facts = model_facts(state.row.model, config.context_windows, config.output_limits)
    own = state.row.model_info.get("contextLength") or facts.context_window
    if not own or state.context_window >= own:
        return None
    head = (f"the window is {state.context_window:,} tokens of {state.row.model}'s {int(own):,}: "
            f"{totals.passes:,} compression passes so far")
    if not rules.caches:
        return head + f" ({rules.provider} caches no prompt, so passes cost no cache)"
    share = f" ({totals.pass_cost / billed:.0%} of the input billed)" if billed else ""
    return head + f", which billed {totals.pass_cost:,.0f} input tokens' worth again of what was cached{share}"
