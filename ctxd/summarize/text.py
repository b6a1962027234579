"""A message's own words as the summarizers read them: its text blocks (tool calls and
results are facts, not prose), its sentences, an item clipped to a length, and which
user messages are not the user's (tool output, worked examples)."""

from __future__ import annotations

import re

from ctxd.engine.context import is_demonstration, is_observation
from ctxd.protocol.message import Message, TextBlock

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[*])")
FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)


def not_the_users(message: Message) -> bool:
    """Tool output or a worked example sent as a user message (engine/context.py)."""
    return is_observation(message) or is_demonstration(message)


def text_blocks(message: Message) -> list[str]:
    """The message's own words: text blocks only (tool calls and results are facts, not prose)."""
    content = message.content
    if content is None or message.role == "tool":
        return []
    if isinstance(content, str):
        return [content] if content.strip() else []
    return [b.text for b in content if isinstance(b, TextBlock) and b.text.strip()]


def sentences_of(text: str, min_words: int = 3) -> list[str]:
    if "```" in text:
        text = FENCE.sub("\n", text)
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip().lstrip("#>*-• ").strip()
        if not line or line.startswith(("|", "→", "<", "{", "}")):
            continue
        if "**" in line:
            line = line.replace("**", "")
        for sentence in _SENTENCE_SPLIT.split(line):
            sentence = sentence.strip()
            if len(sentence.split()) >= min_words:
                out.append(" ".join(sentence.split()))
    return out


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"
