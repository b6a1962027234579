"""What a request stores beside messages has a size (issue 23, 6): a 20 MB goal, title,
tag list, metadata or system prompt is refused at once with -32602 naming the field and
both sizes, nothing is stored, and the session stays as usable as before. A goal that
would leave the conversation no room is refused too; goal markers in pushed messages are
cut to the same sizes, and read in time linear in their length."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ctxd.engine.goals import parse_markers
from ctxd.protocol.common import MAX_GOAL_CHARS, MAX_GOAL_ITEM_CHARS
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.message import Message
from ctxd.service import controls, goals, ingest, prompt, sessions, snapshots
from ctxd.service.core import Service

from .service_helpers import chat, params

SID = "s1"
HUGE = "g" * 20_000_000


async def _refused(call: Any, field: str, said: str) -> float:
    started = time.perf_counter()
    with pytest.raises(CtxdError) as error:
        await call
    took = time.perf_counter() - started
    assert error.value.code == ErrorCode.InvalidParams
    assert error.value.data["field"] == field, error.value.data
    assert said in error.value.message, error.value.message
    return took


async def _usable(svc: Service) -> None:
    await ingest.push(svc, params("session/push", sessionId=SID, messages=chat(0, 2)))
    result = await prompt.prompt(svc, params("context/prompt", sessionId=SID, format="openai"))
    assert [m.role for m in result.messages if m.role != "system"] == ["user", "assistant"] * 2


async def test_a_huge_goal_is_refused_at_once_and_the_session_is_unharmed(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=8192))
    took = await _refused(goals.set_goal(service, params("goal/set", sessionId=SID, description=HUGE)),
                          "description", f"description is 20,000,000 characters; at most {MAX_GOAL_CHARS:,}")
    assert took < 0.5
    await _refused(goals.set_goal(service, params("goal/set", sessionId=SID, description="ship it",
                                                  decisions=[{"description": "d" * 2000}])),
                   "decisions[0].description", "2,000 characters")
    await _refused(goals.set_goal(service, params("goal/set", sessionId=SID, description="ship it",
                                                  checkpoints=[{"description": f"c{i}"} for i in range(101)])),
                   "checkpoints", "101 entries; at most 100")
    assert (await goals.get_goal(service, SID)).goal is None
    await goals.set_goal(service, params("goal/set", sessionId=SID, description="ship it"))
    await _refused(goals.update_goal(service, params("goal/update", sessionId=SID, nextSteps=["x" * 1001])),
                   "nextSteps[0]", "1,001 characters")
    await _refused(goals.update_goal(service, params("goal/update", sessionId=SID, description=HUGE)),
                   "description", "20,000,000 characters")
    assert (await goals.get_goal(service, SID)).goal.description == "ship it"
    await _usable(service)


async def test_a_goal_that_would_crowd_out_the_conversation_is_refused(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=1024))
    words = " ".join(f"word{i}" for i in range(600))[:MAX_GOAL_CHARS]
    await _refused(goals.set_goal(service, params("goal/set", sessionId=SID, description=words)),
                   "description", "a goal may take at most 25% of it")
    assert (await goals.get_goal(service, SID)).goal is None
    await _usable(service)


async def test_session_fields_have_sizes(service: Service) -> None:
    create = {"sessionId": SID, "model": "gpt-4o"}
    cases = [
        ({"title": HUGE}, "title", "20,000,000 characters; at most 1,000"),
        ({"model": "m" * 201}, "model", "201 characters"),
        ({"tags": [f"t{i}" for i in range(101)]}, "tags", "101 entries"),
        ({"tags": ["t" * 201]}, "tags[0]", "201 characters"),
        ({"metadata": {"blob": "b" * 70_000}}, "metadata", "at most 65,536 are accepted"),
        ({"systemPrompt": "s" * (4 * 1024 * 1024 + 1)}, "systemPrompt", "limits.max_message_bytes"),
    ]
    for extra, field, said in cases:
        await _refused(sessions.create_session(service, params("session/create", **{**create, **extra})), field, said)
    assert await sessions.list_sessions(service, params("session/list")) == []
    await sessions.create_session(service, params("session/create", **create, title="fine", tags=["a"]))
    for extra, field, said in cases:
        if field in ("model",):
            continue
        await _refused(sessions.update_session(service, params("session/update", sessionId=SID, **extra)), field,
                       said)
    info = await sessions.get_session(service, SID)
    assert info.title == "fine" and info.tags == ["a"]
    await _refused(snapshots.create(service, params("snapshot/create", sessionId=SID, label=HUGE)), "label",
                   "20,000,000 characters")
    await _refused(controls.compress(service, params("context/compress", sessionId=SID, focus=HUGE)), "focus",
                   "20,000,000 characters")
    await _usable(service)


def test_goal_markers_are_cut_to_size_and_read_in_linear_time() -> None:
    long = "[GOAL] " + "g" * 100_000 + "\n[DECISION] " + "d" * 5_000 + " - LOCKED\n[CHECKPOINT] write tests - DONE"
    markers = parse_markers(Message(role="assistant", content=long))
    assert markers.goal == "g" * MAX_GOAL_CHARS
    assert markers.decisions[0].description == "d" * MAX_GOAL_ITEM_CHARS
    assert markers.checkpoints[0].status == "completed"
    # Runs of spaces cost their length, not its square (200,000 spaces took minutes).
    spaced = ("[CHECKPOINT] x" + " " * 200_000 + "x - done\n[DECISION] y" + " " * 200_000 + "y: LOCKED\n"
              "[GOAL]" + " " * 200_000 + "\n")
    started = time.perf_counter()
    parse_markers(Message(role="assistant", content=spaced))
    assert time.perf_counter() - started < 2
