"""OpenAI Responses API (ctxd/formats/responses.py): items read as the chat messages they
stand for, ctxd's prompt written back as items, ids, usage."""

from __future__ import annotations

from ctxd import formats
from ctxd.formats import responses

from ._formats_helpers import rendered, stored

ITEMS = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "..."},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "ls", "arguments": '{"path": "."}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
    {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "One file."}]},
]


def items_back(items):
    messages, _ = rendered("openai", stored("responses", items))
    return [item for message in messages for item in responses.items_of(message)]


def test_items_come_back_as_ctxd_models_them():
    back = items_back(ITEMS)
    kept = [i for i in ITEMS if i["type"] != "reasoning"]  # reasoning is never pushed
    assert [formats.projection("responses", i) for i in back] == [formats.projection("responses", i) for i in kept]
    assert back[1] == {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": '{"path": "."}'}
    assert back[2] == {"type": "function_call_output", "call_id": "call_1", "output": "README.md"}


def test_reasoning_is_left_out_and_other_items_are_named():
    assert formats.to_ctxd("responses", ITEMS[1]) is None and formats.chain_part("responses", ITEMS[1]) is None
    assert formats.projection("responses", ITEMS[1]) == ["skipped", ["reasoning"]]
    web = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    assert formats.to_ctxd("responses", web) == {
        "role": "assistant", "content": "[web_search_call not kept by ctxd]",
        "metadata": {"ctxdProxyUnkept": ["web_search_call"]}}


def test_an_item_as_a_chat_message():
    assert responses.as_chat(ITEMS[0]) == {"role": "user", "content": [{"type": "text", "text": "list the files"}]}
    assert responses.as_chat(ITEMS[3]) == {"role": "tool", "tool_call_id": "call_1", "content": "README.md"}


def test_ids_of_an_item():
    assert formats.ids_of("responses", ITEMS[2]) == [("item", "fc_1"), ("call", "call_1")]
    assert formats.ids_of("responses", ITEMS[3]) == [("result", "call_1")]
    assert formats.ids_of("responses", ITEMS[4]) == [("item", "msg_1")]
    custom = {"type": "custom_tool_call_output", "id": "ctco_1", "call_id": "call_9", "output": "ok"}
    assert formats.ids_of("responses", custom) == [("item", "ctco_1"), ("result", "call_9")]


def test_usage():
    assert formats.usage("responses", {"input_tokens": 90, "output_tokens": 30, "total_tokens": 120,
                                       "input_tokens_details": {"cached_tokens": 64},
                                       "output_tokens_details": {"reasoning_tokens": 20}}) == \
        {"inputTokens": 90, "outputTokens": 30, "totalTokens": 120, "reasoningTokens": 20,
         "cachedInputTokens": 64}


def test_system_text_is_instructions_then_leading_system_items():
    items = [{"role": "developer", "content": [{"type": "input_text", "text": "rules"}]}, ITEMS[0]]
    leading = responses.leading_system(items)
    assert leading == items[:1]
    assert responses.system_text("be brief", leading) == "be brief\n\nrules"


PATCH = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return a\n+    return b\n*** End Patch\n"
FREEFORM = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
    {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success. Updated src/app.py"},
    {"type": "function_call", "id": "fc_2", "call_id": "call_t", "name": "shell", "arguments": '{"cmd":"make"}'},
    {"type": "function_call_output", "call_id": "call_t", "output": "ok"},
]


def test_freeform_calls_and_outputs_are_kept_and_come_back_as_sent():
    call, output = formats.to_ctxd("responses", FREEFORM[1]), formats.to_ctxd("responses", FREEFORM[2])
    assert call == {"role": "assistant", "toolCalls": [
        {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}]}
    assert output == {"role": "tool", "toolCallId": "call_p", "content": "Success. Updated src/app.py"}
    messages, _ = rendered("openai", stored("responses", FREEFORM))
    back = responses.items_of_prompt(messages)
    assert back[1:] == [
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success. Updated src/app.py"},
        {"type": "function_call", "call_id": "call_t", "name": "shell", "arguments": '{"cmd":"make"}'},
        {"type": "function_call_output", "call_id": "call_t", "output": "ok"}]
    assert [formats.projection("responses", i) for i in back] == \
        [formats.projection("responses", i) for i in FREEFORM]
    assert formats.ids_of("responses", FREEFORM[1]) == [("item", "ctc_1"), ("call", "call_p")]
