"""Client messages in each API's shape -> what ctxd stores, and the projection that says
whether two messages are the same.

Three things are computed from one raw (JSON-decoded) client message:

* :func:`to_ctxd`: the ctxd Message (as a JSON dict) the proxy pushes. Blocks ctxd does
  not model (images, documents, ``server_tool_use``, ``redacted_thinking``, anything
  new) are left out of it; a message made only of such blocks becomes a text placeholder
  naming their types (:func:`placeholder`).
* :func:`projection`: the message as ctxd models it (role, text, tool calls, tool results;
  thinking and ``cache_control`` left out): equal projections mean ctxd renders the
  message as the client sent it, so the client's own bytes may be sent instead.
* :func:`chain_part`: the projection plus the type (and id) of each unmodelled block: what
  a session's hash chain is built from (docs/proxy.md, "Which messages are new").
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import msgspec

Api = Literal["openai", "anthropic", "ollama", "responses"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def loads(raw: bytes) -> Any:
    """A request or reply body: msgspec decodes a long conversation in ~60% of json's
    time; what it refuses and Python's json accepts (``NaN``, lone surrogates) goes to json."""
    try:
        return _decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def dumps(value: Any) -> bytes:
    """The body sent upstream: msgspec encodes a long conversation ~7x faster than
    json.dumps (compact, UTF-8); json for what msgspec cannot encode (lone surrogates).
    The same encoder every time, so an unchanged prefix stays the same bytes (prompt
    caching)."""
    try:
        return _encode(value)
    except (msgspec.EncodeError, TypeError, UnicodeEncodeError, OverflowError):
        return json.dumps(value).encode()

MODELED_ANTHROPIC = frozenset({"text", "tool_use", "tool_result", "thinking"})


# Responses API input items ctxd leaves out entirely (never pushed, never in the chain): a
# model's reasoning, which clients resend only some of the time (``store: false`` with
# encrypted content) and which ctxd could not render back.
RESPONSES_SKIPPED = frozenset({"reasoning"})


def responses_item_as_chat(item: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Responses API input (or output) item as the Chat Completions message it
    stands for, so one reading serves both: a message item keeps its role and its text
    parts (``input_text``/``output_text`` read as text), ``function_call`` is an assistant
    tool call, ``function_call_output`` a tool message; any other item type is a message
    made of one block ctxd does not model (placeholder, chain entry by type)."""
    kind = item.get("type")
    if kind in (None, "message") and "role" in item:
        content = item.get("content")
        if isinstance(content, list):
            content = [dict(part, type="text") if isinstance(part, dict)
                       and part.get("type") in ("input_text", "output_text") else part for part in content]
        return {"role": item.get("role"), "content": content}
    if kind == "function_call":
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": item.get("call_id"), "type": "function",
                                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]}
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = [dict(part, type="text") if isinstance(part, dict) and part.get("type") == "input_text"
                      else part for part in output]
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
    return {"role": "assistant", "content": [{"type": str(kind)}]}


def _as_chat(api: Api, message: dict[str, Any]) -> tuple[Api, dict[str, Any] | None]:
    if api != "responses":
        return api, message
    if message.get("type") in RESPONSES_SKIPPED:
        return "openai", None
    return "openai", responses_item_as_chat(message)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments whatever their spelling (OpenAI's JSON text, an object)."""
    if isinstance(arguments, str):
        try:
            return canonical_json(json.loads(arguments)) if arguments.strip() else "{}"
        except ValueError:
            return arguments
    return canonical_json(arguments if arguments is not None else {})


def chain_hash(previous: str, part: Any) -> str:
    return hashlib.sha256((previous + "\n" + canonical_json(part)).encode()).hexdigest()[:20]


def placeholder(types: list[str]) -> str:
    return "[" + ", ".join(sorted(set(types))) + " not kept by ctxd]"


def _text_of(content: Any) -> tuple[str, list[str]]:
    """Text of a string or a list of parts, and the types of the parts that are not text."""
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


# --- the projection --------------------------------------------------------------------


def _parts(api: Api, message: dict[str, Any], *, with_unmodeled: bool) -> tuple[str, list[Any]]:
    """(role, parts) as ctxd models them; ``with_unmodeled`` adds ("x", type, id) entries."""
    role = str(message.get("role"))
    if role == "developer":
        role = "system"
    parts: list[Any] = []
    unknown: list[str] = []
    content = message.get("content")
    if api == "anthropic" and isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                if isinstance(block.get("text"), str) and block["text"].strip():
                    parts.append(("t", block["text"].strip()))
            elif kind == "tool_use":
                parts.append(("u", block.get("id"), block.get("name"), canonical_arguments(block.get("input"))))
            elif kind == "tool_result":
                text, other = _text_of(block.get("content"))
                unknown += other
                parts.append(("r", block.get("tool_use_id"), text.strip(), bool(block.get("is_error"))))
            elif kind == "thinking":
                continue
            else:
                unknown.append(str(kind))
                if with_unmodeled:
                    parts.append(("x", kind, block.get("id") or block.get("tool_use_id")))
    else:
        text, other = _text_of(content)
        unknown += other
        if with_unmodeled:
            parts += [("x", t, None) for t in other]
        if role == "tool":
            call = message.get("tool_call_id") or message.get("tool_name") or message.get("name")
            parts.append(("r", call if api == "openai" else None, text.strip(), False))
        elif text.strip():
            parts.append(("t", text.strip()))
        if api == "ollama" and message.get("images"):
            unknown.append("image")
            if with_unmodeled:
                parts.append(("x", "images", len(message["images"])))
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            parts.append(("u", call.get("id") if api == "openai" else None, function.get("name"),
                          canonical_arguments(function.get("arguments"))))
    if not with_unmodeled and unknown and not any(p[0] != "x" for p in parts):
        parts = [("t", placeholder(unknown))]
    return role, parts


def projection(api: Api, message: dict[str, Any]) -> list[Any]:
    api, chat = _as_chat(api, message)
    if chat is None:
        return ["skipped", [message.get("type")]]
    role, parts = _parts(api, chat, with_unmodeled=False)
    return [role, parts]


def chain_part(api: Api, message: dict[str, Any]) -> list[Any] | None:
    """What the chain hashes for this message; None for a message with nothing in it
    (never pushed, never part of the chain)."""
    api, chat = _as_chat(api, message)
    if chat is None:
        return None
    role, parts = _parts(api, chat, with_unmodeled=True)
    if not parts:
        return None
    return [role, parts]


# --- to ctxd's Message -------------------------------------------------------------------


def to_ctxd(api: Api, message: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None,
            position: int = 0) -> dict[str, Any] | None:
    """The ctxd Message (JSON) for one client message; None when it holds nothing ctxd can
    store. ``call_ids``/``position``: Ollama's tool calls have no ids, so the proxy makes
    them from the message's position in the conversation (``ollama-<position>-<n>``), and
    a ``tool`` message answers the oldest unanswered call (of its ``tool_name``)."""
    api, chat = _as_chat(api, message)
    if chat is None:
        return None
    message = chat
    role = message.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        return None
    out: dict[str, Any] = {"role": role}
    unknown: list[str] = []
    content = message.get("content")
    if api == "anthropic" and isinstance(content, list):
        blocks: list[dict[str, Any]] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                if isinstance(block.get("text"), str) and block["text"]:
                    blocks.append({"type": "text", "text": block["text"]})
            elif kind == "tool_use":
                blocks.append({"type": "tool_use", "id": str(block.get("id")), "name": str(block.get("name")),
                               "input": block.get("input") if isinstance(block.get("input"), dict) else {}})
            elif kind == "tool_result":
                text, other = _text_of(block.get("content"))
                unknown += other
                result: dict[str, Any] = {"type": "tool_result", "toolUseId": str(block.get("tool_use_id")),
                                          "content": text}
                if block.get("is_error"):
                    result["isError"] = True
                blocks.append(result)
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking: dict[str, Any] = {"type": "thinking", "thinking": block["thinking"]}
                if isinstance(block.get("signature"), str):
                    thinking["signature"] = block["signature"]
                blocks.append(thinking)
            else:
                unknown.append(str(kind))
        if not blocks and unknown:
            blocks = [{"type": "text", "text": placeholder(unknown)}]
        if not blocks:
            return None
        out["content"] = blocks
    else:
        text, other = _text_of(content)
        unknown += other
        if api == "ollama" and message.get("images"):
            unknown.append("image")
        if api == "ollama" and isinstance(message.get("thinking"), str) and message["thinking"] and role == "assistant":
            blocks = [{"type": "thinking", "thinking": message["thinking"]}]
            if text:
                blocks.append({"type": "text", "text": text})
            out["content"] = blocks
        elif text:
            out["content"] = text
        calls = []
        for n, call in enumerate(message.get("tool_calls") or ()):
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            arguments = function.get("arguments")
            call_id = call.get("id") if api == "openai" else f"ollama-{position}-{n}"
            calls.append({"id": str(call_id), "type": "function",
                          "function": {"name": str(function.get("name")),
                                       "arguments": arguments if isinstance(arguments, str)
                                       else canonical_json(arguments or {})}})
        if calls and role == "assistant":
            out["toolCalls"] = calls
            if call_ids is not None:
                call_ids[position] = [c["id"] for c in calls]
        if role == "tool":
            if api == "openai":
                out["toolCallId"] = str(message.get("tool_call_id"))
            else:
                out["toolCallId"] = _answer_ollama(message, call_ids or {})
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


def _answer_ollama(message: dict[str, Any], call_ids: dict[int, list[str]]) -> str:
    """The id of the call an Ollama ``tool`` message answers: the newest assistant
    message's calls, in order (consumed as answered)."""
    if not call_ids:
        return "ollama-unknown"
    newest = max(call_ids)
    pending = call_ids[newest]
    if not pending:
        return f"ollama-{newest}-done"
    return pending.pop(0)
