"""What a coding agent's session offers its summary: the user's requests (verbatim: the
first real sentence and the instruction-like ones) and the assistant's prose sentences,
scored by salience, best first; on a merge, older summaries' request and prose lines."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxd.protocol.message import Message
from ctxd.summarize.base import SummaryRequest
from ctxd.summarize.salience import Analysis, content_words
from ctxd.summarize.text import FENCE, not_the_users, sentences_of, text_blocks

_PATH = re.compile(r"(?:[\w.~-]+/)+[\w.-]+|\b[\w-]+\.(?:py|ts|tsx|js|jsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|md|"
                   r"toml|yaml|yml|json|sql|sh|txt|cfg|ini|html|css|lock)\b")
_TAG_LINE = re.compile(r"</?[A-Za-z_][\w-]*>")
_INSTRUCTION = re.compile(r"(?i)\b(must|should|don't|do not|never|always|please|make sure|ensure|require[sd]?|"
                          r"only|avoid|keep|use)\b")
_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?([A-Za-z][A-Za-z /]{1,40}?)\s*:?\s*$")
_INLINE = re.compile(r"^\s*([A-Za-z][A-Za-z ]{1,20}):\s+(\S.*)$")
_MARKERS = ("[DECISION]", "[NEXT]", "[ARTIFACT]", "[GOAL]", "[CHECKPOINT]")
_FACT_SECTIONS = ("decision", "file", "artifact", "command", "error", "next", "blocker")
_REQUEST_SECTIONS = ("task", "user request", "user instruction", "request", "instruction")


def candidates(request: SummaryRequest, analysis: Analysis
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
        if message.role == "user" and not_the_users(message):
            continue  # tool output or a worked example sent as a user message: not the user's request
        texts = text_blocks(message)
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
            for position, sentence in enumerate(sentences_of(text)):
                if sentence.startswith(_MARKERS):
                    continue  # decisions, artifacts and next steps have their own sections
                key = sentence.lower()
                if key in seen:
                    repeats[key] = repeats.get(key, 0) + 1
                    continue
                seen.add(key)
                order += 1
                raw.append((order, recency, position == 0, sentence, content_words(sentence)))
    return requests, _scored(raw, repeats, analysis, bonus=0.0)


def _scored(raw: list[tuple[int, float, bool, str, list[str]]], repeats: dict[str, int], analysis: Analysis,
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


def _checkpoint_candidates(messages: Sequence[Message], analysis: Analysis
                           ) -> tuple[list[str], list[tuple[float, int, str]]]:
    """From earlier summaries: their task/request lines and their prose lines."""
    requests: list[str] = []
    raw: list[tuple[int, float, bool, str, list[str]]] = []
    seen: set[str] = set()
    n = max(1, len(messages))
    order = 0
    for index, message in enumerate(messages):
        section = ""
        for text in text_blocks(message):
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
                raw.append((order, index / n, False, body, content_words(body)))
    return requests, _scored(raw, {}, analysis, bonus=1.0)


def _user_request(text: str) -> str | None:
    """What the user asked: the first real sentence plus instruction-like ones, verbatim."""
    text = FENCE.sub(" ", text)
    if "<" in text:
        text = _TAG_LINE.sub("\n", text)
    sentences = [s for s in sentences_of(text, min_words=1)]
    if not sentences:
        return None
    lead = next((i for i, s in enumerate(sentences) if len(s.split()) >= 4), 0)
    keep = [sentences[lead]]
    keep.extend(s for s in sentences[lead + 1: lead + 8] if _INSTRUCTION.search(s))
    joined = " ".join(keep)
    if len(joined.split()) < 2 and not _PATH.search(joined):
        return None  # "continue", "ok": nothing to keep
    return joined
