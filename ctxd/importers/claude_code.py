"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``).

One JSON record per line. Records of ``type`` ``user``/``assistant`` carry ``message``,
an Anthropic Messages object (``text``, ``tool_use``, ``tool_result``, ``thinking``
blocks). Everything else (``queue-operation``, ``summary``, ``file-history-snapshot``,
``system``...) is not a chat message and is skipped with one warning per type.

* Title: the last ``custom-title`` record's (``/rename``), else the first ``summary``
  record's text, else the last ``ai-title``, else the first words the user typed (not
  a slash command's wrapper, a hook's feedback or an interruption notice).

* Order: records are put in ``parentUuid`` order (a child after its parent), otherwise
  keeping file order, which is also timestamp order in the logs Claude Code writes.
* Claude Code writes one assistant API reply as several records (one per content block)
  sharing ``message.id``; they are merged, in order, into one assistant message at the
  position of the first. Its ``usage`` is the last record's ``message.usage``.
* Tool results stay Anthropic style: ``tool_result`` blocks inside ``user`` messages,
  one message per record (parallel results are separate user messages, as logged).
* Metadata: every top-level scalar of the record (``uuid``, ``parentUuid``,
  ``sessionId``, ``cwd``, ``gitBranch``, ``isSidechain``, ``isMeta``, ``version``,
  ``requestId``...) under its own name; ``message.id`` as ``messageId``,
  ``message.model`` as ``model``, ``message.stop_reason`` as ``stop_reason``; a merged
  reply lists all record uuids in ``uuids``. A record repeating an earlier ``uuid`` is
  skipped with a warning. ``toolUseResult`` (Claude Code's structured
  copy of the tool output, already in the ``tool_result`` block) is not kept.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ctxd.formats.common import content_blocks
from ctxd.formats.native import any_usage
from ctxd.protocol.message import Message, TextBlock

from ._base import Builder, Document, Transcript, title_from_text

NAME = "claude_code"
DESCRIPTION = "Claude Code session log (JSONL, one user/assistant/... record per line)"

_MESSAGE_TYPES = ("user", "assistant")
_OTHER_TYPES = frozenset({
    "summary", "queue-operation", "file-history-snapshot", "system", "progress",
    "custom-title", "ai-title", "agent-name", "tag",
})
# What Claude Code writes as a user message that the user did not type.
_NOT_TYPED = ("<command-", "<local-command-", "<system-reminder>", "<bash-", "<user-prompt-submit-hook>",
              "Caveat: ", "[Request interrupted")
_NOT_METADATA = frozenset({"type", "message", "timestamp", "toolUseResult"})


def _is_record(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return False
    kind = value["type"]
    if kind in _MESSAGE_TYPES:
        return isinstance(value.get("message"), dict) and (
            "uuid" in value or "sessionId" in value or "parentUuid" in value)
    return kind in _OTHER_TYPES and (
        "sessionId" in value or "leafUuid" in value or "messageId" in value
        or "uuid" in value)


def _records(doc: Document) -> list[tuple[int, Any]]:
    if doc.records is not None:
        return doc.records
    if isinstance(doc.value, dict):
        return [(1, doc.value)]
    return []


def detect(doc: Document) -> bool:
    head = [record for _, record in _records(doc)[:20]]
    if not head or not _is_record(head[0]):
        return False
    return any(r.get("type") in _MESSAGE_TYPES for r in head if isinstance(r, dict)) or all(
        _is_record(r) for r in head)


def _order(records: list[tuple[int, dict[str, Any]]], b: Builder) -> list[tuple[int, dict]]:
    """File order, except that a record never comes before its parent."""
    known = {r["uuid"] for _, r in records if isinstance(r.get("uuid"), str)}
    emitted: set[str] = set()
    waiting: dict[str, list[tuple[int, dict]]] = {}
    out: list[tuple[int, dict]] = []

    def emit(item: tuple[int, dict]) -> None:
        stack = [item]
        while stack:
            current = stack.pop()
            out.append(current)
            uuid = current[1].get("uuid")
            if isinstance(uuid, str):
                emitted.add(uuid)
                stack.extend(reversed(waiting.pop(uuid, [])))

    for item in records:
        parent = item[1].get("parentUuid")
        if isinstance(parent, str) and parent in known and parent not in emitted:
            waiting.setdefault(parent, []).append(item)
        else:
            emit(item)
    if waiting:
        left = sorted((i for items in waiting.values() for i in items), key=lambda i: i[0])
        b.warn(f"{len(left)} records in a parentUuid cycle kept in file order "
               f"(lines {', '.join(str(i[0]) for i in left[:10])})")
        out.extend(left)
    return out


def parse(doc: Document) -> list[Transcript]:
    b = Builder(NAME)
    skipped: Counter[str] = Counter()
    skipped_lines: dict[str, list[int]] = {}
    title: str | None = None
    custom_title: str | None = None
    ai_title: str | None = None
    messages: list[tuple[int, dict[str, Any]]] = []
    seen_uuids: set[str] = set()
    duplicates: list[int] = []
    for line, record in _records(doc):
        kind = record.get("type") if isinstance(record, dict) else None
        if kind in _MESSAGE_TYPES and isinstance(record.get("message"), dict):
            uuid = record.get("uuid")
            if isinstance(uuid, str):
                if uuid in seen_uuids:
                    duplicates.append(line)
                    continue
                seen_uuids.add(uuid)
            messages.append((line, record))
            continue
        if kind == "summary" and title is None and isinstance(record.get("summary"), str):
            title = record["summary"]
        elif kind == "custom-title" and isinstance(record.get("customTitle"), str) and record["customTitle"].strip():
            custom_title = record["customTitle"].strip()
        elif kind == "ai-title" and isinstance(record.get("aiTitle"), str) and record["aiTitle"].strip():
            ai_title = record["aiTitle"].strip()
        label = kind if isinstance(kind, str) else "non-record"
        skipped[label] += 1
        skipped_lines.setdefault(label, []).append(line)
    if duplicates:
        b.warn(f"skipped {len(duplicates)} records repeating an earlier uuid "
               f"(line {', '.join(str(n) for n in duplicates[:10])})")
    for label, count in skipped.items():
        lines = skipped_lines[label]
        shown = ", ".join(str(n) for n in lines[:10]) + (", ..." if len(lines) > 10 else "")
        b.warn(f"skipped {count} {label} record{'s' if count != 1 else ''} (line {shown})")

    drafts: list[dict[str, Any]] = []
    by_message_id: dict[str, dict[str, Any]] = {}
    models: list[str] = []
    for line, record in _order(messages, b):
        message = record["message"]
        where = f"line {line}"
        role = message.get("role") if message.get("role") in _MESSAGE_TYPES else record["type"]
        meta: dict[str, Any] = {}
        content = content_blocks(message.get("content"), where, b.warn, meta)
        model = message.get("model")
        if isinstance(model, str) and model not in models and model != "<synthetic>":
            models.append(model)
        message_id = message.get("id")
        if role == "assistant" and isinstance(message_id, str) and message_id in by_message_id:
            draft = by_message_id[message_id]
            draft["parts"].append(content)
            draft["records"].append(record)
            draft["meta"].update(meta)
            if message.get("usage") is not None:
                draft["usage"] = message["usage"]
            if message.get("stop_reason") is not None:
                draft["meta"]["stop_reason"] = message["stop_reason"]
            continue
        for key, value in record.items():
            if key not in _NOT_METADATA and value is not None and not isinstance(
                    value, (dict, list)):
                meta[key] = value
        if isinstance(message_id, str):
            meta["messageId"] = message_id
        if isinstance(model, str):
            meta["model"] = model
        if message.get("stop_reason") is not None:
            meta["stop_reason"] = message["stop_reason"]
        draft = {
            "role": role, "parts": [content], "records": [record], "meta": meta,
            "usage": message.get("usage"), "where": where,
            "timestamp": record.get("timestamp") if isinstance(
                record.get("timestamp"), str) else None,
        }
        drafts.append(draft)
        if role == "assistant" and isinstance(message_id, str):
            by_message_id[message_id] = draft

    for draft in drafts:
        parts = draft["parts"]
        if len(parts) == 1:
            content = parts[0]
        else:
            content = []
            for part in parts:
                if isinstance(part, str):
                    if part:
                        content.append(TextBlock(text=part))
                elif part:
                    content.extend(part)
            uuids = [r.get("uuid") for r in draft["records"] if r.get("uuid")]
            draft["meta"]["uuids"] = uuids
        b.add(Message(
            role=draft["role"],
            content=content,
            usage=any_usage(draft["usage"]) if draft["role"] == "assistant" else None,
            metadata=draft["meta"],
            timestamp=draft["timestamp"],
        ), draft["where"])

    metadata: dict[str, Any] = {}
    first = messages[0][1] if messages else {}
    for key in ("sessionId", "cwd", "gitBranch", "version"):
        if isinstance(first.get(key), str):
            metadata[key] = first[key]
    if len(models) > 1:
        metadata["models"] = models
    model = models[0] if models else None
    title = custom_title or title or ai_title or _first_words(b.messages)
    return [b.finish(title=title, model=model,
                     provider="anthropic", metadata=metadata)]


def _first_words(messages: list[Message]) -> str | None:
    """A title from the first thing the user typed."""
    for message in messages:
        if message.role != "user" or (message.metadata or {}).get("isMeta"):
            continue
        content = message.content
        texts = [content] if isinstance(content, str) else [
            block.text for block in content or () if isinstance(block, TextBlock)]
        for text in texts:
            if text.strip() and not text.lstrip().startswith(_NOT_TYPED):
                return title_from_text(text)
    return None
