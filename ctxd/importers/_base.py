"""Shared pieces of the transcript importers.

* :class:`Transcript` and :class:`TranscriptError` (re-exported by ``ctxd.importers``).
* :class:`Document`: a file decoded once, as one JSON value or as JSONL records with
  their line numbers, so every format's ``detect``/``parse`` works on the same thing.
* :class:`Builder`: collects messages and warnings for one transcript, validates each
  message against :class:`~ctxd.protocol.message.Message` (a message that would not
  survive a round trip is skipped with a warning, never stored half-valid; a timestamp
  that is not ISO 8601 moves to ``metadata.timestamp``), and checks tool pairing at the end.
* Converters shared by the OpenAI-shaped formats (OpenAI chat, mini-swe-agent, SWE-agent,
  OpenHands) and the Anthropic-shaped ones (Claude Code): content parts/blocks, tool
  calls, provider usage.

Conventions for ``Message.metadata``: a field the source had and ``Message`` has no
field for is kept under the source's own name (``thought``, ``action``, ``uuid``,
``dia_id``...); keys ctxd adds itself are camelCase (``originalRole``, ``observation``,
``recordNumber``...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

import msgspec

from ctxd.protocol.message import (
    FunctionCall,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

IMAGE_PLACEHOLDER = "[image omitted]"

_ROLES = frozenset({"system", "user", "assistant", "tool"})


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
            first = self.records[0][1] if self.records else None
            return f"JSONL with {len(self.records)} records, the first {_shape(first)}"
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


def epoch_to_iso(value: Any) -> str | None:
    """A Unix time (seconds) as an ISO 8601 UTC string; None when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(value, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


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


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def usage_from(raw: Any) -> Usage | None:
    """Provider usage (Anthropic or OpenAI/litellm keys) as :class:`Usage`, numbers as reported.

    Anthropic's ``input_tokens`` excludes cache reads; OpenAI's ``prompt_tokens``
    includes cached tokens. Both are stored as ``input_tokens`` exactly as reported, and
    only Anthropic's cache reads as ``cache_read_tokens`` (so input + cache reads is
    always what the provider counted).
    """
    if not isinstance(raw, dict):
        return None
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    if not isinstance(prompt_details, dict):
        prompt_details = {}
    if not isinstance(completion_details, dict):
        completion_details = {}
    input_tokens = _int(raw.get("input_tokens"))
    if input_tokens is None:
        input_tokens = _int(raw.get("prompt_tokens"))
    output_tokens = _int(raw.get("output_tokens"))
    if output_tokens is None:
        output_tokens = _int(raw.get("completion_tokens"))
    # ``cacheReadTokens`` has Anthropic's meaning (not part of ``inputTokens``), as a push
    # defines it; OpenAI's and DeepSeek's cached counts are already inside prompt_tokens.
    cache_read = _int(raw.get("cache_read_input_tokens"))
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=_int(raw.get("total_tokens")),
        cache_read_tokens=cache_read,
        cache_write_tokens=_int(raw.get("cache_creation_input_tokens")),
        reasoning_tokens=_int(completion_details.get("reasoning_tokens")),
    )
    if usage == Usage():
        return None
    return usage


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


def text_of(value: Any) -> str:
    """Best-effort text of a value that should have been a string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


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


# --------------------------------------------------------------------------- content


_PLACEHOLDERS = {
    "image": IMAGE_PLACEHOLDER,
    "image_url": IMAGE_PLACEHOLDER,
    "input_image": IMAGE_PLACEHOLDER,
    "input_audio": "[audio omitted]",
    "audio": "[audio omitted]",
    "file": "[file omitted]",
    "document": "[document omitted]",
}


def convert_block(part: Any, where: str, b: Builder, meta: dict[str, Any]) -> Any:
    """One OpenAI content part or Anthropic content block as a ctxd block (or None).

    Images and other binary parts become a text placeholder with a warning; unknown
    block types become ``[<type> block omitted]`` with a warning, so the position of
    something in the conversation is never silently lost.
    """
    if isinstance(part, str):
        return TextBlock(text=part)
    if not isinstance(part, dict):
        b.warn(f"{where}: content part of type {type(part).__name__} kept as text")
        return TextBlock(text=text_of(part))
    kind = part.get("type")
    if not isinstance(kind, str):
        kind = None
    if "cache_control" in part:
        meta["cache_control"] = part["cache_control"]
    if kind == "text" or (kind is None and "text" in part):
        return TextBlock(text=text_of(part.get("text")))
    if kind in _PLACEHOLDERS:
        b.warn(f"{where}: {kind} part replaced by {_PLACEHOLDERS[kind]!r}")
        return TextBlock(text=_PLACEHOLDERS[kind])
    if kind == "refusal":
        meta["refusal"] = True
        return TextBlock(text=text_of(part.get("refusal")))
    if kind == "thinking":
        sig = part.get("signature")
        return ThinkingBlock(thinking=text_of(part.get("thinking")),
                             signature=sig if isinstance(sig, str) else None)
    if kind == "redacted_thinking":
        meta.setdefault("redacted_thinking", []).append(part.get("data"))
        b.warn(f"{where}: redacted_thinking block kept in metadata only")
        return None
    if kind == "tool_use":
        tool_input = part.get("input")
        if not isinstance(tool_input, dict):
            tool_input = {} if tool_input is None else {"input": tool_input}
        return ToolUseBlock(id=text_of(part.get("id")), name=text_of(part.get("name")),
                            input=tool_input)
    if kind == "tool_result":
        return ToolResultBlock(
            tool_use_id=text_of(part.get("tool_use_id")),
            content=tool_result_content(part.get("content"), where, b),
            is_error=bool(part.get("is_error", False)),
        )
    b.warn(f"{where}: unsupported {kind!r} block replaced by a placeholder")
    return TextBlock(text=f"[{kind} block omitted]")


def tool_result_content(content: Any, where: str, b: Builder) -> str | list[TextBlock]:
    """Content of an Anthropic ``tool_result``: a string or a list of text blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[TextBlock] = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str):
                kind = None
            if kind == "text":
                out.append(TextBlock(text=text_of(part.get("text"))))
            elif kind in _PLACEHOLDERS:
                b.warn(f"{where}: {kind} in tool result replaced by {_PLACEHOLDERS[kind]!r}")
                out.append(TextBlock(text=_PLACEHOLDERS[kind]))
            else:
                b.warn(f"{where}: {kind or type(part).__name__} part in tool result kept as text")
                out.append(TextBlock(text=text_of(part)))
        return out
    return text_of(content)


def convert_content(content: Any, where: str, b: Builder,
                    meta: dict[str, Any]) -> str | list[Any] | None:
    """Message content: a string and None stay as they are; a list becomes blocks."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        blocks = []
        for part in content:
            block = convert_block(part, where, b, meta)
            if block is not None:
                blocks.append(block)
        return blocks
    b.warn(f"{where}: content of type {type(content).__name__} kept as text")
    return text_of(content)


def convert_tool_calls(raw: Any, where: str, b: Builder) -> list[ToolCall] | None:
    """OpenAI ``tool_calls``; ``arguments`` kept verbatim (JSON-encoded if not a string)."""
    if not raw:
        return None
    if not isinstance(raw, list):
        b.warn(f"{where}: tool_calls is not a list, ignored")
        return None
    calls: list[ToolCall] = []
    for number, call in enumerate(raw):
        if not isinstance(call, dict):
            b.warn(f"{where}: tool call {number} is not an object, ignored")
            continue
        function = call.get("function") or {}
        if not isinstance(function, dict):
            function = {}
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{len(b.messages)}_{number}"
            b.warn(f"{where}: tool call {number} has no id, using {call_id!r}")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = text_of(arguments)
        calls.append(ToolCall(id=call_id, function=FunctionCall(
            name=text_of(function.get("name")), arguments=arguments)))
    return calls or None


# Keys of an OpenAI-style message that ``convert_openai_message`` consumes itself.
_OPENAI_CONSUMED = frozenset({
    "role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content",
    "thinking_blocks", "timestamp",
})
# Keys dropped as noise: streaming indexes, nulls litellm always writes, duplicates.
_OPENAI_NOISE = frozenset({"function_call", "provider_specific_fields", "audio", "annotations"})


def convert_openai_message(
    raw: Any,
    where: str,
    b: Builder,
    *,
    ignore: Iterable[str] = (),
    role_map: dict[str, str] | None = None,
) -> Message | None:
    """One OpenAI-style chat message as a :class:`Message` (not yet added).

    Roles outside system/user/assistant/tool are mapped through ``role_map`` (``developer``
    → system and ``function`` → tool by default) with ``metadata.originalRole``; other
    unknown roles become ``user`` with a warning. ``reasoning_content`` /
    ``thinking_blocks`` become leading :class:`ThinkingBlock` s. Any other non-null key
    goes to metadata under its own name, unless listed in ``ignore``.
    """
    if not isinstance(raw, dict):
        b.warn(f"{where}: skipped, not a JSON object")
        return None
    meta: dict[str, Any] = {}
    role = raw.get("role")
    if not isinstance(role, str):
        b.warn(f"{where}: skipped, no role")
        return None
    mapping = {"developer": "system", "function": "tool"}
    if role_map:
        mapping.update(role_map)
    if role not in _ROLES:
        meta["originalRole"] = role
        if role in mapping:
            role = mapping[role]
        else:
            b.warn(f"{where}: unknown role {role!r} imported as user")
            role = "user"
    content = convert_content(raw.get("content"), where, b, meta)
    thinking: list[Any] = []
    reasoning = raw.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        thinking.append(ThinkingBlock(thinking=reasoning))
        meta["thinkingSource"] = "reasoning_content"
    for block in raw.get("thinking_blocks") or ():
        if isinstance(block, dict) and block.get("type") == "thinking":
            sig = block.get("signature")
            thinking.append(ThinkingBlock(thinking=text_of(block.get("thinking")),
                                          signature=sig if isinstance(sig, str) else None))
    if thinking:
        if content is None or content == "":
            rest: list[Any] = []
        elif isinstance(content, str):
            rest = [TextBlock(text=content)]
        else:
            rest = content
        content = thinking + rest
    name = raw.get("name")
    tool_call_id = raw.get("tool_call_id")
    skip = _OPENAI_CONSUMED | _OPENAI_NOISE | set(ignore)
    for key, value in raw.items():
        if key not in skip and value is not None:
            meta[key] = value
    if raw.get("function_call"):
        meta["function_call"] = raw["function_call"]
    timestamp = raw.get("timestamp")
    if not isinstance(timestamp, str):
        timestamp = epoch_to_iso(timestamp)
    return Message(
        role=role,
        content=content,
        name=name if isinstance(name, str) else None,
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
        tool_calls=convert_tool_calls(raw.get("tool_calls"), where, b),
        metadata=meta or None,
        timestamp=timestamp,
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
