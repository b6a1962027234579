"""Params decoding (server/app.py): provider-native message spellings, unknown fields."""

from __future__ import annotations

import pytest

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.message import FunctionCall, TextBlock, ToolCall, ToolResultBlock, ToolUseBlock, Usage
from ctxd.protocol.methods import METHODS
from ctxd.service.params import decode_params

PUSH = METHODS["session/push"]


def push(*messages: dict) -> list:
    return decode_params(PUSH, {"sessionId": "s", "messages": list(messages)}).messages


def test_openai_messages_as_the_api_returns_them():
    call, reply, answer = push(
        {"role": "assistant", "content": None, "refusal": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a b"},
        {"role": "assistant", "content": "I can't.", "refusal": "policy", "annotations": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
    )
    assert call.tool_calls == [ToolCall(id="call_1", function=FunctionCall(name="ls", arguments="{}"))]
    assert call.metadata is None  # a null refusal is nothing to keep
    assert reply.tool_call_id == "call_1"
    assert answer.metadata == {"refusal": "policy"}
    assert answer.usage == Usage(input_tokens=5, output_tokens=1, total_tokens=6)


def test_ollama_counts_passed_on_as_usage():
    (answer,) = push({"role": "assistant", "content": "hi", "usage": {"prompt_eval_count": 812, "eval_count": 9}})
    assert answer.usage == Usage(input_tokens=812, output_tokens=9)


def test_anthropic_blocks_as_the_api_returns_them():
    use, result = push(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"c": 1}}],
         "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 2,
                   "cache_creation_input_tokens": 4}},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "x"}],
                                      "cache_control": {"type": "ephemeral"}}]},
    )
    assert use.content == [ToolUseBlock(id="toolu_1", name="bash", input={"c": 1})]
    assert use.usage == Usage(input_tokens=10, output_tokens=3, cache_read_tokens=2, cache_write_tokens=4)
    assert result.content == [ToolResultBlock(tool_use_id="toolu_1", content=[TextBlock(text="x")], is_error=True)]


def test_both_spellings_at_once_is_refused_not_guessed():
    with pytest.raises(CtxdError) as error:
        push({"role": "tool", "toolCallId": "ours", "tool_call_id": "theirs", "content": "x"})
    assert error.value.code == ErrorCode.InvalidParams and "tool_call_id" in error.value.message


def test_unknown_fields_are_named():
    with pytest.raises(CtxdError) as error:
        push({"role": "user", "content": "x", "colour": "red"})
    assert error.value.code == ErrorCode.InvalidParams and "colour" in error.value.message
    with pytest.raises(CtxdError) as error:
        decode_params(METHODS["session/get"], {"sessionId": "s", "session": "t"})
    assert error.value.data == {"field": "session"}
    assert decode_params(METHODS["session/get"], {"sessionId": "s", "workDoneToken": 1}).session_id == "s"


def test_usage_details_and_citations_are_kept_not_refused():
    openai, anthropic = push(
        {"role": "assistant", "content": "done",
         "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                   "prompt_tokens_details": {"cached_tokens": 32, "audio_tokens": 0},
                   "completion_tokens_details": {"reasoning_tokens": 12}}},
        {"role": "assistant", "content": [{"type": "text", "text": "per the docs", "cache_control": None,
                                           "citations": [{"type": "char_location", "cited_text": "x"}]}],
         "usage": {"input_tokens": 9, "output_tokens": 4, "service_tier": "standard",
                   "cache_creation": {"ephemeral_5m_input_tokens": 0}}},
    )
    # (cached_tokens is part of prompt_tokens for OpenAI: cachedInputTokens, not cacheReadTokens)
    assert openai.usage == Usage(input_tokens=50, output_tokens=20, total_tokens=70, reasoning_tokens=12,
                                 cached_input_tokens=32)
    assert openai.metadata == {"usageDetails": {"prompt_tokens_details": {"cached_tokens": 32, "audio_tokens": 0},
                                                "completion_tokens_details": {"reasoning_tokens": 12}}}
    assert anthropic.content == [TextBlock(text="per the docs")]
    assert anthropic.metadata == {"citations": [{"type": "char_location", "cited_text": "x"}],
                                  "usageDetails": {"service_tier": "standard",
                                                   "cache_creation": {"ephemeral_5m_input_tokens": 0}}}


def test_a_misspelt_usage_field_is_refused_not_hidden():
    with pytest.raises(CtxdError) as error:
        push({"role": "assistant", "content": "x", "usage": {"inputTokens": 5, "outputToken": 3}})
    assert "outputToken" in error.value.message
    [message] = push({"role": "assistant", "content": [{"type": "text", "text": "t", "citations": [{"n": 1}]}],
                      "metadata": {"citations": "mine"}})
    assert message.metadata == {"citations": "mine", "providerCitations": [{"n": 1}]}


def test_a_responses_api_usage_keeps_its_reasoning_count():
    (answer,) = push({"role": "assistant", "content": "done",
                      "usage": {"input_tokens": 90, "output_tokens": 30, "total_tokens": 120,
                                "input_tokens_details": {"cached_tokens": 64},
                                "output_tokens_details": {"reasoning_tokens": 20}}})
    assert answer.usage == Usage(input_tokens=90, output_tokens=30, total_tokens=120, reasoning_tokens=20,
                                 cached_input_tokens=64)
