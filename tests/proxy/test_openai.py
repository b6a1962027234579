"""The official openai SDK through ``ctxd proxy`` to a fake upstream."""

from __future__ import annotations

import openai

from tests.proxy.conftest import both_modes, history, sessions
from tests.proxy.upstream import MODEL

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def sdk(proxy, **headers) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-secret-key", max_retries=0,
                              default_headers=headers or None)


@both_modes
async def test_a_conversation_with_tool_calls_whole_and_streamed(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy)
    messages: list[dict] = [{"role": "system", "content": "You are terse."},
                            {"role": "user", "content": "Hello there, please use the tool for Paris."}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0.3)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert first.usage.prompt_tokens > 0
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"})
    # Streamed: the tool result's answer arrives in pieces.
    stream = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True,
                                                  stream_options={"include_usage": True})
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "Answer to: the result of tool"
    messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": "Thanks. And tomorrow?"})
    third = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=50)
    assert third.choices[0].message.content == "Answer to: Thanks. And tomorrow?"

    sent = upstream.chats("/v1/chat/completions")
    assert len(sent) == 3
    # The client's other parameters are untouched; its key is forwarded.
    assert sent[0].json["tools"] == TOOLS and sent[0].json["temperature"] == 0.3
    assert sent[2].json["max_tokens"] == 50
    assert all(r.headers["authorization"] == "Bearer sk-test-secret-key" for r in sent)
    assert sent[2].json["messages"] == messages
    # One session holds the whole conversation once, the replies with their usage.
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-openai-")]
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert info["systemPrompt"] == "You are terse."
    assert stored[1]["toolCalls"][0]["function"]["name"] == "get_weather"
    assert stored[1]["usage"]["inputTokens"] > 0
    assert stored[3]["usage"]["outputTokens"] > 0  # include_usage's last chunk
    assert stored[5]["content"] == "Answer to: Thanks. And tomorrow?"
    assert "sk-test-secret-key" not in proxy.log()
    # Nor stored: no file of the daemon's data directory holds it (the database, its WAL).
    for path in ctxd_daemon.data_dir.rglob("*"):
        if path.is_file():
            assert b"sk-test-secret-key" not in path.read_bytes(), path
