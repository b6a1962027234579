"""Reading a request's conversation reuses the previous request's work on the messages
both start with; the result must be what a reading from scratch gives, whatever changed."""

from __future__ import annotations

import copy

import pytest

from ctxd.proxy import apis
from ctxd.proxy.sessions import conversation


def openai_history(turns: int) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "Agent."}]
    for n in range(turns):
        messages.append({"role": "user", "content": f"Step {n}, please."})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {n}}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"output {n}"})
        messages.append({"role": "assistant", "content": f"Done {n}."})
    return messages


def read(api, messages, previous=None, key="messages"):
    body = {"model": "m", key: messages}
    if api == "anthropic":
        body["system"] = "Agent."
    return conversation(api, body, apis.split(api, body), session=None, window=None, previous=previous)


def same(a, b) -> None:
    assert a.chain == b.chain and a.counts == b.counts and a.base_id == b.base_id
    assert [(m, p) for m, p, _ in a.items] == [(m, p) for m, p, _ in b.items]


@pytest.mark.parametrize("change", ["grown", "edited", "shorter", "system", "empty"])
def test_reuse_gives_what_a_fresh_reading_gives(change: str) -> None:
    first = openai_history(5)
    before = read("openai", first)
    second = copy.deepcopy(first)
    if change == "grown":
        second += [{"role": "user", "content": "More."}]
    elif change == "edited":
        second[6]["content"] = "edited output"
    elif change == "shorter":
        second = second[:7]
    elif change == "system":
        second[0]["content"] = "Another agent."
    else:
        second = second[:1]
    fresh = read("openai", second)
    reused = read("openai", second, previous=before)
    same(reused, fresh)
    if change == "grown":
        assert reused.chain[:len(before.chain)] == before.chain and len(reused.chain) == len(before.chain) + 1


def test_reuse_on_responses_items_and_a_different_api() -> None:
    items = [{"role": "user", "content": "Hi."}, {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    before = read("responses", items, key="input")
    grown = items + [{"role": "assistant", "content": "Done."}]
    same(read("responses", grown, previous=before, key="input"), read("responses", grown, key="input"))
    # A previous reading of another API is not reused.
    other = read("openai", [{"role": "user", "content": "Hi."}])
    same(read("responses", grown, previous=other, key="input"), read("responses", grown, key="input"))


def test_a_streamed_freeform_call_is_read_as_one() -> None:
    """Chat Completions: a custom tool's call streamed in pieces is the reply's freeform
    call (``type: "custom"``), as the client sends it back."""
    import json

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() \
            + b"\n\n"

    assembler = apis.Assembler("openai")
    for data in (chunk({"role": "assistant", "content": None}),
                 chunk({"tool_calls": [{"index": 0, "id": "call_p", "type": "custom",
                                        "custom": {"name": "apply_patch", "input": "*** Begin"}}]}),
                 chunk({"tool_calls": [{"index": 0, "custom": {"input": " Patch\n"}}]}),
                 chunk({}, "tool_calls"), b"data: [DONE]\n\n"):
        assembler.feed(data)
    reply = assembler.finish()
    assert reply.message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch\n"}}]}
