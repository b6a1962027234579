"""The agent harness's own parts, without any CLI: the scripted upstream as the official
SDKs see it (whole and streamed, on all three APIs), its checks worded as the APIs word
them, the tap's pairing, the pricer's cache rule and the script's decisions."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest

from tests.agents import fixture, pricing, script, wire
from tests.agents import measure as measure_module
from tests.agents.measure import expected_diff_ok, measure, newest
from tests.agents.script import Call, Move
from tests.agents.upstream import ScriptedUpstream, model_window


class Fixed(script.Script):
    """Answers every request with one tool call (and a thinking text), then text."""

    def __init__(self, calls: list[Call]) -> None:
        super().__init__()
        self.calls = calls

    def reply(self, v: wire.View) -> Move:
        if any(m.role in ("tool",) or any(b.type == "result" for b in m.blocks) for m in v.trailing()):
            return Move("task", "done")
        return Move("task", "calling", list(self.calls), thinking="I should call the tool.", step=0)


READ = Call("toolu_01ag00nabcdefabcdef12", "Read", {"file_path": "/x"})


@pytest.fixture
def server(tmp_path: Path):
    with ScriptedUpstream(Fixed([READ]), None) as up:
        yield up


def test_anthropic_sdk_streams_thinking_and_tool_use(server: ScriptedUpstream) -> None:
    client = anthropic.Anthropic(base_url=server.tap_url, api_key="k", max_retries=0)
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=100, thinking={"type": "enabled",
                                                                                    "budget_tokens": 50},
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()
    thinking, _text, use = message.content
    assert thinking.type == "thinking" and wire.verify(thinking.thinking, thinking.signature)
    assert use.type == "tool_use" and use.input == {"file_path": "/x"} and message.stop_reason == "tool_use"
    # the conversation sent back as the SDK built it is accepted; the thinking altered is not
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "text"}]}]
    done = client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=history,
                                  thinking={"type": "enabled", "budget_tokens": 50})
    assert done.content[-1].text == "done"
    history[1]["content"][0]["thinking"] = "something else"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature` in `thinking` block"):
        client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=history,
                               thinking={"type": "enabled", "budget_tokens": 50})
    history[1]["content"] = history[1]["content"][1:]  # the turn in progress without its thinking
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
        client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=history,
                               thinking={"type": "enabled", "budget_tokens": 50})
    # every request paired with the client's through the tap, refusals recorded
    assert [e.tap for e in server.record.exchanges] == [t.n for t in server.record.tapped] == [0, 1, 2, 3]
    assert [e.status for e in server.record.exchanges] == [200, 200, 400, 400]


def test_anthropic_prompt_too_long_over_the_models_window(server: ScriptedUpstream) -> None:
    client = anthropic.Anthropic(base_url=server.tap_url, api_key="k", max_retries=0)
    words = "lorem " * (model_window("claude-sonnet-4-6") + 10)
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 200000 maximum"):
        client.messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=[{"role": "user", "content": words}])


def test_openai_chat_sdk_streams_a_tool_call_and_pairs_results(server: ScriptedUpstream) -> None:
    client = openai.OpenAI(base_url=server.tap_url + "/v1", api_key="k", max_retries=0)
    stream = client.chat.completions.create(model="gpt-4o", stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "hi"}])
    chunks = list(stream)
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].id == READ.id and "".join(c[0].function.arguments or "" for c in calls) == '{"file_path": "/x"}'
    assert chunks[-1].usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError, match="must be a response to a preceeding message with 'tool_calls'"):
        client.chat.completions.create(model="gpt-4o", messages=[
            {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "out"}])
    with pytest.raises(openai.BadRequestError, match="did not have response messages: call_y"):
        client.chat.completions.create(model="gpt-4o", messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "call_y", "type": "function",
                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "and?"}])


def test_openai_responses_sdk_streams_a_freeform_tool_call() -> None:
    patch = "*** Begin Patch\n*** End Patch\n"
    with ScriptedUpstream(Fixed([Call("call_ag23nabcdefabcdef12", "apply_patch", patch)]), None) as up:
        client = openai.OpenAI(base_url=up.tap_url + "/v1", api_key="k", max_retries=0)
        tools = [{"type": "custom", "name": "apply_patch", "description": "edit files"}]
        with client.responses.stream(model="gpt-5.5", input="hi", tools=tools,
                                     include=["reasoning.encrypted_content"], store=False) as stream:
            response = stream.get_final_response()
        reasoning, _message, call = response.output
        assert reasoning.type == "reasoning" and wire.unseal(reasoning.encrypted_content) == "I should call the tool."
        assert call.type == "custom_tool_call" and call.input == patch
        back = [{"type": "message", "role": "user", "content": "hi"},
                reasoning.model_dump(exclude_none=True), call.model_dump(exclude_none=True),
                {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."}]
        assert client.responses.create(model="gpt-5.5", input=back, tools=tools, store=False).output_text == "done"
        back[1]["encrypted_content"] = "forged"
        with pytest.raises(openai.BadRequestError, match="could not be verified"):
            client.responses.create(model="gpt-5.5", input=back, tools=tools, store=False)
        with pytest.raises(openai.BadRequestError, match="No tool output found for function call call_z"):
            client.responses.create(model="gpt-5.5", store=False, input=[
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "call_z", "name": "f", "arguments": "{}"}])


def test_anthropic_at_most_four_breakpoints() -> None:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 10,
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user" if i % 2 == 0 else "assistant",
                          "content": [{"type": "text", "text": f"m{i}", "cache_control": {"type": "ephemeral"}}]}
                         for i in range(4)]}
    assert wire.problem("anthropic", body, wire.view("anthropic", body)) == \
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    body["system"][0].pop("cache_control")
    assert wire.problem("anthropic", body, wire.view("anthropic", body)) is None


def test_pricing_caches_the_common_prefix_in_blocks() -> None:
    assert [pricing.cached(n, pricing.OPENAI) for n in (1023, 1024, 1151, 1152, 5000)] == [0, 1024, 1024, 1152, 4992]
    a = list(range(3000))
    b = a[:2000] + [-1] * 500
    assert pricing.common_prefix(a, b) == 2000 and pricing.common_prefix(a, a[:10]) == 10
    first, second, third = pricing.price([a, b, a], pricing.ANTHROPIC)
    assert (first.cached, first.cost) == (0, 3000 * 1.25)
    assert second.cached == 1920 and second.cost == pytest.approx(1920 * 0.1 + 580 * 1.25)
    assert third.cached == 2944  # the whole first request, in 128-token blocks
    assert [b.cost for b in pricing.price([a, b], pricing.OPENAI)] == [3000, pytest.approx(192 + 580)]


def test_script_follows_the_newest_tool_result_and_checks_what_it_sees() -> None:
    s = script.ClaudeCode("/repo", script.SHORT_PLAN)

    def request(*messages: dict) -> wire.View:
        return wire.view("anthropic", {"model": "m", "max_tokens": 1, "messages": list(messages)})

    task = {"role": "user", "content": script.TASK}
    first = s.reply(request(task))
    assert first.step == 0 and first.calls[0].name == "Bash"
    # the result of the step before the edit, with the line to change out of sight: read again first
    before = s.edit_step - 1
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": script.call_id("toolu_01", before),
                                              "name": "Read", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": script.call_id("toolu_01", before),
                                           "content": "(folded)"}]}
    again = s.reply(request(task, call, result))
    assert again.calls[0].name == "Read" and again.calls[0].id == script.call_id("toolu_01", s.edit_step, "r")
    shown = dict(result, content=[dict(result["content"][0], content=fixture.BUGGY)])
    edit = s.reply(request(task, call, shown))
    assert edit.step == s.edit_step and edit.calls[0].name == "Edit"
    # a request of another conversation (no task in it) gets a side answer
    assert s.reply(request({"role": "user", "content": "hello"})).kind == "other"


def test_measures_read_the_newest_turn_and_the_fix() -> None:
    body = {"messages": [{"role": "user", "content": "q", "cache_control": {"type": "ephemeral"}},
                         {"role": "system", "content": "reminder"}]}
    assert newest("chat", body) == [{"role": "user", "content": "q"}, {"role": "system", "content": "reminder"}]
    good = (f"diff --git a/{fixture.EDITED} b/{fixture.EDITED}\n--- a/{fixture.EDITED}\n+++ b/{fixture.EDITED}\n"
            f"@@ -1 +1 @@\n-{fixture.BUGGY}+{fixture.FIXED}")
    assert expected_diff_ok(good)
    assert not expected_diff_ok(good.replace(fixture.FIXED, "    return 0\n"))


def _run(client_body: dict, upstream_body: dict, files: dict[str, str], shown: list[str], window: int) -> dict:
    """A one-request run record as tests/agents/run.py writes it (chat API)."""
    return {"cli": "aider", "via": "proxy", "window": window, "model": "gpt-4o", "returncode": 0, "files": files,
            "tapped": [{"n": 0, "body": client_body, "shown": shown}],
            "exchanges": [{"n": 0, "tap": 0, "api": "chat", "status": 200, "kind": "task", "step": 0,
                           "tokens": wire.count("chat", upstream_body), "body": upstream_body}]}


def test_the_clients_own_files_apart_from_its_tool_reads_and_what_cannot_fit() -> None:
    """A file the client sends in its own words (aider's files in the chat) is one of its
    files; one in a tool result is a view. A request whose fixed part, files, newest turn and
    reply floor are over the window counts as "cannot fit", not as a miss."""
    small = "\n".join(f"line {k}: value = {k * 3}" for k in range(40))
    big = "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(700))
    files = {"a": small, "b": big}
    client = {"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are aider."},
        {"role": "user", "content": f"src/app.py\n```\n{small}\n```"},
        {"role": "assistant", "content": "Ok.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
        {"role": "user", "content": "Fix the bug."}]}
    cut = json.loads(json.dumps(client))
    cut["messages"][3]["content"] = big[:500] + "\n[... left out ...]"
    m = measure(_run(client, cut, files, ["a", "b"], 32_000))
    assert (m.files_intact, m.files_pairs, m.files_unfit) == (1, 1, 0)  # its own file; the cat is a view
    assert (m.views_intact, m.views) == (0, 1)
    dropped = json.loads(json.dumps(cut))
    dropped["messages"][1]["content"] = "src/app.py (left out)"
    m = measure(_run(client, dropped, files, ["a", "b"], 32_000))
    assert (m.files_intact, m.files_pairs, m.files_unfit) == (0, 1, 0)  # it fits: a miss
    fixed = wire.count("chat", dict(client, messages=client["messages"][:1] + client["messages"][-1:]))
    floor = measure_module.reply_floor("chat", client, 8_000)  # a window under 8,192: the floor's least
    tight = fixed + wire.count_text(small) + floor - 5
    assert tight < 8_192 and measure_module.reply_floor("chat", client, tight) == floor
    m = measure(_run(client, dropped, files, ["a", "b"], tight))
    assert (m.files_intact, m.files_pairs, m.files_unfit) == (0, 0, 1)  # cannot fit: counted apart


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
def test_a_tool_result_cannot_fit_without_the_call_it_answers(api: str) -> None:
    """The newest turn is a tool result: a prompt that holds it holds its call too (the
    providers refuse a result without one), so the call counts toward what must fit."""
    read = "\n".join(f"{k}: SKU-{k:05d},widget {k},{k * 31 % 997},{k % 17}" for k in range(300))
    call_text = "Which items are the dearest? " * 40
    if api == "chat":
        items = [{"role": "user", "content": "Fix it."},
                 {"role": "assistant", "content": call_text, "tool_calls": [
                     {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
                     {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                 {"role": "tool", "tool_call_id": "c2", "content": read}]
        body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Agent."}, *items]}
        key = "messages"
    elif api == "anthropic":
        items = [{"role": "user", "content": "Fix it."},
                 {"role": "assistant", "content": [{"type": "text", "text": call_text},
                                                   {"type": "tool_use", "id": "c2", "name": "bash", "input": {}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c2", "content": read}]}]
        body = {"model": "claude", "system": "Agent.", "messages": items}
        key = "messages"
    else:
        items = [{"role": "user", "content": "Fix it."},
                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": call_text}]},
                 {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{}"},
                 {"type": "function_call_output", "call_id": "c2", "output": read}]
        body = {"model": "gpt-5", "instructions": "Agent.", "input": items}
        key = "input"
    fixed = measure_module._fixed_body(api, body)
    alone = wire.count(api, dict(fixed, **{key: list(fixed[key]) + items[-1:]}))
    answered = items[2:] if api == "responses" else items[1:]  # (from the call on: the user's words may go)
    with_call = wire.count(api, dict(fixed, **{key: list(fixed[key]) + answered}))
    floor = measure_module.reply_floor(api, body, 8_000)  # (any window under 8,192: the floor's least)
    assert with_call > alone and with_call + floor < 8_000
    assert not measure_module.cannot_fit(api, body, with_call + floor, [])
    # The newest alone would fit one token less: with its call, it cannot.
    assert alone + floor <= with_call + floor - 1
    assert measure_module.cannot_fit(api, body, with_call + floor - 1, [])
