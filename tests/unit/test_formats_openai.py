"""OpenAI Chat Completions (ctxd/formats/openai.py): a client's messages read into ctxd's
and written back the same, ids, usage, and the lenient reading importers use."""

from __future__ import annotations

import msgspec

from ctxd import formats
from ctxd.formats import openai
from ctxd.formats.common import turn_of
from ctxd.protocol.message import (
    FunctionCall,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
)

from ._formats_helpers import rendered, stored

CONVERSATION = [
    {"role": "user", "content": "list the files", "name": "ana"},
    {"role": "assistant", "content": "Looking.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "pwd", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "README.md"},
    {"role": "tool", "tool_call_id": "call_2", "content": "/src"},
    {"role": "assistant", "content": "One file, in /src."},
]


def test_a_conversation_comes_back_as_the_client_sent_it():
    messages, _ = rendered("openai", stored("openai", CONVERSATION))
    assert messages == CONVERSATION  # arguments kept verbatim, names kept


def test_what_ctxd_stores_for_each_message():
    user, call, result = (formats.to_ctxd("openai", m) for m in CONVERSATION[:3])
    assert user == {"role": "user", "content": "list the files", "name": "ana"}
    assert call is not None and [c["id"] for c in call["toolCalls"]] == ["call_1", "call_2"]
    assert result == {"role": "tool", "toolCallId": "call_1", "content": "README.md"}
    assert formats.to_ctxd("openai", {"role": "developer", "content": "be brief"}) == \
        {"role": "system", "content": "be brief"}
    assert formats.to_ctxd("openai", {"role": "critic", "content": "x"}) is None


def test_parts_ctxd_does_not_keep_are_named_never_silently_lost():
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]}
    assert formats.to_ctxd("openai", image) == {
        "role": "user", "content": "[image_url not kept by ctxd]", "metadata": {"ctxdProxyUnkept": ["image_url"]}}
    both = {"role": "user", "content": [{"type": "text", "text": "this one"}, {"type": "input_audio"}]}
    assert formats.to_ctxd("openai", both) == {"role": "user", "content": "this one",
                                                "metadata": {"ctxdProxyUnkept": ["input_audio"]}}
    # The chain sees the unkept part; the projection (what ctxd renders) does not.
    assert formats.chain_part("openai", both) == ["user", [("x", "input_audio", None), ("t", "this one")]]
    assert formats.projection("openai", both) == ["user", [("t", "this one")]]


def test_the_projection_does_not_see_spelling():
    a = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]}
    b = {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 2, "b": 1}}}]}
    assert formats.projection("openai", a) == formats.projection("openai", b)
    assert formats.chain_part("openai", {"role": "user", "content": "  "}) is None  # nothing in it


def test_ids_of_a_raw_message():
    assert formats.ids_of("openai", CONVERSATION[1]) == [("call", "call_1"), ("call", "call_2")]
    assert formats.ids_of("openai", CONVERSATION[2]) == [("result", "call_1")]
    assert formats.ids_of("openai", CONVERSATION[0]) == []
    assert formats.ids_of("openai", {"role": "tool", "tool_call_id": 7}) == []  # not an id
    assert formats.ids_of("openai", "not a message") == []


def test_usage():
    raw = {"prompt_tokens": 5401, "completion_tokens": 137, "total_tokens": 5538,
           "prompt_tokens_details": {"cached_tokens": 5120}, "completion_tokens_details": {"reasoning_tokens": 64}}
    # (cached_tokens is part of prompt_tokens: cachedInputTokens, no cacheReadTokens)
    assert formats.usage("openai", raw) == {"inputTokens": 5401, "outputTokens": 137, "totalTokens": 5538,
                                            "reasoningTokens": 64, "cachedInputTokens": 5120}
    # DeepSeek's spelling of the same
    assert formats.usage("openai", {"prompt_tokens": 900, "prompt_cache_hit_tokens": 640}) == \
        {"inputTokens": 900, "cachedInputTokens": 640}
    assert formats.usage("openai", {"prompt_tokens": -1, "completion_tokens": True, "total_tokens": 2.0}) == {}
    assert formats.usage("openai", None) == {}


def test_a_reply_is_kept_as_the_client_sends_it_back():
    assert openai.reply_message({"role": "assistant", "content": "hi", "refusal": None, "annotations": []}) == \
        {"role": "assistant", "content": "hi"}


def test_lenient_reading_round_trips_through_the_export_lines():
    warnings: list[str] = []
    for raw in CONVERSATION:
        message = openai.to_message(raw, "here", warnings.append)
        assert message is not None and openai.is_plain(message)
        assert openai.export_lines(message) == [raw]
    assert warnings == []


def test_lenient_reading_says_what_it_changed():
    warnings: list[str] = []
    message = openai.to_message(
        {"role": "function", "content": [{"type": "image_url"}, {"type": "text", "text": "seen"}],
         "reasoning_content": "hmm", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
         "extra_key": 1, "timestamp": 0}, "message 3", warnings.append, index=3)
    assert message == Message(
        role="tool", content=[ThinkingBlock(thinking="hmm"), TextBlock(text="[image omitted]"), TextBlock(text="seen")],
        tool_calls=[ToolCall(id="call_3_0", function=FunctionCall(name="f", arguments='{"a":1}'))],
        metadata={"originalRole": "function", "thinkingSource": "reasoning_content", "extra_key": 1},
        timestamp="1970-01-01T00:00:00Z")
    assert warnings == ["message 3: image_url part replaced by '[image omitted]'",
                        "message 3: tool call 0 has no id, using 'call_3_0'"]
    assert openai.to_message("text", "line 1", warnings.append) is None and warnings[-1] == \
        "line 1: skipped, not a JSON object"


def test_a_message_openai_cannot_hold_is_exported_as_the_prompt_renders_it():
    message = Message(role="assistant", content=[ThinkingBlock(thinking="hm"), TextBlock(text="Running."),
                                                 ToolUseBlock(id="t1", name="sh", input={"cmd": "ls"})])
    lines = openai.export_lines(message)
    assert lines == [msgspec.to_builtins(m) for m in openai.emit([turn_of(message)])]
    assert lines == [{"role": "assistant", "content": "Running.",
                      "tool_calls": [{"id": "t1", "type": "function",
                                      "function": {"name": "sh", "arguments": '{"cmd":"ls"}'}}]}]
    results = Message(role="user", name="ana", timestamp="2026-01-01T00:00:00Z", content=[
        ToolResultBlock(tool_use_id="t1", content="a b"), TextBlock(text="and now?")])
    assert openai.export_lines(results) == [{"role": "tool", "content": "a b", "tool_call_id": "t1"},
                                            {"role": "user", "content": "and now?", "name": "ana"}]
    assert openai.export_lines(Message(role="assistant", content=[ThinkingBlock(thinking="only")])) == \
        [{"role": "assistant", "content": None}]  # never no line: the line carries the message


def test_system_text_of_leading_messages():
    assert openai.system_text([{"role": "system", "content": "a"},
                               {"role": "developer", "content": [{"type": "text", "text": "b"}]}]) == "a\n\nb"


FREEFORM = [
    {"role": "user", "content": "fix the rounding"},
    {"role": "assistant",
     "tool_calls": [{"id": "call_p", "type": "custom",
                     "custom": {"name": "apply_patch", "input": "*** Begin Patch\n*** Update File: a.py\n-x\n+y\n"}}]},
    {"role": "tool", "tool_call_id": "call_p", "content": "Done."},
]


def test_a_freeform_call_is_kept_as_sent_and_comes_back_in_its_shape():
    call = formats.to_ctxd("openai", FREEFORM[1])
    assert call == {"role": "assistant", "toolCalls": [FREEFORM[1]["tool_calls"][0]]}
    message = msgspec.convert(call, Message)
    assert message.tool_calls is not None and message.tool_calls[0].type == "custom"
    assert message.tool_calls[0].name == "apply_patch" and message.tool_calls[0].text.startswith("*** Begin")
    messages, _ = rendered("openai", stored("openai", FREEFORM))
    assert messages == FREEFORM
    # Its result answers it under its own role; ids and the projection see it as a call.
    assert formats.ids_of("openai", FREEFORM[1]) == [("call", "call_p")]
    assert formats.projection("openai", FREEFORM[1]) == \
        ["assistant", [("u", "call_p", "apply_patch", FREEFORM[1]["tool_calls"][0]["custom"]["input"], "custom")]]
    assert formats.projection("openai", FREEFORM[1]) != formats.projection("openai", {
        "role": "assistant", "tool_calls": [{"id": "call_p", "type": "function", "function": {
            "name": "apply_patch", "arguments": FREEFORM[1]["tool_calls"][0]["custom"]["input"]}}]})


def test_a_freeform_call_elsewhere():
    warnings: list[str] = []
    message = openai.to_message(FREEFORM[1], "line 2", warnings.append)
    assert message is not None and warnings == [] and openai.export_lines(message) == [dict(FREEFORM[1], content=None)]
    # Anthropic has no freeform calls: the text goes as the tool_use's one field.
    anthropic_messages, _ = rendered("anthropic", stored("openai", FREEFORM))
    assert anthropic_messages[1]["content"] == [
        {"type": "tool_use", "id": "call_p", "name": "apply_patch",
         "input": {"input": FREEFORM[1]["tool_calls"][0]["custom"]["input"]}}]


def test_a_tool_call_is_a_function_or_a_freeform_one_never_both():
    for bad in ({"id": "c", "type": "custom"}, {"id": "c"},
                {"id": "c", "type": "custom", "custom": {"name": "p"}, "function": {"name": "p"}}):
        try:
            msgspec.convert(bad, ToolCall)
        except msgspec.ValidationError as exc:
            assert "tool call has" in str(exc)
        else:
            raise AssertionError(bad)
    # A function call is written as before (no "custom" key).
    assert msgspec.to_builtins(ToolCall(id="c", function=FunctionCall(name="f", arguments="{}"))) == \
        {"id": "c", "function": {"name": "f", "arguments": "{}"}, "type": "function"}
