"""A push's role and kind totals: summed over the batch at once (``SessionStats.add_messages``,
on the writer inside the push's transaction) they equal adding each message on its own, and
what the service stores equals what its messages add up to."""

from __future__ import annotations

import random

import msgspec

from ctxd.protocol.message import (
    FunctionCall,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
)
from ctxd.service import ingest, sessions
from ctxd.service.core import Service
from ctxd.store.sessions import SessionStats
from ctxd.tokens import MessageTokens

from .service_helpers import params


def _messages(n: int, seed: int = 7) -> list[tuple[Message, MessageTokens]]:
    rng = random.Random(seed)

    def block() -> object:
        return rng.choice([TextBlock(text=rng.choice(["", "words"])),
                           ToolUseBlock(id=f"u{rng.randrange(10**6)}", name="read", input={}),
                           ToolResultBlock(tool_use_id="u1", content="out"), ThinkingBlock(thinking="hmm")])

    out = []
    for _ in range(n):
        role = rng.choice(["user", "assistant", "tool", "system"])
        content = rng.choice(["", "hello", None, [block() for _ in range(rng.randrange(4))]])
        calls = ([ToolCall(id=f"c{i}", function=FunctionCall(name="run", arguments="{}")) for i in range(2)]
                 if role == "assistant" and rng.random() < 0.3 else None)
        tokens = MessageTokens(*(rng.randrange(50) for _ in range(6)))
        out.append((Message(role=role, content=content, tool_calls=calls), tokens))  # type: ignore[arg-type]
    return out


def test_a_batch_adds_what_its_messages_add_one_by_one() -> None:
    counted = _messages(3000)
    one_by_one, batched = SessionStats(), SessionStats()
    for message, tokens in counted:
        one_by_one.add_message(message, tokens)
    for start in range(0, len(counted), 97):
        batched.add_messages(counted[start:start + 97])
    assert msgspec.json.encode(batched) == msgspec.json.encode(one_by_one)
    assert sum(t.blocks for t in batched.by_kind.values()) > len(counted)  # (every kind was exercised)
    assert {k for k, t in batched.by_kind.items() if t.blocks} == {"text", "toolCall", "toolResult", "thinking",
                                                                   "framing"}


async def test_pushed_totals_are_the_sum_of_the_messages(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId="s", model="gpt-4",
                                                  contextWindow=1_000_000))
    raw = [{"role": "user", "content": "fix the parser"},
           {"role": "assistant", "content": "reading it",
            "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
            "usage": {"inputTokens": 40, "outputTokens": 5}},
           {"role": "tool", "toolCallId": "c1", "content": "def parse(): ..."},
           {"role": "assistant", "content": [{"type": "thinking", "thinking": "it is the loop"},
                                             {"type": "text", "text": "found it"}]}]
    total = 0
    for _ in range(3):
        result = await ingest.push(service, params("session/push", sessionId="s", messages=raw))
        total += sum(pushed.tokens for pushed in result.messages)
    state = await service.cache.get("s")
    stats = state.row.stats
    assert state.row.token_count == total
    assert sum(r.messages for r in stats.by_role.values()) == 12
    assert stats.by_role["assistant"].messages == 6 and stats.by_role["tool"].messages == 3
    assert stats.by_kind["toolCall"].blocks == 3 and stats.by_kind["toolResult"].blocks == 3
    assert stats.by_kind["thinking"].blocks == 3 and stats.by_kind["framing"].blocks == 12
    assert sum(k.tokens for k in stats.by_kind.values()) == total
    assert stats.drift.messages == 3
