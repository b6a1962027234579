"""``goal/set``, ``goal/update``, ``goal/get``: the session's goal, kept in the system part."""

from __future__ import annotations

import msgspec

from ctxd.engine.goals import merge_artifacts, merge_checkpoints, merge_decisions, new_goal, render_goal
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params
from ctxd.protocol.goal import Goal, GoalResult, GoalSetParams, GoalUpdateParams
from ctxd.service import compression, notify
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState
from ctxd.store import sessions as store


def _result(state: SessionState) -> GoalResult:
    text = render_goal(state.row.goal)
    return GoalResult(session_id=state.id, goal=state.row.goal, tokens=state.counter.count(text) if text else 0)


async def _save(svc: Service, state: SessionState, goal: Goal | None) -> GoalResult:
    async with state.lock:
        await svc.cache.context(state)
        state.row.goal = goal
        svc.cache.refresh(state, system=True)
        await svc.db.write(store.save_context, state.id, goal=goal, context_state=state.encoded_state(),
                           context_tokens=state.row.context_tokens)
        budget = svc.cache.budget(state)
    notify.updated(svc, state, "goal")
    notify.after_change(svc, state, budget)
    compression.schedule(svc, state)
    return _result(state)


async def set_goal(svc: Service, params: GoalSetParams) -> GoalResult:
    if not params.description.strip():
        raise invalid_params("description must not be empty", "description")
    state = await svc.cache.get(params.session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        goal = new_goal(params.description.strip(), now_iso(), params.priority)
        if state.row.goal is not None:
            # A new goal never loses a locked or architecture decision (goal preservation).
            goal.decisions = [d for d in state.row.goal.decisions if d.locked or d.architecture]
        merge_checkpoints(goal, params.checkpoints)
        merge_decisions(goal, params.decisions)
        return await _save(svc, state, goal)


async def update_goal(svc: Service, params: GoalUpdateParams) -> GoalResult:
    state = await svc.cache.get(params.session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        current = state.row.goal
        if current is None:
            raise CtxdError(ErrorCode.InvalidParams, "the session has no goal; set one with goal/set",
                            {"field": "sessionId"})
        goal = msgspec.structs.replace(current, checkpoints=list(current.checkpoints),
                                       decisions=list(current.decisions), artifacts=list(current.artifacts),
                                       next_steps=list(current.next_steps))
        if params.description is not None:
            goal.description = params.description
        if params.priority is not None:
            goal.priority = params.priority
        if params.status is not None:
            goal.status = params.status
            goal.completed_at = now_iso() if params.status == "completed" else None
        merge_checkpoints(goal, params.checkpoints)
        merge_decisions(goal, params.decisions, keep_locks=False)  # goal/update may unlock
        merge_artifacts(goal, params.artifacts)
        if params.next_steps is not None:
            goal.next_steps = params.next_steps
        return await _save(svc, state, goal)


async def get_goal(svc: Service, session_id: str) -> GoalResult:
    return _result(await svc.cache.get(session_id))
