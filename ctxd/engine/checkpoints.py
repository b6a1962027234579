"""Checkpoints: how they read in the prompt, and how they age and merge
(checkpoint ageing: progressive compression).

Each new compression ages the older summary checkpoints one level down
(detailed -> moderate -> compact); when more than ``max_checkpoints`` remain, the two
oldest merge into one ``ultra`` checkpoint. Ageing and merging re-summarize the
checkpoint's own summary (the summarizer never sees history again), so their cost
is bounded by the checkpoints' size, not the session's. Folded and truncation
checkpoints hold the user's words or a notice, not summaries: they never age.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ctxd.engine.policy import LEVELS, lower, target_tokens
from ctxd.protocol.compression import Checkpoint, ToolUse, merge_ranges

SECTION_HEADER = (
    "## Earlier conversation, compressed by ctxd\n"
    "Where ctxd compressed the conversation, messages like this one summarize its turns, in "
    "order. User messages are sent as written beside them, unless folded."
)


FILES_SHOWN = 20
"""Most files a checkpoint lists beyond its summary text."""
ERRORS_SHOWN, ERROR_CHARS = 5, 160
"""The newest errors a checkpoint lists beyond its summary text, each cut to this length."""
ERRORS_KEPT = 8
"""The newest errors a merged checkpoint keeps."""


def new_id() -> str:
    """``ckpt_`` and 15 random digits: an id the prompt names (a notice's ``checkpoint/expand
    <id>``) must cost the same tokens whatever its draw, or the same conversation compresses
    differently from one run to the next (hex ids took 5-8 tokens; digits go by threes)."""
    return f"ckpt_{secrets.randbelow(10 ** 15):015d}"


def render_checkpoint(cp: Checkpoint) -> str:
    if cp.kind == "folded":
        # (Its first line says which of them it quotes exactly and which it cut.)
        title = (f"### Earlier user messages {cp.seq_from}-{cp.seq_to} "
                 "(folded out of the conversation to fit the window)")
    elif cp.kind == "truncated":
        title = f"### Messages {cp.seq_from}-{cp.seq_to} (omitted)"
    else:
        title = f"### Messages {cp.seq_from}-{cp.seq_to} ({cp.level} summary)"
        body = cp.summary.strip()
        # The structured facts outlive the prose: files the summary no longer names are
        # listed (ageing and merging shorten the text, the file lists are joined).
        missing = [f for f in cp.files_modified if f not in body][:FILES_SHOWN]
        if missing:
            body += ("\n" if body else "") + "Files: " + ", ".join(missing)
        errors = [e[:ERROR_CHARS] for e in cp.errors[-ERRORS_SHOWN:] if e[:ERROR_CHARS] not in body]
        if errors:
            body += ("\n" if body else "") + "Errors: " + "; ".join(errors)
        return f"{title}\n{body}"
    return f"{title}\n{cp.summary.strip()}"


def measure(cp: Checkpoint, count: Callable[[str], int]) -> Checkpoint:
    """Set what the checkpoint costs in the prompt (its text and its share of the section's
    separators) and its ratio to what it replaced."""
    cp.tokens = count(render_checkpoint(cp)) + 2
    cp.ratio = round(cp.tokens / cp.original_tokens, 4) if cp.original_tokens else 1.0
    return cp


def place(cp: Checkpoint) -> tuple[int, int]:
    """Where a checkpoint goes in the conversation, against ``(seq, 0)`` for a message sent
    as written: a summary (or a notice of what was left out) after the messages of its span
    that are sent as written (the user's words of that span, then what the rest of it
    said); the user's folded words where their oldest was."""
    if cp.kind == "folded":
        return (cp.seq_from, -1)
    return (cp.seq_to, 1)


def in_order(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """The checkpoints as the conversation holds them (by :func:`place`)."""
    return sorted(checkpoints, key=place)


def message_text(cp: Checkpoint, first: bool) -> str:
    """A checkpoint as the conversation sends it: its own message (the first opens with
    the section header, which says what these messages are)."""
    text = render_checkpoint(cp)
    return f"{SECTION_HEADER}\n\n{text}" if first else text


def render_section(checkpoints: list[Checkpoint]) -> str | None:
    """Every checkpoint's text, in order, as one text (None without checkpoints): what a
    reader of the whole prompt sees of them (tests, tools)."""
    if not checkpoints:
        return None
    ordered = in_order(checkpoints)
    return "\n\n".join(message_text(cp, i == 0) for i, cp in enumerate(ordered))


@dataclass(frozen=True)
class AgeStep:
    checkpoint_id: str
    to_level: str
    target_tokens: int


@dataclass(frozen=True)
class MergeStep:
    checkpoint_ids: tuple[str, str]
    target_tokens: int


def ageable(cp: Checkpoint) -> bool:
    return cp.kind == "summary" and LEVELS.index(cp.level) > LEVELS.index("compact")


def plan_aging(checkpoints: list[Checkpoint], max_prompt: int, share: float | None = None) -> list[AgeStep]:
    """One level down for the summary checkpoints above ``compact``: every one (plain ageing),
    or with ``share``, only the oldest as far as needed to bring the summaries within
    that share of the largest prompt (ageing makes room; it is not a ritual)."""
    steps = []
    summaries = [cp for cp in checkpoints if cp.kind == "summary"]
    excess = None if share is None else sum(cp.tokens for cp in summaries) - int(share * max_prompt)
    if excess is not None and excess <= 0:
        return []
    for cp in summaries:
        if ageable(cp):
            level = lower(cp.level)
            target = target_tokens(level, cp.tokens, max_prompt)
            steps.append(AgeStep(cp.id, level, target))
            if excess is not None:
                excess -= max(0, cp.tokens - target)
                if excess <= 0:
                    break
    return steps


def merge_truncated(checkpoints: list[Checkpoint], max_checkpoints: int, count: Callable[[str], int],
                    now: str) -> list[Checkpoint]:
    """Truncation notices beyond ``max_checkpoints`` merge into one notice (no summarizer
    needed: they only say what was left out)."""
    notices = [cp for cp in checkpoints if cp.kind == "truncated"]
    while len(notices) > max_checkpoints:
        first, second = notices[0], notices[1]
        ranges = merge_ranges(first.message_ranges, second.message_ranges)
        seqs = sum(high - low + 1 for low, high in ranges)
        files = list(dict.fromkeys(first.files_modified + second.files_modified))
        original = first.original_tokens + second.original_tokens
        cp = Checkpoint(
            id=new_id(), kind="truncated", level="compact", seq_from=first.seq_from, seq_to=second.seq_to,
            message_ranges=ranges, summary=truncation_notice(first.seq_from, second.seq_to, seqs, original, files),
            tokens=0, original_tokens=original, created_at=now, compressed_at=now,
            compression_number=second.compression_number, summarizer="truncation",
            compression_count=max(first.compression_count, second.compression_count) + 1,
            merged_from=[first.id, second.id], files_modified=files)
        measure(cp, count)
        index = checkpoints.index(first)
        checkpoints = [c for c in checkpoints if c.id not in (first.id, second.id)]
        checkpoints.insert(index, cp)
        notices = [c for c in checkpoints if c.kind == "truncated"]
    return checkpoints


def plan_merge(checkpoints: list[Checkpoint], max_checkpoints: int, max_prompt: int,
               share: float | None = None) -> MergeStep | None:
    """Merge the two oldest summary checkpoints when there are too many. With ``share``
    the merged one may keep what the summaries' share of the prompt still has room for
    (a merge made because of their number need not forget; ageing shrinks them when
    they take too much); without it, the ultra size (~400 tokens at 8K)."""
    summaries = [cp for cp in checkpoints if cp.kind == "summary"]
    if len(summaries) <= max_checkpoints:
        return None
    first, second = summaries[0], summaries[1]
    both = first.tokens + second.tokens
    target = target_tokens("ultra", both, max_prompt)
    if share is not None:
        others = sum(cp.tokens for cp in summaries[2:])
        room = int(share * max_prompt) - others
        target = max(target, min(both - 16, room))
    return MergeStep((first.id, second.id), target)


def merged(first: Checkpoint, second: Checkpoint, summary: str, tokens: int, summarizer: str, now: str,
           number: int) -> Checkpoint:
    """The ultra checkpoint standing for two older ones (their ranges and facts joined)."""
    def union(a: list[str], b: list[str]) -> list[str]:
        return list(dict.fromkeys(a + b))

    tools: dict[str, ToolUse] = {}
    for use in first.tools_used + second.tools_used:
        known = tools.get(use.tool)
        if known is None:
            tools[use.tool] = ToolUse(use.tool, use.count, list(use.notable_uses))
        else:  # calls of one tool in both: counted together, up to three notable uses
            known.count += use.count
            known.notable_uses = union(known.notable_uses, use.notable_uses)[:3]

    return Checkpoint(
        id=new_id(), kind="summary", level="ultra",
        seq_from=min(first.seq_from, second.seq_from), seq_to=max(first.seq_to, second.seq_to),
        message_ranges=merge_ranges(first.message_ranges, second.message_ranges),
        summary=summary, tokens=tokens, original_tokens=first.original_tokens + second.original_tokens,
        created_at=now, compressed_at=now, compression_number=number, summarizer=summarizer,
        compression_count=max(first.compression_count, second.compression_count) + 1,
        merged_from=[first.id, second.id],
        key_decisions=union(first.key_decisions, second.key_decisions),
        files_modified=union(first.files_modified, second.files_modified),
        tools_used=sorted(tools.values(), key=lambda t: -t.count),  # most used first, as extracted
        next_steps=second.next_steps or first.next_steps,
        errors=(first.errors + second.errors)[-ERRORS_KEPT:],
    )


def truncation_notice(seq_from: int, seq_to: int, count: int, tokens: int, files: list[str]) -> str:
    text = (f"{count} earlier messages ({tokens} tokens) were left out of the prompt to fit the "
            f"context window. They are kept whole in the session history.")
    if files:
        text += " Files touched in them: " + ", ".join(files[:10]) + "."
    return text


def collapse(checkpoints: list[Checkpoint], count: Callable[[str], int], now: str,
             number: int) -> Checkpoint | None:
    """Every summary and truncation checkpoint as one truncation notice (what they stood
    for, in a line: left out, whole in history), for a prompt that does not fit with the
    summaries at their least. None when that would not be smaller."""
    spans = [cp for cp in checkpoints if cp.kind in ("summary", "truncated")]
    if not spans:
        return None
    ranges = merge_ranges(*(cp.message_ranges for cp in spans))
    files = list(dict.fromkeys(f for cp in spans for f in cp.files_modified))
    original = sum(cp.original_tokens for cp in spans)
    seq_from, seq_to = min(cp.seq_from for cp in spans), max(cp.seq_to for cp in spans)
    cp = Checkpoint(
        id=new_id(), kind="truncated", level="compact", seq_from=seq_from, seq_to=seq_to, message_ranges=ranges,
        summary=truncation_notice(seq_from, seq_to, sum(b - a + 1 for a, b in ranges), original, files),
        tokens=0, original_tokens=original, created_at=now, compressed_at=now, compression_number=number,
        summarizer="truncation", compression_count=max(c.compression_count for c in spans) + 1,
        merged_from=[c.id for c in spans], files_modified=files)
    measure(cp, count)
    if len(spans) == 1 and cp.tokens >= spans[0].tokens:
        return None
    return cp
