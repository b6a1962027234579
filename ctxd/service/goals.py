"""``goal/set``, ``goal/update``, ``goal/get``: the session's goal, kept in the system part."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ctxd.engine.goals import merge_artifacts, merge_checkpoints, merge_decisions, new_goal, render_goal
from ctxd.protocol.common import MAX_GOAL_CHARS, MAX_GOAL_ITEM_CHARS, MAX_GOAL_ITEMS, MAX_GOAL_SHARE
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params
from ctxd.protocol.goal import Artifact, Decision, Goal, GoalCheckpoint, GoalResult, GoalSetParams, GoalUpdateParams
from ctxd.service import compression, fields, notify
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState
from ctxd.store import sessions as store


def _result(state: SessionState) -> GoalResult:
    text = render_goal(state.row.goal)
    return GoalResult(session_id=state.id, goal=state.row.goal, tokens=state.counter.count(text) if text else 0)


def _check_sizes(description: str | None, checkpoints: Sequence[GoalCheckpoint], decisions: Sequence[Decision],
                 artifacts: Sequence[Artifact] = (), next_steps: Sequence[str] | None = None) -> None:
    """What one ``goal/set`` or ``goal/update`` gives: each text and list within its size
    (``protocol.common``), before anything is merged, counted or stored."""
    fields.text(description, "description", MAX_GOAL_CHARS)
    for name, values in (("checkpoints", checkpoints), ("decisions", decisions), ("artifacts", artifacts),
                         ("nextSteps", next_steps)):
        fields.items(values, name, MAX_GOAL_ITEMS)
    for i, c in enumerate(checkpoints):
        fields.text(c.description, f"checkpoints[{i}].description", MAX_GOAL_ITEM_CHARS)
    for i, d in enumerate(decisions):
        fields.text(d.description, f"decisions[{i}].description", MAX_GOAL_ITEM_CHARS)
    for i, a in enumerate(artifacts):
        fields.text(a.path, f"artifacts[{i}].path", MAX_GOAL_ITEM_CHARS)
    for i, step in enumerate(next_steps or ()):
        fields.text(step, f"nextSteps[{i}]", MAX_GOAL_ITEM_CHARS)


def _check_fits(svc: Service, state: SessionState, goal: Goal) -> None:
    """The goal block (never compressed, sent with every prompt) may take at most
    ``MAX_GOAL_SHARE`` of the session's largest prompt: a larger one would leave the
    conversation no room, and the session would fail on its next push."""
    text = render_goal(goal) or ""
    tokens = state.counter.count(text)
    largest = svc.cache.budget(state).max_prompt_tokens
    if tokens > largest * MAX_GOAL_SHARE:
        raise invalid_params(f"the goal would take {tokens:,} tokens of this session's largest prompt "
                             f"({largest:,} tokens); a goal may take at most {MAX_GOAL_SHARE:.0%} of it: "
                             f"shorten it", "description")


async def _save(svc: Service, state: SessionState, goal: Goal | None) -> GoalResult:
    async with state.lock:
        await svc.cache.context(state)
        if goal is not None:
            _check_fits(svc, state, goal)
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
    _check_sizes(params.description, params.checkpoints, params.decisions)
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
    _check_sizes(params.description, params.checkpoints, params.decisions, params.artifacts, params.next_steps)
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
    return _result(await svc.cache.current(session_id))
