"""``context/prompt`` with ``push``: the messages are stored as ``session/push`` stores
them, then the prompt includes them (one round trip per turn, what ``ctxd proxy`` uses)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import METHODS
from ctxd.service import history, prompt, sessions
from ctxd.service.core import Service
from ctxd.service.params import decode_params

from .service_helpers import chat, params

SID = "s1"


async def _create(svc: Service) -> None:
    await sessions.create_session(svc, params("session/create", sessionId=SID, model="gpt-4o", contextWindow=4096))


async def _prompt(svc: Service, push: list[dict[str, Any]] | None) -> Any:
    return await prompt.prompt(svc, params("context/prompt", sessionId=SID, format="openai", push=push))


async def _stored(svc: Service) -> list[Any]:
    page = await history.history(svc, params("session/history", sessionId=SID, limit=100))
    return [entry.message for entry in page.messages]


async def test_pushed_messages_are_stored_and_in_the_prompt(service: Service) -> None:
    await _create(service)
    first = await _prompt(service, chat(0, 1))
    assert [m.content for m in first.messages] == [m["content"] for m in chat(0, 1)]
    second = await _prompt(service, [{"role": "user", "content": "and now?", "idempotencyKey": "k1"}])
    assert second.last_seq == 3 and second.messages[-1].content == "and now?"
    # The same idempotency key again: stored once, as session/push would.
    again = await _prompt(service, [{"role": "user", "content": "and now?", "idempotencyKey": "k1"}])
    assert again.last_seq == 3
    assert [m.content for m in await _stored(service)] == [*(m["content"] for m in chat(0, 1)), "and now?"]
    # Without push it is the plain prompt.
    assert (await _prompt(service, None)).last_seq == 3


async def test_a_refused_push_stores_nothing_and_fails_the_request(service: Service) -> None:
    await _create(service)
    bad = [{"role": "user", "content": "fine"}, {"role": "tool", "content": "no call id"}]
    with pytest.raises(CtxdError):
        await _prompt(service, bad)
    assert await _stored(service) == []


def test_push_accepts_the_providers_spellings_as_session_push_does() -> None:
    raw = {"sessionId": SID, "push": [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]}
    decoded = decode_params(METHODS["context/prompt"], raw)
    assert decoded.push[1].tool_call_id == "c1" and decoded.push[0].tool_calls[0].id == "c1"
    with pytest.raises(CtxdError) as info:
        decode_params(METHODS["context/prompt"], {"sessionId": SID, "push": [{"role": "nobody"}]})
    assert info.value.code == ErrorCode.InvalidParams
