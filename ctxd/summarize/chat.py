"""Chat conversations (people talking, no tools): recognising one, a turn's words, who
said it and when (``[8 May 2023]``), and older summaries that are condensed chat
transcripts (``[date] Speaker: ...`` lines)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxd.protocol.message import ImageBlock, Message, TextBlock, ThinkingBlock, image_text
from ctxd.summarize.base import SummaryRequest
from ctxd.summarize.text import not_the_users, text_blocks

_SECTION_LABELS = frozenset({"task", "user requests", "asked", "decisions", "progress", "state", "files",
                             "commands", "errors", "next", "accomplished", "current work", "user instructions",
                             "next steps", "blockers", "artifacts", "key decisions"})

CHAT_LINE = re.compile(r"^(?:\[([^\]\n]{0,39}\d[^\]\n]{0,39})\]\s+)?([^\s:\[\]\-*•#>|`][^:\n]{0,63}):\s+(?=\S)")
"""A line of a condensed transcript, ``[8 May 2023] Caroline: `` (the match is the prefix;
a date has a digit, so ``[DECISION] x: y`` is not one, and a bullet is not a speaker)."""
DATE_HEADING = re.compile(r"^\[([^\]\n]{0,39}\d[^\]\n]{0,39})\]$")
"""A condensed transcript's date line, ``[8 May 2023]``: the turns under it were said that day."""
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_MONTH_BY_PREFIX = {m[:3].lower(): m for m in _MONTHS}
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+([A-Za-z]{3,9})\.?,?\s+(\d{4})\b")
_MONTH_DAY_YEAR = re.compile(r"\b([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b")
_ISO_DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")


def is_chat(messages: Sequence[Message]) -> bool:
    """True for a conversation without tools (people talking, or a plain chat with a model):
    no tool calls or results, no tool output sent as a user message, no shell blocks."""
    has_text = False
    for message in messages:
        if message.role == "tool" or message.tool_calls:
            return False
        if not_the_users(message):
            return False
        content = message.content
        if isinstance(content, list):
            if not all(isinstance(block, (TextBlock, ThinkingBlock, ImageBlock)) for block in content):
                return False
        for text in text_blocks(message):
            if "```" in text and message.role == "assistant":
                return False  # a text-protocol agent's command (or code: a technical chat)
            has_text = True
    return has_text


def is_chat_request(request: SummaryRequest) -> bool:
    """A chat conversation, or older summaries that are condensed chat transcripts."""
    if request.kind == "checkpoint_merge":
        return chat_summaries(request.messages)
    return is_chat(request.messages)


def chat_text(message: Message) -> str:
    """A turn's words, verbatim (whitespace inside a line kept; line breaks become spaces)."""
    texts = text_blocks(message)
    if not texts:
        return ""
    text = " ".join(t.strip() for t in texts)
    if "\n" in text:
        text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return text


def image_texts(message: Message) -> list[str]:
    """The images that came with a turn, as they are sent (``[image: <description>]``)."""
    content = message.content
    if not isinstance(content, list):
        return []
    return [image_text(b) for b in content if isinstance(b, ImageBlock)]


def speaker_of(message: Message) -> str:
    """Who said it: ``metadata.speaker``, the message's ``name``, else the role."""
    metadata = message.metadata or {}
    speaker = metadata.get("speaker")
    if isinstance(speaker, str) and speaker.strip():
        return " ".join(speaker.split())[:64]
    if message.name:
        return message.name
    return message.role.capitalize()


def session_date_of(message: Message) -> str | None:
    """The day of the chat session it belongs to ("8 May 2023"), when the message says
    (``metadata.sessionDateTime``, as multi-session chats carry it); None otherwise."""
    raw = (message.metadata or {}).get("sessionDateTime")
    return compact_date(raw) if isinstance(raw, str) and raw.strip() else None


def date_of(message: Message) -> str | None:
    """The day it was said, compactly ("8 May 2023"): the session's date, else the timestamp's."""
    metadata = message.metadata or {}
    raw = metadata.get("sessionDateTime")
    if isinstance(raw, str) and raw.strip():
        return compact_date(raw)
    if message.timestamp:
        return compact_date(message.timestamp)
    return None


def compact_date(text: str) -> str:
    """"1:56 pm on 8 May, 2023" or "2023-05-08T13:56:00" as "8 May 2023"; other text as it is."""
    text = " ".join(text.split())
    iso = _ISO_DAY.match(text)
    if iso:
        year, month, day = int(iso.group(1)), int(iso.group(2)), int(iso.group(3))
        if 1 <= month <= 12 and 1 <= day <= 31:
            return f"{day} {_MONTHS[month - 1]} {year}"
    for pattern, day_group, month_group in ((_DAY_MONTH_YEAR, 1, 2), (_MONTH_DAY_YEAR, 2, 1)):
        found = pattern.search(text)
        if found:
            name = _MONTH_BY_PREFIX.get(found.group(month_group)[:3].lower())
            if name and found.group(month_group).lower() in (name.lower(), name[:3].lower(), "sept"):
                return f"{int(found.group(day_group))} {name} {found.group(3)}"
    return text[:40]


def chat_summaries(messages: Sequence[Message]) -> bool:
    """Older summaries that are condensed transcripts: most lines are ``[date] Speaker: ...``."""
    speaker_lines = other = 0
    for message in messages:
        for text in text_blocks(message):
            for raw in text.splitlines():
                line = raw.strip()
                if not line or DATE_HEADING.match(line):
                    continue
                match = CHAT_LINE.match(line)
                if match and (match.group(1) or match.group(2).strip().lower() not in _SECTION_LABELS):
                    speaker_lines += 1
                else:
                    other += 1
    return speaker_lines > 0 and speaker_lines >= other


def line_body(line: str) -> str:
    """A transcript line without its ``[date] Speaker:`` prefix."""
    found = CHAT_LINE.match(line)
    return line[found.end():] if found else line
