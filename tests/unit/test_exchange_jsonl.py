"""The JSONL export is an OpenAI chat log and nothing else: every line a chat message,
the session's own fields on the first line's ``ctxd`` key; import reads that and the
older form, whose first line was a header of its own."""

from __future__ import annotations

import json

from ctxd.exchange import ExportedMessage, SessionDocument
from ctxd.exchange.jsonl import export_jsonl, import_jsonl, is_ctxd_jsonl
from ctxd.protocol.message import FunctionCall, Message, TextBlock, ThinkingBlock, ToolCall, ToolResultBlock

ROLES = {"system", "user", "assistant", "tool"}


def document(messages: list[Message]) -> SessionDocument:
    return SessionDocument(
        session_id="s-1", created_at="2025-01-02T03:04:05.000Z", title="the title", model="gpt-4o",
        provider="openai", context_window=16384, system_prompt="be brief", tags=["a", "b"],
        metadata={"source": "test"}, settings={"autoCompress": False},
        goal={"description": "ship it", "priority": "high", "status": "active", "createdAt": "2025-01-02T03:04:05Z"},
        messages=[ExportedMessage(i + 1, f"2025-01-02T03:04:0{i}.000Z", m) for i, m in enumerate(messages)])


MESSAGES = [
    Message(role="user", content="list the files"),
    Message(role="assistant", content=None,
            tool_calls=[ToolCall(id="c1", function=FunctionCall(name="ls", arguments="{}"))]),
    Message(role="tool", tool_call_id="c1", content="README.md"),
    Message(role="assistant", content=[ThinkingBlock(thinking="hmm"), TextBlock(text="one file")]),
]


def test_every_line_is_a_chat_message() -> None:
    text = export_jsonl(document(MESSAGES))
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == len(MESSAGES)
    for line in lines:  # what a tool reading OpenAI chat JSONL sees
        assert line["role"] in ROLES and ("content" in line or "tool_calls" in line)
    assert lines[0]["content"] == "list the files"
    head = lines[0]["ctxd"]["session"]
    assert head["sessionId"] == "s-1" and head["title"] == "the title" and head["goal"]["description"] == "ship it"
    assert all("session" not in line["ctxd"] for line in lines[1:])
    assert is_ctxd_jsonl(text)


def test_round_trip() -> None:
    doc = document(MESSAGES)
    back = import_jsonl(export_jsonl(doc))
    assert [m.message for m in back.messages] == MESSAGES
    assert [(m.seq, m.created_at) for m in back.messages] == [(m.seq, m.created_at) for m in doc.messages]
    assert (back.session_id, back.title, back.model, back.context_window, back.tags, back.settings, back.goal) == \
        (doc.session_id, doc.title, doc.model, doc.context_window, doc.tags, doc.settings, doc.goal)


def test_the_older_form_with_a_header_line_still_imports() -> None:
    doc = document(MESSAGES)
    new = export_jsonl(doc).splitlines()
    first = json.loads(new[0])
    head = first["ctxd"].pop("session")
    old = [json.dumps({"ctxd": {"session": head}})] + [json.dumps(first)] + new[1:]
    text = "\n".join(old) + "\n"
    assert is_ctxd_jsonl(text)
    back = import_jsonl(text)
    assert [m.message for m in back.messages] == MESSAGES and back.title == "the title"


def test_a_session_without_messages() -> None:
    text = export_jsonl(document([]))
    assert len(text.splitlines()) == 1  # nothing to carry the fields but a line of their own
    back = import_jsonl(text)
    assert back.session_id == "s-1" and back.messages == [] and back.system_prompt == "be brief"


def test_a_file_without_the_session_fields_is_refused() -> None:
    lines = export_jsonl(document(MESSAGES)).splitlines()
    try:
        import_jsonl("\n".join(lines[1:]))
    except ValueError as exc:
        assert "line 1" in str(exc)
    else:
        raise AssertionError("imported without the session's fields")


def test_a_message_the_chat_shape_cannot_hold_exports_valid_chat_lines() -> None:
    named = Message(role="user", name="ana", timestamp="2026-01-01T00:00:00Z", content="hello")
    results = Message(role="tool", tool_call_id="c1", content=[
        ToolResultBlock(tool_use_id="c2", content="second"), TextBlock(text="first")])
    lines = [json.loads(line) for line in export_jsonl(document([named, results])).splitlines()]
    for line in lines:
        line.pop("ctxd")
    # The name stays on its line; every tool line names the call it answers.
    assert lines == [{"role": "user", "content": "hello", "name": "ana"},
                     {"role": "tool", "content": "first", "tool_call_id": "c1"},
                     {"role": "tool", "content": "second", "tool_call_id": "c2"}]
    assert [m.message for m in import_jsonl(export_jsonl(document([named, results]))).messages] == [named, results]


def test_a_line_that_is_no_chat_message_is_refused_naming_it() -> None:
    lines = export_jsonl(document(MESSAGES)).splitlines()
    second = json.loads(lines[1])
    del second["tool_calls"][0]["id"]
    lines[1] = json.dumps(second)
    try:
        import_jsonl("\n".join(lines))
    except ValueError as exc:
        assert str(exc).startswith("line 2: tool call 0 has no id")
    else:
        raise AssertionError("imported a tool call without its id")


def test_what_a_push_accepts_comes_back_equal() -> None:
    """Tool calls a push accepts whatever their spelling (an empty id, as some
    OpenAI-compatible servers send, and an empty list) read back as they were stored: an
    export ctxd wrote is never refused by its own import, nor changed by it."""
    messages = [
        Message(role="user", content="go"),
        Message(role="assistant", content="",
                tool_calls=[ToolCall(id="", function=FunctionCall(name="ls", arguments="{}"))]),
        Message(role="tool", tool_call_id="", content="README.md"),
        Message(role="assistant", content="done", tool_calls=[]),
    ]
    back = import_jsonl(export_jsonl(document(messages)))
    assert [m.message for m in back.messages] == messages
    for line in export_jsonl(document(messages)).splitlines():  # still a chat log
        assert json.loads(line)["role"] in ROLES
