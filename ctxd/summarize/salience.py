"""How much a candidate (a sentence, a chat turn, a line of an older summary) is worth
keeping: what later questions need, scored within the request.

* rarity: the IDF of its words over the request's own candidates (a word said once in
  the session says more than one said in every turn), summed and damped by length;
* named entities (capitalised words not at a sentence start), numbers, dates
  (months, weekdays, years, "yesterday", "last week"), places ("in Paris"), file paths,
  identifiers, errors, outcomes and decisions;
* overlap with the query: the goal and the focus, and, with less weight, the newest
  user messages of the request;
* minus filler ("Let me…", "Great!"), headings, fragments and repeated boilerplate.

Coding-agent prose and chat weigh these differently (``_AGENT_WEIGHTS``,
``_CHAT_WEIGHTS``); in a chat, praise and feelings do not count as rare words
(``_CHAT_STOP``). :func:`salience` gives the chat measure per token for callers that
choose among whole messages (the folded user messages) rather than summarize them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ctxd.summarize.base import Count, SummaryRequest
from ctxd.summarize.chat import line_body
from ctxd.summarize.text import not_the_users, text_blocks

_FILLER = re.compile(r"(?i)^(let me|let's|now let's|now,? let me|i'll|i will|first,? |great|perfect|okay|ok,|"
                     r"alright|sure|now i|i need to|i see|looking at|here is|here's|i apologize|sorry|thanks|"
                     r"thank you|excellent|good|nice|wow|hey|hi|hello|oh|aw+|haha|lol|yeah|yes|no problem|"
                     r"you too|same here|me too|bye|take care)\b")


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:['’][a-z]+)?|\d+(?:[.,:/]\d+)*")
_CAPITALISED = re.compile(r"\b[A-Z][A-Za-z0-9'’&-]*[A-Za-z0-9]|\b[A-Z]\b")
DATE = re.compile(
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
DATE_WORDS = frozenset("""January February March April May June July August September October November December
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
NOT_NAMES = frozenset("""i i'm i've i'll i'd i’m i’ve i’ll i’d ok okay hey hi hello oh wow yeah yes no
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


@dataclass(slots=True)
class Unit:
    """A chat candidate: a whole turn, one sentence of a long turn, or an older summary's line."""

    turn: int            # index of its line in the output (a turn, or a line of a summary)
    part: int            # sentence number within the turn (0 for whole turns and lines)
    text: str            # verbatim
    score: float = 0.0
    words: list[str] = field(default_factory=list)
    tier: int = 0
    """Units of a later tier are taken only once every worthwhile one of earlier tiers is."""


def content_words(text: str) -> list[str]:
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
    if any(t in DATE_WORDS for t in tokens):
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
        if match.group(0).lower() in NOT_NAMES:
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
# over 7-17k windows 1.30x -> 1.36x a sliding window (docs/decisions.md).
_CHAT_WEIGHTS = _Weights(rarity=3.0, rarity_cap=7.0, recency=0.3, first=0.0, entity=0.6, number=0.5,
                         number_word=0.2, date=1.7, place=0.3, path=1.0, ident=0.3, outcome=0.2, decision=0.8,
                         error=0.3, filler=1.0, question=0.4, long=0.0, personal=0.45)


class Analysis:
    """IDF over the request's own candidates, and the query terms."""

    __slots__ = ("idf", "mean_rarity", "strong", "weak", "default_idf")

    def __init__(self, strong: frozenset[str], weak: frozenset[str]) -> None:
        self.idf: dict[str, float] = {}
        self.mean_rarity = 1.0
        self.default_idf = 1.0
        self.strong = strong
        self.weak = weak

    @classmethod
    def of(cls, request: SummaryRequest, *, chat: bool = False) -> Analysis:
        strong = frozenset(content_words(" ".join(t for t in (request.goal, request.focus) if t)))
        weak: set[str] = set()
        if request.kind != "checkpoint_merge":
            seen = 0
            for message in reversed(request.messages):
                if message.role != "user" or not_the_users(message):
                    continue
                text = " ".join(text_blocks(message))[:2000]
                if not text:
                    continue
                weak.update(content_words(text))
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

    def score_units(self, units: list[Unit], turns: int, *, lines: bool = False) -> None:
        """Scores chat units in place (each unit's ``score`` holds its role adjustment).
        ``lines``: the units are lines of older summaries, scored without their
        ``[date] Speaker:`` prefix."""
        bodies = [line_body(u.text) for u in units] if lines else [u.text for u in units]
        for unit, body in zip(units, bodies):
            unit.words = [w for w in content_words(body) if w not in _CHAT_STOP]
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


def density(score: float, tokens: int) -> float:
    """A unit's salience per square root of its cost (negative scores stay negative)."""
    return score / math.sqrt(max(1, tokens)) if score > 0 else score


def salience(texts: Sequence[str], count: Count, goal: str | None = None) -> list[float]:
    """How much each of ``texts`` (turns of one conversation, oldest first) is worth
    keeping, per token of its length: the chat summaries' own measure (rare words,
    names, numbers, dates, places; a little recency), for callers that choose among
    whole messages (the folded user messages) rather than summarize them."""
    units = [Unit(i, 0, text) for i, text in enumerate(texts)]
    if not units:
        return []
    analysis = Analysis(frozenset(content_words(goal or "")), frozenset())
    analysis.score_units(units, len(units))
    return [density(u.score, count(u.text) + 4) for u in units]
