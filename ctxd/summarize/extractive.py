"""The summarizer that needs no model: deterministic, offline, always available.

It is the embedded default and the fallback of every chain, so it must never fail and
never exceed ``target_tokens`` (measured with the injected counter).

**What it keeps: what later questions need.** Every candidate (a sentence, a chat turn,
a line of an older summary) gets a *salience* score computed within the request
(``salience.py``; the coding-agent candidates are ``candidates.py``'s). The token
target is spent on the best candidates, not on per-level quotas: a large
target gets a long summary when the input has that much worth keeping, a small target
keeps the facts first (decisions, the task, files, errors) and then the most salient
sentences.

**Two shapes.**

* Coding-agent input (a tool call or result, tool output sent as a user message, or a
  fenced block from the assistant): a checkpoint in sections (``Task``,
  ``User requests``, ``Decisions``, ``Progress``, ``Files``, ``Commands``, ``Errors``,
  ``Next``), only the non-empty ones, built on ``ctxd.engine.extract``; at ``ultra`` a
  few ``Label: a; b`` lines. ``extract`` reads these sections back, so facts survive
  when the checkpoint is merged later.
* Chat (no tools: two people talking, e.g. LoCoMo): a condensed transcript, in the
  original order, one line per chosen turn, ``Caroline: <her words>``, under a
  ``[8 May 2023]`` line for each day (dates once, not on every line).
  A chosen turn is quoted whole and verbatim when it is short (under ~60 tokens),
  otherwise its best sentences are (verbatim, joined with ``…`` where some were left
  out). The speaker is ``metadata.speaker``, else the message's ``name``, else its
  role; the date is ``metadata.sessionDateTime``, else the day of ``timestamp``. The
  user's turns rank a little lower (ctxd keeps them verbatim in the prompt anyway); an
  image that came with a turn (an ``image`` block, as ``[image: <description>]``) is a
  unit of its own, quoted only once every worthwhile turn is in; praise and feelings ("inspiring", "so proud")
  do not count as rare words; a target too small for the best turn
  gets that turn's beginning, not a lesser scrap.

``checkpoint_merge`` requests (older summaries as assistant messages): sectioned
summaries are merged by section (facts re-extracted, prose lines by salience); chat
summaries keep their highest-salience lines whole, or not at all, in order.

Which conversations are chats, and their speakers and dates: ``chat.py``. What the LLM
summarizers are told must survive: ``survive.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxd.engine.extract import Extraction, extract
from ctxd.protocol.message import message_text
from ctxd.summarize.base import Count, Level, SummaryRequest, SummaryResult
from ctxd.summarize.candidates import candidates
from ctxd.summarize.chat import (
    CHAT_LINE,
    DATE_HEADING,
    chat_summaries,
    chat_text,
    date_of,
    image_texts,
    is_chat,
    speaker_of,
)
from ctxd.summarize.salience import Analysis, Unit, density
from ctxd.summarize.text import clip, text_blocks

log = logging.getLogger("ctxd.summarize")

# Inputs above this many characters are summarized in a worker thread so the daemon's
# event loop keeps serving.
THREAD_THRESHOLD_CHARS = 200_000

# Characters an item of a sectioned summary may have, by level, before the target
# lets it grow (a large target gives each item room, up to _MAX_ITEM_CHARS).
_ITEM_CHARS: dict[Level, int] = {"detailed": 300, "moderate": 200, "compact": 140, "ultra": 100}
_MAX_ITEM_CHARS = 700
WHOLE_TURN_TOKENS = 100
"""A chat turn shorter than this is quoted whole (a question about it can be answered from
its own words); a longer one by its best sentences."""
_CHAT_SPLIT = re.compile(r"(?<=[.!?…])\s+(?=[A-Z0-9\"'“‘(\[])")
_LOOKUP_COMMANDS = frozenset({"grep", "egrep", "rg", "ag", "find", "ls", "cat", "head", "tail", "wc", "echo",
                              "pwd", "tree", "less", "more", "file", "stat", "which", "type", "cd"})


@dataclass(slots=True)
class _Item:
    priority: float
    section: str
    order: int
    text: str


@dataclass(slots=True)
class _Line:
    date: str            # "8 May 2023", shown once above the turns of that day ("": none)
    prefix: str          # "Caroline: " (empty for lines of older summaries)
    parts: int           # how many units the turn was cut into (1: whole)


# A chat's user turns stay verbatim in the prompt (kept, or folded with their words), so a
# summary quotes them (tier 1) only after every worthwhile turn of the other speakers.


class ExtractiveSummarizer:
    """Summaries from the messages' own sentences and extracted facts; no model."""

    name = "extractive"

    def __init__(self, count: Count) -> None:
        self._count = count

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        size = sum(len(message_text(m)) for m in request.messages)
        if size > THREAD_THRESHOLD_CHARS:
            return await asyncio.to_thread(self.summarize_now, request)
        return self.summarize_now(request)

    def summarize_now(self, request: SummaryRequest) -> SummaryResult:
        """The same as ``summarize``, synchronously (pure CPU work)."""
        input_text = "\n".join(message_text(m) for m in request.messages)
        try:
            text = self.render(request)
        except Exception:  # the fallback of every chain must not fail: a plain excerpt instead
            log.exception("extractive summary failed; using a plain excerpt")
            text = self._excerpt(input_text, request.target_tokens)
        return SummaryResult(text=text, summarizer=self.name, input_tokens=self._count(input_text),
                             output_tokens=self._count(text) if text else 0, chunks=0, calls=0)

    # ---- building ----------------------------------------------------------------------

    def render(self, request: SummaryRequest) -> str:
        """The summary text for ``request``, within ``target_tokens``."""
        target = request.target_tokens
        if target <= 0 or not request.messages:
            return ""
        if request.kind == "checkpoint_merge":
            if chat_summaries(request.messages):
                return self._merge_chat(request)
        elif is_chat(request.messages):
            return self._chat(request)
        facts = extract(request.messages, max_items=max(50, target // 40))
        analysis = Analysis.of(request)
        requests, progress = candidates(request, analysis)
        items = self._items(request.level, target, facts, requests, progress)
        if request.level == "ultra":
            return self._pack_lines(items, target)
        return self._pack_sections(items, target)

    # ---- coding-agent input: sections --------------------------------------------------

    def _items(self, level: Level, target: int, facts: Extraction, requests: list[str],
               progress: list[tuple[float, int, str]]) -> list[_Item]:
        """Every candidate with its priority (lower first): facts, then salient prose.

        No per-kind quota: the n-th item of a kind just ranks lower (kinds interleave),
        so a small target keeps the task, the first decisions, the first files and the
        latest errors, and a large one keeps them all and fills up with progress."""
        chars = _item_chars(level, target)
        items: list[_Item] = []
        for i, text in enumerate(facts.key_decisions):
            items.append(_Item(0.0 + i * 0.5, "Decisions", i, clip(text, chars)))
        if requests:
            items.append(_Item(0.0, "Task", 0, clip(requests[0], chars * 2 if level != "ultra" else chars)))
            rest = requests[1:]
            for i, text in enumerate(rest):
                age = len(rest) - 1 - i  # the latest request matters most after the task itself
                priority = 1.0 if age == 0 else 3.0 + age * 0.1
                items.append(_Item(priority, "User requests", i, clip(text, chars)))
        next_steps = facts.next_steps
        for i, text in enumerate(next_steps):
            items.append(_Item(1.0 + (len(next_steps) - 1 - i) * 0.3, "Next", i, clip(text, chars)))
        for i, path in enumerate(facts.files_modified):
            items.append(_Item(2.0 + i * 0.001 if i < 6 else 2.5 + i * 0.05, "Files", i, path))
        errors = facts.errors
        for i, text in enumerate(errors):
            items.append(_Item(2.0 + (len(errors) - 1 - i) * 0.3, "Errors", i, clip(text, chars)))
        decided = {" ".join(d.split()).lower() for d in facts.key_decisions}
        rank = 0
        for score, order, text in progress:  # best first
            if text.lower() in decided:
                continue
            # The best sentences rank with the first errors, weak ones after the commands;
            # many equally good ones still leave room for the other kinds.
            items.append(_Item(6.0 - min(score, 7.0) * 0.5 + rank * 0.02, "Progress", order, clip(text, chars)))
            rank += 1
        useful = facts.commands if level == "detailed" else [c for c in facts.commands if not _is_lookup(c)]
        for i, text in enumerate(useful):
            first_line = text.splitlines()[0] if text else text
            items.append(_Item(4.0 + (len(useful) - 1 - i) * 0.05, "Commands", i,
                               f"`{clip(first_line, min(chars, 200))}`"))
        return items

    def _pack_sections(self, items: list[_Item], target: int) -> str:
        chosen = self._choose(items, target, lambda name, text: f"- {text}\n", lambda name: f"{name}:\n")
        return self._fit(_render_sections, chosen, target)

    def _pack_lines(self, items: list[_Item], target: int) -> str:
        chosen = self._choose(items, target, lambda name, text: f"{text}; ", lambda name: f"{_ULTRA_LABELS[name]}: \n")
        return self._fit(_render_lines, chosen, target)

    def _choose(self, items: list[_Item], target: int, item_cost, header_cost) -> list[_Item]:
        """Greedy by priority with an additive token estimate; ``_fit`` checks it exactly."""
        count = self._count
        used = 0
        misses = 0
        headers: set[str] = set()
        chosen: list[_Item] = []
        for item in sorted(items, key=lambda it: it.priority):
            cost = count(item_cost(item.section, item.text))
            if item.section not in headers:
                cost += count(header_cost(item.section))
            if used + cost > target:
                if not chosen:
                    shortened = self._shorten(item, target - (cost - count(item_cost(item.section, item.text))))
                    if shortened is not None:
                        chosen.append(shortened)
                        used = target
                misses += 1
                if misses > 200 or used >= target:
                    break  # nothing much fits any more: stop measuring the rest
                continue
            used += cost
            headers.add(item.section)
            chosen.append(item)
        return chosen

    def _shorten(self, item: _Item, budget: int) -> _Item | None:
        """The item cut to fit ``budget`` tokens (used when not even one item fits whole)."""
        if budget <= 1:
            return None
        cut = self._clip_to(item.text, budget, lambda t: f"- {t}\n")
        return None if cut is None else _Item(item.priority, item.section, item.order, cut)

    def _clip_to(self, text: str, budget: int, wrap) -> str | None:
        """``text`` clipped (with "…") so that ``wrap(text)`` counts at most ``budget`` tokens."""
        lo, hi = 0, min(len(text), budget * 8)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(wrap(clip(text, mid))) <= budget:
                lo = mid
            else:
                hi = mid - 1
        if lo < 8:
            return None
        return clip(text, lo)

    def _fit(self, render, chosen: list[_Item], target: int) -> str:
        """Render; when the exact count is over, keep the longest prefix (by priority) that fits."""
        selection = sorted(chosen, key=lambda it: it.priority)
        if not selection:
            return ""
        text = render(selection)
        if self._count(text) <= target:
            return text
        keep = self._longest_fitting(lambda n: render(selection[:n]), len(selection) - 1, target)
        if keep:
            return render(selection[:keep])
        only = selection[0]
        shorter = only.text
        while len(shorter) > 8:
            shorter = clip(shorter, max(8, int(len(shorter) * 0.8)))
            text = render([_Item(only.priority, only.section, only.order, shorter)])
            if self._count(text) <= target:
                return text
            if len(shorter) <= 8:
                break
        return ""

    def _longest_fitting(self, render_first, upper: int, target: int) -> int:
        """The largest n <= upper whose ``render_first(n)`` fits ``target`` (0 if none):
        a binary search, so an over-long selection costs O(log n) renders, not O(n)."""
        lo, hi = 0, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(render_first(mid)) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---- chat: a condensed transcript ----------------------------------------------------

    def _chat(self, request: SummaryRequest) -> str:
        lines: list[_Line] = []
        units: list[Unit] = []
        for message in request.messages:
            if message.role not in ("user", "assistant"):
                continue
            text = chat_text(message)
            images = image_texts(message)
            if not text:
                if not images:
                    continue
                text, images = " ".join(images), []  # (an image alone is what the turn says)
            turn = len(lines)
            speaker, date = speaker_of(message), date_of(message)
            prefix = f"{speaker}: "
            # An image that came with the turn is a unit of its own, taken only once every
            # worthwhile turn is in (tier 2): the words are quoted whole without it.
            body = text
            if len(body) <= 160 or (len(body) <= WHOLE_TURN_TOKENS * 8 and self._count(body) < WHOLE_TURN_TOKENS):
                pieces = [body]
            else:
                pieces = [p for p in _CHAT_SPLIT.split(body) if p.strip()] or [body]
            lines.append(_Line(date or "", prefix, len(pieces)))
            pieces += images  # (not parts of the turn: no "…" without them)
            user = message.role == "user"
            for part, piece in enumerate(pieces):
                unit = Unit(turn, part, piece)
                unit.tier = 2 if part >= lines[-1].parts else 1 if user else 0
                units.append(unit)
        if not units:
            return ""
        Analysis.of(request, chat=True).score_units(units, len(lines))
        return self._pack_units(units, lines, request.target_tokens, whole=False)

    def _merge_chat(self, request: SummaryRequest) -> str:
        """Older chat summaries: their lines are units, kept whole or not at all."""
        lines: list[_Line] = []
        units: list[Unit] = []
        for message in request.messages:
            for text in text_blocks(message):
                date = ""
                for raw in text.splitlines():
                    line = raw.strip()
                    if not line:
                        continue
                    heading = DATE_HEADING.match(line)
                    if heading:
                        date = heading.group(1)
                        continue
                    line_date = date
                    found = CHAT_LINE.match(line)
                    if found and found.group(1):  # a line written before dates became headings
                        line_date, line = found.group(1), line[found.start(2):]
                    units.append(Unit(len(lines), 0, line))
                    lines.append(_Line(line_date, "", 1))
        if not units:
            return ""
        Analysis.of(request, chat=True).score_units(units, len(lines), lines=True)
        return self._pack_units(units, lines, request.target_tokens, whole=True)

    def _pack_units(self, units: list[Unit], lines: list[_Line], target: int, *, whole: bool) -> str:
        """The best units that fit ``target``, rendered in their original order."""
        count = self._count
        worth = [u for u in units if u.score > 0]
        # Salience per token, not per unit: a target holds more of what later questions
        # ask when a long turn must be worth its length (on LoCoMo, score / sqrt(tokens)
        # keeps 1.3x the answer-bearing turns that ranking by score alone keeps).
        cost = {id(u): count(u.text) + 4 for u in worth or units}
        ranked = sorted(worth or units, key=lambda u: (u.tier, -density(u.score, cost[id(u)]), u.turn, u.part))
        # The first unit must be worth half the best one: a tiny target gets the best
        # unit's beginning rather than whatever scrap fits ("Yep!").
        best = max(u.score for u in ranked)
        first_floor = best / 2 if best > 0 else float("-inf")
        chosen: list[Unit] = []
        opened: set[int] = set()
        dated: set[str] = set()
        used = 0
        misses = 0
        for unit in ranked:
            if unit.score <= 0 and chosen:
                break  # nothing worth keeping is left
            if not chosen and unit.score < first_floor:
                break
            line = lines[unit.turn]
            if unit.turn in opened:
                price = count(" … " + unit.text)
            else:
                price = count(line.prefix + unit.text + "\n")
                if line.date and line.date not in dated:
                    price += count(f"[{line.date}]\n")
            if used + price > target:
                misses += 1
                if misses > 200 or used >= target:
                    break
                continue
            used += price
            opened.add(unit.turn)
            if line.date:
                dated.add(line.date)
            chosen.append(unit)
        if not chosen:
            if whole:
                return ""  # lines of older summaries are kept whole or not at all
            top = ranked[0]
            line = lines[top.turn]
            prefix = (f"[{line.date}]\n" if line.date else "") + line.prefix + ("… " if top.part else "")
            cut = self._clip_to(top.text, target, lambda t: prefix + t)
            return prefix + cut if cut is not None else ""
        text = _render_units(chosen, lines)
        if count(text) <= target:
            return text
        keep = self._longest_fitting(lambda n: _render_units(chosen[:n], lines), len(chosen) - 1, target)
        return _render_units(chosen[:keep], lines) if keep else ""

    # ---- last resort -----------------------------------------------------------------------

    def _excerpt(self, text: str, target: int) -> str:
        if target <= 0 or not text.strip():
            return ""
        try:
            cut = self._clip_to(" ".join(text[-target * 8:].split()), target, lambda t: t)
        except Exception:
            return ""
        return cut or ""


def _render_units(chosen: Sequence[Unit], lines: Sequence[_Line]) -> str:
    by_turn: dict[int, list[Unit]] = {}
    for unit in chosen:
        by_turn.setdefault(unit.turn, []).append(unit)
    out: list[str] = []
    shown_date = ""
    # The date once above the turns of each day (~8 tokens a line saved), unless some turns
    # have no date: under a date line they would look dated, so then each dated line says it.
    grouped = all(lines[turn].date for turn in by_turn)
    for turn in sorted(by_turn):
        line = lines[turn]
        if grouped and line.date != shown_date:
            out.append(f"[{line.date}]")
            shown_date = line.date
        parts = sorted(by_turn[turn], key=lambda u: u.part)
        pieces: list[str] = ["… "] if parts[0].part else []  # sentences were left out before it
        previous = parts[0].part
        for index, unit in enumerate(parts):
            if index:
                pieces.append(" " if unit.part == previous + 1 else " … ")
            pieces.append(unit.text)
            previous = unit.part
        if line.parts > 1 and parts[-1].part < line.parts - 1:
            pieces.append(" …")
        inline = f"[{line.date}] " if line.date and not grouped else ""
        out.append(inline + line.prefix + "".join(pieces))
    return "\n".join(out)


_SECTION_ORDER = ("Task", "User requests", "Decisions", "Progress", "Files", "Commands", "Errors", "Next")
_ULTRA_LABELS = {"Task": "Task", "User requests": "Asked", "Decisions": "Decisions", "Progress": "State",
                 "Files": "Files", "Commands": "Commands", "Errors": "Errors", "Next": "Next"}


def _grouped(selection: Sequence[_Item]) -> list[tuple[str, list[str]]]:
    by_section: dict[str, list[_Item]] = {}
    for item in selection:
        by_section.setdefault(item.section, []).append(item)
    out = []
    for name in _SECTION_ORDER:
        if name in by_section:
            out.append((name, [it.text for it in sorted(by_section[name], key=lambda it: it.order)]))
    return out


def _render_sections(selection: Sequence[_Item]) -> str:
    blocks = []
    for name, texts in _grouped(selection):
        blocks.append(f"{name}:\n" + "\n".join(f"- {t}" for t in texts))
    return "\n\n".join(blocks)


def _render_lines(selection: Sequence[_Item]) -> str:
    lines = []
    for name, texts in _grouped(selection):
        separator = ", " if name == "Files" else "; "
        lines.append(f"{_ULTRA_LABELS[name]}: {separator.join(texts)}")
    return "\n".join(lines)


def _item_chars(level: Level, target: int) -> int:
    return max(_ITEM_CHARS[level], min(_MAX_ITEM_CHARS, target // 8))


def _is_lookup(command: str) -> bool:
    """A command that only reads (grep, find, cat ...): worth little in a short summary."""
    for part in command.replace("&&", ";").replace("|", ";").split(";"):
        words = part.split()
        if words and words[0] not in _LOOKUP_COMMANDS and not (words[0] == "sed" and "-n" in words):
            return False
    return True
