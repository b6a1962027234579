"""The summarizer that needs no model: deterministic, offline, always available.

It is the embedded default and the fallback of every chain, so it must never fail and
never exceed ``target_tokens`` (measured with the injected counter).

**What it keeps: what later questions need.** Every candidate (a sentence, a chat turn,
a line of an older summary) gets a *salience* score computed within the request:

* rarity: the IDF of its words over the request's own sentences (a word said once in
  the session says more than one said in every turn), summed and damped by length;
* named entities (capitalised words not at a sentence start), numbers, dates
  (months, weekdays, years, "yesterday", "last week"), places ("in Paris"), file paths,
  identifiers, errors, outcomes and decisions;
* overlap with the query: the goal and the focus, and, with less weight, the newest
  user messages of the request;
* minus filler ("Let me…", "Great!"), headings, fragments and repeated boilerplate.

The token target is spent on the best candidates, not on per-level quotas: a large
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
  do not count as rare words (``_CHAT_STOP``); a target too small for the best turn
  gets that turn's beginning, not a lesser scrap.

``checkpoint_merge`` requests (older summaries as assistant messages): sectioned
summaries are merged by section (facts re-extracted, prose lines by salience); chat
summaries keep their highest-salience lines whole, or not at all, in order.

``must_survive`` lists what the LLM summarizers are told must survive (``prompt.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ctxd.engine.context import is_demonstration, is_observation
from ctxd.engine.extract import Extraction, extract
from ctxd.protocol.message import ImageBlock, Message, TextBlock, ThinkingBlock, image_text, message_text
from ctxd.summarize.base import Count, Level, SummaryRequest, SummaryResult

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

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[*])")
_CHAT_SPLIT = re.compile(r"(?<=[.!?…])\s+(?=[A-Z0-9\"'“‘(\[])")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_PATH = re.compile(r"(?:[\w.~-]+/)+[\w.-]+|\b[\w-]+\.(?:py|ts|tsx|js|jsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|md|"
                   r"toml|yaml|yml|json|sql|sh|txt|cfg|ini|html|css|lock)\b")
_FILLER = re.compile(r"(?i)^(let me|let's|now let's|now,? let me|i'll|i will|first,? |great|perfect|okay|ok,|"
                     r"alright|sure|now i|i need to|i see|looking at|here is|here's|i apologize|sorry|thanks|"
                     r"thank you|excellent|good|nice|wow|hey|hi|hello|oh|aw+|haha|lol|yeah|yes|no problem|"
                     r"you too|same here|me too|bye|take care)\b")
_TAG_LINE = re.compile(r"</?[A-Za-z_][\w-]*>")
_LOOKUP_COMMANDS = frozenset({"grep", "egrep", "rg", "ag", "find", "ls", "cat", "head", "tail", "wc", "echo",
                              "pwd", "tree", "less", "more", "file", "stat", "which", "type", "cd"})
_INSTRUCTION = re.compile(r"(?i)\b(must|should|don't|do not|never|always|please|make sure|ensure|require[sd]?|"
                          r"only|avoid|keep|use)\b")
_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?([A-Za-z][A-Za-z /]{1,40}?)\s*:?\s*$")
_INLINE = re.compile(r"^\s*([A-Za-z][A-Za-z ]{1,20}):\s+(\S.*)$")
_MARKERS = ("[DECISION]", "[NEXT]", "[ARTIFACT]", "[GOAL]", "[CHECKPOINT]")
_FACT_SECTIONS = ("decision", "file", "artifact", "command", "error", "next", "blocker")
_REQUEST_SECTIONS = ("task", "user request", "user instruction", "request", "instruction")
_SECTION_LABELS = frozenset({"task", "user requests", "asked", "decisions", "progress", "state", "files",
                             "commands", "errors", "next", "accomplished", "current work", "user instructions",
                             "next steps", "blockers", "artifacts", "key decisions"})

# ---- salience features ------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:['’][a-z]+)?|\d+(?:[.,:/]\d+)*")
_CAPITALISED = re.compile(r"\b[A-Z][A-Za-z0-9'’&-]*[A-Za-z0-9]|\b[A-Z]\b")
_DATE = re.compile(
    r"\b(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
    r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|"
    r"(?:19|20)\d\d|\d{4}-\d\d-\d\d)\b"
    r"|(?i:\b(?:yesterday|today|tonight|tomorrow|recently|(?:last|next|this|past) (?:week|weekend|month|year|"
    r"night|summer|winter|spring|fall|autumn|monday|tuesday|wednesday|thursday|friday|saturday|sunday)|"
    r"\w+ (?:days?|weeks?|months?|years?) ago|(?:in|since|until|by) (?:the )?(?:19|20)\d\d)\b)")
# Cue words, looked up in a candidate's (lower-cased) word set: one findall per
# candidate instead of a case-insensitive regex per cue, which was most of the time.
_OUTCOME_WORDS = frozenset("""fixed added implemented created updated changed passes passed passing works working
done completed resolved refactored removed renamed found because""".split())
_OUTCOME_PHRASES = ("root cause", "the issue", "the problem", "the bug")
_DECISION_WORDS = frozenset({"decided", "chose", "prefer"})
_DECISION_PHRASES = ("will use", "go with", "settled on", "instead of")
_ERROR_WORDS = frozenset({"error", "exception", "fail", "fails", "failed", "failing", "traceback", "crash",
                          "crashed", "crashes", "crashing"})
_NUMBER_WORDS = frozenset("""two three four five six seven eight nine ten eleven twelve fifteen twenty thirty
forty fifty hundred thousand million billion dozen half""".split())
_DATE_WORDS = frozenset("""January February March April May June July August September October November December
Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday Saturday
Sunday""".split())
_RELATIVE_DAYS = frozenset({"yesterday", "today", "tonight", "tomorrow", "recently", "ago"})
_FIRST_PERSON = frozenset({"i", "i'm", "i've", "i'd", "i'll", "my", "me", "we", "we're", "we've", "our", "us",
                           "i’m", "i’ve", "i’d", "i’ll", "we’re", "we’ve"})
_PERIOD_LEAD = frozenset({"last", "next", "this", "past"})
_PERIODS = frozenset("""week weekend month year night summer winter spring fall autumn monday tuesday wednesday
thursday friday saturday sunday""".split())
_YEAR = re.compile(r"(?:19|20)\d\d")
_SLASH_PATH = re.compile(r"(?:[\w.~-]+/)+[\w.-]+")
_EXT_FILE = re.compile(r"(?<=\w)\.(?:py|ts|tsx|js|jsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|md|toml|yaml|yml|json|sql|"
                       r"sh|txt|cfg|ini|html|css|lock)\b")
_CAMEL = re.compile(r"\b[A-Z][a-z]+[A-Z]\w*\b")
_SNAKE = re.compile(r"\b[a-z]+_[a-z_0-9]+\b")
_PLACE = re.compile(r"\b(?:in|at|to|from|near|visit(?:ed|ing)?|around|across)\s+(?:the\s+)?[A-Z][a-z]{2,}")
# Capitalised words that are not names (besides the first word of a sentence).
_NOT_NAMES = frozenset("""i i'm i've i'll i'd i’m i’ve i’ll i’d ok okay hey hi hello oh wow yeah yes no
thanks thank sure well so and but the a an it its that this these those there they we you he she my our your
his her their what when where which who why how if then also just please let lets let's mr mrs ms dr st
""".split())
_STOP = frozenset("""the and for are but not you all any can had her was one our out day get has him his how man
new now old see two way who boy did its let put say she too use this that with from have will what when where
which there their them then than into about also just like need make sure should could would while these those
been being were your more some such only other over very each does done goal active status priority yes yeah
really much many well know think thing things going want got getting gonna wanna lot lots good great nice
glad hear happy love awesome amazing cool wow thanks thank hey hello sounds sound feel feeling felt always
never ever even still yet maybe something anything everything someone anyone everyone time times here back
because since though although after before again right now today just might must shall may can't don't
didn't doesn't isn't wasn't aren't weren't won't wouldn't couldn't shouldn't it's i'm i've i'll i'd you're
you've you'll that's there's what's let's he's she's they're we're we've they've
""".split())

# In a chat, praise and feelings ("inspiring", "so proud", "means a lot") are said in
# every other turn and carry no fact a later question could ask about: however rare
# one of them is in a session, it does not make a turn worth keeping.
_CHAT_STOP = frozenset("""inspiring inspired inspiration inspire inspires admirable incredible wonderful fantastic
awesome amazing proud rewarding heartwarming glad appreciate appreciated appreciation supportive support
supporting definitely totally absolutely agreed agree agreeing congrats congratulations cherish special
beautiful gorgeous lovely cute fun blast enjoy enjoyed enjoying excited exciting stoked thrilled super pretty
kind sweet means meant meaningful powerful positive journey dedication commitment passion passionate impact
difference hope hoping happiness joy peace peaceful grateful thankful wish wishing luck courage strength brave
tough care caring heart important essential crucial truly true worth fulfilling fulfilled motivation
motivated motivating motivates determination determined encouraging encouragement encourage
cool neat rock rocks shine shining keep kept wow omg yay hooray sounds sounded hear heard share sharing
happy sad nice great good""".split())

_CHAT_LINE = re.compile(r"^(?:\[([^\]\n]{0,39}\d[^\]\n]{0,39})\]\s+)?([^\s:\[\]\-*•#>|`][^:\n]{0,63}):\s+(?=\S)")
"""A line of a condensed transcript, ``[8 May 2023] Caroline: `` (the match is the prefix;
a date has a digit, so ``[DECISION] x: y`` is not one, and a bullet is not a speaker)."""
_DATE_HEADING = re.compile(r"^\[([^\]\n]{0,39}\d[^\]\n]{0,39})\]$")
"""A condensed transcript's date line, ``[8 May 2023]``: the turns under it were said that day."""
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_MONTH_BY_PREFIX = {m[:3].lower(): m for m in _MONTHS}
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+([A-Za-z]{3,9})\.?,?\s+(\d{4})\b")
_MONTH_DAY_YEAR = re.compile(r"\b([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b")
_ISO_DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")


@dataclass(slots=True)
class _Item:
    priority: float
    section: str
    order: int
    text: str


@dataclass(slots=True)
class _Unit:
    """A chat candidate: a whole turn, one sentence of a long turn, or an older summary's line."""

    turn: int            # index of its line in the output (a turn, or a line of a summary)
    part: int            # sentence number within the turn (0 for whole turns and lines)
    text: str            # verbatim
    score: float = 0.0
    words: list[str] = field(default_factory=list)
    tier: int = 0
    """Units of a later tier are taken only once every worthwhile one of earlier tiers is."""


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
            if _chat_summaries(request.messages):
                return self._merge_chat(request)
        elif is_chat(request.messages):
            return self._chat(request)
        facts = extract(request.messages, max_items=max(50, target // 40))
        analysis = _Analysis.of(request)
        requests, progress = _candidates(request, analysis)
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
            items.append(_Item(0.0 + i * 0.5, "Decisions", i, _clip(text, chars)))
        if requests:
            items.append(_Item(0.0, "Task", 0, _clip(requests[0], chars * 2 if level != "ultra" else chars)))
            rest = requests[1:]
            for i, text in enumerate(rest):
                age = len(rest) - 1 - i  # the latest request matters most after the task itself
                priority = 1.0 if age == 0 else 3.0 + age * 0.1
                items.append(_Item(priority, "User requests", i, _clip(text, chars)))
        next_steps = facts.next_steps
        for i, text in enumerate(next_steps):
            items.append(_Item(1.0 + (len(next_steps) - 1 - i) * 0.3, "Next", i, _clip(text, chars)))
        for i, path in enumerate(facts.files_modified):
            items.append(_Item(2.0 + i * 0.001 if i < 6 else 2.5 + i * 0.05, "Files", i, path))
        errors = facts.errors
        for i, text in enumerate(errors):
            items.append(_Item(2.0 + (len(errors) - 1 - i) * 0.3, "Errors", i, _clip(text, chars)))
        decided = {" ".join(d.split()).lower() for d in facts.key_decisions}
        rank = 0
        for score, order, text in progress:  # best first
            if text.lower() in decided:
                continue
            # The best sentences rank with the first errors, weak ones after the commands;
            # many equally good ones still leave room for the other kinds.
            items.append(_Item(6.0 - min(score, 7.0) * 0.5 + rank * 0.02, "Progress", order, _clip(text, chars)))
            rank += 1
        useful = facts.commands if level == "detailed" else [c for c in facts.commands if not _is_lookup(c)]
        for i, text in enumerate(useful):
            first_line = text.splitlines()[0] if text else text
            items.append(_Item(4.0 + (len(useful) - 1 - i) * 0.05, "Commands", i,
                               f"`{_clip(first_line, min(chars, 200))}`"))
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
            if self._count(wrap(_clip(text, mid))) <= budget:
                lo = mid
            else:
                hi = mid - 1
        if lo < 8:
            return None
        return _clip(text, lo)

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
            shorter = _clip(shorter, max(8, int(len(shorter) * 0.8)))
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
        units: list[_Unit] = []
        for message in request.messages:
            if message.role not in ("user", "assistant"):
                continue
            text = chat_text(message)
            images = _images(message)
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
                unit = _Unit(turn, part, piece)
                unit.tier = 2 if part >= lines[-1].parts else 1 if user else 0
                units.append(unit)
        if not units:
            return ""
        _Analysis.of(request, chat=True).score_units(units, len(lines))
        return self._pack_units(units, lines, request.target_tokens, whole=False)

    def _merge_chat(self, request: SummaryRequest) -> str:
        """Older chat summaries: their lines are units, kept whole or not at all."""
        lines: list[_Line] = []
        units: list[_Unit] = []
        for message in request.messages:
            for text in _texts(message):
                date = ""
                for raw in text.splitlines():
                    line = raw.strip()
                    if not line:
                        continue
                    heading = _DATE_HEADING.match(line)
                    if heading:
                        date = heading.group(1)
                        continue
                    line_date = date
                    found = _CHAT_LINE.match(line)
                    if found and found.group(1):  # a line written before dates became headings
                        line_date, line = found.group(1), line[found.start(2):]
                    units.append(_Unit(len(lines), 0, line))
                    lines.append(_Line(line_date, "", 1))
        if not units:
            return ""
        _Analysis.of(request, chat=True).score_units(units, len(lines), lines=True)
        return self._pack_units(units, lines, request.target_tokens, whole=True)

    def _pack_units(self, units: list[_Unit], lines: list[_Line], target: int, *, whole: bool) -> str:
        """The best units that fit ``target``, rendered in their original order."""
        count = self._count
        worth = [u for u in units if u.score > 0]
        # Salience per token, not per unit: a target holds more of what later questions
        # ask when a long turn must be worth its length (on LoCoMo, score / sqrt(tokens)
        # keeps 1.3x the answer-bearing turns that ranking by score alone keeps).
        cost = {id(u): count(u.text) + 4 for u in worth or units}
        ranked = sorted(worth or units, key=lambda u: (u.tier, -_density(u.score, cost[id(u)]), u.turn, u.part))
        # The first unit must be worth half the best one: a tiny target gets the best
        # unit's beginning rather than whatever scrap fits ("Yep!").
        best = max(u.score for u in ranked)
        first_floor = best / 2 if best > 0 else float("-inf")
        chosen: list[_Unit] = []
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


def _density(score: float, tokens: int) -> float:
    """A unit's salience per square root of its cost (negative scores stay negative)."""
    return score / math.sqrt(max(1, tokens)) if score > 0 else score


def _render_units(chosen: Sequence[_Unit], lines: Sequence[_Line]) -> str:
    by_turn: dict[int, list[_Unit]] = {}
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


# ---- chat messages --------------------------------------------------------------------------

def _not_the_users(message: Message) -> bool:
    """Tool output or a worked example sent as a user message (engine/context.py)."""
    return is_observation(message) or is_demonstration(message)


def is_chat(messages: Sequence[Message]) -> bool:
    """True for a conversation without tools (people talking, or a plain chat with a model):
    no tool calls or results, no tool output sent as a user message, no shell blocks."""
    has_text = False
    for message in messages:
        if message.role == "tool" or message.tool_calls:
            return False
        if _not_the_users(message):
            return False
        content = message.content
        if isinstance(content, list):
            if not all(isinstance(block, (TextBlock, ThinkingBlock, ImageBlock)) for block in content):
                return False
        for text in _texts(message):
            if "```" in text and message.role == "assistant":
                return False  # a text-protocol agent's command (or code: a technical chat)
            has_text = True
    return has_text


def is_chat_request(request: SummaryRequest) -> bool:
    """A chat conversation, or older summaries that are condensed chat transcripts."""
    if request.kind == "checkpoint_merge":
        return _chat_summaries(request.messages)
    return is_chat(request.messages)


def chat_text(message: Message) -> str:
    """A turn's words, verbatim (whitespace inside a line kept; line breaks become spaces)."""
    texts = _texts(message)
    if not texts:
        return ""
    text = " ".join(t.strip() for t in texts)
    if "\n" in text:
        text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return text


def _images(message: Message) -> list[str]:
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


def _chat_summaries(messages: Sequence[Message]) -> bool:
    """Older summaries that are condensed transcripts: most lines are ``[date] Speaker: ...``."""
    speaker_lines = other = 0
    for message in messages:
        for text in _texts(message):
            for raw in text.splitlines():
                line = raw.strip()
                if not line or _DATE_HEADING.match(line):
                    continue
                match = _CHAT_LINE.match(line)
                if match and (match.group(1) or match.group(2).strip().lower() not in _SECTION_LABELS):
                    speaker_lines += 1
                else:
                    other += 1
    return speaker_lines > 0 and speaker_lines >= other


# ---- salience ----------------------------------------------------------------------------------

def _body(line: str) -> str:
    """A transcript line without its ``[date] Speaker:`` prefix."""
    found = _CHAT_LINE.match(line)
    return line[found.end():] if found else line


def _words(text: str) -> list[str]:
    """Content words, lower-cased, for IDF and query overlap (numbers are a feature of
    their own: as words, every distinct number would look rare)."""
    out = []
    for word in _WORD.findall(text):
        low = word.lower()
        if len(low) >= 3 and low not in _STOP and not low[0].isdigit():
            if low.endswith(("'s", "’s")):
                low = low[:-2]
            out.append(low)
    return out


def _has_date(tokens: list[str], lows: set[str], digits: list[str]) -> bool:
    """A month, weekday, year, "yesterday", "last week", "three days ago"..."""
    if not lows.isdisjoint(_RELATIVE_DAYS):
        return True
    if any(t in _DATE_WORDS for t in tokens):
        return True
    if any(len(t) == 4 and _YEAR.fullmatch(t) for t in digits):
        return True
    if not lows.isdisjoint(_PERIOD_LEAD) and not lows.isdisjoint(_PERIODS):
        previous = ""
        for token in tokens:
            low = token.lower()
            if previous in _PERIOD_LEAD and low in _PERIODS:
                return True
            previous = low
    return False


def _has_path(text: str) -> bool:
    return bool(("/" in text and _SLASH_PATH.search(text)) or ("." in text and _EXT_FILE.search(text)))


def _has_ident(text: str) -> bool:
    """`code`, snake_case, CamelCase or a call()."""
    return bool(text.count("`") >= 2 or "()" in text or ("_" in text and _SNAKE.search(text))
                or _CAMEL.search(text))


def _entities(text: str) -> int:
    """Capitalised words that do not start a sentence (names, places, titles)."""
    found = 0
    for match in _CAPITALISED.finditer(text):
        start = match.start()
        i = start - 1
        while i >= 0 and text[i] in " \t\"'“‘(*[":
            i -= 1
        if i < 0 or text[i] in ".!?:;\n…-–—]":
            continue  # a sentence (or a quotation) starts here
        if match.group(0).lower() in _NOT_NAMES:
            continue
        found += 1
        if found >= 4:
            break
    return found


@dataclass(frozen=True, slots=True)
class _Weights:
    """How much each feature adds to a candidate's salience."""

    rarity: float
    rarity_cap: float
    recency: float
    first: float
    entity: float
    number: float
    number_word: float
    date: float
    place: float
    path: float
    ident: float
    outcome: float
    decision: float
    error: float
    filler: float
    question: float
    long: float
    personal: float = 0.0
    """Per first-person word, up to three: a speaker's own news ("I signed up for a pottery
    class yesterday") is what later questions ask about; praise and agreement are not."""


# Agent prose: paths, identifiers, outcomes and decisions say most; recent work counts.
_AGENT_WEIGHTS = _Weights(rarity=2.0, rarity_cap=4.0, recency=1.0, first=0.3, entity=0.5, number=0.5,
                          number_word=0.2, date=0.8, place=0.3, path=1.5, ident=1.0, outcome=1.5, decision=1.5,
                          error=0.8, filler=2.5, question=0.0, long=0.5)
# Chat: rare words carry the answers (on LoCoMo the IDF term alone ranks evidence turns
# better than the mix of cues did: AUC 0.78 against 0.74); cues add a little each, names
# and numbers a little more (entity 0.3 -> 0.6, number 0.3 -> 0.5: once praise stopped
# counting as rare, LoCoMo answers kept at 16k 31.7% -> 33.2%; 1.0 / 0.8 kept 32.5%).
# A speaker's own news, and when it happened, weigh more (first person 0.45 a word, a date
# 0.7 -> 1.7): LoCoMo's evidence turns ranked at AUC 0.781 -> 0.81, evidence turns kept
# over 7-17k windows 1.30x -> 1.36x a sliding window (docs/performance.md).
_CHAT_WEIGHTS = _Weights(rarity=3.0, rarity_cap=7.0, recency=0.3, first=0.0, entity=0.6, number=0.5,
                         number_word=0.2, date=1.7, place=0.3, path=1.0, ident=0.3, outcome=0.2, decision=0.8,
                         error=0.3, filler=1.0, question=0.4, long=0.0, personal=0.45)


class _Analysis:
    """IDF over the request's own candidates, and the query terms."""

    __slots__ = ("idf", "mean_rarity", "strong", "weak", "default_idf")

    def __init__(self, strong: frozenset[str], weak: frozenset[str]) -> None:
        self.idf: dict[str, float] = {}
        self.mean_rarity = 1.0
        self.default_idf = 1.0
        self.strong = strong
        self.weak = weak

    @classmethod
    def of(cls, request: SummaryRequest, *, chat: bool = False) -> _Analysis:
        strong = frozenset(_words(" ".join(t for t in (request.goal, request.focus) if t)))
        weak: set[str] = set()
        if request.kind != "checkpoint_merge":
            seen = 0
            for message in reversed(request.messages):
                if message.role != "user" or _not_the_users(message):
                    continue
                text = " ".join(_texts(message))[:2000]
                if not text:
                    continue
                weak.update(_words(text))
                seen += 1
                if seen >= 2:
                    break
        return cls(strong, frozenset(weak - strong))

    def fit(self, docs: Iterable[list[str]]) -> None:
        """Document frequencies over ``docs`` (each a list of content words)."""
        df: dict[str, int] = {}
        n = 0
        for words in docs:
            n += 1
            for word in set(words):
                df[word] = df.get(word, 0) + 1
        total = max(1, n)
        self.idf = {w: math.log((total + 1) / (c + 0.5)) for w, c in df.items()}
        self.default_idf = math.log((total + 1) / 0.5)

    def rarity(self, words: list[str]) -> float:
        distinct = set(words)
        if not distinct:
            return 0.0
        idf = self.idf
        default = self.default_idf
        return sum(idf.get(w, default) for w in distinct) / math.sqrt(len(distinct) + 1)

    def set_mean(self, rarities: list[float]) -> None:
        positive = [r for r in rarities if r > 0]
        self.mean_rarity = (sum(positive) / len(positive)) if positive else 1.0

    def score(self, text: str, words: list[str], rarity: float, *, recency: float = 0.0,
              first: bool = False, chat: bool = False) -> float:
        """The salience of one candidate (higher is better; <= 0 is not worth keeping)."""
        w = _CHAT_WEIGHTS if chat else _AGENT_WEIGHTS
        filler = _FILLER.match(text) is not None
        score = 0.5
        if not (filler and not chat):  # an agent's "Let me look at X" is not informative however rare X is
            score += min(w.rarity_cap, w.rarity * rarity / self.mean_rarity)
        score += recency * w.recency
        if first:
            score += w.first
        entities = _entities(text)
        if entities:
            score += w.entity * min(3, entities)
        tokens = _WORD.findall(text)
        lows = {t.lower() for t in tokens}
        digits = [t for t in tokens if t[0].isdigit()]
        if digits:
            score += w.number * min(2, len(digits))
        number_words = len(lows & _NUMBER_WORDS)
        if number_words:
            score += w.number_word * min(2, number_words)
        if _has_date(tokens, lows, digits):
            score += w.date
        if _PLACE.search(text):
            score += w.place
        if w.personal:
            mine = len(lows & _FIRST_PERSON)
            if mine:
                score += w.personal * min(3, mine)
        if _has_path(text):
            score += w.path
        if _has_ident(text):
            score += w.ident
        low = text.lower()
        if not lows.isdisjoint(_OUTCOME_WORDS) or any(p in low for p in _OUTCOME_PHRASES):
            score += w.outcome
        if not lows.isdisjoint(_DECISION_WORDS) or any(p in low for p in _DECISION_PHRASES):
            score += w.decision
        if not lows.isdisjoint(_ERROR_WORDS):
            score += w.error
        if filler:
            score -= w.filler
        stripped = text.rstrip()
        if stripped.endswith(":"):
            score -= 1.0
        elif stripped.endswith("?"):
            score -= w.question  # a question carries less than its answer
        if len(text) < 25:
            score -= 1.0
        elif len(text) > 400:
            score -= w.long
        if self.strong:
            score += min(3, len(self.strong.intersection(words))) * 1.0
        if self.weak:
            score += min(2, len(self.weak.intersection(words))) * 0.5
        return score

    def score_units(self, units: list[_Unit], turns: int, *, lines: bool = False) -> None:
        """Scores chat units in place (each unit's ``score`` holds its role adjustment).
        ``lines``: the units are lines of older summaries, scored without their
        ``[date] Speaker:`` prefix."""
        bodies = [_body(u.text) for u in units] if lines else [u.text for u in units]
        for unit, body in zip(units, bodies):
            unit.words = [w for w in _words(body) if w not in _CHAT_STOP]
        self.fit(u.words for u in units)
        rarities = [self.rarity(u.words) for u in units]
        self.set_mean(rarities)
        n = max(1, turns)
        seen: dict[str, int] = {}
        for unit, body, rarity in zip(units, bodies, rarities):
            key = unit.text.lower()
            repeats = seen.get(key, 0)
            seen[key] = repeats + 1
            unit.score += self.score(body, unit.words, rarity, recency=unit.turn / n, chat=True)
            if len(set(unit.words)) < 3:
                unit.score -= 1.5  # "Yep!", "Me too, Mel.": rare-looking, but says nothing
            if repeats:
                unit.score -= 10.0  # said before, word for word: keep the first
            unit.words = []  # not needed any more


def salience(texts: Sequence[str], count: Count, goal: str | None = None) -> list[float]:
    """How much each of ``texts`` (turns of one conversation, oldest first) is worth
    keeping, per token of its length: the chat summaries' own measure (rare words,
    names, numbers, dates, places; a little recency), for callers that choose among
    whole messages (the folded user messages) rather than summarize them."""
    units = [_Unit(i, 0, text) for i, text in enumerate(texts)]
    if not units:
        return []
    analysis = _Analysis(frozenset(_words(goal or "")), frozenset())
    analysis.score_units(units, len(units))
    return [_density(u.score, count(u.text) + 4) for u in units]


# ---- coding-agent candidates ---------------------------------------------------------------

def _candidates(request: SummaryRequest, analysis: _Analysis
                ) -> tuple[list[str], list[tuple[float, int, str]]]:
    """User requests (oldest first) and scored progress sentences (score, order, text), best first."""
    if request.kind == "checkpoint_merge":
        return _checkpoint_candidates(request.messages, analysis)
    requests: list[str] = []
    raw: list[tuple[int, float, bool, str, list[str]]] = []  # order, recency, first, sentence, words
    seen: set[str] = set()
    repeats: dict[str, int] = {}
    n = max(1, len(request.messages))
    order = 0
    for index, message in enumerate(request.messages):
        if message.role == "user" and _not_the_users(message):
            continue  # tool output or a worked example sent as a user message: not the user's request
        texts = _texts(message)
        if not texts:
            continue
        if message.role == "user":
            request_text = _user_request(" ".join(texts))
            if request_text:
                requests.append(request_text)
            continue
        if message.role != "assistant":
            continue
        recency = index / n
        for text in texts:
            for position, sentence in enumerate(_sentences(text)):
                if sentence.startswith(_MARKERS):
                    continue  # decisions, artifacts and next steps have their own sections
                key = sentence.lower()
                if key in seen:
                    repeats[key] = repeats.get(key, 0) + 1
                    continue
                seen.add(key)
                order += 1
                raw.append((order, recency, position == 0, sentence, _words(sentence)))
    return requests, _scored(raw, repeats, analysis, bonus=0.0)


def _scored(raw: list[tuple[int, float, bool, str, list[str]]], repeats: dict[str, int], analysis: _Analysis,
            bonus: float) -> list[tuple[float, int, str]]:
    analysis.fit(words for _, _, _, _, words in raw)
    rarities = [analysis.rarity(words) for _, _, _, _, words in raw]
    analysis.set_mean(rarities)
    scored: list[tuple[float, int, str]] = []
    for (order, recency, first, sentence, words), rarity in zip(raw, rarities):
        score = analysis.score(sentence, words, rarity, recency=recency, first=first) + bonus
        # A sentence said over and over is boilerplate, not progress.
        score -= min(3.0, repeats.get(sentence.lower(), 0))
        if score > 0:
            scored.append((score, order, sentence))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return scored


def _checkpoint_candidates(messages: Sequence[Message], analysis: _Analysis
                           ) -> tuple[list[str], list[tuple[float, int, str]]]:
    """From earlier summaries: their task/request lines and their prose lines."""
    requests: list[str] = []
    raw: list[tuple[int, float, bool, str, list[str]]] = []
    seen: set[str] = set()
    n = max(1, len(messages))
    order = 0
    for index, message in enumerate(messages):
        section = ""
        for text in _texts(message):
            for line_raw in text.splitlines():
                line = line_raw.strip()
                if not line:
                    continue
                inline = _INLINE.match(line)
                heading = _HEADING.match(line) if not inline else None
                if heading and (line.endswith(":") or line.startswith("#")):
                    section = heading.group(1).lower()
                    continue
                label = inline.group(1).lower() if inline else section
                body = inline.group(2) if inline else line.lstrip("-*• ").strip()
                if label.startswith(_FACT_SECTIONS) or body.startswith(("[DECISION]", "[NEXT]", "[ARTIFACT]")):
                    continue
                if label.startswith(_REQUEST_SECTIONS) or label == "asked":
                    if body not in requests:
                        requests.append(body)
                    continue
                key = body.lower()
                if key in seen:
                    continue
                seen.add(key)
                order += 1
                raw.append((order, index / n, False, body, _words(body)))
    return requests, _scored(raw, {}, analysis, bonus=1.0)


def _texts(message: Message) -> list[str]:
    """The message's own words: text blocks only (tool calls and results are facts, not prose)."""
    content = message.content
    if content is None or message.role == "tool":
        return []
    if isinstance(content, str):
        return [content] if content.strip() else []
    return [b.text for b in content if isinstance(b, TextBlock) and b.text.strip()]


def _user_request(text: str) -> str | None:
    """What the user asked: the first real sentence plus instruction-like ones, verbatim."""
    text = _FENCE.sub(" ", text)
    if "<" in text:
        text = _TAG_LINE.sub("\n", text)
    sentences = [s for s in _sentences(text, min_words=1)]
    if not sentences:
        return None
    lead = next((i for i, s in enumerate(sentences) if len(s.split()) >= 4), 0)
    keep = [sentences[lead]]
    keep.extend(s for s in sentences[lead + 1: lead + 8] if _INSTRUCTION.search(s))
    joined = " ".join(keep)
    if len(joined.split()) < 2 and not _PATH.search(joined):
        return None  # "continue", "ok": nothing to keep
    return joined


def _sentences(text: str, min_words: int = 3) -> list[str]:
    if "```" in text:
        text = _FENCE.sub("\n", text)
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


def _is_lookup(command: str) -> bool:
    """A command that only reads (grep, find, cat ...): worth little in a short summary."""
    for part in command.replace("&&", ";").replace("|", ";").split(";"):
        words = part.split()
        if words and words[0] not in _LOOKUP_COMMANDS and not (words[0] == "sed" and "-n" in words):
            return False
    return True


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"


# ---- what must survive (for the LLM prompt) -------------------------------------------------

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
        out.errors = [_clip(e, 160) for e in facts.errors[-max_items:]]
        out.decisions = [_clip(d, 200) for d in facts.key_decisions[:max_items]]
        out.next_steps = [_clip(s, 160) for s in facts.next_steps[-max_items:]]
        _, progress = _candidates(request, _Analysis.of(request))
        top = sorted(progress[: max_items * 2], key=lambda p: p[1])  # the best, in order
        best = [text for _, _, text in top]
    else:
        units: list[_Unit] = []
        turns = 0
        for message in messages:
            if message.role not in ("user", "assistant"):
                continue
            if merge:
                for text in _texts(message):
                    for raw in text.splitlines():
                        heading = _DATE_HEADING.match(raw.strip())
                        if heading:
                            dates.setdefault(heading.group(1))
                        elif raw.strip():
                            units.append(_Unit(turns, 0, raw.strip()))
                            turns += 1
                continue
            text = chat_text(message)
            if not text:
                continue
            speakers.setdefault(speaker_of(message))
            date = date_of(message)
            if date:
                dates.setdefault(date)
            units.append(_Unit(turns, 0, text))
            turns += 1
        if merge:
            for unit in units:
                found = _CHAT_LINE.match(unit.text)
                if found:
                    if found.group(1):
                        dates.setdefault(found.group(1))
                    speakers.setdefault(found.group(2).strip())
        if units:
            _Analysis.of(request, chat=True).score_units(units, turns, lines=merge)
            top_units = sorted((u for u in units if u.score > 0), key=lambda u: (-u.score, u.turn))[: max_items * 2]
            best = [_body(u.text) if merge else u.text for u in sorted(top_units, key=lambda u: u.turn)]
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
            if low in _NOT_NAMES or low in known or name in _DATE_WORDS or len(name) < 2:
                continue
            names.setdefault(low, name)
        for match in _DATE.finditer(body):
            numbers.setdefault(match.group(0).lower(), match.group(0))
        if any(c.isdigit() for c in body):
            for match in _NUMBER_PHRASE.finditer(body):
                value = match.group(0).strip()
                if value and not _DATE.fullmatch(value):
                    numbers.setdefault(value.lower(), value)
    out.names = list(names.values())[: max_items * 2]
    out.numbers = list(numbers.values())[: max_items * 2]
    out.speakers = list(speakers)[:max_items]
    out.dates = list(dates)[: max_items * 3]
    return out
