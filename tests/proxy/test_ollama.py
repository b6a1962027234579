"""The ``ollama`` Python client through ``ctxd proxy`` to a fake upstream."""

from __future__ import annotations

import httpx
import ollama

from tests.proxy.conftest import both_modes, history, sessions
from tests.proxy.upstream import MODEL

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


@both_modes
async def test_chat_streamed_with_tools_and_pass_through(proxy, upstream, ctxd_daemon) -> None:
    client = ollama.AsyncClient(host=proxy.url)
    messages: list[dict] = [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Please use the tool for Paris."}]
    first = await client.chat(model=MODEL, messages=messages, tools=TOOLS, stream=False,
                              options={"num_ctx": 8192, "temperature": 0})
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    messages.append(first.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"})
    parts = [part async for part in await client.chat(model=MODEL, messages=messages, tools=TOOLS, stream=True,
                                                       options={"num_ctx": 8192})]
    assert len(parts) > 2 and parts[-1].done
    text = "".join(p.message.content for p in parts)
    assert text == "Answer to: the result of tool"
    messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": "And tomorrow?"})
    third = await client.chat(model=MODEL, messages=messages, stream=False, options={"num_ctx": 8192})
    assert third.message.content == "Answer to: And tomorrow?"

    sent = upstream.chats("/api/chat")
    assert sent[0].json["options"] == {"num_ctx": 8192, "temperature": 0}
    assert sent[2].json["messages"][0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in sent[2].json["messages"]] == ["system", "user", "assistant", "tool", "assistant",
                                                             "user"]
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-ollama-")]
    assert info["contextWindow"] == 8192  # options.num_ctx is the window
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert stored[2]["toolCallId"] == stored[1]["toolCalls"][0]["id"]
    assert stored[3]["usage"]["outputTokens"] > 0

    # Everything else passes through unchanged.
    listed = await client.list()
    assert listed.models[0].model == MODEL
    async with httpx.AsyncClient() as http:
        models = await http.get(proxy.url + "/v1/models", headers={"authorization": "Bearer k"})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    assert models.headers["x-upstream"] == "fake"
    assert [r.path for r in upstream.received][-2:] == ["/api/tags", "/v1/models"]
