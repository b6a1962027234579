"""The official anthropic SDK through ``ctxd proxy`` to a fake upstream."""

from __future__ import annotations

import json

import anthropic
import httpx

from tests.agents import wire
from tests.proxy.conftest import both_modes, history, sessions
from tests.proxy.upstream import MODEL

TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
SYSTEM = [{"type": "text", "text": "You are a careful agent.", "cache_control": {"type": "ephemeral"}}]


def sdk(proxy, **headers) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test-secret", max_retries=0,
                                    default_headers=headers or None)


def _strip_cache(value):
    """Without breakpoints (a string content and one text block being the same)."""
    if isinstance(value, dict) and isinstance(value.get("content"), str) and "role" in value:
        value = dict(value, content=[{"type": "text", "text": value["content"]}])
    if isinstance(value, dict):
        return {k: _strip_cache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache(v) for v in value]
    return value


@both_modes
async def test_tools_streaming_and_unmodelled_blocks(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy)
    messages: list[dict] = [{"role": "user", "content": [
        {"type": "text", "text": "Please use the tool for Paris."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]
    first = await client.messages.create(model=MODEL, max_tokens=300, system=SYSTEM, messages=messages,
                                         tools=TOOLS, stop_sequences=["END"])
    assert first.stop_reason == "tool_use"
    # The provider's usage passed back unchanged (input tokens after the last breakpoint).
    total, read, written = upstream.reports[0]
    assert (first.usage.input_tokens, first.usage.cache_read_input_tokens,
            first.usage.cache_creation_input_tokens) == (total - read - written, read, written)
    tool_use = first.content[1]
    # The client sends the reply back with a thinking signature ctxd never rewrites.
    assistant = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": "c2lnbmF0dXJl"},
        *[block.model_dump(exclude_none=True) for block in first.content]]}
    messages.append(assistant)
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use.id, "content": "Sunny, 21 C",
         "cache_control": {"type": "ephemeral"}}]})
    async with client.messages.stream(model=MODEL, max_tokens=300, system=SYSTEM, messages=messages,
                                      tools=TOOLS) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "Answer to: the tool result"
    total, read, written = upstream.reports[1]
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens,
            final.usage.cache_creation_input_tokens) == (total - read - written, read, written)
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    messages.append({"role": "user", "content": "Thanks!"})
    third = await client.messages.create(model=MODEL, max_tokens=100, system=SYSTEM, messages=messages)
    assert third.content[0].text == "Answer to: Thanks!"

    sent = upstream.chats("/v1/messages")
    assert len(sent) == 3
    # The client's credential (x-api-key, or a bearer token in newer SDKs) is forwarded.
    assert all("sk-ant-test-secret" in (r.headers.get("x-api-key", "") + r.headers.get("authorization", ""))
               and "anthropic-version" in r.headers for r in sent)
    assert sent[0].json["tools"] == TOOLS and sent[0].json["stop_sequences"] == ["END"]
    # The image, the thinking block and its signature reach the upstream byte for byte.
    assert sent[1].json["messages"][0]["content"][1] == messages[0]["content"][1]
    assert sent[1].json["messages"][1] == assistant
    assert sent[2].json["system"] == SYSTEM
    assert _strip_cache(sent[2].json["messages"]) == _strip_cache(messages)
    # Each request starts with the previous one (prompt caching survives the proxy).
    for before, after in zip(sent, sent[1:]):
        assert _strip_cache(after.json["messages"][:len(before.json["messages"])]) == \
            _strip_cache(before.json["messages"])
        assert after.json["system"] == before.json["system"]
    # Breakpoints: the client's are kept, never more than 4.
    for request in sent:
        assert json.dumps(request.json).count('"cache_control"') <= 4
    assert sent[1].json["messages"][-1]["content"][0]["cache_control"] == {"type": "ephemeral"}

    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-anthropic-")]
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert stored[0]["metadata"]["ctxdProxy"]["unkept"] == ["image"]
    for at, report in ((1, upstream.reports[0]), (3, upstream.reports[1])):
        total, read, written = report
        assert stored[at]["usage"]["inputTokens"] == total - read - written
        assert (stored[at]["usage"].get("cacheReadTokens", 0), stored[at]["usage"].get("cacheWriteTokens", 0)) == \
            (read, written)
    assert "sk-ant-test-secret" not in proxy.log()


@both_modes
async def test_count_tokens_counts_what_would_be_sent(proxy, upstream) -> None:
    client = sdk(proxy, **{"X-Ctxd-Session": "counted"})
    messages = [{"role": "user", "content": "Count me."}]
    await client.messages.create(model=MODEL, max_tokens=100, system="Sys.", messages=messages)
    messages += [{"role": "assistant", "content": "Answer to: Count me."}, {"role": "user", "content": "More."}]
    counted = await client.messages.count_tokens(model=MODEL, system="Sys.", messages=messages)
    assert counted.input_tokens > 0
    [request] = [r for r in upstream.received if r.path == "/v1/messages/count_tokens"]
    assert _strip_cache(request.json["messages"]) == _strip_cache(messages)
    # Counting pushes nothing: the next real request pushes the two new messages.
    await client.messages.create(model=MODEL, max_tokens=100, system="Sys.", messages=messages)


async def test_the_query_string_reaches_the_upstream(proxy, upstream) -> None:
    """Claude Code sends ``/v1/messages?beta=true``."""
    client = sdk(proxy)
    await client.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi."}],
                                 extra_query={"beta": "true"})
    await client.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi."}])
    await client.models.list(extra_query={"limit": "5"})
    async with httpx.AsyncClient(timeout=30) as http:  # (a repeated parameter, as sent, through the pass-through)
        listed = await http.get(proxy.url + "/v1/models?after=m&after=n&flag", headers={"x-api-key": "sk-test"})
        assert listed.status_code == 200, listed.text
    assert [r.query for r in upstream.received] == ["beta=true", "", "limit=5", "after=m&after=n&flag"]


async def test_a_thinking_tool_loop_longer_than_the_window_is_accepted(proxy, upstream, ctxd_daemon) -> None:
    """Extended thinking, a tool-use loop far over the window: every request passes the
    checks of the real API (the fake upstream refuses as it does: the last assistant
    message of the loop must open with its thinking, signatures intact), and that message
    reaches the upstream as the client sent it, its ``redacted_thinking`` block included,
    also when ctxd sends the output after it as an excerpt."""
    client = sdk(proxy, **{"X-Ctxd-Context-Window": "4096"})
    messages: list[dict] = [{"role": "user", "content": "Please use the tool for one city after another."}]
    sizes = [500, 700, 300, 6000, 400, 800, 200]  # words of each output; the fourth is over any prompt
    sent_by_client = []
    for n in range(len(sizes) + 1):
        sent_by_client.append(json.loads(json.dumps(messages)))
        kwargs = dict(model=MODEL, max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 512},
                      system=SYSTEM, tools=TOOLS, messages=messages)
        if n % 2:
            async with client.messages.stream(**kwargs) as stream:
                reply = await stream.get_final_message()
        else:
            reply = await client.messages.create(**kwargs)
        assert [b.type for b in reply.content][:2] == ["thinking", "redacted_thinking"]
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        if reply.stop_reason != "tool_use":
            break
        call = reply.content[-1]
        output = " ".join(f"{call.id}-weather-{k}" for k in range(sizes[n]))
        output += " (that is enough)" if n == len(sizes) - 1 else ""
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                      "content": output}]})
    assert upstream.refused == []
    assert len(messages) == 2 + 2 * len(sizes) and messages[-1]["content"][-1]["text"].startswith("Answer to:")
    sent = upstream.chats("/v1/messages")
    assert len(sent) == len(sent_by_client)
    compressed = excerpted = 0
    for request, ours in zip(sent, sent_by_client):
        upstream_messages = request.json["messages"]
        compressed += upstream_messages != ours
        if len(ours) > 1:
            # The step the last results answer: the client's own message, byte for byte.
            assert _strip_cache(upstream_messages[-2]) == _strip_cache(ours[-2])
        # Every step of the loop that is sent (ctxd's rendering of the older ones too)
        # opens with its thinking, as the model wrote it.
        for message in upstream_messages:
            if message["role"] == "assistant":
                first = message["content"][0]
                assert first["type"] == "thinking" and wire.verify(first["thinking"], first["signature"])
            excerpted += _strip_cache(upstream_messages[-1]) != _strip_cache(ours[-1])
    assert compressed and excerpted  # (ctxd did compress the loop, the big output included)
