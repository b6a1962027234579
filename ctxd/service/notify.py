"""Notifications that follow from a session's figures: thresholds and reliability.

Each is sent when its level changes, not on every push, so a client sees one warning
when the trigger is passed, one when the prompt nears its limit, and one each time the
reliability level moves.
"""

from __future__ import annotations

from ctxd.engine.reliability import budget_inputs, reliability
from ctxd.protocol import notifications
from ctxd.protocol.compression import Reliability, ReliabilityNotification, ThresholdNotification
from ctxd.protocol.context import Budget
from ctxd.service.core import Service
from ctxd.service.state import SessionState


def session_reliability(state: SessionState, budget: Budget) -> Reliability:
    """The session's reliability; the same object while what it is computed from is the
    same (a turn asks for it after its push and in its prompt; callers never change it).
    Of the budget, only what the score depends on is compared (``budget_inputs``: nothing
    while within the compression trigger)."""
    row, cstate = state.row, state.cstate
    key = (row.model, row.model_info.get("parameterSize"), cstate.compression_count, cstate.lossy,
           budget_inputs(budget))
    memo = state.reliability_memo
    if memo is not None and memo[0] == key:
        return memo[1]
    rel = reliability(key[0], key[1], key[2], budget, key[3])
    state.reliability_memo = (key, rel)
    return rel


def threshold_level(budget: Budget, critical_fraction: float) -> str | None:
    if budget.max_prompt_tokens > 0 and budget.prompt_tokens >= critical_fraction * budget.max_prompt_tokens:
        return "critical"
    if budget.used > budget.trigger_at:
        return "warning"
    return None


def after_change(svc: Service, state: SessionState, budget: Budget) -> None:
    """Send ``context/threshold`` and ``context/reliability`` when their level changed."""
    cstate = state.cstate
    level = threshold_level(budget, svc.cache.policy(state).critical_fraction)
    if level != cstate.threshold_level:
        # One push can pass the trigger and the critical level at once: a client still
        # hears the warning first (the trigger sits close below the critical level).
        levels = ["warning", "critical"] if level == "critical" and cstate.threshold_level is None \
            and budget.used > budget.trigger_at else [level]
        cstate.threshold_level = level
        for each in levels:
            if each is not None:
                svc.events.emit(state.id, ThresholdNotification(
                    session_id=state.id, level=each, prompt_tokens=budget.prompt_tokens,  # type: ignore[arg-type]
                    max_prompt_tokens=budget.max_prompt_tokens, used=budget.used, trigger_at=budget.trigger_at))
    rel = session_reliability(state, budget)
    if rel.level != cstate.reliability_level:
        previous = cstate.reliability_level
        cstate.reliability_level = rel.level
        if previous is not None or rel.level != "high":
            svc.events.emit(state.id, ReliabilityNotification(
                session_id=state.id, reliability=rel, previous_level=previous))  # type: ignore[arg-type]


def updated(svc: Service, state: SessionState, reason: notifications.UpdateReason, pushed: int = 0) -> None:
    row = state.row
    svc.events.emit(state.id, notifications.SessionUpdated(
        session_id=state.id, reason=reason, last_seq=row.last_seq, message_count=row.message_count,
        token_count=row.token_count, context_tokens=row.context_tokens, pushed=pushed))
