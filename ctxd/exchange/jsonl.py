"""JSONL export: one OpenAI chat message per line, and nothing else.

Each history message becomes the OpenAI chat message(s) a provider would accept
(``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``; ``formats.openai.export_lines``)
plus a ``ctxd`` key with its sequence number and time. When the OpenAI shape cannot hold
the message as it was (Anthropic content blocks, thinking, usage, metadata, timestamps),
``ctxd.message`` carries the original, its lines are those ctxd's prompt renders for it,
and the extra lines it needs are marked ``ctxd.part``; an importer that does not know
ctxd still reads a valid chat log.

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
from ctxd.formats import openai
from ctxd.protocol.message import Message

_to_builtins = msgspec.to_builtins


def export_jsonl(doc: SessionDocument) -> str:
    session = header(doc)
    if not doc.messages:
        return json.dumps({"ctxd": {"session": session}}, ensure_ascii=False) + "\n"
    out: list[str] = []
    for item in doc.messages:
        lines = openai.export_lines(item.message)
        for part, line in enumerate(lines):
            meta: dict[str, Any] = {"seq": item.seq, "createdAt": item.created_at}
            if part:
                meta["part"] = part
            elif not openai.is_plain(item.message):
                meta["message"] = _to_builtins(item.message)
            if not out:
                meta["session"] = session
            line["ctxd"] = meta
            out.append(json.dumps(line, ensure_ascii=False))
    return "\n".join(out) + "\n"


def _refuse(problem: str) -> None:
    """A line that is no chat message ctxd wrote: an import takes nothing it must guess."""
    raise DocumentError(problem)


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
            message: Message | None
            if "message" in meta:
                message = msgspec.convert(meta["message"], Message)
            else:
                message = openai.to_message(line, f"line {number}", _refuse, index=len(messages))
            if message is None:
                raise DocumentError(f"line {number}: not a chat message")
            messages.append(ExportedMessage(int(meta["seq"]), meta.get("createdAt", ""), message))
        except DocumentError:
            raise
        except (ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
            raise DocumentError(f"line {number}: {exc}") from None
    return from_header(head, messages)
