"""ctxd's own JSON export: everything about a session, in one object."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.exchange import FORMAT_NAME, FORMAT_VERSION, DocumentError, ExportedMessage, SessionDocument
from ctxd.protocol.message import Message

_encode = msgspec.json.Encoder().encode


def header(doc: SessionDocument, past: bool = True) -> dict[str, Any]:
    """The session's fields, and (``past``) its ``context``: its state, calibration,
    snapshots and checkpoints merged away, and (for the JSONL and Markdown forms, which have
    no other place for them) its active checkpoints and the record of its compressions and
    events. ctxd's JSON form keeps the last three at its top level, as it always did."""
    head: dict[str, Any] = {
        "sessionId": doc.session_id, "createdAt": doc.created_at, "title": doc.title, "model": doc.model,
        "provider": doc.provider, "contextWindow": doc.context_window, "systemPrompt": doc.system_prompt,
        "tags": doc.tags, "metadata": doc.metadata, "settings": doc.settings, "goal": doc.goal,
    }
    context = _context(doc, with_checkpoints=past)
    if context:
        head["context"] = context
    return head


def _context(doc: SessionDocument, with_checkpoints: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if doc.state is not None:
        out["state"] = doc.state
    if doc.calibration is not None:
        out["calibration"] = doc.calibration
    if doc.retired_checkpoints:
        out["retiredCheckpoints"] = doc.retired_checkpoints
    if doc.snapshots:
        out["snapshots"] = doc.snapshots
    if with_checkpoints:
        for key, value in (("checkpoints", doc.checkpoints), ("compressions", doc.compressions),
                           ("events", doc.events)):
            if value:
                out[key] = value
    return out


def export_json(doc: SessionDocument, exported_at: str) -> str:
    body = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "exportedAt": exported_at,
        "session": header(doc, past=False),
        "messages": [{"seq": m.seq, "createdAt": m.created_at, "message": m.message} for m in doc.messages],
        "checkpoints": doc.checkpoints, "compressions": doc.compressions, "events": doc.events,
    }
    return msgspec.json.format(_encode(body), indent=1).decode()


class _Entry(msgspec.Struct):
    seq: int
    message: Message
    createdAt: str = ""


def from_header(head: Any, messages: list[ExportedMessage]) -> SessionDocument:
    if not isinstance(head, dict) or not isinstance(head.get("sessionId"), str):
        raise DocumentError("session.sessionId is missing")
    doc = SessionDocument(
        session_id=head["sessionId"], created_at=head.get("createdAt") or "", messages=messages,
        title=head.get("title"), model=head.get("model"), provider=head.get("provider"),
        context_window=head.get("contextWindow"), system_prompt=head.get("systemPrompt"),
        tags=list(head.get("tags") or []), metadata=dict(head.get("metadata") or {}),
        settings=dict(head.get("settings") or {}), goal=head.get("goal"),
    )
    context = head.get("context")
    if context is not None:
        if not isinstance(context, dict):
            raise DocumentError("session.context is not an object")
        for key in ("retiredCheckpoints", "snapshots", "checkpoints", "compressions", "events"):
            if not isinstance(context.get(key, []), list):
                raise DocumentError(f"session.context.{key} is not a list")
        for key in ("state", "calibration"):
            if not isinstance(context.get(key, {}), dict):
                raise DocumentError(f"session.context.{key} is not an object")
        doc.state = context.get("state")
        doc.calibration = context.get("calibration")
        doc.retired_checkpoints = list(context.get("retiredCheckpoints") or [])
        doc.snapshots = list(context.get("snapshots") or [])
        doc.checkpoints = list(context.get("checkpoints") or [])
        doc.compressions = list(context.get("compressions") or [])
        doc.events = list(context.get("events") or [])
    return doc


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
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_any_decoder = msgspec.json.Decoder()

SLICE_CHARS = 1 << 20
""":func:`outline_json` with ``between`` reads a large document's messages about this many
characters at a time (one msgspec call holds the interpreter lock throughout: the whole
30 MB document of 200,000 messages, 30-50 ms on an idle core, 130-250 ms on a busy one)."""
MAX_MISSES = 8
"""Cut places that turned out to be inside a message, per slice, before giving up on slices."""
STEP_SECONDS = 0.002
""":func:`import_outline` calls ``between`` after about this much work."""
_MESSAGES = re.compile(r'"messages"[ \t\n\r]*:[ \t\n\r]*\[')
_ENTRY_CUT = re.compile(r'\}[ \t\n\r]*,[ \t\n\r]*(?=\{[ \t\n\r]*"(?:seq|createdAt|message)"[ \t\n\r]*:)')
"""Where one entry of a ctxd export's messages ends and the next begins: found with a
regular expression, so it may also be inside an entry (a string, a nested object), which
the slice's decode then shows."""


def _outline_in_slices(text: str, between: Callable[[], object]) -> Outline | None:
    """The outline of a large document, its message array decoded a slice at a time with
    ``between`` called between slices; None when the document is not what this expects (the
    caller then decodes it whole, which gives its exact error).

    The top-level ``"messages": [`` is found with a regular expression and proved to be the
    top-level object's by decoding what comes before it closed with ``"messages":[]}``.
    From there, a slice ends before a comma followed by what looks like an entry's start
    (:data:`_ENTRY_CUT`) about ``SLICE_CHARS`` on; ``[slice]`` decoded as a list of raw JSON
    values proves the cut was between two entries (a cut inside a string, an entry or a
    nested list leaves a string or a container open, and the decode fails: the next place
    is tried). Last, the document without the sliced entries (its head, the rest of the
    array, what follows it) is decoded as an outline: the entries sliced off and its own
    are the whole document's, in order, and every other member is what a whole decode
    gives. A later ``"messages"`` key (the last one wins) is left to the whole decode."""
    found = _MESSAGES.search(text)
    if found is None or found.start() > SLICE_CHARS:
        return None
    try:
        head = _any_decoder.decode(text[:found.start()] + '"messages":[0]}')
    except (ValueError, RecursionError):
        return None  # (not the top-level object's key)
    if not isinstance(head, dict) or head.get("messages") != [0]:
        return None  # (a key that only ends in "messages": '\\"messages')
    start = at = found.end()
    entries: list[msgspec.Raw] = []
    misses = 0
    look_from = at + SLICE_CHARS
    try:
        while (cut := _next_cut(text, look_from)) is not None:
            try:
                entries += _raw_list_decoder.decode("[" + text[at:cut.start() + 1] + "]")
            except msgspec.DecodeError:
                misses += 1
                if misses > MAX_MISSES:
                    return None
                look_from = cut.start() + 1
            else:
                misses = 0
                at = cut.end()
                look_from = at + SLICE_CHARS
            between()
        if at == start:
            return None
        mark = f'"ctxd-sliced:{os.urandom(8).hex()}"'
        outline = _outline_decoder.decode(text[:start] + mark + "," + text[at:])
        if not outline.messages or bytes(outline.messages[0]) != mark.encode():
            return None  # (another "messages" key, however spelled, came later and won)
        del outline.messages[0]
    except (ValueError, RecursionError):  # (msgspec's errors, a lone surrogate's UnicodeEncodeError)
        return None
    outline.messages = entries + outline.messages
    return outline


def _next_cut(text: str, look_from: int) -> re.Match[str] | None:
    """The first :data:`_ENTRY_CUT` from ``look_from``, looked for a window at a time (one
    search holds the interpreter lock until it ends: in a document with no such place,
    to its end)."""
    while look_from < len(text):
        found = _ENTRY_CUT.search(text, look_from, look_from + SLICE_CHARS)
        if found is not None:
            return found
        look_from += SLICE_CHARS - 256  # (a cut across the window's end: found in the next)
    return None


def outline_json(text: str | bytes, between: Callable[[], object] | None = None) -> Outline:
    """Scan a ctxd JSON export (cheap: messages are kept as raw JSON). With ``between`` (in a
    thread: the daemon's ``Turns.step_aside``), a large document's messages are read in
    slices with ``between`` called between them; the outline is the same."""
    outline = None
    if between is not None and isinstance(text, str) and len(text) > 2 * SLICE_CHARS:
        outline = _outline_in_slices(text, between)
    try:
        if outline is None:
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


def import_outline(outline: Outline, between: Callable[[], object] | None = None) -> SessionDocument:
    """The document of a scanned export, decoding one message at a time (so a thread doing
    this lets the event loop run between messages), calling ``between`` after every
    ``STEP_SECONDS`` or so."""
    entries = []
    stepped = time.perf_counter()
    for index, raw in enumerate(outline.messages):
        if between is not None and time.perf_counter() - stepped > STEP_SECONDS:
            between()
            stepped = time.perf_counter()
        try:
            entries.append(_entry_decoder.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise DocumentError(f"messages[{index}]: {exc}") from None
    doc = from_header(outline.session, [ExportedMessage(e.seq, e.createdAt, e.message) for e in entries])
    _top_level(doc, outline.checkpoints, outline.compressions, outline.events)
    return doc


def _top_level(doc: SessionDocument, checkpoints: Any, compressions: Any, events: Any) -> None:
    """The JSON form's own places for the checkpoints and the record of the session."""
    for key, value in (("checkpoints", checkpoints), ("compressions", compressions), ("events", events)):
        if value is not None and not isinstance(value, list):
            raise DocumentError(f"{key} is not a list")
    doc.checkpoints = list(checkpoints or doc.checkpoints)
    doc.compressions = list(compressions or doc.compressions)
    doc.events = list(events or doc.events)


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
    _top_level(doc, data.get("checkpoints"), data.get("compressions"), data.get("events"))
    return doc
