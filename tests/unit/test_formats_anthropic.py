"""Anthropic Messages (ctxd/formats/anthropic.py): a client's messages read into ctxd's
and written back the same, ids, usage, the system part and cache breakpoints."""

from __future__ import annotations

import copy

import msgspec

from ctxd import formats
from ctxd.formats import anthropic
from ctxd.protocol.providers import AnthropicMessage, AnthropicText, AnthropicThinking, CacheControl

from ._formats_helpers import rendered, stored

CONVERSATION = [
    {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "ls will do", "signature": "sig"},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}},
        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"cmd": "pwd"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such dir", "is_error": True}]},
    {"role": "assistant", "content": [{"type": "text", "text": "One file."}]},
]


def without_thinking(messages):
    out = copy.deepcopy(messages)
    for m in out:
        m["content"] = [b for b in m["content"] if b["type"] != "thinking"]
    return out


def test_a_conversation_comes_back_as_the_client_sent_it():
    messages = stored("anthropic", CONVERSATION)
    assert messages[1].content[0] == msgspec.convert(  # thinking is kept, with its signature
        {"type": "thinking", "thinking": "ls will do", "signature": "sig"}, type(messages[1].content[0]))
    out, system = rendered("anthropic", messages, ["be brief"])
    # Signed thinking goes back first in its message (Anthropic checks it in tool-use loops).
    assert out == CONVERSATION and system == "be brief"
    unsigned = stored("anthropic", [dict(m, content=[dict(b, signature=None) if b["type"] == "thinking" else b
                                                     for b in m["content"]]) for m in CONVERSATION])
    assert rendered("anthropic", unsigned, ["be brief"])[0] == without_thinking(CONVERSATION)
    # Equal as ctxd models them: the proxy may send the client's own bytes (signatures included).
    assert [formats.projection("anthropic", m) for m in out] == \
        [formats.projection("anthropic", m) for m in CONVERSATION]


def test_blocks_ctxd_does_not_model_are_named():
    message = {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "redacted_thinking", "data": "..."}]}
    assert formats.to_ctxd("anthropic", message) == {
        "role": "assistant",
        "content": [{"type": "text", "text": "[redacted_thinking, server_tool_use not kept by ctxd]"}],
        "metadata": {"ctxdProxyUnkept": ["redacted_thinking", "server_tool_use"]}}
    assert formats.chain_part("anthropic", message) == [
        "assistant", [("x", "server_tool_use", "srvtoolu_1"), ("x", "redacted_thinking", None)]]
    text = {"role": "user", "content": "plain text"}  # a string content reads as a chat message
    assert formats.to_ctxd("anthropic", text) == text


def test_ids_of_a_raw_message():
    assert formats.ids_of("anthropic", CONVERSATION[1]) == [("call", "toolu_1"), ("call", "toolu_2")]
    assert formats.ids_of("anthropic", CONVERSATION[2]) == [("result", "toolu_1"), ("result", "toolu_2")]
    server = {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1"},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1"}]}
    assert formats.ids_of("anthropic", server) == [("call", "srvtoolu_1"), ("result", "srvtoolu_1")]
    assert formats.ids_of("anthropic", {"role": "user", "content": "x"}) == []


def test_usage_cache_counts_are_beside_input():
    assert formats.usage("anthropic", {"input_tokens": 3, "output_tokens": 90, "cache_read_input_tokens": 15289,
                                       "cache_creation_input_tokens": 3257, "service_tier": "standard"}) == \
        {"inputTokens": 3, "outputTokens": 90, "cacheReadTokens": 15289, "cacheWriteTokens": 3257}


def test_system_text_and_merge():
    assert anthropic.system_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\n\nb"
    client = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    assert anthropic.merge_system("be brief", "be brief", client) == (client, False)
    merged, added = anthropic.merge_system("be brief\n\n## Checkpoints", "be brief", client)
    checkpoints = {"type": "text", "text": "## Checkpoints", "cache_control": {"type": "ephemeral"}}
    assert added and merged == client + [checkpoints]
    assert anthropic.merge_system("", "", None) == (None, False)


def test_the_proxy_keeps_client_breakpoints_and_adds_one_when_none():
    body: dict = {"system": "s"}
    out = anthropic.place_breakpoints(body, copy.deepcopy(CONVERSATION), ctxd_system_breakpoint=False)
    assert anthropic.count_breakpoints(out) == 1 and "cache_control" in out[-1]["content"][-1]
    marked = copy.deepcopy(CONVERSATION)
    marked[0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert anthropic.place_breakpoints({}, marked, ctxd_system_breakpoint=False) == marked


def test_over_four_breakpoints_ctxd_gives_up_its_own_first_then_the_oldest():
    messages = [{"role": "user", "content": [{"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}}]}
                for i in range(4)]
    body = {"system": [{"type": "text", "text": "ctxd", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "t", "cache_control": {"type": "ephemeral"}}]}
    out = anthropic.place_breakpoints(body, messages, ctxd_system_breakpoint=True)
    assert "cache_control" not in body["system"][-1]  # ctxd's own went first
    assert anthropic.count_breakpoints(out) + anthropic.count_breakpoints(body) == anthropic.MAX_BREAKPOINTS
    assert "cache_control" not in out[0]["content"][0] and "cache_control" in out[1]["content"][0]
    assert "cache_control" in messages[0]["content"][0]  # the client's list is not changed


def test_context_prompt_breakpoints():
    messages = [AnthropicMessage("user", [AnthropicText("hi")]),
                AnthropicMessage("assistant", [AnthropicText("ok"), AnthropicThinking("t", "sig")])]
    system, out = anthropic.cache_breakpoints("client part\n\nctxd part", messages, head="client part")
    eph = CacheControl()
    assert system == [AnthropicText("client part", eph), AnthropicText("ctxd part", eph)]
    assert out[-1].content == [AnthropicText("ok", eph), AnthropicThinking("t", "sig")]
    assert messages[-1].content[0].cache_control is None  # the cached rendering is untouched


def test_rendering_opens_with_the_user_and_trims_a_prefill():
    from ctxd.formats.common import Turn

    out = anthropic.emit([Turn("assistant", ["first "]), Turn("assistant", ["more  "])], [])
    assert out == [AnthropicMessage("assistant", [AnthropicText("first "), AnthropicText("more  ")])]
    finished, extra, repairs = anthropic.finish(out, lambda s: 1)
    assert finished == [AnthropicMessage("user", [AnthropicText(anthropic.OPENER)]),
                        AnthropicMessage("assistant", [AnthropicText("first "), AnthropicText("more")])]
    assert repairs == ["opened with a user turn"] and extra > 0
