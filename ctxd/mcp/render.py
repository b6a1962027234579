"""Tool results sized for a prompt: plain text, paged, never over a token cap.

Tokens are counted with ``cl100k_base`` (bundled, offline): close enough to any
current model's count for a cap whose job is to keep a result a small part of a
prompt. A result is a header, as many items as fit, and a footer saying how to get
the next page; an item too large for a page on its own is cut, and the footer says
where it continues.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ctxd.tokens import TokenCounter

FOOTER_RESERVE = 80
"""Tokens kept free for the footer (paging hints)."""


@lru_cache(maxsize=1)
def _counter() -> TokenCounter:
    return TokenCounter.for_encoding("cl100k_base")


def count(text: str) -> int:
    return _counter().count(text)


def clip(text: str, budget: int) -> tuple[str, int]:
    """The longest prefix of ``text`` within ``budget`` tokens (cut at a line or word
    when one is near), and its length in characters."""
    if budget <= 0:
        return "", 0
    tokens = count(text)
    if tokens <= budget:
        return text, len(text)
    end = max(1, int(len(text) * budget / tokens))
    while end > 1 and count(text[:end]) > budget:
        end = int(end * 0.9)
    cut = end
    for sep in ("\n", " "):
        at = text.rfind(sep, 0, end)
        if at > end * 0.8:
            cut = at + 1
            break
    return text[:cut], cut


@dataclass
class Item:
    text: str
    continue_hint: Callable[[int], str] | None = None
    """Given how many characters of ``text`` were shown, where the rest can be read."""
    start: int = 0
    """Where in ``text`` the message's own text starts (after its ``---`` line)."""
    base: int = 0
    """Characters of the message before ``text`` (read_message's ``char_offset``)."""


def page(header: str, items: list[Item], *, offset: int, total: int | None, max_tokens: int,
         next_hint: Callable[[int], str], noun: str = "items", more: bool | None = None,
         span: Callable[[int, int], str] | None = None) -> str:
    """``items`` are those from ``offset`` on (maybe not all the remaining ones: ``more``
    says whether others follow them; ``total`` is the count of all, when known; ``span``
    words the footer's "[items 1-5 of 9]" given the first and last shown, 1-based)."""
    reserve = FOOTER_RESERVE
    for _ in range(4):
        # Parts counted apart do not add up exactly (tokens merge across the joins, a
        # footer with long ids is longer than its reserve): check the whole, retry smaller.
        text = _page(header, items, offset=offset, total=total, max_tokens=max_tokens, next_hint=next_hint,
                     noun=noun, more=more, span=span, reserve=reserve)
        over = count(text) - max_tokens
        if over <= 0:
            return text
        reserve += over + 16
    return text


def _page(header: str, items: list[Item], *, offset: int, total: int | None, max_tokens: int,
          next_hint: Callable[[int], str], noun: str, more: bool | None,
          span: Callable[[int, int], str] | None, reserve: int) -> str:
    budget = max_tokens - count(header) - reserve
    shown: list[str] = []
    cut_note = ""
    for item in items:
        tokens = count(item.text) + 1
        if tokens <= budget:
            shown.append(item.text)
            budget -= tokens
            continue
        if not shown:
            # Too large for a page of its own: show its beginning.
            text, chars = clip(item.text, max(budget, 1))
            shown.append(text + "\n[... cut at the token cap]")
            hint = item.continue_hint(chars) if item.continue_hint else ""
            # (counted in the message's text, as char_offset counts, not in the item's lines)
            shown_chars = item.base + max(0, chars - item.start)
            total_chars = item.base + len(item.text) - item.start
            cut_note = f"The last item was cut after {shown_chars:,} of {total_chars:,} characters" + (
                f"; the rest: {hint}." if hint else ".")
        break
    n = len(shown)
    remaining = n < len(items) or bool(more)
    if cut_note and n == len(items) and not more:
        remaining = False
    lines = [header.rstrip(), ""] if header else []
    lines.append("\n\n".join(shown) if shown else f"(no {noun})")
    first, last = offset + 1, offset + n
    of = f" of {total}" if total is not None else ""
    footer: list[str] = []
    if n:
        footer.append(span(first, last) if span else f"[{noun} {first}-{last}{of}]")
    if cut_note:
        footer.append(cut_note)
    if remaining:
        # A cut item counts as shown: its rest is read with the hint, the page moves on.
        footer.append(f"More: {next_hint(offset + max(n, 1))}.")
    elif n:
        footer.append("(end)")
    lines += ["", " ".join(footer)] if footer else []
    return "\n".join(lines).strip() + "\n"


def fit(text: str, max_tokens: int, hint: str = "") -> str:
    """A single text under the cap (for results that are not lists)."""
    if count(text) <= max_tokens:
        return text
    clipped, _ = clip(text, max_tokens - FOOTER_RESERVE)
    return clipped.rstrip() + "\n[... cut at the token cap" + (f"; {hint}" if hint else "") + "]\n"


# --- messages -----------------------------------------------------------------------


def _args(text: Any) -> str:
    return text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)


def message_body(message: dict[str, Any]) -> str:
    """The readable text of a stored message (camelCase dict as the daemon returns it)."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        if content:
            parts.append(content)
    elif isinstance(content, list):
        for block in content:
            kind = block.get("type")
            if kind == "text":
                parts.append(block.get("text", ""))
            elif kind == "tool_use":
                parts.append(f"[tool call {block.get('id', '')}] {block.get('name', '')}"
                             f"({_args(block.get('input', {}))})")
            elif kind == "tool_result":
                body = block.get("content", "")
                if isinstance(body, list):
                    body = "\n".join(part.get("text", "") for part in body)
                error = " (error)" if block.get("isError") else ""
                parts.append(f"[tool result {block.get('toolUseId', '')}{error}]\n{body}")
            elif kind == "thinking":
                parts.append(f"[thinking]\n{block.get('thinking', '')}")
            elif kind == "image":
                parts.append(f"[image: {block.get('description', '')}]" if block.get("description") else "[image]")
    for call in message.get("toolCalls") or ():
        function = call.get("function") or call.get("custom") or {}
        text = function.get("arguments", function.get("input", ""))
        parts.append(f"[tool call {call.get('id', '')}] {function.get('name', '')}({text})")
    if message.get("toolCallId") and message.get("role") == "tool":
        parts.insert(0, f"[tool result {message['toolCallId']}]")
    return "\n".join(parts) if parts else "(empty)"


def message_head(seq: int, message: dict[str, Any], *, tokens: int | None = None, status: str | None = None,
                 created_at: str | None = None, session_id: str | None = None) -> str:
    bits = [f"#{seq} {message.get('role', '?')}"]
    if message.get("name"):
        bits[0] += f" ({message['name']})"
    if tokens is not None:
        bits.append(f"{tokens:,} tokens")
    if status:
        bits.append(status)
    if created_at:
        bits.append(created_at)
    if session_id:
        bits.insert(0, f"session {session_id}")
    return "--- " + " · ".join(bits)
