"""Ollama's /api/chat: the Chat Completions message shape (read by ``openai.py`` with
``api="ollama"``) but for tool calls without ids and ``input`` objects as
``arguments``, results named by ``tool_name``, ``images`` beside the text, the
assistant's ``thinking``, and its counts (``prompt_eval_count``, ``eval_count``) at the
top of a reply rather than in a usage object."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ctxd.formats import openai
from ctxd.formats.common import Ref, Turn, UsageField, join, read_usage
from ctxd.protocol.providers import OllamaFunction, OllamaMessage, OllamaToolCall

USAGE: tuple[UsageField, ...] = (
    ("prompt_eval_count", None, "inputTokens"),
    ("eval_count", None, "outputTokens"),
)
"""Usage fields, read from the reply object itself."""


def usage(raw: Any) -> dict[str, int]:
    """An Ollama reply's counts as ctxd's Usage (JSON)."""
    return read_usage(raw, USAGE)


def projection(message: dict[str, Any]) -> list[Any]:
    """See ``openai.projection``."""
    role, out = openai.parts(message, with_unmodeled=False, api="ollama")
    return [role, out]


def chain_part(message: dict[str, Any]) -> list[Any] | None:
    """See ``openai.chain_part``."""
    role, out = openai.parts(message, with_unmodeled=True, api="ollama")
    return [role, out] if out else None


def to_ctxd(message: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None,
            position: int = 0) -> dict[str, Any] | None:
    """See ``openai.to_ctxd``: calls get ids from their message's ``position``, results
    answer the newest calls in order, ``thinking`` is kept as a block."""
    return openai.to_ctxd(message, call_ids=call_ids, position=position, api="ollama")


def ids_of(message: Any) -> list[Ref]:
    """None: Ollama's messages carry no provider ids (the ids ctxd stores are made from
    a message's position, see :func:`to_ctxd`)."""
    return []


def reply_message(message: dict[str, Any]) -> dict[str, Any]:
    """A reply's ``message`` (or a stream's pieces joined) as the client sends it back in
    its next request."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("thinking"):
        kept["thinking"] = message["thinking"]
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def emit(turns: Iterable[Turn]) -> list[OllamaMessage]:
    """Turns as Ollama messages: each result a ``tool`` message naming its tool, calls with
    ``arguments`` as objects."""
    out: list[OllamaMessage] = []
    for turn in turns:
        for r in turn.results:
            out.append(OllamaMessage(role="tool", content=r.text, tool_name=r.name))
        if turn.role == "assistant":
            if not turn.texts and not turn.calls:
                continue
            calls = [OllamaToolCall(function=OllamaFunction(name=c.name, arguments=c.input))
                     for c in turn.calls] or None
            out.append(OllamaMessage(role="assistant", content=join(turn.texts), tool_calls=calls))
        elif turn.texts and turn.role != "results":
            out.append(OllamaMessage(role=turn.role, content=join(turn.texts)))
    return out
