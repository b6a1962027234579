"""The OpenAI Responses API (``client.responses.create``) through ``ctxd proxy`` to a fake
upstream: whole and streamed, tool calls, compression at a small window, and requests
that continue a stored response passing through untouched."""

from __future__ import annotations

import json

import openai
import pytest

from ctxd.tokens import TokenCounter
from tests.proxy.conftest import both_modes, history, sessions
from tests.proxy.upstream import MODEL

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def sdk(proxy, **headers) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-secret-key", max_retries=0,
                              default_headers=headers or None)


def output_items(response) -> list[dict]:
    """What an SDK user appends to ``input`` for the next turn (``input += response.output``)."""
    return [item.model_dump(exclude_none=True) for item in response.output]


@both_modes
async def test_a_conversation_with_tool_calls_whole_and_streamed(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy)
    items: list[dict] = [{"role": "user", "content": "Hello there, please use the tool for Paris."}]
    first = await client.responses.create(model=MODEL, instructions="You are terse.", input=items, tools=TOOLS,
                                          temperature=0.3, store=False)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert first.usage.input_tokens > 0
    items += output_items(first)
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"})
    # Streamed: the answer to the tool result arrives in pieces.
    text = ""
    completed = None
    async for event in await client.responses.create(model=MODEL, instructions="You are terse.", input=items,
                                                     tools=TOOLS, stream=True, store=False):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed":
            completed = event.response
    assert text == "Answer to: the result of tool" and completed is not None
    items += output_items(completed)
    items.append({"role": "user", "content": [{"type": "input_text", "text": "Thanks. And tomorrow?"}]})
    third = await client.responses.create(model=MODEL, instructions="You are terse.", input=items,
                                          max_output_tokens=50, store=False)
    assert third.output_text == "Answer to: Thanks. And tomorrow?"

    sent = upstream.chats("/v1/responses")
    assert len(sent) == 3
    # Nothing to compress yet: the upstream gets the client's own items and parameters.
    assert sent[0].json["tools"] == TOOLS and sent[0].json["temperature"] == 0.3
    assert sent[2].json["max_output_tokens"] == 50 and sent[2].json["store"] is False
    assert all(r.json["instructions"] == "You are terse." for r in sent)
    assert sent[2].json["input"] == items
    assert all(r.headers["authorization"] == "Bearer sk-test-secret-key" for r in sent)
    # One session holds the conversation once, each reply with its usage.
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-responses-")]
    assert info["systemPrompt"] == "You are terse." and info["provider"] == "openai"
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert stored[1]["toolCalls"][0]["function"]["name"] == "get_weather"
    assert stored[2]["toolCallId"] == call.call_id and stored[2]["content"] == "Sunny, 21 C"
    assert stored[1]["usage"]["inputTokens"] > 0 and stored[3]["usage"]["outputTokens"] > 0
    assert stored[5]["content"] == "Answer to: Thanks. And tomorrow?"
    assert "sk-test-secret-key" not in proxy.log()


async def test_previous_response_id_passes_through_untouched(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy)
    body = {"model": MODEL, "previous_response_id": "resp_earlier",
            "input": [{"role": "user", "content": "And then?"}]}
    # The fake upstream does not keep responses: it answers from the items it was given.
    reply = await client.responses.create(**body)
    assert reply.output_text == "Answer to: And then?"
    [received] = upstream.chats("/v1/responses")
    assert received.json == body
    assert await sessions(ctxd_daemon) == []


@both_modes
async def test_a_cut_stream_is_an_error_and_nothing_is_pushed(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy, **{"X-Ctxd-Session": "cut"})
    upstream.mode = "cut"
    with pytest.raises(openai.APIError, match="ctxd proxy"):
        async for _ in await client.responses.create(model=MODEL, input="Tell me a story.", stream=True):
            pass
    assert [m["role"] for m in await history(ctxd_daemon, "cut")] == ["user"]


async def test_a_long_conversation_is_compressed_and_stays_valid(proxy, upstream, ctxd_daemon) -> None:
    client = sdk(proxy, **{"X-Ctxd-Context-Window": "8192"})
    counter = TokenCounter.for_model("gpt-4o")
    output = " ".join(f"line {i}: build step finished, file src/module_{i}.py compiled" for i in range(40))
    items: list[dict] = []
    users: list[str] = []
    # 40 turns: old tool outputs are cleared first, and with the trigger at 97% of the
    # budget (d996eea) 32 turns no longer needed a compression pass (context 5,422 tokens).
    for turn in range(40):
        users.append(f"Request {turn}: please use the tool to check the build of module {turn}.")
        items.append({"role": "user", "content": users[-1]})
        reply = await client.responses.create(model=MODEL, instructions="You are a build agent.", input=items,
                                              tools=TOOLS)
        [call] = [o for o in reply.output if o.type == "function_call"]
        items += output_items(reply)
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": f"{output} ({turn})"})
        text = ""
        async for event in await client.responses.create(model=MODEL, instructions="You are a build agent.",
                                                         input=items, tools=TOOLS, stream=True):
            if event.type == "response.completed":
                items += output_items(event.response)
                text = event.response.output_text
        assert text == "Answer to: the result of tool"
    assert sum(counter.count(json.dumps(i)) for i in items) > 2 * 8192
    sent = upstream.chats("/v1/responses")
    assert len(sent) == 80  # each one accepted by the fake upstream's item checks
    [info] = await sessions(ctxd_daemon)
    assert info["compressionCount"] >= 1
    last = sent[-1].json
    assert len(last["input"]) < len(items)  # compressed
    assert sum(counter.count(json.dumps(i)) for i in last["input"]) < 8192
    text = json.dumps(last)
    assert all(u in text for u in users)  # every user message, verbatim
    assert last["input"][-2:] == items[-3:-1]  # the newest items are the client's own bytes (the last reply came after)


def test_reasoning_items_stay_with_the_item_they_precede() -> None:
    """ctxd keeps no reasoning items; the client's stay in place, before the client's own
    items they belong to, wherever ctxd's prompt agrees with the client's tail."""
    from ctxd.proxy import apis

    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "opaque", "summary": []}
    answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}
    client = [{"role": "user", "content": "First, a long request."}, reasoning, answer,
              {"role": "user", "content": "Next."}]
    body = {"model": MODEL, "instructions": "Agent.", "input": client}
    parts = apis.split("responses", body)
    # ctxd's prompt where the first user message was replaced by a checkpoint.
    prompt = {"messages": [{"role": "system", "content": "Agent.\n\nCheckpoint: the work so far."},
                           {"role": "user", "content": "[checkpoint 1]"},
                           {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Next."}]}
    out = apis.upstream_body("responses", body, parts, prompt)
    # The client's instructions as sent; ctxd's checkpoint after them, a developer item.
    assert out["input"] == [{"role": "developer", "content": "Checkpoint: the work so far."},
                            {"role": "user", "content": "[checkpoint 1]"}, reasoning, answer, client[-1]]
    assert out["instructions"] == "Agent."
    # Unchanged by ctxd: the client's items and instructions exactly.
    same = {"messages": [{"role": "system", "content": "Agent."}, {"role": "user", "content": "First, a long request."},
                         {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Next."}]}
    out = apis.upstream_body("responses", dict(body), parts, same)
    assert out["input"] == client and out["instructions"] == "Agent."


def test_requests_that_are_not_a_conversation_pass_through() -> None:
    from ctxd.proxy import apis

    assert apis.messages_of("responses", {"input": "Hi"}) == [{"role": "user", "content": "Hi"}]
    assert apis.messages_of("responses", {"input": [], "previous_response_id": "resp_1"}) is None
    assert apis.messages_of("responses", {"input": [], "conversation": "conv_1"}) is None
    assert apis.messages_of("responses", {"model": MODEL}) is None


def test_the_checkpoint_goes_after_the_clients_fixed_prefix() -> None:
    """Codex's shape: ``instructions`` and two leading developer items, then user items.
    ctxd's checkpoint never joins them: they go as sent, in their place, and ctxd's text
    follows them (Responses: a developer item; Chat Completions: a system message after
    the client's own)."""
    from ctxd.proxy import apis

    developer = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: on."}]},
                 {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "AGENTS.md"}]}]
    users = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]}]
    body = {"model": MODEL, "instructions": "You are Codex.", "input": developer + users}
    parts = apis.split("responses", body)
    prompt = {"messages": [{"role": "system", "content": parts.system_text + "\n\n## Earlier: the work so far."},
                           {"role": "user", "content": "<environment_context>"},
                           {"role": "user", "content": "Fix the bug."}]}
    out = apis.upstream_body("responses", dict(body), parts, prompt)
    assert out["instructions"] == "You are Codex."
    assert out["input"] == developer + [{"role": "developer", "content": "## Earlier: the work so far."}] + users
    chat = {"model": MODEL, "messages": [{"role": "system", "content": "You are an agent."},
                                         {"role": "user", "content": "Go."}]}
    parts = apis.split("openai", chat)
    prompt = {"messages": [{"role": "system", "content": "You are an agent.\n\n## Earlier: done."},
                           {"role": "user", "content": "Go."}]}
    out = apis.upstream_body("openai", dict(chat), parts, prompt)
    assert out["messages"] == [chat["messages"][0], {"role": "system", "content": "## Earlier: done."},
                               chat["messages"][1]]


async def test_the_file_an_agent_reads_then_patches_reaches_the_upstream_whole(proxy, upstream, ctxd_daemon) -> None:
    """An agent reads a file with a shell call (Codex's ``sed -n``), runs long commands, then
    patches it: compression summarizes the commands' outputs, never its read of the file (the
    working set, engine/workset.py), which every later request still shows whole."""
    client = sdk(proxy, **{"X-Ctxd-Context-Window": "8192", "X-Ctxd-Session": "workset"})
    source = "\n".join(f"def step_{i}(value):\n    return value * {i} + {i * 7}  # stage {i}" for i in range(25))
    log = " ".join(f"build {i}: compiled module_{i}.o in {i * 3} ms, no warnings" for i in range(70))
    shell = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
             {"type": "function", "name": "apply_patch", "parameters": {"type": "object"}}]
    items: list[dict] = [{"role": "user", "content": "Fix step_5 in src/app.py (task WS-1)."}]

    def call(n: int, name: str, arguments: dict, output: str) -> None:
        items.append({"type": "function_call", "call_id": f"call_{n}", "name": name,
                      "arguments": json.dumps(arguments)})
        items.append({"type": "function_call_output", "call_id": f"call_{n}", "output": output})

    call(0, "exec_command", {"cmd": "sed -n '1,400p' src/app.py"}, "Output:\n" + source)
    await client.responses.create(model=MODEL, input=items, tools=shell)
    for n in range(1, 9):
        call(n, "exec_command", {"cmd": f"make target_{n}"}, f"Output:\n{log} ({n})")
        await client.responses.create(model=MODEL, input=items, tools=shell)
    patch = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return value * 5 + 35  # stage 5\n" \
            "+    return value * 5 + 36  # stage 5\n*** End Patch\n"
    call(9, "apply_patch", {"input": patch}, "Success. Updated the following files:\nM src/app.py")
    for n in range(10, 13):
        await client.responses.create(model=MODEL, input=items, tools=shell)
        call(n, "exec_command", {"cmd": f"make check_{n}"}, f"Output:\n{log} ({n})")
    await client.responses.create(model=MODEL, input=items, tools=shell)

    sent = upstream.chats("/v1/responses")
    last = sent[-1].json
    assert len(last["input"]) < len(items)  # compressed
    assert not any(i.get("call_id") == "call_1" for i in last["input"])  # (older commands: in a checkpoint)
    read = next(i for i in last["input"] if i.get("call_id") == "call_0" and i["type"] == "function_call_output")
    assert read["output"] == "Output:\n" + source
    assert any(i.get("call_id") == "call_0" and i["type"] == "function_call" for i in last["input"])
    assert last["input"][-1] == items[-1]
