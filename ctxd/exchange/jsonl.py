"""JSONL export: one OpenAI chat message per line, and nothing else.

Each history message becomes the OpenAI chat message(s) a provider would accept
(``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``) plus a ``ctxd`` key
with its sequence number and time. When the OpenAI shape cannot hold the message as it
was (Anthropic content blocks, thinking, usage, metadata, timestamps), ``ctxd.message``
carries the original, and the extra OpenAI lines it needs are marked ``ctxd.part``;
an importer that does not know ctxd still reads a valid chat log.

The session's own fields (title, model, window, goal...) ride on the first line, as
``ctxd.session`` beside that message's ``seq``: every line is a chat message, so tools
that read OpenAI chat JSONL take the file as it is. (A session without messages has
nothing to carry them: its export is the one line ``{"ctxd": {"session": ...}}``, the
form every export had before; import reads both.)
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ctxd.exchange import DocumentError, ExportedMessage, SessionDocument
from ctxd.exchange.document import from_header, header
from ctxd.protocol.message import (
    FunctionCall,
    ImageBlock,
    Message,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
    image_text,
    tool_result_text,
)

_to_builtins = msgspec.to_builtins


def _is_plain(m: Message) -> bool:
    return (isinstance(m.content, str) or m.content is None) and m.usage is None and m.metadata is None \
        and m.timestamp is None


def _openai_lines(m: Message) -> list[dict[str, Any]]:
    if _is_plain(m):
        line: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name is not None:
            line["name"] = m.name
        if m.tool_calls is not None:
            line["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                  for c in m.tool_calls]
        if m.tool_call_id is not None:
            line["tool_call_id"] = m.tool_call_id
        return [line]
    blocks = m.content if isinstance(m.content, list) else []
    text = "\n\n".join(b.text if isinstance(b, TextBlock) else image_text(b) for b in blocks
                       if isinstance(b, (TextBlock, ImageBlock))) or (
        m.content if isinstance(m.content, str) else "")
    lines: list[dict[str, Any]] = []
    if m.role == "assistant":
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in blocks if isinstance(b, ToolUseBlock)]
        calls += [{"id": c.id, "type": "function",
                   "function": {"name": c.function.name, "arguments": c.function.arguments}}
                  for c in m.tool_calls or ()]
        line = {"role": "assistant", "content": text or None}
        if calls:
            line["tool_calls"] = calls
        lines.append(line)
    else:
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        for b in results:
            lines.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": tool_result_text(b)})
        if m.role == "tool" and not results:
            lines.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": text})
        elif text or not results:
            lines.append({"role": m.role, "content": text})
    return lines


def export_jsonl(doc: SessionDocument) -> str:
    session = header(doc)
    if not doc.messages:
        return json.dumps({"ctxd": {"session": session}}, ensure_ascii=False) + "\n"
    out = []
    for item in doc.messages:
        lines = _openai_lines(item.message)
        for part, line in enumerate(lines):
            meta: dict[str, Any] = {"seq": item.seq, "createdAt": item.created_at}
            if part:
                meta["part"] = part
            elif not _is_plain(item.message):
                meta["message"] = _to_builtins(item.message)
            if not out:
                meta["session"] = session
            line["ctxd"] = meta
            out.append(json.dumps(line, ensure_ascii=False))
    return "\n".join(out) + "\n"


def _from_openai(line: dict[str, Any]) -> Message:
    calls = None
    if line.get("tool_calls") is not None:
        calls = [ToolCall(id=c["id"], function=FunctionCall(name=c["function"]["name"],
                                                            arguments=c["function"].get("arguments", "")))
                 for c in line["tool_calls"]]
    return Message(role=line["role"], content=line.get("content"), name=line.get("name"),
                   tool_calls=calls, tool_call_id=line.get("tool_call_id"))


def is_ctxd_jsonl(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    try:
        data = json.loads(first)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("ctxd"), dict) and "session" in data["ctxd"]


def import_jsonl(text: str) -> SessionDocument:
    """A ctxd JSONL export: the session's fields on the first line (beside its first
    message, or, as exports used to have it, on a line of their own), then messages."""
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        raise DocumentError("the document is empty")
    try:
        first = json.loads(lines[0])
        head = first["ctxd"]["session"]
    except (ValueError, KeyError, TypeError):
        raise DocumentError("line 1: no ctxd.session (the session's fields): not a ctxd JSONL export") from None
    start = 1 if "role" in first else 2  # the first line is a message too, unless it is the old header
    messages: list[ExportedMessage] = []
    for number, raw in enumerate(lines[start - 1:], start=start):
        try:
            line = json.loads(raw)
            meta = line.pop("ctxd")
            meta.pop("session", None)
            if meta.get("part"):
                continue
            if "message" in meta:
                message = msgspec.convert(meta["message"], Message)
            else:
                message = _from_openai(line)
            messages.append(ExportedMessage(int(meta["seq"]), meta.get("createdAt", ""), message))
        except (ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
            raise DocumentError(f"line {number}: {exc}") from None
    return from_header(head, messages)
