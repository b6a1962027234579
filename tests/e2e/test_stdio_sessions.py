"""ctxd's data plane over stdio, driven by pytest-lsp: sessions, push, idempotency,
prompts in the three provider shapes, stats and notifications.

The whole module shares one stdio daemon (``shared_lsp``); every test works in
sessions named after itself, so tests do not see each other's data.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from tests.e2e.helpers import (
    anthropic_pairing_problems,
    assistant,
    check_prompt,
    cl100k,
    db_rows,
    openai_pairing_problems,
    text_tokens,
    user,
)
from tests.e2e.lsp import create, push, raw_request, request, rpc_error

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def lsp(shared_lsp: LanguageClient) -> LanguageClient:
    return shared_lsp


@pytest.fixture
def sid(request: pytest.FixtureRequest) -> str:
    """A session id of this test's own."""
    return request.node.name


async def test_request_without_params_field_is_answered(lsp, sid):
    await create(lsp, sessionId=sid)
    with_params = await request(lsp, "session/list", {})
    answer = await raw_request(lsp, {"jsonrpc": "2.0", "id": "no-params", "method": "session/list"})
    assert answer == with_params
    assert sid in [s["sessionId"] for s in answer["sessions"]]
    answer = await raw_request(lsp, {"jsonrpc": "2.0", "id": "null-params", "method": "session/list",
                                     "params": None})
    assert answer == with_params
    status = await raw_request(lsp, {"jsonrpc": "2.0", "id": 7, "method": "daemon/status"})
    assert status["sessions"] == len(with_params["sessions"])
    # A method whose params are required says so.
    with pytest.raises(JsonRpcException) as info:
        await raw_request(lsp, {"jsonrpc": "2.0", "id": 8, "method": "session/get"})
    assert info.value.code == -32602
    assert info.value.data == {"field": "params"}


# --- sessions ---------------------------------------------------------------------------


async def test_session_create_list_get_delete(lsp, sid):
    generated = await create(lsp, tags=[sid])
    uuid.UUID(generated["sessionId"])  # a generated id is a UUID
    assert generated["messageCount"] == 0 and generated["lastSeq"] == 0

    explicit = await create(lsp, sessionId=sid, model="gpt-4", title="T", tags=[sid, f"{sid}-b"],
                            systemPrompt="Be brief.", metadata={"k": [1, 2]}, contextWindow=4096)
    assert explicit["sessionId"] == sid
    assert explicit["model"] == "gpt-4"
    assert explicit["tags"] == [sid, f"{sid}-b"]
    assert explicit["contextWindow"] == 4096
    assert explicit["metadata"] == {"k": [1, 2]}
    assert explicit["systemPromptTokens"] == text_tokens("Be brief.")
    assert explicit["tokensEstimated"] is False  # gpt-4 is counted exactly with cl100k_base

    err = await rpc_error(lsp, "session/create", {"sessionId": sid})
    assert err.code == -33002
    assert sid in err.message

    got = await request(lsp, "session/get", {"sessionId": sid})
    assert {k: got[k] for k in ("sessionId", "title", "tags", "systemPrompt")} == {
        "sessionId": sid, "title": "T", "tags": [sid, f"{sid}-b"], "systemPrompt": "Be brief."}

    async def listed(**params: Any) -> list[str]:
        return [s["sessionId"] for s in (await request(lsp, "session/list", params))["sessions"]]

    # Most recently active first.
    await push(lsp, generated["sessionId"], [user("latest activity")])
    assert await listed(tag=sid) == [generated["sessionId"], sid]
    await push(lsp, sid, [user("now this one")])
    assert await listed(tag=sid) == [sid, generated["sessionId"]]
    assert await listed(tag=f"{sid}-b") == [sid]
    assert len(await listed(limit=1)) == 1

    deleted = await request(lsp, "session/delete", {"sessionId": generated["sessionId"]})
    assert deleted == {"sessionId": generated["sessionId"], "deletedMessages": 1}
    for method in ("session/get", "session/delete", "context/prompt", "context/stats"):
        err = await rpc_error(lsp, method, {"sessionId": generated["sessionId"]})
        assert err.code == -33001, method
    err = await rpc_error(lsp, "session/push", {"sessionId": generated["sessionId"], "messages": [user("x")]})
    assert err.code == -33001
    assert await listed(tag=sid) == [sid]
    assert db_rows(lsp.data_dir, generated["sessionId"]) == []
    # The id is free again.
    again = await create(lsp, sessionId=generated["sessionId"])
    assert again["messageCount"] == 0


# --- push -------------------------------------------------------------------------------


async def test_push_one_and_many(lsp, sid):
    await create(lsp, sessionId=sid, model="gpt-4")
    first = await push(lsp, sid, [user("Hello there")])
    assert first["messages"] == [{"seq": 1, "tokens": text_tokens("Hello there"), "duplicate": False}]
    assert first["messageCount"] == 1
    assert first["tokenCount"] == text_tokens("Hello there")
    assert first["tokensEstimated"] is False

    texts = [f"message number {i} with some words ✓" for i in range(20)]
    many = await push(lsp, sid, [user(t) if i % 2 else assistant(t) for i, t in enumerate(texts)])
    assert [m["seq"] for m in many["messages"]] == list(range(2, 22))
    assert [m["tokens"] for m in many["messages"]] == [text_tokens(t) for t in texts]
    assert many["messageCount"] == 21
    assert many["tokenCount"] == text_tokens("Hello there") + sum(text_tokens(t) for t in texts)
    info = await request(lsp, "session/get", {"sessionId": sid})
    assert (info["messageCount"], info["lastSeq"], info["tokenCount"]) == (21, 21, many["tokenCount"])
    # contextTokens: the priming (3) plus every message.
    assert info["contextTokens"] == 3 + many["tokenCount"]
    assert many["budget"]["used"] == many["tokenCount"]


async def test_push_thousands_in_one_call(lsp, sid):
    await create(lsp, sessionId=sid)
    n = 5000
    messages = [user(f"bulk {i}") if i % 2 == 0 else assistant(f"reply {i}") for i in range(n)]
    result = await push(lsp, sid, messages)
    assert [m["seq"] for m in result["messages"]] == list(range(1, n + 1))
    assert result["messageCount"] == n
    assert result["tokenCount"] == sum(m["tokens"] for m in result["messages"])
    assert sum(m["tokens"] for m in result["messages"]) == sum(text_tokens(m["content"]) for m in messages)
    rows = db_rows(lsp.data_dir, sid)
    assert [seq for seq, _, _ in rows] == list(range(1, n + 1))
    assert [body["content"] for _, body, _ in rows] == [m["content"] for m in messages]
    stats = await request(lsp, "context/stats", {"sessionId": sid})
    assert stats["byRole"]["user"]["messages"] == n // 2
    assert stats["byRole"]["assistant"]["messages"] == n // 2


async def test_idempotency_key_retries_store_once(lsp, sid):
    await create(lsp, sessionId=sid)
    await create(lsp, sessionId=f"{sid}-other")
    first = await push(lsp, sid, [user("a", idempotencyKey="k1")])
    assert first["messages"] == [{"seq": 1, "tokens": text_tokens("a"), "duplicate": False}]
    retry = await push(lsp, sid, [user("a", idempotencyKey="k1")])
    assert retry["messages"] == [{"seq": 1, "tokens": text_tokens("a"), "duplicate": True}]
    assert retry["messageCount"] == 1 and retry["tokenCount"] == first["tokenCount"]

    # A retried batch that also carries new messages stores only the new ones.
    mixed = await push(lsp, sid, [user("a", idempotencyKey="k1"), assistant("b", idempotencyKey="k2"),
                                  user("c")])
    assert [(m["seq"], m["duplicate"]) for m in mixed["messages"]] == [(1, True), (2, False), (3, False)]
    assert mixed["messageCount"] == 3
    # The same key twice in one batch: stored once, the second is its duplicate.
    twice = await push(lsp, sid, [user("d", idempotencyKey="k3"), user("d", idempotencyKey="k3")])
    assert [(m["seq"], m["duplicate"]) for m in twice["messages"]] == [(4, False), (4, True)]
    # Keys are per session.
    elsewhere = await push(lsp, f"{sid}-other", [user("a", idempotencyKey="k1")])
    assert elsewhere["messages"][0] == {"seq": 1, "tokens": text_tokens("a"), "duplicate": False}

    rows = db_rows(lsp.data_dir, sid)
    assert [(seq, body["content"], key) for seq, body, key in rows] == [
        (1, "a", "k1"), (2, "b", "k2"), (3, "c", None), (4, "d", "k3")]
    assert all("idempotencyKey" not in body for _, body, _ in rows)
    info = await request(lsp, "session/get", {"sessionId": sid})
    assert (info["messageCount"], info["lastSeq"]) == (4, 4)
    assert info["tokenCount"] == sum(text_tokens(t) for t in "abcd")


# --- prompts ----------------------------------------------------------------------------

OPENAI_STYLE = [
    user("What is the weather in Paris and in Rome?"),
    {"role": "assistant", "content": "Let me check.", "toolCalls": [
        {"id": "call_1", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "toolCallId": "call_1", "name": "weather", "content": "Paris: 18C"},
    {"role": "tool", "toolCallId": "call_2", "name": "weather", "content": "Rome: 24C"},
    assistant("Paris is 18C and Rome is 24C."),
]

ANTHROPIC_STYLE = [
    user("List the files."),
    {"role": "assistant", "content": [
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "/tmp"}}]},
    {"role": "user", "content": [{"type": "tool_result", "toolUseId": "toolu_1", "content": "a.txt\nb.txt"}]},
    assistant("There are two files."),
]


async def prompts(client: LanguageClient, session_id: str) -> dict[str, dict[str, Any]]:
    out = {}
    for fmt in ("openai", "anthropic", "ollama"):
        result = await request(client, "context/prompt", {"sessionId": session_id, "format": fmt})
        assert result["format"] == fmt
        assert check_prompt(result) == [], (fmt, check_prompt(result))
        out[fmt] = result
    return out


async def test_prompt_shapes_with_openai_style_tool_calls(lsp, sid):
    await create(lsp, sessionId=sid, systemPrompt="You are a weather bot.")
    await push(lsp, sid, OPENAI_STYLE)
    p = await prompts(lsp, sid)

    openai = p["openai"]["messages"]
    assert openai[0] == {"role": "system", "content": "You are a weather bot."}
    assert [m["role"] for m in openai] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert openai[2]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]
    assert [(m["tool_call_id"], m["content"]) for m in openai[3:5]] == [("call_1", "Paris: 18C"),
                                                                          ("call_2", "Rome: 24C")]
    assert openai_pairing_problems(openai) == []

    anthropic = p["anthropic"]
    # Prompt-cache breakpoints on the system part and the last message (cacheControl on by default).
    assert anthropic["system"] == [{"type": "text", "text": "You are a weather bot.",
                                    "cache_control": {"type": "ephemeral"}}]
    assert anthropic["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sum("cache_control" in b for m in anthropic["messages"] for b in m["content"]) == 1
    assert [m["role"] for m in anthropic["messages"]] == ["user", "assistant", "user", "assistant"]
    plain = await request(lsp, "context/prompt", {"sessionId": sid, "format": "anthropic", "cacheControl": False})
    assert plain["system"] == "You are a weather bot."
    assert not any("cache_control" in b for m in plain["messages"] for b in m["content"])
    uses = [b for b in anthropic["messages"][1]["content"] if b["type"] == "tool_use"]
    assert [(b["id"], b["input"]) for b in uses] == [("call_1", {"city": "Paris"}), ("call_2", {"city": "Rome"})]
    results = anthropic["messages"][2]["content"]
    assert [(b["type"], b["tool_use_id"], b["content"]) for b in results] == [
        ("tool_result", "call_1", "Paris: 18C"), ("tool_result", "call_2", "Rome: 24C")]
    assert anthropic_pairing_problems(anthropic["messages"]) == []

    ollama = p["ollama"]["messages"]
    assert ollama[0] == {"role": "system", "content": "You are a weather bot."}
    assert [m["role"] for m in ollama] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [c["function"] for c in ollama[2]["tool_calls"]] == [
        {"name": "weather", "arguments": {"city": "Paris"}}, {"name": "weather", "arguments": {"city": "Rome"}}]
    assert [m["content"] for m in ollama[3:5]] == ["Paris: 18C", "Rome: 24C"]

    # Token totals: the same for every format when nothing had to be repaired.
    session = await request(lsp, "session/get", {"sessionId": sid})
    assert {r["tokens"] for r in p.values()} == {session["contextTokens"]}
    assert {r["lastSeq"] for r in p.values()} == {5}


async def test_prompt_shapes_with_anthropic_style_tool_calls(lsp, sid):
    await create(lsp, sessionId=sid)  # no system prompt
    await push(lsp, sid, ANTHROPIC_STYLE)
    p = await prompts(lsp, sid)
    openai = p["openai"]["messages"]
    assert [m["role"] for m in openai] == ["user", "assistant", "tool", "assistant"]
    call = openai[1]["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "ls"
    assert json.loads(call["function"]["arguments"]) == {"path": "/tmp"}
    assert openai[2] == {"role": "tool", "content": "a.txt\nb.txt", "tool_call_id": "toolu_1"}
    assert openai_pairing_problems(openai) == []
    assert p["anthropic"]["system"] is None
    anthropic = p["anthropic"]["messages"]
    assert anthropic[1]["content"] == [{"type": "text", "text": "Listing."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "/tmp"}}]
    assert anthropic[2]["content"][0]["tool_use_id"] == "toolu_1"
    assert anthropic_pairing_problems(anthropic) == []
    ollama = p["ollama"]["messages"]
    assert ollama[1]["tool_calls"] == [{"function": {"name": "ls", "arguments": {"path": "/tmp"}}}]
    assert ollama[2]["role"] == "tool" and ollama[2]["content"] == "a.txt\nb.txt"


async def test_prompt_repairs_tool_pairing(lsp, sid):
    """A result pushed after an interrupting message, a call never answered, and a
    result whose call is not in history: every format still pairs each result with its call."""
    await create(lsp, sessionId=sid, systemPrompt="sys")
    await push(lsp, sid, [
        {"role": "system", "content": "Mid-conversation instruction."},
        user("go"),
        {"role": "assistant", "toolCalls": [{"id": "late", "function": {"name": "slow", "arguments": "{}"}}]},
        user("(user interrupts)"),
        {"role": "tool", "toolCallId": "late", "content": "late result"},
        {"role": "assistant", "toolCalls": [{"id": "never", "function": {"name": "lost", "arguments": "{}"}}]},
        {"role": "tool", "toolCallId": "ghost", "content": "orphan output"},
        assistant("done"),
    ])
    p = await prompts(lsp, sid)
    openai = p["openai"]["messages"]
    assert openai_pairing_problems(openai) == []
    late_call = next(i for i, m in enumerate(openai) if m.get("tool_calls") and m["tool_calls"][0]["id"] == "late")
    assert openai[late_call + 1] == {"role": "tool", "content": "late result", "tool_call_id": "late"}
    never = next(i for i, m in enumerate(openai) if m.get("tool_calls") and m["tool_calls"][0]["id"] == "never")
    assert openai[never + 1]["role"] == "tool" and openai[never + 1]["tool_call_id"] == "never"
    assert any("orphan output" in (m.get("content") or "") and m["role"] == "user" for m in openai)
    assert anthropic_pairing_problems(p["anthropic"]["messages"]) == []
    # Anthropic: system-role messages of the conversation join the system text.
    system = p["anthropic"]["system"][0]["text"]
    assert system.startswith("sys")
    assert "Mid-conversation instruction." in system
    assert all(b.get("text") != "Mid-conversation instruction." for m in p["anthropic"]["messages"]
               for b in m["content"])
    # Repairs cost tokens, and every figure counts them: one count for the prompt.
    session = await request(lsp, "session/get", {"sessionId": sid})
    assert p["openai"]["tokens"] == p["openai"]["budget"]["promptTokens"] == session["contextTokens"]


async def test_prompt_of_new_empty_session(lsp, sid):
    await create(lsp, sessionId=sid, systemPrompt="only system")
    p = await prompts(lsp, sid)
    assert p["openai"]["messages"] == [{"role": "system", "content": "only system"}]
    assert p["anthropic"]["messages"] == []
    assert p["anthropic"]["system"] == [{"type": "text", "text": "only system", "cache_control": {"type": "ephemeral"}}]


async def test_prompt_default_and_bad_format(lsp, sid):
    await create(lsp, sessionId=sid)
    await push(lsp, sid, [user("hi")])
    default = await request(lsp, "context/prompt", {"sessionId": sid})
    assert default["format"] == "openai"
    assert default["messages"] == [{"role": "user", "content": "hi"}]
    err = await rpc_error(lsp, "context/prompt", {"sessionId": sid, "format": "gemini"})
    assert err.code == -32602
    assert err.data["field"] == "format"


# --- stats ------------------------------------------------------------------------------


async def test_stats_by_role_and_kind(lsp, sid):
    await create(lsp, sessionId=sid)
    pushed = await push(lsp, sid, OPENAI_STYLE + ANTHROPIC_STYLE)
    stats = await request(lsp, "context/stats", {"sessionId": sid})
    assert stats["messageCount"] == 9
    assert stats["tokenCount"] == pushed["tokenCount"]
    by_role = stats["byRole"]
    # (The user message that only carries a tool_result block is tool output, not the user's.)
    assert {role: v["messages"] for role, v in by_role.items()} == {"user": 2, "assistant": 4, "tool": 3}
    assert sum(v["tokens"] for v in by_role.values()) == stats["tokenCount"]
    kinds = stats["byKind"]
    assert kinds["toolCall"]["blocks"] == 3  # two OpenAI calls, one tool_use
    assert kinds["toolResult"]["blocks"] == 3  # two tool messages, one tool_result block
    assert kinds["framing"]["blocks"] == 9
    assert sum(v["tokens"] for v in kinds.values()) == stats["tokenCount"]
    drift = stats["usageDrift"]
    assert drift["messagesWithUsage"] == 0
    assert drift["outputRatio"] is None and drift["inputRatio"] is None


async def test_stats_usage_drift(lsp, sid):
    await create(lsp, sessionId=sid, model="gpt-4")
    answer = "The answer is forty-two, as computed."
    first = await push(lsp, sid, [user("What is six times seven?")])
    context_before = 3 + first["tokenCount"]  # priming + the question
    await push(lsp, sid, [assistant(answer, usage={"inputTokens": 30, "outputTokens": 20,
                                                    "cacheReadTokens": 4})])
    stats = await request(lsp, "context/stats", {"sessionId": sid})
    drift = stats["usageDrift"]
    counted_output = cl100k(answer)
    assert drift["messagesWithUsage"] == 1
    assert drift["reportedOutputTokens"] == 20
    assert drift["countedOutputTokens"] == counted_output
    assert drift["outputRatio"] == round(20 / counted_output, 4)
    assert drift["reportedInputTokens"] == 34
    assert drift["countedInputTokens"] == context_before
    assert drift["inputRatio"] == round(34 / context_before, 4)


async def test_budget_learns_the_providers_count(lsp, sid):
    """Usage pushed with replies teaches the session's token ratio; the budget applies it,
    and the prompt handed out fits the window as the provider counts it."""
    await create(lsp, sessionId=sid, model="llama3.1:8b", contextWindow=8192)
    before = (await request(lsp, "context/stats", {"sessionId": sid}))["budget"]
    assert before["tokenRatio"] == 1.0
    history = 3
    for i in range(12):
        question = user(f"Question {i}: " + "explain the parser state machine again " * 20)
        pushed = await push(lsp, sid, [question])
        history += pushed["messages"][0]["tokens"]
        # A client that sends the whole history to a provider counting 1.3x what ctxd counts.
        reply = assistant(f"Answer {i}: " + "the lexer hands tokens to the parser " * 20,
                          usage={"inputTokens": round(history * 1.3), "outputTokens": 200})
        pushed = await push(lsp, sid, [reply])
        history += pushed["messages"][0]["tokens"]
    stats = await request(lsp, "context/stats", {"sessionId": sid})
    budget = stats["budget"]
    assert 1.28 <= budget["tokenRatio"] <= 1.32
    assert stats["usageDrift"]["appliedRatio"] == budget["tokenRatio"]
    assert budget["maxPromptTokens"] == int((before["maxPromptTokens"]) / budget["tokenRatio"])
    prompt = await request(lsp, "context/prompt", {"sessionId": sid})
    assert prompt["tokens"] <= prompt["budget"]["maxPromptTokens"]
    assert prompt["tokens"] * budget["tokenRatio"] <= before["maxPromptTokens"]


# --- notifications ------------------------------------------------------------------------


async def test_subscribe_then_push_notifies(lsp, sid):
    a, b = f"{sid}-a", f"{sid}-b"
    await create(lsp, sessionId=a)
    await create(lsp, sessionId=b)
    err = await rpc_error(lsp, "session/subscribe", {"sessionId": f"{sid}-nope"})
    assert err.code == -33001
    assert (await request(lsp, "session/subscribe", {"sessionId": a})) == {"subscriptions": [a]}
    try:
        # The waiter is registered before the push that triggers the notification.
        updated = lsp.protocol.wait_for_notification_async("session/updated")
        result = await push(lsp, a, [user("one"), assistant("two")])
        note = await asyncio.wait_for(updated, 30)
        assert note == {"sessionId": a, "reason": "push", "lastSeq": 2, "messageCount": 2,
                        "tokenCount": result["tokenCount"], "contextTokens": result["contextTokens"],
                        "pushed": 2}

        # No notification for a session this connection does not follow: the first one
        # that arrives after pushing to b and then to a is a's.
        updated = lsp.protocol.wait_for_notification_async("session/updated")
        await push(lsp, b, [user("unwatched")])
        await push(lsp, a, [user("three")])
        note = await asyncio.wait_for(updated, 30)
        assert (note["sessionId"], note["lastSeq"]) == (a, 3)

        # Unsubscribed from a; the wildcard covers b.
        assert (await request(lsp, "session/unsubscribe", {"sessionId": a})) == {"subscriptions": []}
        assert (await request(lsp, "session/subscribe", {"sessionId": "*"})) == {"subscriptions": ["*"]}
        updated = lsp.protocol.wait_for_notification_async("session/updated")
        await push(lsp, b, [user("now watched")])
        assert (await asyncio.wait_for(updated, 30))["sessionId"] == b

        deleted = lsp.protocol.wait_for_notification_async("session/deleted")
        await request(lsp, "session/delete", {"sessionId": b})
        assert await asyncio.wait_for(deleted, 30) == {"sessionId": b, "reason": "request", "detail": None}
    finally:
        await request(lsp, "session/unsubscribe", {"sessionId": a})
        await request(lsp, "session/unsubscribe", {"sessionId": "*"})


async def test_cancel_of_unknown_or_finished_request_is_harmless(lsp, sid):
    await create(lsp, sessionId=sid)
    lsp.protocol.notify("$/cancelRequest", {"id": "never-sent"})
    lsp.protocol.notify("$/cancelRequest", {})
    result = await push(lsp, sid, [user("x")])
    assert result["messageCount"] == 1

