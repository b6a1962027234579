"""Ollama /api/chat (ctxd/formats/ollama.py): the chat shape without call ids, with
images and thinking; counts at the top of a reply."""

from __future__ import annotations

from ctxd import formats
from ctxd.formats import ollama
from ctxd.protocol.message import ThinkingBlock

from ._formats_helpers import rendered, stored

CONVERSATION = [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": {"path": "."}}},
                                                         {"function": {"name": "pwd", "arguments": {}}}]},
    {"role": "tool", "content": "README.md", "tool_name": "ls"},
    {"role": "tool", "content": "/src", "tool_name": "pwd"},
    {"role": "assistant", "content": "One file, in /src."},
]


def test_a_conversation_comes_back_as_the_client_sent_it():
    messages = stored("ollama", CONVERSATION)
    # Calls get ids from their message's place; results answer them in order.
    assert [c.id for c in messages[1].tool_calls] == ["ollama-1-0", "ollama-1-1"]
    assert [m.tool_call_id for m in messages[2:4]] == ["ollama-1-0", "ollama-1-1"]
    out, _ = rendered("ollama", messages)
    assert out == CONVERSATION


def test_thinking_is_kept_as_history_and_images_are_named():
    [answer] = stored("ollama", [{"role": "assistant", "content": "Yes.", "thinking": "check first"}])
    assert answer.content is not None and answer.content[0] == ThinkingBlock(thinking="check first")
    picture = {"role": "user", "content": "what is this?", "images": ["iVBOR..."]}
    assert formats.to_ctxd("ollama", picture) == {"role": "user", "content": "what is this?",
                                                   "metadata": {"ctxdProxyUnkept": ["image"]}}
    assert formats.chain_part("ollama", picture) == ["user", [("t", "what is this?"), ("x", "images", 1)]]


def test_no_provider_ids_and_counts_from_the_reply():
    assert formats.ids_of("ollama", CONVERSATION[1]) == []
    assert formats.usage("ollama", {"message": {}, "prompt_eval_count": 812, "eval_count": 9, "done": True}) == \
        {"inputTokens": 812, "outputTokens": 9}


def test_a_reply_is_kept_as_the_client_sends_it_back():
    assert ollama.reply_message({"role": "assistant", "content": None, "thinking": "", "images": None}) == \
        {"role": "assistant", "content": ""}
