"""ctxd's own JSON export: everything about a session, in one object."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.exchange import FORMAT_NAME, FORMAT_VERSION, DocumentError, ExportedMessage, SessionDocument
from ctxd.protocol.message import Message

_encode = msgspec.json.Encoder().encode


def header(doc: SessionDocument) -> dict[str, Any]:
    return {
        "sessionId": doc.session_id, "createdAt": doc.created_at, "title": doc.title, "model": doc.model,
        "provider": doc.provider, "contextWindow": doc.context_window, "systemPrompt": doc.system_prompt,
        "tags": doc.tags, "metadata": doc.metadata, "settings": doc.settings, "goal": doc.goal,
    }


def export_json(doc: SessionDocument, exported_at: str) -> str:
    body = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "exportedAt": exported_at,
        "session": header(doc),
        "messages": [{"seq": m.seq, "createdAt": m.created_at, "message": m.message} for m in doc.messages],
        "checkpoints": doc.checkpoints, "compressions": doc.compressions, "events": doc.events,
    }
    return msgspec.json.format(_encode(body), indent=1).decode()


class _Entry(msgspec.Struct):
    seq: int
    message: Message
    createdAt: str = ""


def from_header(head: dict[str, Any], messages: list[ExportedMessage]) -> SessionDocument:
    if not isinstance(head, dict) or not isinstance(head.get("sessionId"), str):
        raise DocumentError("session.sessionId is missing")
    return SessionDocument(
        session_id=head["sessionId"], created_at=head.get("createdAt") or "", messages=messages,
        title=head.get("title"), model=head.get("model"), provider=head.get("provider"),
        context_window=head.get("contextWindow"), system_prompt=head.get("systemPrompt"),
        tags=list(head.get("tags") or []), metadata=dict(head.get("metadata") or {}),
        settings=dict(head.get("settings") or {}), goal=head.get("goal"),
    )


class Outline(msgspec.Struct):
    """A ctxd JSON export scanned, not decoded: its messages are still raw JSON, so a
    document's size can be judged (``len(messages)``) before any message is built."""

    format: Any = None
    version: Any = 0
    session: Any = None
    messages: list[msgspec.Raw] = []
    checkpoints: Any = None
    compressions: Any = None
    events: Any = None


_outline_decoder = msgspec.json.Decoder(Outline)
_entry_decoder = msgspec.json.Decoder(_Entry)


def outline_json(text: str | bytes) -> Outline:
    """Scan a ctxd JSON export (cheap: messages are kept as raw JSON)."""
    try:
        outline = _outline_decoder.decode(text)
    except msgspec.ValidationError as exc:
        if "Expected `object`" in str(exc) and "$." not in str(exc):
            raise DocumentError(f'not a ctxd session export (expected "format": "{FORMAT_NAME}")') from None
        raise DocumentError(f"{exc}") from None
    except msgspec.DecodeError as exc:
        raise DocumentError(f"not valid JSON: {exc}") from None
    if outline.format != FORMAT_NAME:
        raise DocumentError(f'not a ctxd session export (expected "format": "{FORMAT_NAME}")')
    if not isinstance(outline.version, int) or outline.version > FORMAT_VERSION:
        raise DocumentError(f"export version {outline.version} is newer than this ctxd reads ({FORMAT_VERSION})")
    return outline


def import_outline(outline: Outline) -> SessionDocument:
    """The document of a scanned export, decoding one message at a time (so a thread doing
    this lets the event loop run between messages)."""
    entries = []
    for index, raw in enumerate(outline.messages):
        try:
            entries.append(_entry_decoder.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise DocumentError(f"messages[{index}]: {exc}") from None
    doc = from_header(outline.session, [ExportedMessage(e.seq, e.createdAt, e.message) for e in entries])
    doc.checkpoints = list(outline.checkpoints or [])
    doc.compressions = list(outline.compressions or [])
    doc.events = list(outline.events or [])
    return doc


def import_json(data: Any) -> SessionDocument:
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise DocumentError(f'not a ctxd session export (expected "format": "{FORMAT_NAME}")')
    if data.get("version", 0) > FORMAT_VERSION:
        raise DocumentError(f"export version {data.get('version')} is newer than this ctxd reads ({FORMAT_VERSION})")
    try:
        entries = msgspec.convert(data.get("messages", []), list[_Entry])
    except msgspec.ValidationError as exc:
        raise DocumentError(f"messages: {exc}") from None
    doc = from_header(data.get("session"), [ExportedMessage(e.seq, e.createdAt, e.message) for e in entries])
    doc.checkpoints = list(data.get("checkpoints") or [])
    doc.compressions = list(data.get("compressions") or [])
    doc.events = list(data.get("events") or [])
    return doc
