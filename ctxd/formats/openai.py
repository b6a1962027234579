"""OpenAI Chat Completions: the message shape (``role``, ``content`` as text or parts,
``tool_calls`` with JSON-text ``arguments``, ``role: tool`` results with ``tool_call_id``),
read into ctxd's Message and written from it; its usage object.

Ollama's /api/chat borrows this shape with three differences (tool calls have no ids,
``images`` beside the text, the assistant's ``thinking``): the chat readers here take
``api="ollama"`` for it, and ``ollama.py`` is its public face. The Responses API's items
are read as the Chat Completions messages they stand for (``responses.as_chat``).

Who uses what: the proxy (:func:`to_ctxd`, :func:`projection`, :func:`chain_part`,
:func:`ids_of`, :func:`usage`, :func:`system_text`, :func:`reply_message`), the engine's
renderer (:func:`emit`), the summarizer's backend (:func:`usage`),
the importers and the JSONL import (:func:`to_message`), the JSONL export
(:func:`export_lines`), and ``session/push`` (``native.py``: :data:`NATIVE_MESSAGE`,
:data:`NATIVE_EXTRAS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import msgspec

from ctxd.formats.common import (
    Api,
    Call,
    Ref,
    Turn,
    UsageField,
    Warn,
    canonical_arguments,
    canonical_json,
    content_blocks,
    content_text,
    epoch_to_iso,
    join,
    placeholder,
    read_usage,
    text_of,
    turn_of,
)
from ctxd.protocol.message import CustomCall, FunctionCall, Message, Role, TextBlock, ThinkingBlock, ToolCall
from ctxd.protocol.providers import OpenAICustom, OpenAIFunction, OpenAIMessage, OpenAIToolCall

ROLES = ("system", "user", "assistant", "tool")  # (a tuple: a role may be any JSON value)

USAGE: tuple[UsageField, ...] = (
    ("prompt_tokens", None, "inputTokens"),
    ("completion_tokens", None, "outputTokens"),
    ("total_tokens", None, "totalTokens"),
    ("completion_tokens_details", "reasoning_tokens", "reasoningTokens"),
    ("prompt_tokens_details", "cached_tokens", "cachedInputTokens"),
    ("prompt_cache_hit_tokens", None, "cachedInputTokens"),
)
"""Usage fields. ``prompt_tokens`` already includes ``prompt_tokens_details.cached_tokens``
(unlike Anthropic's ``input_tokens``), so the cached count is ``cachedInputTokens``, no
``cacheReadTokens`` (DeepSeek's ``prompt_cache_hit_tokens`` the same)."""

NATIVE_MESSAGE = {"tool_call_id": "toolCallId", "tool_calls": "toolCalls"}
"""Message fields a client may push in OpenAI's spelling (renamed to ctxd's)."""

NATIVE_EXTRAS = ("refusal", "annotations", "audio")
"""Reply fields without a place in Message: kept in ``metadata`` when set."""


def usage(raw: Any) -> dict[str, int]:
    """A Chat Completions ``usage`` object as ctxd's Usage (JSON)."""
    return read_usage(raw, USAGE)


# --- the proxy's reading: raw client messages as dicts --------------------------------------


def parts(message: dict[str, Any], *, with_unmodeled: bool, api: Api = "openai") -> tuple[str, list[Any]]:
    """(role, parts) as ctxd models a chat message: ``("t", text)``, ``("u", id, name,
    arguments)``, ``("r", id, text, is_error)``; ``with_unmodeled`` adds ``("x", type, id)``
    for the parts ctxd does not keep. Text is compared stripped, arguments canonical.
    ``api``: whose message this is (only OpenAI's calls carry ids; Ollama's have images;
    an Anthropic message whose content is a string reads as a chat message)."""
    ollama = api == "ollama"
    role = str(message.get("role"))
    if role == "developer":
        role = "system"
    out: list[Any] = []
    text, unknown = content_text(message.get("content"))
    if with_unmodeled:
        out += [("x", t, None) for t in unknown]
    if role == "tool":
        call = message.get("tool_call_id") or message.get("tool_name") or message.get("name")
        out.append(("r", call if api == "openai" else None, text.strip(), False))
    elif text.strip():
        out.append(("t", text.strip()))
    if ollama and message.get("images"):
        unknown.append("image")
        if with_unmodeled:
            out.append(("x", "images", len(message["images"])))
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        call_id = call.get("id") if api == "openai" else None
        if call.get("type") == "custom":  # (a fifth field: function calls' parts stay as they were)
            custom = call.get("custom") or {}
            out.append(("u", call_id, custom.get("name"), text_of(custom.get("input")), "custom"))
            continue
        function = call.get("function") or {}
        out.append(("u", call_id, function.get("name"), canonical_arguments(function.get("arguments"))))
    if not with_unmodeled and unknown and not any(p[0] != "x" for p in out):
        out = [("t", placeholder(unknown))]
    return role, out


def projection(message: dict[str, Any]) -> list[Any]:
    """The message as ctxd models it (role, text, tool calls, tool results): equal
    projections mean ctxd renders the message as the client sent it."""
    role, out = parts(message, with_unmodeled=False)
    return [role, out]


def chain_part(message: dict[str, Any]) -> list[Any] | None:
    """The projection plus the type of each part ctxd does not keep: what the proxy's hash
    chain is built from; None for a message with nothing in it."""
    role, out = parts(message, with_unmodeled=True)
    return [role, out] if out else None


def to_ctxd(message: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None, position: int = 0,
            api: Api = "openai") -> dict[str, Any] | None:
    """The ctxd Message (JSON) for one chat message; None when it holds nothing ctxd can
    store. Parts ctxd does not keep (images, audio, files) are named in
    ``metadata.ctxdProxyUnkept``; a message made only of them becomes a placeholder text.
    For Ollama (``api="ollama"``), whose calls have no ids, a call's id is made from the
    message's ``position`` (``ollama-<position>-<n>``, remembered in ``call_ids``) and a
    ``tool`` message answers the oldest unanswered call of the newest assistant message.
    ``api``: as for :func:`parts`."""
    ollama = api == "ollama"
    role = message.get("role")
    if role == "developer":
        role = "system"
    if role not in ROLES:
        return None
    out: dict[str, Any] = {"role": role}
    text, unknown = content_text(message.get("content"))
    if ollama and message.get("images"):
        unknown.append("image")
    if ollama and isinstance(message.get("thinking"), str) and message["thinking"] and role == "assistant":
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": message["thinking"]}]
        if text:
            blocks.append({"type": "text", "text": text})
        out["content"] = blocks
    elif text:
        out["content"] = text
    calls: list[dict[str, Any]] = []
    for n, call in enumerate(message.get("tool_calls") or ()):
        if not isinstance(call, dict):
            continue
        call_id = call.get("id") if api == "openai" else f"ollama-{position}-{n}"
        if call.get("type") == "custom" and api == "openai":
            custom = call.get("custom") or {}
            calls.append({"id": str(call_id), "type": "custom",
                          "custom": {"name": str(custom.get("name")), "input": text_of(custom.get("input"))}})
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        calls.append({"id": str(call_id), "type": "function",
                      "function": {"name": str(function.get("name")),
                                   "arguments": arguments if isinstance(arguments, str)
                                   else canonical_json(arguments or {})}})
    if calls and role == "assistant":
        out["toolCalls"] = calls
        if call_ids is not None:
            call_ids[position] = [c["id"] for c in calls]
    if role == "tool":
        out["toolCallId"] = str(message.get("tool_call_id")) if api == "openai" else _answer_ollama(call_ids or {})
        out.setdefault("content", text)
    elif "content" not in out and "toolCalls" not in out:
        if not unknown:
            return None
        out["content"] = placeholder(unknown)
    if api == "openai" and isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if unknown:
        out["metadata"] = {"ctxdProxyUnkept": sorted(set(unknown))}
    return out


def _answer_ollama(call_ids: dict[int, list[str]]) -> str:
    """The id of the call an Ollama ``tool`` message answers: the newest assistant
    message's calls, in order (consumed as answered)."""
    if not call_ids:
        return "ollama-unknown"
    newest = max(call_ids)
    pending = call_ids[newest]
    if not pending:
        return f"ollama-{newest}-done"
    return pending.pop(0)


def ids_of(message: Any) -> list[Ref]:
    """The provider ids a raw chat message carries: its tool calls' ``id`` (``call``) and,
    for a ``tool`` message, the ``tool_call_id`` it answers (``result``)."""
    if not isinstance(message, dict):
        return []
    out: list[Ref] = []
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("id"), str) and call["id"]:
            out.append(("call", call["id"]))
    answered = message.get("tool_call_id")
    if isinstance(answered, str) and answered:
        out.append(("result", answered))
    return out


def reply_message(message: dict[str, Any]) -> dict[str, Any]:
    """A reply's ``choices[0].message`` as the client sends it back in its next request."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def system_text(leading: list[dict[str, Any]]) -> str:
    """The text of a request's leading ``system``/``developer`` messages."""
    texts = []
    for message in leading:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append("\n".join(p.get("text", "") for p in content if isinstance(p, dict)))
    return "\n\n".join(t for t in texts if t)


# --- rendering ctxd's turns -----------------------------------------------------------------


def _call(c: Call) -> OpenAIToolCall:
    if c.custom:
        return OpenAIToolCall(id=c.id, type="custom", custom=OpenAICustom(name=c.name, input=c.arguments))
    return OpenAIToolCall(id=c.id, function=OpenAIFunction(name=c.name, arguments=c.arguments))


def emit(turns: Iterable[Turn]) -> list[OpenAIMessage]:
    """Turns as Chat Completions messages: each result a ``tool`` message (before the
    turn's text, where a user message carried results), an assistant's calls in
    ``tool_calls`` (an assistant turn with neither text nor calls is left out)."""
    out: list[OpenAIMessage] = []
    for turn in turns:
        for r in turn.results:
            out.append(OpenAIMessage(role="tool", content=r.text, tool_call_id=r.id))
        if turn.role == "assistant":
            if not turn.texts and not turn.calls:
                continue
            calls = [_call(c) for c in turn.calls] or None
            out.append(OpenAIMessage(role="assistant", content=join(turn.texts) if turn.texts else None,
                                     name=turn.name, tool_calls=calls))
        elif turn.texts and turn.role != "results":
            out.append(OpenAIMessage(role=turn.role, content=join(turn.texts), name=turn.name))
    return out


def is_plain(m: Message) -> bool:
    """Whether a Chat Completions message holds all of ``m`` (:func:`plain_line`), read back
    equal by :func:`to_message`: not an empty ``tool_calls`` (read as none) nor a call
    without an id (which it refuses to guess at), both of which a push accepts."""
    return (isinstance(m.content, str) or m.content is None) and m.usage is None and m.metadata is None \
        and m.timestamp is None and (m.tool_calls is None or (bool(m.tool_calls) and all(c.id for c in m.tool_calls)))


def plain_line(m: Message) -> dict[str, Any]:
    """A plain message (:func:`is_plain`) as the Chat Completions message that holds all of
    it, field for field (:func:`to_message` reads it back equal)."""
    line: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        line["name"] = m.name
    if m.tool_calls is not None:
        line["tool_calls"] = [{"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.text}}
                              if c.type == "custom" else
                              {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.text}}
                              for c in m.tool_calls]
    if m.tool_call_id is not None:
        line["tool_call_id"] = m.tool_call_id
    return line


def export_lines(m: Message) -> list[dict[str, Any]]:
    """A stored message as the Chat Completions message(s) a provider accepts: itself
    when plain (:func:`plain_line`), else as ctxd's prompt renders it (:func:`emit`):
    Anthropic-style results as ``tool`` messages, ``tool_use`` blocks as ``tool_calls``,
    thinking left out; never no line."""
    if is_plain(m):
        return [plain_line(m)]
    lines = [msgspec.to_builtins(x) for x in emit([turn_of(m)])]
    return lines or [{"role": m.role, "content": None if m.role == "assistant" else ""}]


# --- read leniently into a Message (importers, JSONL import) ---------------------------------

CONSUMED = frozenset({"role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content",
                      "thinking_blocks", "timestamp"})
"""Keys of a chat message that :func:`to_message` reads itself."""

NOISE = frozenset({"function_call", "provider_specific_fields", "audio", "annotations"})
"""Keys dropped as noise: streaming indexes, nulls litellm always writes, duplicates."""


def tool_calls(raw: Any, where: str, warn: Warn, index: int = 0) -> list[ToolCall] | None:
    """``tool_calls``; ``arguments`` kept verbatim (JSON-encoded if not a string). A call
    without an id gets ``call_<index>_<n>`` (``index``: the message's place)."""
    if not raw:
        return None
    if not isinstance(raw, list):
        warn(f"{where}: tool_calls is not a list, ignored")
        return None
    calls: list[ToolCall] = []
    for number, call in enumerate(raw):
        if not isinstance(call, dict):
            warn(f"{where}: tool call {number} is not an object, ignored")
            continue
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{index}_{number}"
            warn(f"{where}: tool call {number} has no id, using {call_id!r}")
        if call.get("type") == "custom":  # a freeform call: its text as written
            custom = call.get("custom")
            custom = custom if isinstance(custom, dict) else {}
            calls.append(ToolCall(id=call_id, type="custom", custom=CustomCall(name=text_of(custom.get("name")),
                                                                               input=text_of(custom.get("input")))))
            continue
        function = call.get("function") or {}
        if not isinstance(function, dict):
            function = {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = text_of(arguments)
        calls.append(ToolCall(id=call_id, function=FunctionCall(name=text_of(function.get("name")),
                                                                arguments=arguments)))
    return calls or None


def to_message(raw: Any, where: str, warn: Warn, *, index: int = 0, ignore: Iterable[str] = (),
               role_map: dict[str, str] | None = None) -> Message | None:
    """One chat message as a :class:`Message`, leniently (what changed goes to ``warn``;
    None, with a warning, for what is no message).

    Roles outside system/user/assistant/tool are mapped through ``role_map`` (``developer``
    -> system and ``function`` -> tool by default) with ``metadata.originalRole``; other
    unknown roles become ``user`` with a warning. ``reasoning_content`` /
    ``thinking_blocks`` become leading :class:`ThinkingBlock` s. Any other non-null key
    goes to metadata under its own name, unless listed in ``ignore``. ``index``: the
    message's place, for ids made for calls that have none.
    """
    if not isinstance(raw, dict):
        warn(f"{where}: skipped, not a JSON object")
        return None
    meta: dict[str, Any] = {}
    role = raw.get("role")
    if not isinstance(role, str):
        warn(f"{where}: skipped, no role")
        return None
    mapping = {"developer": "system", "function": "tool"}
    if role_map:
        mapping.update(role_map)
    if role not in ROLES:
        meta["originalRole"] = role
        if role in mapping:
            role = mapping[role]
        else:
            warn(f"{where}: unknown role {role!r} imported as user")
            role = "user"
    content = content_blocks(raw.get("content"), where, warn, meta)
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
    skip = CONSUMED | NOISE | set(ignore)
    for key, value in raw.items():
        if key not in skip and value is not None:
            meta[key] = value
    if raw.get("function_call"):
        meta["function_call"] = raw["function_call"]
    timestamp = raw.get("timestamp")
    if not isinstance(timestamp, str):
        timestamp = epoch_to_iso(timestamp)
    return Message(
        role=cast(Role, role),
        content=content,
        name=name if isinstance(name, str) else None,
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
        tool_calls=tool_calls(raw.get("tool_calls"), where, warn, index),
        metadata=meta or None,
        timestamp=timestamp,
    )
