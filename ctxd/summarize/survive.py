"""What a summary must keep, for the LLM summarizers' prompt (``prompt.py``): found the
way the extractive summary finds it (the facts ``extract`` reads, the names, numbers and
dates of the most salient candidates; for chats the speakers and dates)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ctxd.engine.extract import extract
from ctxd.summarize.base import SummaryRequest
from ctxd.summarize.candidates import candidates
from ctxd.summarize.chat import CHAT_LINE, DATE_HEADING, chat_text, date_of, is_chat_request, line_body, speaker_of
from ctxd.summarize.salience import DATE, DATE_WORDS, NOT_NAMES, Analysis, Unit
from ctxd.summarize.text import clip, text_blocks


@dataclass
class MustSurvive:
    """What a summary of the request must keep, found the way the extractive summary finds it."""

    chat: bool = False
    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    speakers: list[str] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    numbers: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.files or self.errors or self.decisions or self.next_steps or self.speakers
                    or self.dates or self.names or self.numbers)


_NAME_RUN = re.compile(r"\b(?:[A-Z][a-z0-9'’&-]*[a-z0-9]|[A-Z][A-Z0-9&+-]*[A-Z0-9+])"
                       r"(?:\s+(?:of\s+|the\s+|de\s+)?(?:[A-Z][a-z0-9'’&-]*[a-z0-9]|[A-Z]{2,}))*")
_NUMBER_PHRASE = re.compile(
    r"(?:[$€£]\s?)?\b\d+(?:[.,:/]\d+)*(?:st|nd|rd|th|k|K|%)?(?:\s+(?:%|percent|hours?|minutes?|days?|weeks?|"
    r"months?|years?|km|miles?|kg|lbs?|tokens?|ms|MB|GB|items?|tests?|people|times|am|pm))?")
_SENTENCE_START = frozenset(".!?:;\n…-–—]>")


def must_survive(request: SummaryRequest, *, max_items: int = 12) -> MustSurvive:
    """What a summary of ``request`` must keep: files, errors, decisions and next steps
    (``extract``), and the names, numbers and dates of its most salient sentences (the
    ones the extractive summary would keep first); for chats the speakers and dates."""
    messages = request.messages
    chat = is_chat_request(request)
    out = MustSurvive(chat=chat)
    if not messages or max_items <= 0:
        return out
    merge = request.kind == "checkpoint_merge"
    speakers: dict[str, None] = {}
    dates: dict[str, None] = {}
    best: list[str] = []
    if not chat:
        facts = extract(messages, max_items=max_items)
        out.files = facts.files_modified[: max_items * 2]
        out.errors = [clip(e, 160) for e in facts.errors[-max_items:]]
        out.decisions = [clip(d, 200) for d in facts.key_decisions[:max_items]]
        out.next_steps = [clip(s, 160) for s in facts.next_steps[-max_items:]]
        _, progress = candidates(request, Analysis.of(request))
        top = sorted(progress[: max_items * 2], key=lambda p: p[1])  # the best, in order
        best = [text for _, _, text in top]
    else:
        units: list[Unit] = []
        turns = 0
        for message in messages:
            if message.role not in ("user", "assistant"):
                continue
            if merge:
                for text in text_blocks(message):
                    for raw in text.splitlines():
                        heading = DATE_HEADING.match(raw.strip())
                        if heading:
                            dates.setdefault(heading.group(1))
                        elif raw.strip():
                            units.append(Unit(turns, 0, raw.strip()))
                            turns += 1
                continue
            text = chat_text(message)
            if not text:
                continue
            speakers.setdefault(speaker_of(message))
            date = date_of(message)
            if date:
                dates.setdefault(date)
            units.append(Unit(turns, 0, text))
            turns += 1
        if merge:
            for unit in units:
                found = CHAT_LINE.match(unit.text)
                if found:
                    if found.group(1):
                        dates.setdefault(found.group(1))
                    speakers.setdefault(found.group(2).strip())
        if units:
            Analysis.of(request, chat=True).score_units(units, turns, lines=merge)
            top_units = sorted((u for u in units if u.score > 0), key=lambda u: (-u.score, u.turn))[: max_items * 2]
            best = [line_body(u.text) if merge else u.text for u in sorted(top_units, key=lambda u: u.turn)]
    names: dict[str, str] = {}
    numbers: dict[str, str] = {}
    known = {s.lower() for s in speakers}
    for body in best:
        for match in _NAME_RUN.finditer(body):
            name = match.group(0)
            i = match.start() - 1
            while i >= 0 and body[i] in " \t\"'“‘(*[":
                i -= 1
            if i < 0 or body[i] in _SENTENCE_START:
                continue  # a capital that starts a sentence says nothing
            if name.endswith(("'s", "’s")):
                name = name[:-2]
            low = name.lower()
            if low in NOT_NAMES or low in known or name in DATE_WORDS or len(name) < 2:
                continue
            names.setdefault(low, name)
        for match in DATE.finditer(body):
            numbers.setdefault(match.group(0).lower(), match.group(0))
        if any(c.isdigit() for c in body):
            for match in _NUMBER_PHRASE.finditer(body):
                value = match.group(0).strip()
                if value and not DATE.fullmatch(value):
                    numbers.setdefault(value.lower(), value)
    out.names = list(names.values())[: max_items * 2]
    out.numbers = list(numbers.values())[: max_items * 2]
    out.speakers = list(speakers)[:max_items]
    out.dates = list(dates)[: max_items * 3]
    return out
