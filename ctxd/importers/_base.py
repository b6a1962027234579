"""Shared pieces of the transcript importers.

* :class:`Transcript` and :class:`TranscriptError` (re-exported by ``ctxd.importers``).
* :class:`Document`: a file decoded once, as one JSON value or as JSONL records with
  their line numbers, so every format's ``detect``/``parse`` works on the same thing.
* :class:`Builder`: collects messages and warnings for one transcript, validates each
  message against :class:`~ctxd.protocol.message.Message` (a message that would not
  survive a round trip is skipped with a warning, never stored half-valid; a timestamp
  that is not ISO 8601 moves to ``metadata.timestamp``), and checks tool pairing at the end.

The provider shapes themselves are read by ``ctxd.formats``: ``formats.openai.to_message``
(the OpenAI-shaped formats: OpenAI chat, mini-swe-agent, SWE-agent, OpenHands),
``formats.common.content_blocks`` (content parts and blocks of either shape: Claude Code),
``formats.native.any_usage`` (any provider's usage object).

Conventions for ``Message.metadata``: a field the source had and ``Message`` has no
field for is kept under the source's own name (``thought``, ``action``, ``uuid``,
``dia_id``...); keys ctxd adds itself are camelCase (``originalRole``, ``observation``,
``recordNumber``...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from ctxd.protocol.message import Message, ToolResultBlock, ToolUseBlock


class TranscriptError(ValueError):
    """A file that cannot be imported. ``str(err)`` is one line naming the file."""


class Transcript(msgspec.Struct, omit_defaults=True):
    """One imported conversation."""

    messages: list[Message]
    source_format: str
    title: str | None = None
    model: str | None = None
    provider: str | None = None
    system_prompt: str | None = None
    metadata: dict[str, Any] = {}
    warnings: list[str] = []


# --------------------------------------------------------------------------- decoding


@dataclass
class Document:
    """A decoded file: ``value`` for a JSON document, ``records`` for JSONL.

    ``records`` holds ``(line_number, value)`` pairs (1-based, blank lines skipped).
    Exactly one of the two is set (or ``text``, for a text transcript).
    """

    name: str
    value: Any = None
    records: list[tuple[int, Any]] | None = None
    text: str | None = None
    """A text (not JSON) transcript: aider's Markdown chat history."""

    @property
    def is_jsonl(self) -> bool:
        return self.records is not None

    def describe(self) -> str:
        """A short description of the top-level shape, for error messages."""
        if self.text is not None:
            first = next((line for line in self.text.splitlines() if line.strip()), "")
            return f"text starting {first[:40]!r}"
        if self.records is not None:
            record = self.records[0][1] if self.records else None
            return f"JSONL with {len(self.records)} records, the first {_shape(record)}"
        return _shape(self.value)


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        keys = ", ".join(list(value)[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"a JSON object with keys {keys}{more}" if value else "an empty JSON object"
    if isinstance(value, list):
        if not value:
            return "an empty JSON list"
        return f"a JSON list of {len(value)} items, the first {_shape(value[0])}"
    return f"a JSON {type(value).__name__}"


_decoder = msgspec.json.Decoder()


def _json_error_position(text: bytes) -> str:
    """Line/column of a JSON syntax error, from the stdlib parser (error path only)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        return f"line {err.lineno} column {err.colno}: {err.msg}"
    except (UnicodeDecodeError, RecursionError) as err:  # pragma: no cover - odd input
        return str(err)
    return "invalid JSON"


def decode_document(data: bytes, name: str) -> Document:
    """Decode ``data`` as one JSON document or as JSONL, or raise :class:`TranscriptError`."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    stripped = data.strip()
    if not stripped:
        raise TranscriptError(f"{name}: the file is empty")
    if stripped[:1] not in (b"{", b"["):
        from ctxd.importers.aider import looks_like_aider  # (the one text format)

        if looks_like_aider(stripped[:65536]):
            try:
                return Document(name=name, text=data.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise TranscriptError(f"{name}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        raise TranscriptError(
            f"{name}: not JSON or JSONL (starts with {stripped[:20]!r}); "
            "expected a JSON transcript, one JSON record per line, or aider's .aider.chat.history.md"
        )
    try:
        return Document(name=name, value=_decoder.decode(stripped))
    except msgspec.DecodeError:
        pass
    lines = stripped.split(b"\n")
    if len(lines) > 1:
        try:
            first = _decoder.decode(lines[0])
        except msgspec.DecodeError:
            first = None
        if isinstance(first, dict):
            records: list[tuple[int, Any]] = []
            for number, line in enumerate(lines, start=1):
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append((number, _decoder.decode(line)))
                except msgspec.DecodeError:
                    where = _json_error_position(line)
                    raise TranscriptError(
                        f"{name}: JSONL line {number} is not valid JSON ({where})"
                    ) from None
            return Document(name=name, records=records)
    raise TranscriptError(f"{name}: not valid JSON ({_json_error_position(stripped)})")


# --------------------------------------------------------------------------- helpers


def is_iso_timestamp(value: Any) -> bool:
    """Whether ``value`` is an ISO 8601 date or date-time string."""
    if not isinstance(value, str) or len(value) < 10:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


# litellm-style "provider/model" prefixes that name the provider itself.
_PROVIDER_PREFIXES = frozenset({
    "openai", "anthropic", "deepseek", "gemini", "vertex_ai", "bedrock", "azure",
    "openrouter", "mistral", "groq", "together_ai", "fireworks_ai", "ollama", "xai",
    "cohere", "huggingface",
})


def guess_provider(model: str | None) -> str | None:
    """The provider a model name belongs to, from well-known name patterns."""
    if not model:
        return None
    lowered = model.lower()
    if "/" in lowered:
        prefix = lowered.split("/", 1)[0]
        if prefix in _PROVIDER_PREFIXES:
            return prefix
    name = lowered.rsplit("/", 1)[-1]
    if "claude" in name:
        return "anthropic"
    if name.startswith(("gpt-", "gpt4", "o1", "o3", "o4", "chatgpt", "text-davinci")):
        return "openai"
    if "deepseek" in name:
        return "deepseek"
    if "gemini" in name:
        return "google"
    if "mistral" in name or "mixtral" in name or "codestral" in name:
        return "mistral"
    if "llama" in name:
        return "meta"
    if "qwen" in name:
        return "alibaba"
    return None


TITLE_WIDTH = 60


def title_from_text(text: str, width: int = TITLE_WIDTH) -> str | None:
    """A session title from what the user wrote: its first non-blank line, whitespace
    collapsed, cut at a word before ``width`` characters (with "..."); None for no words."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    words = " ".join(line.split()).rstrip(" ,;:")
    if not words:
        return None
    if len(words) <= width:
        return words
    cut = words[: width - 3]
    if " " in cut[width // 2:]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:-") + "..."


# --------------------------------------------------------------------------- builder


@dataclass
class Builder:
    """Collects the messages and warnings of one transcript."""

    source_format: str
    messages: list[Message] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def add(self, message: Message, where: str) -> bool:
        """Validate ``message`` (round trip through builtins) and append it.

        ``where`` names the source record ("record 12", "line 40") for the warning if
        the message is rejected.
        """
        if message.timestamp is not None and not is_iso_timestamp(message.timestamp):
            message.metadata = {**(message.metadata or {}), "timestamp": message.timestamp}
            message.timestamp = None
            self.warn(f"{where}: timestamp is not ISO 8601, kept in metadata.timestamp")
        if message.metadata is not None and not message.metadata:
            message.metadata = None
        try:
            checked = msgspec.convert(msgspec.to_builtins(message), Message)
        except (msgspec.ValidationError, TypeError) as err:
            self.warn(f"{where}: skipped, not a valid message ({err})")
            return False
        self.messages.append(checked)
        return True

    def finish(self, **fields: Any) -> Transcript:
        if not self.messages:
            self.warn("no messages found")
        check_tool_pairing(self.messages, self.warnings)
        metadata = fields.pop("metadata", None) or {}
        return Transcript(
            messages=self.messages,
            source_format=self.source_format,
            metadata=metadata,
            warnings=self.warnings,
            **fields,
        )


def check_tool_pairing(messages: list[Message], warnings: list[str]) -> None:
    """Warn about tool results whose call is not earlier in the transcript (kept as they are)."""
    seen: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.tool_calls or ():
            seen.add(call.id)
        content = message.content
        if isinstance(content, list):
            for block in content:
                if isinstance(block, ToolUseBlock):
                    seen.add(block.id)
                elif isinstance(block, ToolResultBlock) and block.tool_use_id not in seen:
                    warnings.append(
                        f"message {index}: tool_result for {block.tool_use_id!r} "
                        "has no earlier tool_use (kept)"
                    )
        if message.role == "tool":
            if message.tool_call_id is None:
                if not (isinstance(content, list)
                        and any(isinstance(b, ToolResultBlock) for b in content)):
                    warnings.append(f"message {index}: tool message without tool_call_id (kept)")
            elif message.tool_call_id not in seen:
                warnings.append(
                    f"message {index}: tool result for {message.tool_call_id!r} "
                    "has no earlier tool call (kept)"
                )


def first_dict_items(value: Any, limit: int = 3) -> list[dict[str, Any]]:
    """Up to ``limit`` leading items of a list that are dicts (for cheap detection)."""
    if not isinstance(value, list):
        return []
    return [item for item in value[:limit] if isinstance(item, dict)]


def looks_like_openai_messages(value: Any) -> bool:
    """A non-empty list whose leading items are ``{role, ...}`` objects with known roles."""
    items = first_dict_items(value)
    if not items or len(items) != min(3, len(value)):
        return False
    return all(isinstance(item.get("role"), str) and
               ("content" in item or "tool_calls" in item) for item in items)
