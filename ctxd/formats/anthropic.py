"""Anthropic Messages: content blocks (``text``, ``tool_use``, ``tool_result``,
``thinking``, and the ones ctxd does not model), ``system`` beside the messages, roles
that alternate, usage with cache counts beside ``input_tokens``, and prompt-cache
breakpoints (``cache_control``, at most four a request).

**Where an Anthropic request is built**: the engine's renderer writes ctxd's turns as
messages (:func:`emit`, :func:`join_messages`, :func:`finish`) and ``context/prompt``
places breakpoints on them (:func:`cache_breakpoints`); ``ctxd proxy`` merges ctxd's
system text into the client's (:func:`merge_system`) and places breakpoints around the
client's own (:func:`place_breakpoints`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from ctxd.formats import openai
from ctxd.formats.common import (
    Ref,
    Turn,
    UsageField,
    canonical_arguments,
    content_text,
    placeholder,
    read_usage,
)
from ctxd.protocol.providers import (
    AnthropicMessage,
    AnthropicText,
    AnthropicThinking,
    AnthropicToolResult,
    AnthropicToolUse,
    CacheControl,
)
from ctxd.tokens import MESSAGE_OVERHEAD

USAGE: tuple[UsageField, ...] = (
    ("input_tokens", None, "inputTokens"),
    ("output_tokens", None, "outputTokens"),
    ("cache_read_input_tokens", None, "cacheReadTokens"),
    ("cache_creation_input_tokens", None, "cacheWriteTokens"),
)
"""Usage fields. The cache counts are not part of ``input_tokens`` (ctxd's meaning)."""

NATIVE_BLOCK = {"tool_use_id": "toolUseId", "is_error": "isError"}
"""Block fields a client may push in Anthropic's spelling (renamed to ctxd's)."""

UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})
"""Blocks that cannot carry a cache breakpoint."""

OPENER = "(continuing the conversation)"
"""The user turn put first when a prompt would open with the assistant."""


def usage(raw: Any) -> dict[str, int]:
    """An Anthropic ``usage`` object as ctxd's Usage (JSON)."""
    return read_usage(raw, USAGE)


# --- the proxy's reading: raw client messages as dicts --------------------------------------


def parts(message: dict[str, Any], *, with_unmodeled: bool) -> tuple[str, list[Any]]:
    """(role, parts) as ctxd models the message (see ``openai.parts``); thinking and
    ``cache_control`` are left out."""
    content = message.get("content")
    if not isinstance(content, list):
        return openai.parts(message, with_unmodeled=with_unmodeled, api="anthropic")
    role = str(message.get("role"))
    if role == "developer":
        role = "system"
    out: list[Any] = []
    unknown: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            if isinstance(block.get("text"), str) and block["text"].strip():
                out.append(("t", block["text"].strip()))
        elif kind == "tool_use":
            out.append(("u", block.get("id"), block.get("name"), canonical_arguments(block.get("input"))))
        elif kind == "tool_result":
            text, other = content_text(block.get("content"))
            unknown += other
            out.append(("r", block.get("tool_use_id"), text.strip(), bool(block.get("is_error"))))
        elif kind == "thinking":
            continue
        else:
            unknown.append(str(kind))
            if with_unmodeled:
                out.append(("x", kind, block.get("id") or block.get("tool_use_id")))
    if not with_unmodeled and unknown and not any(p[0] != "x" for p in out):
        out = [("t", placeholder(unknown))]
    return role, out


def projection(message: dict[str, Any]) -> list[Any]:
    """See ``openai.projection``."""
    role, out = parts(message, with_unmodeled=False)
    return [role, out]


def chain_part(message: dict[str, Any]) -> list[Any] | None:
    """See ``openai.chain_part``."""
    role, out = parts(message, with_unmodeled=True)
    return [role, out] if out else None


def to_ctxd(message: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None,
            position: int = 0) -> dict[str, Any] | None:
    """The ctxd Message (JSON) for one Anthropic message (see ``openai.to_ctxd``): text,
    ``tool_use``, ``tool_result`` (its text) and ``thinking`` (with its signature) kept as
    blocks; other blocks named in ``metadata.ctxdProxyUnkept``."""
    content = message.get("content")
    if not isinstance(content, list):
        return openai.to_ctxd(message, call_ids=call_ids, position=position, api="anthropic")
    role = message.get("role")
    if role == "developer":
        role = "system"
    if role not in openai.ROLES:
        return None
    out: dict[str, Any] = {"role": role}
    unknown: list[str] = []
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
            text, other = content_text(block.get("content"))
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
    if unknown:
        out["metadata"] = {"ctxdProxyUnkept": sorted(set(unknown))}
    return out


def ids_of(message: Any) -> list[Ref]:
    """The provider ids a raw Anthropic message carries: the ``id`` of each tool use it
    makes (``tool_use``, and the server's and MCP's: ``call``) and the ``tool_use_id``
    each result answers (``result``)."""
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    out: list[Ref] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if isinstance(kind, str) and kind.endswith("tool_use") and isinstance(block.get("id"), str):
            out.append(("call", block["id"]))
        elif isinstance(block.get("tool_use_id"), str):
            out.append(("result", block["tool_use_id"]))
    return out


def system_text(system: Any) -> str:
    """The text of a request's ``system`` (a string, or text blocks joined by blank lines)."""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(b.get("text", "") for b in system if isinstance(b, dict) and b.get("text"))
    return ""


# --- the proxy's request -----------------------------------------------------------------------

EPHEMERAL = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4


def merge_system(text: str, client_text: str, client_raw: Any) -> tuple[Any, bool]:
    """The ``system`` to send for ctxd's system ``text`` (None: none) when the client sent
    ``client_raw`` (its text ``client_text``), and whether ctxd placed a breakpoint in it:
    the client's own when the text is the client's; ctxd's addition (checkpoints, goal) as
    a block of its own after the client's, with a breakpoint, when the text extends it;
    else one block of ctxd's text, with a breakpoint."""
    if text == client_text:
        return client_raw, False
    if client_text and text.startswith(client_text + "\n\n"):
        blocks = [dict(b) for b in client_raw] if isinstance(client_raw, list) else \
            [{"type": "text", "text": client_raw}]
        blocks.append({"type": "text", "text": text[len(client_text) + 2:], "cache_control": dict(EPHEMERAL)})
        return blocks, True
    if text:
        return [{"type": "text", "text": text, "cache_control": dict(EPHEMERAL)}], True
    return None, False


def count_breakpoints(value: Any) -> int:
    """The ``cache_control`` breakpoints anywhere in a JSON value."""
    if isinstance(value, dict):
        return int("cache_control" in value and value["cache_control"] is not None) + \
            sum(count_breakpoints(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(count_breakpoints(v) for v in value)
    return 0


def place_breakpoints(body: dict[str, Any], messages: list[Any], *, ctxd_system_breakpoint: bool,
                      in_messages: int | None = None) -> list[Any]:
    """Prompt-cache breakpoints (docs/proxy.md): the client's stay where they are; ctxd adds
    one on the last block of the last message when no message carries one, and its system
    addition carries one; over Anthropic's limit of 4, ctxd's own go first, then the
    client's on the oldest messages. ``in_messages``: how many ``messages`` carry, when
    known (the proxy counts the client's incrementally). Changes ``body["system"]`` in
    place; returns the messages (copies where changed)."""
    if in_messages is None:
        in_messages = count_breakpoints(messages)
    used = count_breakpoints(body.get("tools")) + count_breakpoints(body.get("system")) + in_messages
    if messages and in_messages == 0 and used < MAX_BREAKPOINTS:
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str) and content:
            content = [{"type": "text", "text": content}]
        if isinstance(content, list):
            content = list(content)
            for index in range(len(content) - 1, -1, -1):
                block = content[index]
                if isinstance(block, dict) and block.get("type") not in UNCACHEABLE:
                    content[index] = dict(block, cache_control=dict(EPHEMERAL))
                    messages = messages[:-1] + [dict(last, content=content)]
                    used += 1
                    break
    if used > MAX_BREAKPOINTS and ctxd_system_breakpoint and isinstance(body.get("system"), list):
        body["system"][-1].pop("cache_control", None)
        used -= 1
    index = 0
    while used > MAX_BREAKPOINTS and index < len(messages):
        message = messages[index]
        content = message.get("content")
        if isinstance(content, list) and count_breakpoints(content):
            stripped = []
            for block in content:
                if used > MAX_BREAKPOINTS and isinstance(block, dict) and "cache_control" in block:
                    block = {k: v for k, v in block.items() if k != "cache_control"}
                    used -= 1
                stripped.append(block)
            messages = messages[:index] + [dict(message, content=stripped)] + messages[index + 1:]
        index += 1
    return messages


# --- rendering ctxd's turns -----------------------------------------------------------------


def _leading_thinking(blocks: list[Any]) -> int:
    n = 0
    while n < len(blocks) and isinstance(blocks[n], AnthropicThinking):
        n += 1
    return n


def _merged(first: list[Any], second: list[Any]) -> list[Any]:
    """Two assistant messages' blocks as one message's: the thinking of both first (where
    Anthropic requires it), then the rest of each, in order."""
    a, b = _leading_thinking(first), _leading_thinking(second)
    if not b:
        return first + second
    return first[:a] + second[:b] + first[a:] + second[b:]


def emit(turns: Iterable[Turn], system_parts: list[str]) -> list[AnthropicMessage]:
    """Turns as Anthropic messages. Roles alternate (consecutive turns of one role merge,
    an assistant message's signed thinking staying first: with extended thinking on,
    Anthropic refuses a tool-use loop whose last assistant message does not start with its
    thinking); system turns join ``system_parts``; tool results open the user message that
    follows their calls; whitespace-only text is left out (Anthropic rejects it). Never
    changes a message it did not create."""
    out: list[AnthropicMessage] = []

    def add(role: Literal["user", "assistant"], blocks: list[Any]) -> None:
        if not blocks:
            return
        if out and out[-1].role == role:
            if isinstance(blocks[0], AnthropicThinking):
                out[-1].content[:] = _merged(out[-1].content, blocks)
            else:
                out[-1].content.extend(blocks)
        else:
            out.append(AnthropicMessage(role=role, content=blocks))

    for turn in turns:
        if turn.role == "system":
            system_parts.extend(turn.texts)
        elif turn.role == "results":
            add("user", [AnthropicToolResult(tool_use_id=r.id, content=r.text, is_error=r.is_error)
                         for r in turn.results])
        elif turn.role == "assistant":
            blocks: list[Any] = [AnthropicText(text=t) for t in turn.texts if t.strip()]
            blocks += [AnthropicToolUse(id=c.id, name=c.name, input=c.input) for c in turn.calls]
            if blocks and turn.thinking:
                # (Thinking alone, with nothing it led to, is not sent.)
                blocks = [*(AnthropicThinking(thinking=t.thinking, signature=t.signature or "")
                            for t in turn.thinking), *blocks]
            add("assistant", blocks)
        else:
            add("user", [AnthropicText(text=t) for t in turn.texts if t.strip()])
    return out


def join_messages(head: list[AnthropicMessage], tail: list[AnthropicMessage]) -> list[AnthropicMessage]:
    """``head + tail``, the boundary's two messages merged into a new one when they share a role."""
    if head and tail and head[-1].role == tail[0].role:
        merged = AnthropicMessage(role=head[-1].role, content=_merged(head[-1].content, tail[0].content))
        return head[:-1] + [merged] + tail[1:]
    return head + tail


def finish(out: list[AnthropicMessage], count: Callable[[str], int]) -> tuple[list[AnthropicMessage], int, list[str]]:
    """A user turn first; a final assistant turn (a prefill) without thinking (Anthropic
    continues text, never thinking) and without trailing whitespace. Works on copies of
    what it changes (``out``'s messages may be cached). Also the tokens this adds (the
    opening turn) less the thinking it leaves out, and what was repaired."""
    extra = 0
    repairs: list[str] = []
    if out and out[0].role == "assistant":
        out = [AnthropicMessage(role="user", content=[AnthropicText(text=OPENER)])] + out
        extra += MESSAGE_OVERHEAD + count(OPENER)
        repairs.append("opened with a user turn")
    if out and out[-1].role == "assistant":
        # A final assistant turn is a prefill, and Anthropic rejects trailing whitespace in it.
        content = out[-1].content
        lead = _leading_thinking(content)
        last = content[-1]
        if lead or isinstance(last, AnthropicText):
            extra -= sum(count(b.thinking) for b in content[:lead] if isinstance(b, AnthropicThinking))
            content = content[lead:]
            if isinstance(last, AnthropicText):
                stripped = last.text.rstrip()
                content = content[:-1] + ([AnthropicText(text=stripped, cache_control=last.cache_control)]
                                          if stripped else [])
            out = out[:-1] + ([AnthropicMessage(role="assistant", content=content)] if content else [])
    return out, extra, repairs


_EPHEMERAL = CacheControl()


def cache_breakpoints(system: str | None, messages: list[AnthropicMessage], head: str | None = None
                      ) -> tuple[list[AnthropicText] | None, list[AnthropicMessage]]:
    """Breakpoints for ``context/prompt`` (``cacheControl``): on the system part and the
    last message (its last block that can carry one), leaving ``messages`` itself untouched
    (it may be cached). Between compressions the prompt only grows at its end, so each
    request reads the previous one's prefix from the provider's cache. With ``head`` (the
    client's own system text, which opens ``system``) the system part is two blocks,
    each a breakpoint: a compression changes ctxd's checkpoints, not the client's part,
    so that part (and the tool definitions before it) stays cached across passes."""
    blocks: list[AnthropicText] | None = None
    if system:
        rest = system[len(head) + 2:] if head and system.startswith(head + "\n\n") else None
        if head and rest:
            blocks = [AnthropicText(text=head, cache_control=_EPHEMERAL),
                      AnthropicText(text=rest, cache_control=_EPHEMERAL)]
        else:
            blocks = [AnthropicText(text=system, cache_control=_EPHEMERAL)]
    if not messages:
        return blocks, messages
    last = messages[-1]
    content = list(last.content)
    for index in range(len(content) - 1, -1, -1):
        block = content[index]
        if not isinstance(block, AnthropicThinking):
            content[index] = msgspec.structs.replace(block, cache_control=_EPHEMERAL)
            return blocks, messages[:-1] + [AnthropicMessage(role=last.role, content=content)]
    return blocks, messages
