"""OpenAI chat transcripts.

Accepted shapes:

* a bare JSON list of messages ``[{"role": ..., "content": ...}, ...]`` (also the older
  mini-swe-agent fixture form, where command results come back as ``user`` messages);
* ``{"messages": [...], ...}`` (other top-level keys such as ``model``, ``title``,
  ``tools`` go to the transcript);
* a JSON list of such ``{"messages": [...]}`` objects (one transcript each);
* JSONL: one message per line (one transcript), or one ``{"messages": [...]}``
  conversation per line (one transcript per line) - decided from the first record.

Content may be a string, null, or a list of parts; ``text`` parts become text blocks,
``image_url``/audio/file parts become a placeholder (``[image omitted]``) with a warning.
``tool_calls`` and ``role: tool`` + ``tool_call_id`` are kept as they are.
"""

from __future__ import annotations

from typing import Any

from ctxd.formats import openai

from ._base import (
    Builder,
    Document,
    Transcript,
    TranscriptError,
    guess_provider,
    looks_like_openai_messages,
)

NAME = "openai_chat"
DESCRIPTION = ("OpenAI chat messages: a JSON list, {\"messages\": [...]}, or JSONL "
               "(one message or one conversation per line)")


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and (
        "content" in value or "tool_calls" in value)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("messages"), list) and (
        not value["messages"] or looks_like_openai_messages(value["messages"]))


def detect(doc: Document) -> bool:
    if doc.records is not None:
        first = doc.records[0][1] if doc.records else None
        return _is_message(first) or _is_conversation(first)
    value = doc.value
    if isinstance(value, list):
        if looks_like_openai_messages(value):
            return True
        return bool(value) and _is_conversation(value[0]) and bool(value[0]["messages"])
    return _is_conversation(value) or _is_message(value)


def _conversation(raw: dict[str, Any], where: str) -> Transcript:
    b = Builder(NAME)
    for number, item in enumerate(raw["messages"]):
        message = openai.to_message(item, f"{where}message {number}", b.warn, index=len(b.messages))
        if message is not None:
            b.add(message, f"{where}message {number}")
    extra = {k: v for k, v in raw.items() if k != "messages" and v is not None}
    title = extra.pop("title", None)
    model = extra.pop("model", None)
    if not isinstance(title, str):
        title = None
    if not isinstance(model, str):
        model = None
    provider = extra.pop("provider", None)
    if not isinstance(provider, str):
        provider = guess_provider(model)
    return b.finish(title=title, model=model, provider=provider, metadata=extra)


def parse(doc: Document) -> list[Transcript]:
    if doc.records is not None:
        first = doc.records[0][1]
        if _is_conversation(first):
            out: list[Transcript] = []
            skipped: list[str] = []
            for line, record in doc.records:
                if _is_conversation(record):
                    transcript = _conversation(record, f"line {line}: ")
                    transcript.metadata.setdefault("line", line)
                    out.append(transcript)
                else:
                    skipped.append(f"line {line}: skipped, not a {{\"messages\": [...]}} object")
            if out and skipped:
                out[0].warnings[:0] = skipped
            return out
        b = Builder(NAME)
        for line, record in doc.records:
            message = openai.to_message(record, f"line {line}", b.warn, index=len(b.messages))
            if message is not None:
                b.add(message, f"line {line}")
        return [b.finish()]
    value = doc.value
    if isinstance(value, dict):
        if _is_message(value):
            value = [value]
        else:
            return [_conversation(value, "")]
    if isinstance(value, list) and value and _is_conversation(value[0]):
        return [_conversation(item, f"conversation {n}: ")
                for n, item in enumerate(value) if _is_conversation(item)]
    if not isinstance(value, list):
        raise TranscriptError(f"{doc.name}: expected a list of OpenAI chat messages")
    return [_conversation({"messages": value}, "")]
