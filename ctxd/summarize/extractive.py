"""The summarizer that needs no model: deterministic, offline, always available.

It is the embedded default and the fallback of every chain, so it must never fail and
never exceed ``target_tokens`` (measured with the injected counter). It builds on
``ctxd.engine.extract`` (decisions, files, commands, errors, next steps) and adds the
user's requests and the assistant sentences that score best (position, paths and
identifiers, outcomes, decision words, overlap with the goal and focus). Items are
packed by priority: decisions and the user's task first, then next steps, files,
errors, progress prose and commands, so a smaller target drops prose before facts.

Output is a checkpoint in sections (``Task``, ``User requests``, ``Decisions``,
``Progress``, ``Files``, ``Commands``, ``Errors``, ``Next``), only the non-empty ones;
at ``ultra`` it is a few ``Label: a; b`` lines. The section names are ones
``extract`` reads back, so facts survive when the checkpoint is merged later.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxd.engine.extract import Extraction, extract
from ctxd.protocol.message import Message, TextBlock, message_text
from ctxd.summarize.base import Count, Level, SummaryRequest, SummaryResult

# Inputs above this many characters are summarized in a worker thread so the daemon's
# event loop keeps serving.
THREAD_THRESHOLD_CHARS = 200_000


@dataclass(frozen=True)
class _Quota:
    """How much of each kind a level keeps (before the token budget is applied)."""

    requests: int
    progress: int
    item_chars: int
    files: int
    commands: int
    errors: int
    decisions: int
    next_steps: int


_QUOTAS: dict[Level, _Quota] = {
    "detailed": _Quota(requests=8, progress=20, item_chars=300, files=40, commands=10, errors=8, decisions=20,
                       next_steps=8),
    "moderate": _Quota(requests=6, progress=7, item_chars=200, files=25, commands=5, errors=5, decisions=12,
                       next_steps=5),
    "compact": _Quota(requests=4, progress=3, item_chars=140, files=12, commands=3, errors=3, decisions=8,
                      next_steps=3),
    "ultra": _Quota(requests=1, progress=1, item_chars=100, files=6, commands=0, errors=1, decisions=3,
                    next_steps=1),
}

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[*])")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_PATH = re.compile(r"(?:[\w.~-]+/)+[\w.-]+|\b[\w-]+\.(?:py|ts|tsx|js|jsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|md|"
                   r"toml|yaml|yml|json|sql|sh|txt|cfg|ini|html|css|lock)\b")
_IDENT = re.compile(r"`[^`]+`|\b[a-z]+_[a-z_0-9]+\b|\b[A-Z][a-z]+[A-Z]\w*\b|\b\w+\(\)")
_OUTCOME = re.compile(r"(?i)\b(fixed|added|implemented|created|updated|changed|passes|passed|passing|works|"
                      r"working|done|completed|resolved|refactored|removed|renamed|found|root cause|because|"
                      r"the issue|the problem|the bug)\b")
_DECISION_WORD = re.compile(r"(?i)\b(decided|chose|will use|go with|settled on|instead of|prefer)\b")
_ERROR_WORD = re.compile(r"(?i)\b(error|exception|fails?|failed|failing|traceback|crash\w*)\b")
_FILLER = re.compile(r"(?i)^(let me|let's|now let's|now,? let me|i'll|i will|first,? |great|perfect|okay|ok,|"
                     r"alright|sure|now i|i need to|i see|looking at|here is|here's|i apologize|sorry|thanks|"
                     r"thank you|excellent|good|nice)")
_TAG_LINE = re.compile(r"</?[A-Za-z_][\w-]*>")
_LOOKUP_COMMANDS = frozenset({"grep", "egrep", "rg", "ag", "find", "ls", "cat", "head", "tail", "wc", "echo",
                              "pwd", "tree", "less", "more", "file", "stat", "which", "type", "cd"})
_INSTRUCTION = re.compile(r"(?i)\b(must|should|don't|do not|never|always|please|make sure|ensure|require[sd]?|"
                          r"only|avoid|keep|use)\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]{3,}")
_STOP = frozenset("""this that with from have will what when where which there their them then than into
about also just like need make sure should could would while these those been being were your more
some such only other over very each does done goal active status priority""".split())
_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?([A-Za-z][A-Za-z /]{1,40}?)\s*:?\s*$")
_INLINE = re.compile(r"^\s*([A-Za-z][A-Za-z ]{1,20}):\s+(\S.*)$")
_MARKERS = ("[DECISION]", "[NEXT]", "[ARTIFACT]", "[GOAL]", "[CHECKPOINT]")
_FACT_SECTIONS = ("decision", "file", "artifact", "command", "error", "next", "blocker")
_REQUEST_SECTIONS = ("task", "user request", "user instruction", "request", "instruction")


@dataclass
class _Item:
    priority: float
    section: str
    order: int
    text: str


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
        text = self.render(request)
        return SummaryResult(text=text, summarizer=self.name, input_tokens=self._count(input_text),
                             output_tokens=self._count(text) if text else 0, chunks=0, calls=0)

    # ---- building ----------------------------------------------------------------------

    def render(self, request: SummaryRequest) -> str:
        """The summary text for ``request``, within ``target_tokens``."""
        if request.target_tokens <= 0 or not request.messages:
            return ""
        quota = _QUOTAS[request.level]
        facts = extract(request.messages)
        terms = _terms(request.goal, request.focus)
        requests, progress = _candidates(request, terms)
        items = self._items(request.level, quota, facts, requests, progress)
        if request.level == "ultra":
            return self._pack_lines(items, request.target_tokens)
        return self._pack_sections(items, request.target_tokens)

    def _items(self, level: Level, quota: _Quota, facts: Extraction, requests: list[str],
               progress: list[tuple[int, str]]) -> list[_Item]:
        chars = quota.item_chars
        items: list[_Item] = []
        for i, text in enumerate(facts.key_decisions[: quota.decisions]):
            items.append(_Item(0.0 + i * 0.001, "Decisions", i, _clip(text, chars)))
        if requests:
            items.append(_Item(0.0, "Task", 0, _clip(requests[0], chars * 2 if level != "ultra" else chars)))
            rest = requests[1:]
            if rest and quota.requests > 1:
                kept = rest[-(quota.requests - 1):]
                for i, text in enumerate(kept):
                    # The latest request matters most after the task itself.
                    priority = 1.0 if i == len(kept) - 1 else 3.0 + (len(kept) - i) * 0.01
                    items.append(_Item(priority, "User requests", i, _clip(text, chars)))
        next_steps = facts.next_steps[-quota.next_steps:] if quota.next_steps else []
        for i, text in enumerate(next_steps):
            items.append(_Item(1.0 + (len(next_steps) - i) * 0.01, "Next", i, _clip(text, chars)))
        for i, path in enumerate(facts.files_modified[: quota.files]):
            items.append(_Item(2.0 + i * 0.001 if i < 6 else 4.0 + i * 0.001, "Files", i, path))
        errors = facts.errors[-quota.errors:] if quota.errors else []
        for i, text in enumerate(errors):
            items.append(_Item(2.5 + (len(errors) - i) * 0.01, "Errors", i, _clip(text, chars)))
        decided = {" ".join(d.split()).lower() for d in facts.key_decisions}
        progress = [(order, text) for order, text in progress if text.lower() not in decided]
        for rank, (order, text) in enumerate(progress[: quota.progress]):
            items.append(_Item(3.0 + rank * 0.01, "Progress", order, _clip(text, chars)))
        useful = facts.commands if level == "detailed" else [c for c in facts.commands if not _is_lookup(c)]
        commands = useful[-quota.commands:] if quota.commands else []
        for i, text in enumerate(commands):
            first_line = text.splitlines()[0] if text else text
            items.append(_Item(4.5 + (len(commands) - i) * 0.01, "Commands", i,
                               f"`{_clip(first_line, min(chars, 160))}`"))
        return items

    def _pack_sections(self, items: list[_Item], target: int) -> str:
        chosen = self._choose(items, target, lambda name, text: f"- {text}\n", lambda name: f"{name}:\n")
        return self._fit(lambda sel: _render_sections(sel), chosen, target)

    def _pack_lines(self, items: list[_Item], target: int) -> str:
        chosen = self._choose(items, target, lambda name, text: f"{text}; ", lambda name: f"{_ULTRA_LABELS[name]}: \n")
        return self._fit(lambda sel: _render_lines(sel), chosen, target)

    def _choose(self, items: list[_Item], target: int, item_cost, header_cost) -> list[_Item]:
        """Greedy by priority with an additive token estimate; ``_fit`` checks it exactly."""
        count = self._count
        used = 0
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
                continue
            used += cost
            headers.add(item.section)
            chosen.append(item)
        return chosen

    def _shorten(self, item: _Item, budget: int) -> _Item | None:
        """The item cut to fit ``budget`` tokens (used when not even one item fits whole)."""
        if budget <= 1:
            return None
        lo, hi = 0, len(item.text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(f"- {_clip(item.text, mid)}\n") <= budget:
                lo = mid
            else:
                hi = mid - 1
        if lo < 8:
            return None
        return _Item(item.priority, item.section, item.order, _clip(item.text, lo))

    def _fit(self, render, chosen: list[_Item], target: int) -> str:
        """Render, and drop the least important items until the exact count fits."""
        selection = sorted(chosen, key=lambda it: it.priority)
        while selection:
            text = render(selection)
            if self._count(text) <= target:
                return text
            if len(selection) == 1:
                only = selection[0]
                shorter = _clip(only.text, max(8, int(len(only.text) * 0.8)))
                if shorter == only.text or len(only.text) <= 8:
                    break
                selection = [_Item(only.priority, only.section, only.order, shorter)]
                continue
            selection = selection[:-1]
        return ""


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


# ---- candidates ---------------------------------------------------------------------------

def _terms(goal: str | None, focus: str | None) -> frozenset[str]:
    words = _WORD.findall(" ".join(t for t in (goal, focus) if t).lower())
    return frozenset(w for w in words if w not in _STOP)


def _candidates(request: SummaryRequest, terms: frozenset[str]) -> tuple[list[str], list[tuple[int, str]]]:
    """User requests (oldest first) and scored progress sentences (best first, with order)."""
    if request.kind == "checkpoint_merge":
        return _checkpoint_candidates(request.messages, terms)
    requests: list[str] = []
    scored: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    repeats: dict[str, int] = {}
    n = max(1, len(request.messages))
    order = 0
    for index, message in enumerate(request.messages):
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
                scored.append((_score(sentence, recency, position == 0, terms), order, sentence))
    # A sentence said over and over is boilerplate, not progress.
    rescored = [(score - min(3.0, repeats.get(sentence.lower(), 0)), o, sentence) for score, o, sentence in scored]
    rescored.sort(key=lambda s: (-s[0], s[1]))
    return requests, [(o, s) for score, o, s in rescored if score > 0]


def _checkpoint_candidates(messages: Sequence[Message], terms: frozenset[str]
                           ) -> tuple[list[str], list[tuple[int, str]]]:
    """From earlier summaries: their task/request lines and their prose lines."""
    requests: list[str] = []
    scored: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    n = max(1, len(messages))
    order = 0
    for index, message in enumerate(messages):
        section = ""
        for text in _texts(message):
            for raw in text.splitlines():
                line = raw.strip()
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
                scored.append((_score(body, index / n, False, terms) + 1.0, order, body))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return requests, [(o, s) for score, o, s in scored if score > 0]


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


def _score(sentence: str, recency: float, first: bool, terms: frozenset[str]) -> float:
    score = 0.5 + recency
    if first:
        score += 0.3
    if _PATH.search(sentence):
        score += 1.5
    if _IDENT.search(sentence):
        score += 1.0
    if _OUTCOME.search(sentence):
        score += 1.5
    if _DECISION_WORD.search(sentence):
        score += 1.5
    if _ERROR_WORD.search(sentence):
        score += 0.8
    if _FILLER.match(sentence):
        score -= 2.5
    if sentence.endswith(":"):
        score -= 1.0
    if len(sentence) < 25:
        score -= 1.0
    elif len(sentence) > 400:
        score -= 0.5
    if terms:
        hits = sum(1 for w in _WORD.findall(sentence.lower()) if w in terms)
        score += min(3, hits) * 1.0
    return score


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
