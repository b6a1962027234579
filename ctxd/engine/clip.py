"""Excerpts of tool outputs too big for the prompt.

A recent tool output can be larger than everything the prompt may hold (``cat big.log``
in a 4K window). Pruning would replace it with a placeholder, and the model would lose
what it just asked for; truncation cannot cut between a call and its result. Instead it
is sent as its head and tail with a line saying what was left out, within a token limit
("truncate large outputs", applied to the view only: history keeps it whole).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.protocol.message import (
    CustomCall,
    FunctionCall,
    Message,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
    tool_result_text,
)
from ctxd.tokens import TOOL_BLOCK_OVERHEAD, MessageTokens

ELIDED = ("[... {lines} lines, {tokens} tokens of this output left out by ctxd to fit the context window; "
          "the whole output is in history (history/search) ...]")
WORDS_CUT = "of this message left out by ctxd"
WORDS_ELIDED = ("[... {lines} lines, {tokens} tokens " + WORDS_CUT + " to fit the context window; "
                "the whole message is in history (session/history) ...]")
"""The notice inside an excerpt of the user's words (an agent's task too big for the prompt)."""
HEAD_SHARE = 0.4
"""Of the excerpt: the head (what the command printed first); the tail gets the rest
(where errors and summaries usually are)."""
MIN_EXCERPT = 32


def excerpt(text: str, max_tokens: int, count: Callable[[str], int], notice: str = ELIDED) -> str:
    """``text`` itself when it fits in ``max_tokens``, else its head and tail around a
    ``notice`` (what was left out and where it is whole), the whole at most ``max_tokens``
    (a few tokens more for very small limits, and never more than ``text``)."""
    elided = notice
    total = count(text)
    if total <= max_tokens:
        return text
    room = max(MIN_EXCERPT, max_tokens - count(elided.format(lines=10**6, tokens=10**7)) - 2)
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
        notice = elided.format(lines=middle.count("\n") + (0 if middle.endswith("\n") else 1),
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


def clip_words(message: Message, view_tokens: int, max_tokens: int,
               count: Callable[[str], int]) -> tuple[Message, int]:
    """The message with its text (a plain string, or its text blocks in proportion) cut to
    about ``max_tokens`` in all, head and tail around a notice that says the whole message
    is in history; its other blocks (images, tool results) as they are. For an older user
    message only (an agent's task too big for what is left of the prompt): the newest
    user message is never cut."""
    content = message.content
    if isinstance(content, str):
        before = count(content)
        cut = excerpt(content, max_tokens, count, notice=WORDS_ELIDED)
        if cut == content:
            return message, view_tokens
        return msgspec.structs.replace(message, content=cut), view_tokens - before + count(cut)
    if not content:
        return message, view_tokens
    texts = [b for b in content if isinstance(b, TextBlock) and b.text]
    total = sum(count(b.text) for b in texts)
    if not texts or total <= max_tokens:
        return message, view_tokens
    blocks: list[Any] = []
    delta = 0
    for block in content:
        if isinstance(block, TextBlock) and block.text:
            before = count(block.text)
            cut = excerpt(block.text, max(MIN_EXCERPT, max_tokens * before // total), count, notice=WORDS_ELIDED)
            delta += count(cut) - before
            blocks.append(TextBlock(text=cut) if cut != block.text else block)
        else:
            blocks.append(block)
    if delta >= 0:
        return message, view_tokens
    return msgspec.structs.replace(message, content=blocks), view_tokens + delta


def _arguments_excerpt(arguments: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """Tool-call arguments cut to an excerpt, still a JSON object (providers parse them)."""
    cut = excerpt(arguments, max_tokens, count)
    if cut == arguments:
        return arguments
    return msgspec.json.encode({"ctxd_excerpt": cut}).decode()


def clip_any(message: Message, tokens: MessageTokens, max_tokens: int,
             count: Callable[[str], int]) -> tuple[Message, int]:
    """Any message cut to about ``max_tokens`` as sent: tool output as by
    :func:`clip_message`, and the text and tool-call arguments of other messages (an
    assistant's long answer, a huge ``write_file`` call) as head/tail excerpts. Thinking
    is never sent, so it is left as it is."""
    if tokens.tool_result and message.role == "tool":
        return clip_message(message, tokens, max_tokens, count)
    view, cost = message, tokens.context
    if tokens.tool_result:
        share = max(MIN_EXCERPT, max_tokens * tokens.tool_result // max(1, tokens.context))
        view, cost = clip_message(message, tokens, share, count)
    sized = tokens.text + tokens.tool_call
    if sized <= 0 or cost <= max_tokens:
        return view, cost
    room = max(MIN_EXCERPT, max_tokens - tokens.overhead - (cost - sized - tokens.overhead))

    def share_of(part_tokens: int) -> int:
        return max(MIN_EXCERPT, room * part_tokens // max(1, sized))

    content = view.content
    delta = 0
    if isinstance(content, str) and content:
        cut = excerpt(content, share_of(tokens.text), count)
        if cut != content:
            delta += count(cut) - tokens.text
            content = cut
    elif isinstance(content, list):
        blocks: list[Any] = []
        for block in content:
            if isinstance(block, TextBlock) and block.text:
                before = count(block.text)
                cut = excerpt(block.text, share_of(before), count)
                delta += count(cut) - before
                blocks.append(TextBlock(text=cut) if cut != block.text else block)
            elif isinstance(block, ToolUseBlock):
                raw = msgspec.json.encode(block.input).decode()
                before = count(raw)
                cut = excerpt(raw, share_of(before), count)
                if cut != raw:
                    blocks.append(ToolUseBlock(id=block.id, name=block.name, input={"ctxd_excerpt": cut}))
                    delta += count(msgspec.json.encode({"ctxd_excerpt": cut}).decode()) - before
                else:
                    blocks.append(block)
            else:
                blocks.append(block)
        content = blocks
    calls = view.tool_calls
    if calls:
        new_calls = []
        for call in calls:
            before = count(call.text)
            if isinstance(call.custom, CustomCall):  # freeform text: an excerpt of it as it is
                cut = excerpt(call.text, share_of(before), count)
                replaced = ToolCall(id=call.id, type="custom", custom=CustomCall(name=call.name, input=cut))
            else:
                cut = _arguments_excerpt(call.text, share_of(before), count)
                replaced = ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=cut))
            delta += count(cut) - before
            new_calls.append(call if cut == call.text else replaced)
        calls = new_calls
    if delta >= 0:
        return view, cost
    return msgspec.structs.replace(view, content=content, tool_calls=calls), cost + delta
