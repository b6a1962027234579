"""Excerpts of tool outputs too big for the prompt.

A recent tool output can be larger than everything the prompt may hold (``cat big.log``
in a 4K window). Pruning would replace it with a placeholder, and the model would lose
what it just asked for; truncation cannot cut between a call and its result. Instead it
is sent as its head and tail with a line saying what was left out, within a token limit
(seed 004's "truncate large outputs", applied to the view only: history keeps it whole).
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from ctxd.protocol.message import Message, TextBlock, ToolResultBlock, tool_result_text
from ctxd.tokens import TOOL_BLOCK_OVERHEAD, MessageTokens

ELIDED = ("[... {lines} lines, {tokens} tokens of this output left out by ctxd to fit the context window; "
          "the whole output is in history (history/search) ...]")
HEAD_SHARE = 0.4
"""Of the excerpt: the head (what the command printed first); the tail gets the rest
(where errors and summaries usually are)."""
MIN_EXCERPT = 32


def excerpt(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """``text`` itself when it fits in ``max_tokens``, else its head and tail around a
    notice, the whole at most ``max_tokens`` (a few tokens more for very small limits,
    and never more than ``text``)."""
    total = count(text)
    if total <= max_tokens:
        return text
    room = max(MIN_EXCERPT, max_tokens - count(ELIDED.format(lines=10**6, tokens=10**7)) - 2)
    chars_per_token = len(text) / max(1, total)
    scale = 1.0
    for _ in range(8):
        budget = int(room * chars_per_token * scale)
        head_n = int(budget * HEAD_SHARE)
        tail_n = budget - head_n
        head, tail = text[:head_n], text[len(text) - tail_n:] if tail_n else ""
        # End the head and start the tail at line breaks when one is near.
        cut = head.rfind("\n")
        if cut >= head_n * 0.8:
            head = head[: cut + 1]
        cut = tail.find("\n")
        if 0 <= cut <= tail_n * 0.2:
            tail = tail[cut + 1:]
        middle = text[len(head): len(text) - len(tail)]
        notice = ELIDED.format(lines=middle.count("\n") + (0 if middle.endswith("\n") else 1),
                               tokens=count(middle))
        out = f"{head.rstrip(chr(10))}\n{notice}\n{tail}"
        cost = count(out)
        if cost >= total:
            return text  # a limit this small saves nothing: the output as it is
        if cost <= max(max_tokens, MIN_EXCERPT + count(notice) + 2):
            return out
        scale *= 0.85
    return notice if count(notice) < total else text


def clip_message(message: Message, tokens: MessageTokens, max_tokens: int,
                 count: Callable[[str], int]) -> tuple[Message, int]:
    """The message with its tool output cut to ``max_tokens`` in all, and what the result
    costs as sent (counted the way ``tokens.count_message`` counts). Tool output is a
    ``tool`` message's content, and the ``tool_result`` blocks of any message."""
    before = tokens.context
    content = message.content
    if message.role == "tool" and not isinstance(content, list):
        cut = excerpt(content or "", max_tokens, count)
        if cut == (content or ""):
            return message, before
        return msgspec.structs.replace(message, content=cut), before - tokens.tool_result + count(cut)
    if not isinstance(content, list):
        return message, before
    is_tool = message.role == "tool"
    parts = [b for b in content if isinstance(b, ToolResultBlock) or (is_tool and isinstance(b, TextBlock))]
    if not parts:
        return message, before
    share = max(MIN_EXCERPT, max_tokens // len(parts))
    new_content: list[Any] = []
    results = 0
    changed = False
    for block in content:
        if isinstance(block, ToolResultBlock):
            text = tool_result_text(block)
            cut = excerpt(text, share, count)
            changed = changed or cut != text
            new_content.append(ToolResultBlock(tool_use_id=block.tool_use_id, content=cut, is_error=block.is_error))
            results += TOOL_BLOCK_OVERHEAD + count(cut)
        elif is_tool and isinstance(block, TextBlock):
            cut = excerpt(block.text, share, count)
            changed = changed or cut != block.text
            new_content.append(TextBlock(text=cut))
            results += count(cut)
        else:
            new_content.append(block)
    if not changed:
        return message, before
    return msgspec.structs.replace(message, content=new_content), before - tokens.tool_result + results
