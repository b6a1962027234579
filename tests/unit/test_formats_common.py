"""What the provider formats share (ctxd/formats/common.py, native.py): the proxy's hash
chain stays the same across versions, stored messages read as turns, usage from any
provider, provider spellings on a push."""

from __future__ import annotations

import pytest

from ctxd import formats
from ctxd.formats import native
from ctxd.formats.common import Call, Result, Turn, content_blocks, ctxd_ids, read_usage, turn_of
from ctxd.protocol.message import FunctionCall, Message, TextBlock, ToolCall, ToolResultBlock, ToolUseBlock, Usage
from ctxd.proxy.convert import chain_hash

from . import test_formats_anthropic, test_formats_ollama, test_formats_openai, test_formats_responses

# Each message the proxy pushes carries its link of this chain (metadata.ctxdProxy.hash, and
# its idempotency key): a reading that changed it would fork every session after an upgrade.
# The values are what earlier versions computed for these conversations.
CHAINS = [
    ("openai", test_formats_openai.CONVERSATION, "f0d6a94f9889acb10e6a"),
    ("anthropic", test_formats_anthropic.CONVERSATION, "b21f3df22ecb3974266c"),
    ("responses", test_formats_responses.ITEMS, "4b247e43cbd36ea86dac"),
    ("ollama", test_formats_ollama.CONVERSATION, "934ca057117d6423d487"),
]


@pytest.mark.parametrize(("api", "conversation", "expected"), CHAINS, ids=[c[0] for c in CHAINS])
def test_the_hash_chain_of_a_conversation_does_not_change(api, conversation, expected):
    link = ""
    for message in conversation:
        part = formats.chain_part(api, message)
        if part is not None:
            link = chain_hash(link, part)
    assert link == expected


def test_a_stored_message_as_a_turn_whichever_tool_style():
    openai_style = Message(role="assistant", content="Looking.", tool_calls=[
        ToolCall(id="c1", function=FunctionCall(name="ls", arguments='{"path": "."}'))])
    anthropic_style = Message(role="assistant", content=[TextBlock(text="Looking."),
                                                         ToolUseBlock(id="c1", name="ls", input={"path": "."})])
    a, b = turn_of(openai_style), turn_of(anthropic_style)
    assert a.calls == [Call("c1", "ls", {"path": "."}, '{"path": "."}')]
    assert b.calls == [Call("c1", "ls", {"path": "."}, '{"path":"."}')]  # compact, as counted
    assert a.texts == b.texts == ["Looking."]
    results = turn_of(Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="x", is_error=True)]))
    assert results == Turn("user", results=[Result("c1", "x", True)])
    assert turn_of(Message(role="tool", tool_call_id="c1", name="ls", content="x")) == \
        Turn("results", results=[Result("c1", "x", False, "ls")])


def test_usage_fields_first_present_wins_and_only_counts():
    fields = (("a", None, "inputTokens"), ("b", None, "inputTokens"), ("c", "d", "outputTokens"))
    assert read_usage({"b": 2, "a": 1, "c": {"d": 3}}, fields) == {"inputTokens": 1, "outputTokens": 3}
    assert read_usage({"a": -1, "b": 2, "c": {"d": True}}, fields) == {"inputTokens": 2}
    assert read_usage([1], fields) == {}


def test_usage_from_any_provider():
    assert native.any_usage({"prompt_tokens": 5, "completion_tokens": 1}) == Usage(input_tokens=5, output_tokens=1)
    assert native.any_usage({"input_tokens": 3, "cache_read_input_tokens": 7}) == \
        Usage(input_tokens=3, cache_read_tokens=7)
    assert native.any_usage({"output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 2}}) == \
        Usage(output_tokens=4, reasoning_tokens=2)
    assert native.any_usage({"prompt_eval_count": 9}) == Usage(input_tokens=9)
    assert native.any_usage({"prompt_tokens": -3}) is None and native.any_usage("x") is None


def test_a_pushed_responses_usage_keeps_its_reasoning_count():
    messages = [{"role": "assistant", "content": "done",
                 "usage": {"input_tokens": 90, "output_tokens": 30, "total_tokens": 120,
                           "output_tokens_details": {"reasoning_tokens": 20}}}]
    native.accept_native_names(messages)
    assert messages[0]["usage"] == {"inputTokens": 90, "outputTokens": 30, "totalTokens": 120,
                                    "reasoningTokens": 20}
    assert messages[0]["metadata"] == {"usageDetails": {"output_tokens_details": {"reasoning_tokens": 20}}}


def test_content_blocks_of_either_shape():
    warnings: list[str] = []
    meta: dict = {}
    blocks = content_blocks([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                             {"type": "image", "source": {}}, {"type": "redacted_thinking", "data": "d"},
                             {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]},
                             {"type": "mystery"}], "line 4", warnings.append, meta)
    assert blocks == [TextBlock(text="a"), TextBlock(text="[image omitted]"),
                      ToolResultBlock(tool_use_id="t", content=[TextBlock(text="r")]),
                      TextBlock(text="[mystery block omitted]")]
    assert meta == {"cache_control": {"type": "ephemeral"}, "redacted_thinking": ["d"]}
    assert len(warnings) == 3 and all(w.startswith("line 4: ") for w in warnings)


@pytest.mark.parametrize(("api", "conversation"), [c[:2] for c in CHAINS if c[0] != "ollama"],
                         ids=[c[0] for c in CHAINS if c[0] != "ollama"])
def test_a_stored_message_carries_the_client_messages_call_ids(api, conversation):
    for raw in conversation:
        stored = formats.to_ctxd(api, raw)
        client = [ref for ref in formats.ids_of(api, raw) if ref[0] != "item"]
        assert ctxd_ids(stored) == client, raw
