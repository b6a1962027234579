"""What every provider shape shares: JSON spellings, the text of content parts, usage
tables, and ctxd's side of rendering (a stored Message read as a neutral :class:`Turn`,
which each provider module writes out in its own shape).

Nothing here knows a provider's field names but the content parts that several shapes
spell alike; those live in the provider modules (``openai.py``, ``anthropic.py``,
``responses.py``, ``ollama.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from ctxd.protocol.message import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    image_text,
    tool_result_text,
)

Api = Literal["openai", "anthropic", "ollama", "responses"]
"""A provider shape: OpenAI Chat Completions, Anthropic Messages, Ollama's /api/chat,
OpenAI Responses."""

Ref = tuple[Literal["call", "result", "item"], str]
"""A provider id a raw message carries (:func:`ctxd.formats.ids_of`): a tool call it makes
(``call``), the call a result answers (``result``), or the message's own id (``item``,
Responses API items)."""

Warn = Callable[[str], None]
"""Where a lenient conversion reports what it changed (an importer's warnings)."""


# --- JSON spellings -------------------------------------------------------------------------


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""(What ``json.dumps`` with these arguments builds on each call: made once.)"""


def canonical_json(value: Any) -> str:
    """One spelling per JSON value (sorted keys, no spaces): what the proxy compares and hashes."""
    return _CANONICAL.encode(value)


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments whatever their spelling (OpenAI's JSON text, an object)."""
    if isinstance(arguments, str):
        try:
            return canonical_json(json.loads(arguments)) if arguments.strip() else "{}"
        except ValueError:
            return arguments
    return canonical_json(arguments if arguments is not None else {})


def compact_json(value: Any) -> str:
    """A tool_use input as OpenAI ``arguments`` text: the compact JSON ctxd counted it as
    (``tokens.count_message``), so the rendered prompt costs what its ``tokens`` says."""
    return msgspec.json.encode(value).decode()


def arguments_to_input(arguments: str) -> dict[str, Any]:
    """OpenAI ``arguments`` text as an Anthropic/Ollama ``input`` object (text that is
    not a JSON object is kept under ``arguments``)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def text_of(value: Any) -> str:
    """Best-effort text of a value that should have been a string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def epoch_to_iso(value: Any) -> str | None:
    """A Unix time (seconds) as an ISO 8601 UTC string; None when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def placeholder(types: list[str]) -> str:
    """The text that stands for content ctxd does not keep, naming its types."""
    return "[" + ", ".join(sorted(set(types))) + " not kept by ctxd]"


def content_text(content: Any) -> tuple[str, list[str]]:
    """Text of a string or a list of parts (``text``, ``refusal``, bare strings), and the
    types of the parts that are not text."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    other: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal":
                texts.append(str(part.get("refusal") or ""))
            elif isinstance(part, str):
                texts.append(part)
            else:
                other.append(str(part.get("type") if isinstance(part, dict) else type(part).__name__))
    return "\n".join(t for t in texts if t), other


def parts_text(content: Any) -> str:
    """A system message's text: a string, or its parts' ``text`` joined by lines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def ctxd_ids(message: Any) -> list[Ref]:
    """The provider ids a ctxd Message (JSON, as stored) carries, as ``ids_of`` names them
    for a raw client message: the calls it makes (``toolCalls``, ``tool_use`` blocks) and
    the calls it answers (``toolCallId``, ``tool_result`` blocks)."""
    if not isinstance(message, dict):
        return []
    out: list[Ref] = []
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                    out.append(("call", block["id"]))
                elif block.get("type") == "tool_result" and isinstance(block.get("toolUseId"), str):
                    out.append(("result", block["toolUseId"]))
    for call in message.get("toolCalls") or ():
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            out.append(("call", call["id"]))
    if isinstance(message.get("toolCallId"), str):
        out.append(("result", message["toolCallId"]))
    return out


# --- usage ---------------------------------------------------------------------------------

UsageField = tuple[str, "str | None", str]
"""(provider key, key inside it or None, ctxd's Usage field in camelCase)."""


def read_usage(usage: Any, fields: tuple[UsageField, ...]) -> dict[str, int]:
    """A provider's usage object as ctxd's Usage (JSON, camelCase): the counts ``fields``
    name that are non-negative integers; the first present wins for a field."""
    out: dict[str, int] = {}
    if not isinstance(usage, dict):
        return out
    for key, inner, ours in fields:
        value = usage.get(key)
        if inner is not None:
            value = value.get(inner) if isinstance(value, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0 and ours not in out:
            out[ours] = value
    return out


def usage_struct(counts: dict[str, int]) -> Usage | None:
    """:func:`read_usage`'s result as a :class:`Usage` (None when it holds nothing)."""
    return msgspec.convert(counts, Usage) if counts else None


# --- ctxd's side of rendering ---------------------------------------------------------------


@dataclass(slots=True)
class Call:
    """A tool call, whichever style stored it: ``input`` for Anthropic and Ollama,
    ``arguments`` (JSON text) for OpenAI. ``custom``: a freeform call (OpenAI custom tools),
    whose ``arguments`` is the model's text as it is; the shapes that have no freeform
    calls (Anthropic, Ollama) get it as ``{"input": text}``."""

    id: str
    name: str
    input: dict[str, Any]
    arguments: str
    custom: bool = False


@dataclass(slots=True)
class Result:
    """A tool result; ``name``: the tool's (Ollama names the tool a result is for)."""

    id: str
    text: str
    is_error: bool
    name: str | None = None


@dataclass(slots=True)
class Turn:
    """One message as the renderers see it. ``results`` turns hold tool results only;
    other turns hold text, an assistant's calls, and (before the engine pairs them)
    results that arrived in a user message."""

    role: Literal["system", "user", "assistant", "results"]
    texts: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    name: str | None = None
    thinking: list[ThinkingBlock] = field(default_factory=list)
    """An assistant message's signed thinking blocks, in order (sent in the Anthropic shape
    only: ``anthropic.emit``)."""


def turn_of(message: Message) -> Turn:
    """A stored message (either tool-call style) as a :class:`Turn`. Unsigned thinking is
    history, not prompt: it is left out; an assistant's signed thinking is kept for the
    Anthropic shape; an image is sent as its description (``image_text``)."""
    role = message.role
    content = message.content
    turn = Turn(role="assistant" if role == "assistant" else "system" if role == "system" else "user",
                name=message.name if role in ("user", "assistant", "system") else None)
    if role == "tool":
        turn.role = "results"
        if isinstance(content, str) or content is None:
            turn.results.append(Result(message.tool_call_id or "", content or "", False, message.name))
            return turn
        texts = [b.text for b in content if isinstance(b, TextBlock)]
        if texts or not any(isinstance(b, ToolResultBlock) for b in content):
            turn.results.append(Result(message.tool_call_id or "", "\n".join(texts), False, message.name))
        for block in content:
            if isinstance(block, ToolResultBlock):
                turn.results.append(Result(block.tool_use_id, tool_result_text(block), block.is_error))
        return turn
    if isinstance(content, str):
        if content:
            turn.texts.append(content)
    elif content:
        for block in content:
            if isinstance(block, TextBlock):
                if block.text:
                    turn.texts.append(block.text)
            elif isinstance(block, ImageBlock):
                turn.texts.append(image_text(block))  # (every provider gets the description as text)
            elif isinstance(block, ToolUseBlock) and role == "assistant":
                turn.calls.append(Call(block.id, block.name, block.input, compact_json(block.input)))
            elif isinstance(block, ToolResultBlock):
                turn.results.append(Result(block.tool_use_id, tool_result_text(block), block.is_error))
            elif isinstance(block, ThinkingBlock) and block.signature and role == "assistant":
                turn.thinking.append(block)
    for call in message.tool_calls or ():
        if call.type == "custom":
            turn.calls.append(Call(call.id, call.name, {"input": call.text}, call.text, custom=True))
        else:
            turn.calls.append(Call(call.id, call.name, arguments_to_input(call.text), call.text))
    return turn


def join(texts: list[str]) -> str:
    """How a turn's texts become one message's text."""
    return "\n\n".join(texts)


# --- content blocks, read leniently (importers) ----------------------------------------------

IMAGE_PLACEHOLDER = "[image omitted]"

PLACEHOLDERS = {
    "image": IMAGE_PLACEHOLDER,
    "image_url": IMAGE_PLACEHOLDER,
    "input_image": IMAGE_PLACEHOLDER,
    "input_audio": "[audio omitted]",
    "audio": "[audio omitted]",
    "file": "[file omitted]",
    "document": "[document omitted]",
}
"""Binary parts of either shape (OpenAI parts, Anthropic blocks) and the text an imported
message keeps in their place."""


def content_block(part: Any, where: str, warn: Warn, meta: dict[str, Any]) -> Any:
    """One OpenAI content part or Anthropic content block as a ctxd block (or None).
    Transcripts mix the two shapes (litellm logs Anthropic blocks in OpenAI messages).

    Images and other binary parts become a text placeholder with a warning; unknown
    block types become ``[<type> block omitted]`` with a warning, so the position of
    something in the conversation is never silently lost.
    """
    if isinstance(part, str):
        return TextBlock(text=part)
    if not isinstance(part, dict):
        warn(f"{where}: content part of type {type(part).__name__} kept as text")
        return TextBlock(text=text_of(part))
    kind = part.get("type")
    if not isinstance(kind, str):
        kind = None
    if "cache_control" in part:
        meta["cache_control"] = part["cache_control"]
    if kind == "text" or (kind is None and "text" in part):
        return TextBlock(text=text_of(part.get("text")))
    if kind in PLACEHOLDERS:
        warn(f"{where}: {kind} part replaced by {PLACEHOLDERS[kind]!r}")
        return TextBlock(text=PLACEHOLDERS[kind])
    if kind == "refusal":
        meta["refusal"] = True
        return TextBlock(text=text_of(part.get("refusal")))
    if kind == "thinking":
        sig = part.get("signature")
        return ThinkingBlock(thinking=text_of(part.get("thinking")), signature=sig if isinstance(sig, str) else None)
    if kind == "redacted_thinking":
        meta.setdefault("redacted_thinking", []).append(part.get("data"))
        warn(f"{where}: redacted_thinking block kept in metadata only")
        return None
    if kind == "tool_use":
        tool_input = part.get("input")
        if not isinstance(tool_input, dict):
            tool_input = {} if tool_input is None else {"input": tool_input}
        return ToolUseBlock(id=text_of(part.get("id")), name=text_of(part.get("name")), input=tool_input)
    if kind == "tool_result":
        return ToolResultBlock(
            tool_use_id=text_of(part.get("tool_use_id")),
            content=tool_result_content(part.get("content"), where, warn),
            is_error=bool(part.get("is_error", False)),
        )
    warn(f"{where}: unsupported {kind!r} block replaced by a placeholder")
    return TextBlock(text=f"[{kind} block omitted]")


def tool_result_content(content: Any, where: str, warn: Warn) -> str | list[TextBlock]:
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
            elif kind in PLACEHOLDERS:
                warn(f"{where}: {kind} in tool result replaced by {PLACEHOLDERS[kind]!r}")
                out.append(TextBlock(text=PLACEHOLDERS[kind]))
            else:
                warn(f"{where}: {kind or type(part).__name__} part in tool result kept as text")
                out.append(TextBlock(text=text_of(part)))
        return out
    return text_of(content)


def content_blocks(content: Any, where: str, warn: Warn, meta: dict[str, Any]) -> str | list[Any] | None:
    """Message content read leniently: a string and None stay as they are; a list (or one
    part) becomes ctxd blocks (:func:`content_block`)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        blocks = []
        for part in content:
            block = content_block(part, where, warn, meta)
            if block is not None:
                blocks.append(block)
        return blocks
    warn(f"{where}: content of type {type(content).__name__} kept as text")
    return text_of(content)
