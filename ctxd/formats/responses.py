"""OpenAI Responses API: a conversation of typed input items (``message`` with
``input_text``/``output_text`` parts, ``function_call``, ``function_call_output``,
``custom_tool_call``, ``custom_tool_call_output``, ``reasoning``, ...), ``instructions``
beside them, and its usage object.

An item is read as the Chat Completions message it stands for (:func:`as_chat`), so one
reading (``openai.py``) serves both; ctxd's prompt, rendered in the Chat Completions
shape, is written back as items by :func:`items_of_prompt`.
"""

from __future__ import annotations

from typing import Any

from ctxd.formats import openai
from ctxd.formats.common import Ref, UsageField, parts_text, read_usage

USAGE: tuple[UsageField, ...] = (
    ("input_tokens", None, "inputTokens"),
    ("output_tokens", None, "outputTokens"),
    ("total_tokens", None, "totalTokens"),
    ("output_tokens_details", "reasoning_tokens", "reasoningTokens"),
    ("input_tokens_details", "cached_tokens", "cachedInputTokens"),
)
"""Usage fields. ``input_tokens`` includes ``input_tokens_details.cached_tokens``
(``cachedInputTokens``)."""

SKIPPED = frozenset({"reasoning"})
"""Items ctxd leaves out entirely (never pushed, never in the chain): a model's reasoning,
which clients resend only some of the time (``store: false`` with encrypted content) and
which ctxd could not render back."""


def usage(raw: Any) -> dict[str, int]:
    """A Responses API ``usage`` object as ctxd's Usage (JSON)."""
    return read_usage(raw, USAGE)


def as_chat(item: dict[str, Any]) -> dict[str, Any]:
    """An input (or output) item as the Chat Completions message it stands for: a message
    item keeps its role and its text parts (``input_text``/``output_text`` read as text),
    ``function_call`` is an assistant tool call and ``custom_tool_call`` a freeform one
    (``type: "custom"``, as Chat Completions spells it), ``function_call_output`` and
    ``custom_tool_call_output`` a tool message; any other item type is a message made of
    one block ctxd does not model (placeholder, chain entry by type)."""
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
    if kind == "custom_tool_call":
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": item.get("call_id"), "type": "custom",
                                "custom": {"name": item.get("name"), "input": item.get("input")}}]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        if isinstance(output, list):
            output = [dict(part, type="text") if isinstance(part, dict) and part.get("type") == "input_text"
                      else part for part in output]
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
    return {"role": "assistant", "content": [{"type": str(kind)}]}


def is_skipped(item: dict[str, Any]) -> bool:
    return item.get("type") in SKIPPED


def projection(item: dict[str, Any]) -> list[Any]:
    """See ``openai.projection``; a skipped item projects to its type."""
    if is_skipped(item):
        return ["skipped", [item.get("type")]]
    return openai.projection(as_chat(item))


def chain_part(item: dict[str, Any]) -> list[Any] | None:
    """See ``openai.chain_part``; None for a skipped item."""
    if is_skipped(item):
        return None
    return openai.chain_part(as_chat(item))


def to_ctxd(item: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None,
            position: int = 0) -> dict[str, Any] | None:
    """See ``openai.to_ctxd``; None for a skipped item."""
    if is_skipped(item):
        return None
    return openai.to_ctxd(as_chat(item), call_ids=call_ids, position=position)


def ids_of(item: Any) -> list[Ref]:
    """The provider ids an item carries: its own ``id`` (``item``), and the ``call_id`` of
    the call it makes (``call``: ``function_call`` and the other ``*_call`` items) or
    answers (``result``: ``*_call_output``)."""
    if not isinstance(item, dict):
        return []
    out: list[Ref] = []
    if isinstance(item.get("id"), str) and item["id"]:
        out.append(("item", item["id"]))
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id:
        kind = item.get("type")
        out.append(("result" if isinstance(kind, str) and kind.endswith("_output") else "call", call_id))
    return out


def leading_system(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input's leading ``system``/``developer`` message items."""
    leading: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") in (None, "message") and item.get("role") in ("system", "developer"):
            leading.append(item)
        else:
            break
    return leading


def system_text(instructions: Any, leading: list[dict[str, Any]]) -> str:
    """A request's system text: ``instructions`` followed by its leading system items."""
    texts = [instructions] if isinstance(instructions, str) else []
    for item in leading:
        content = as_chat(item).get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append("\n".join(p.get("text", "") for p in content if isinstance(p, dict)))
    return "\n\n".join(t for t in texts if t)


def items_of(message: dict[str, Any], custom: set[str] | None = None) -> list[dict[str, Any]]:
    """One message of ctxd's prompt in the Chat Completions shape as input items: a
    freeform call as ``custom_tool_call``, and a result as ``custom_tool_call_output`` when
    it answers one of the ``custom`` call ids (the API pairs each output with a call of its
    kind). Use :func:`items_of_prompt` for a whole prompt."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        kind = "custom_tool_call_output" if custom is not None and call_id in custom else "function_call_output"
        return [{"type": kind, "call_id": call_id, "output": parts_text(message.get("content"))}]
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, list):
        kind = "output_text" if role == "assistant" else "input_text"
        content = [dict(p, type=kind) if isinstance(p, dict) and p.get("type") == "text" else p for p in content]
    if content:
        items.append({"role": role, "content": content})
    for call in message.get("tool_calls") or []:
        if call.get("type") == "custom":
            freeform = call.get("custom") or {}
            items.append({"type": "custom_tool_call", "call_id": call.get("id"), "name": freeform.get("name"),
                          "input": freeform.get("input") or ""})
            if custom is not None:
                custom.add(call.get("id"))
            continue
        function = call.get("function") or {}
        items.append({"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
                      "arguments": function.get("arguments") or "{}"})
    if not items:
        items.append({"role": role, "content": ""})
    return items


def items_of_prompt(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ctxd's prompt (Chat Completions messages, system part left out) as input items."""
    custom: set[str] = set()
    return [item for message in messages for item in items_of(message, custom)]


def keep_ids(items: list[Any], client: list[Any]) -> list[Any]:
    """``items`` with each call or output ctxd wrote itself (a pruned output, an excerpt)
    given the ``id`` the client's item of the same type and ``call_id`` carries: what ctxd
    renders of an item is still that item."""
    ids = {(c.get("type"), c.get("call_id")): c["id"] for c in client
           if isinstance(c, dict) and isinstance(c.get("call_id"), str) and isinstance(c.get("id"), str)}
    if not ids:
        return items
    out = []
    for item in items:
        if isinstance(item, dict) and "id" not in item and (item.get("type"), item.get("call_id")) in ids:
            item = {"type": item["type"], "id": ids[item["type"], item["call_id"]],
                    **{k: v for k, v in item.items() if k != "type"}}
        out.append(item)
    return out
