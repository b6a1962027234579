"""Folding the user's words: the overflow policy's step when even what is never
summarized (the user's messages, kept verbatim) takes too much of the prompt.

:func:`plan_fold_users` (past ``compression.user_share``) and :func:`plan_fold` (the
prompt does not fit) choose the oldest kept user messages, the session's first one (the
task) last; :func:`fold` moves them into the one folded checkpoint, their words verbatim
as far as its allowance goes (the task first, then the ones that say most per token),
each day's date once above its messages (``[8 May 2023]`` then ``[message 19] words``);
only their text blocks (an image that came with them is not their words); :func:`unfold`
takes a message back out when it is pinned. Pure functions over the active context.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import msgspec

from ctxd.engine.checkpoints import measure, new_id
from ctxd.engine.clip import WORDS_CUT, WORDS_ELIDED, excerpt
from ctxd.engine.context import ActiveContext, Entry, retire_markers
from ctxd.protocol.compression import Checkpoint, seq_ranges
from ctxd.protocol.message import Message, TextBlock


def _user_text(entry: Entry | Message) -> str:
    content = (entry.message if isinstance(entry, Entry) else entry).content
    if isinstance(content, str):
        return content
    return "\n".join(b.text for b in content or () if isinstance(b, TextBlock))


def _folded_line(entry: Entry, date: Callable[[Message], str | None] | None = None) -> str:
    """``[message N] words``, or ``[message N, 8 May 2023] words`` when the message has a day
    (a chat's session date: the session's marker leaves the prompt once its words are
    folded); continuation lines are indented so entries stay separable."""
    day = date(entry.message) if date is not None else None
    label = f"[message {entry.seq}, {day}] " if day else f"[message {entry.seq}] "
    return label + _user_text(entry).replace("\n", "\n    ")


def _line_seq(line: str) -> int:
    """The message number of a folded line, ``[message N] ...`` or ``[message N, day] ...``."""
    return int(line[len("[message "):line.index("]")].partition(",")[0])


def _line_day(line: str) -> str:
    """The day of a folded line, ``[message N, day] ...`` ("" without one)."""
    return line[len("[message "):line.index("]")].partition(",")[2].strip()


def _undated(line: str) -> str:
    """``[message N, day] words`` as shown under its day's heading: ``[message N] words``."""
    return f"[message {_line_seq(line)}]" + line[line.index("]") + 1:]


def _day_heading(day: str) -> str:
    return f"[{day}]"


def _render_lines(lines: list[str]) -> list[str]:
    """Folded lines as shown: the day once, on a line of its own above that day's messages
    (``[8 May 2023]`` then ``[message 19] words``: ~7 tokens a line saved), unless some
    lines have no day (under a heading they would look dated: then each says its own)."""
    if not lines or not all(_line_day(line) for line in lines):
        return list(lines)
    out: list[str] = []
    shown = ""
    for line in lines:
        day = _line_day(line)
        if day != shown:
            out.append(_day_heading(day))
            shown = day
        out.append(_undated(line))
    return out


_DAY_LINE = re.compile(r"^\[(?!message )[^\]\n]{1,40}\]$")
"""A day's heading in the folded checkpoint, ``[8 May 2023]`` (the notice is longer)."""


NOTICE = "[User messages quoted exactly below: "
"""How the folded checkpoint's first line starts: what it keeps and what it cut."""


def _folded_notice(seqs: list[int], lines: list[str], checkpoint_id: str) -> str:
    """The folded checkpoint's first line: how many of its messages it quotes exactly,
    which one is an excerpt (the task, when it is bigger than its room), and which are
    left out with how to get them back."""
    shown = {_line_seq(line) for line in lines}
    cut = [_line_seq(line) for line in lines if WORDS_CUT in line]
    parts = [f"{NOTICE}{len(shown) - len(cut)}"]
    parts += [f"message {seq} as an excerpt (its beginning and end)" for seq in cut]
    gone = len(set(seqs) - shown)
    if gone:
        parts.append(f"{gone} more (messages {_dropped_ranges(seqs, lines)}) are folded out of the prompt to fit "
                     f"the window: whole in history, checkpoint/expand {checkpoint_id} returns them")
    return "; ".join(parts) + "]"


def folded_summary(cp: Checkpoint) -> str:
    """What the folded checkpoint ``cp`` keeps and cuts, in words (for notifications)."""
    first = cp.summary.split("\n", 1)[0]
    if not first.startswith(NOTICE):
        return ""
    number, _, rest = first[len(NOTICE):-1].partition("; ")
    return f"{number} quoted exactly" + (f"; {rest}" if rest else "")


def describe_seqs(seqs: list[int]) -> str:
    """``messages 5, 9, 13`` (ranges joined, ``message 4`` alone)."""
    runs = seq_ranges(sorted(set(seqs)))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"message {text}" if len(seqs) == 1 else f"messages {text}"


def _dropped_ranges(seqs: list[int], lines: list[str]) -> str:
    """The folded messages whose words no longer fit the folded checkpoint, as ranges."""
    shown = {_line_seq(line) for line in lines}
    gone = sorted(set(seqs) - shown)
    runs = seq_ranges(gone)
    if len(runs) > 4:  # user messages alternate with replies: name the span, not every seq
        return f"between {gone[0]} and {gone[-1]}"
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _line_text(line: str) -> str:
    """A folded line's words without its ``[message N]`` label."""
    return line.partition("] ")[2].replace("\n    ", "\n")


def _folded_lines(summary: str) -> list[str]:
    """The folded checkpoint's lines, each ``[message N, day] words`` again when it was shown
    under its day's heading."""
    out: list[str] = []
    day = ""
    for line in summary.split("\n"):
        if line.startswith(NOTICE):
            continue
        if line.startswith("[message "):
            if day and "," not in line[:line.index("]")]:
                line = f"[message {_line_seq(line)}, {day}]" + line[line.index("]") + 1:]
            out.append(line)
        elif line.startswith("    ") and out:
            out[-1] += "\n" + line
        elif _DAY_LINE.match(line):
            day = line[1:-1]
    return out


def user_entries(ctx: ActiveContext) -> list[Entry]:
    """The user's messages sent verbatim (kept and recent), pinned ones aside."""
    pinned = ctx.pinned_set
    return [e for e in ctx.kept + ctx.recent if e.has_user_text and e.seq not in pinned]


def user_tokens(ctx: ActiveContext) -> int:
    """What the user's words cost in the prompt (their text and message overhead): kept
    ones as sent behind the boundary (without the images and tool results they carried),
    recent ones as pushed. Measured as pushed, the kept words' share overstated what they
    take, and they were folded while the prompt had room for them."""
    pinned = ctx.pinned_set
    kept = sum(e.view_tokens for e in ctx.kept if e.has_user_text and e.seq not in pinned)
    recent = sum(e.tokens.overhead + e.tokens.text for e in ctx.recent if e.has_user_text and e.seq not in pinned)
    return kept + recent


def plan_fold_users(ctx: ActiveContext, max_user_tokens: int,
                    rank: Callable[[list[str]], list[float]] | None = None) -> list[Entry]:
    """The kept user messages to fold so that the user's verbatim words take at most
    ``max_user_tokens`` (never the newest user message, nor pinned ones, nor the session's
    first user message: an agent's task stays verbatim while the prompt can hold it, and
    only the overflow policy, :func:`plan_fold`, folds it, last). With ``rank`` (a worth
    per message text, higher first, as ``summarize.salience.salience`` gives: salience
    per square root of its length), the ones worth least per token go first: the words
    kept verbatim are the ones that say most, and a long thin message folds rather than
    several short telling ones (the fewest that make room). Without it, the oldest."""
    pinned = ctx.pinned_set
    users = [e for e in ctx.kept if e.role == "user" and e.has_user_text and e.seq not in pinned]
    if not any(e.has_user_text for e in ctx.recent) and users:
        users = users[:-1]
    first = _first_user_seq(ctx)
    users = [e for e in users if e.seq != first]
    excess = user_tokens(ctx) - max_user_tokens
    if excess <= 0:
        return []
    if rank is not None and users:
        worth = rank([_user_text(e) for e in users])
        users = [users[i] for i in sorted(range(len(users)), key=lambda i: (
            worth[i] / math.sqrt(max(1, users[i].view_tokens)), users[i].seq))]
    chosen: list[Entry] = []
    for entry in users:
        if excess <= 0:
            break
        chosen.append(entry)
        excess -= entry.view_tokens
    return sorted(chosen, key=lambda e: e.seq)


def _first_user_seq(ctx: ActiveContext) -> int | None:
    """The session's first user message still anywhere in the context (verbatim or folded)."""
    seqs = [e.seq for e in ctx.kept + ctx.recent if e.has_user_text]
    folded = next((cp for cp in ctx.checkpoints if cp.kind == "folded"), None)
    if folded is not None:
        seqs += folded.message_seqs
    return min(seqs) if seqs else None


def plan_fold(ctx: ActiveContext, goal_tokens: int, allowance: int | None = None) -> list[Entry]:
    """The oldest kept user messages to fold until the prompt is at ``goal_tokens``.

    The newest user message is never folded, nor are pinned messages. Given the
    ``allowance`` that :func:`fold` will get, the plan counts what folding really saves:
    folded words stay in the prompt (in the folded checkpoint) up to the allowance, so
    only what goes beyond it is freed. Without it, every folded token counts as freed."""
    pinned = ctx.pinned_set
    users = [e for e in ctx.kept if e.role == "user" and e.seq not in pinned]
    if not any(e.role == "user" and e.has_user_text for e in ctx.recent) and users:
        users = users[:-1]
    first = _first_user_seq(ctx)  # (the task: last to go, as in plan_fold_users)
    users = [e for e in users if e.seq != first] + [e for e in users if e.seq == first]
    excess = ctx.prompt_tokens - goal_tokens
    prior = next((cp.tokens for cp in ctx.checkpoints if cp.kind == "folded"), 0)
    chosen: list[Entry] = []
    moved = saved = 0
    for entry in users:
        if saved >= excess:
            break
        chosen.append(entry)
        moved += entry.view_tokens
        if allowance is None:
            saved = moved
        else:
            saved = moved - max(0, min(allowance, prior + moved) - prior)
    return sorted(chosen, key=lambda e: e.seq)


def _quoted(all_lines: list[str], first: int | None, allowance: int, count: Callable[[str], int],
            rank: Callable[[list[str]], list[float]] | None) -> list[str]:
    """The folded lines kept within ``allowance`` tokens, in their order: the session's
    first user message (the task, for an agent) first, whole when it fits in half the
    allowance, else as an excerpt of that size (of all of it when half is too small to
    say anything; none when all of it is); then the best by ``rank``, else the newest."""
    kept_lines: list[str] = []
    used = 0
    task = next((ln for ln in all_lines if first is not None and _line_seq(ln) == first), None)
    if task is not None:
        all_lines = [ln for ln in all_lines if ln is not task]
        # (In a small room, all of it: the task is the one message a prompt must not lose.)
        share = allowance // 2 if allowance // 2 - 8 >= TASK_KEEP else allowance
        if count(task) + 1 > share:
            if share - 8 < TASK_KEEP:
                task = None  # (an excerpt this small is its notice, nothing of the task)
            else:
                head, _, text = task.partition("] ")
                text = excerpt(text.replace("\n    ", "\n"), share - 8, count, notice=WORDS_ELIDED)
                task = f"{head}] " + text.replace("\n", "\n    ")
        if task is not None:
            used = count(task) + 1
    grouped = all(_line_day(ln) for ln in all_lines + ([task] if task is not None else []))
    days: set[str] = set()
    if task is not None and grouped:
        used = count(_undated(task)) + 1 + count(_day_heading(_line_day(task))) + 1
        days.add(_line_day(task))
    if rank is not None and all_lines:
        worth = rank([_line_text(ln) for ln in all_lines])
        order = sorted(range(len(all_lines)), key=lambda i: (-worth[i], -i))
    else:
        order = list(reversed(range(len(all_lines))))
    chosen: list[int] = []
    for i in order:
        line = all_lines[i]
        if grouped:
            day = _line_day(line)
            cost = count(_undated(line)) + 1 + (0 if day in days else count(_day_heading(day)) + 1)
        else:
            cost = count(line) + 1
        if used + cost > allowance:
            if rank is None:
                break
            continue
        chosen.append(i)
        used += cost
        if grouped:
            days.add(_line_day(line))
    kept_lines = [all_lines[i] for i in sorted(chosen)]
    if task is not None and used <= allowance:
        kept_lines.insert(0, task)
    return kept_lines


TASK_KEEP = 48
"""The least of the task worth quoting as an excerpt in the folded checkpoint: below it,
an excerpt is mostly its notice of what was left out."""


def task_seq(ctx: ActiveContext) -> int | None:
    """The session's first user message (the task) when the folded checkpoint quotes it."""
    return _first_user_seq(ctx) if quotes_task(ctx) else None


def refit(ctx: ActiveContext, over: int, count: Callable[[str], int],
          rank: Callable[[list[str]], list[float]] | None = None, task: Message | None = None) -> Checkpoint | None:
    """The folded checkpoint cut by ``over`` tokens, for a prompt that does not fit
    once everything else is at its least (a newest message that nearly fills the window
    leaves less room than ``fold_share``): its quoted words within what is left, chosen
    as :func:`fold` chooses them (the task first, as an excerpt of half the room, or not
    at all); the rest are counted in its notice as folded out. ``task``: the task as
    stored (:func:`task_seq`), cut anew rather than an excerpt of its excerpt, whose
    notice would undercount what is left out. None when there is no folded checkpoint or
    it quotes nothing more to cut."""
    previous = next((cp for cp in ctx.checkpoints if cp.kind == "folded"), None)
    if previous is None or over <= 0:
        return None
    lines = _folded_lines(previous.summary)
    if not lines:
        return None
    quoted = sum(count(line) + 1 for line in _render_lines(lines))
    first, seqs = _first_user_seq(ctx), previous.message_seqs
    if task is not None:
        lines = [f"{ln.partition('] ')[0]}] " + _user_text(task).replace("\n", "\n    ")
                 if _line_seq(ln) == first else ln for ln in lines]
    allowance = quoted - over
    cp = previous
    for _ in range(4):  # (an excerpt and the notice are measured after the cut: aim lower by the miss)
        kept = _quoted(lines, first, max(0, allowance), count, rank)
        cp = msgspec.structs.replace(
            previous, summary="\n".join([_folded_notice(seqs, kept, previous.id)] + _render_lines(kept)))
        measure(cp, count)
        miss = cp.tokens - (previous.tokens - over)
        if miss <= 0 or allowance <= 0:
            break
        allowance -= miss
    if cp.tokens >= previous.tokens:
        return None
    ctx.checkpoints = [cp if c.id == previous.id else c for c in ctx.checkpoints]
    return cp

def quotes_task(ctx: ActiveContext) -> bool:
    """Whether the folded checkpoint quotes the session's first user message (the task),
    whole or as an excerpt."""
    folded = next((cp for cp in ctx.checkpoints if cp.kind == "folded"), None)
    first = _first_user_seq(ctx)
    return folded is not None and any(_line_seq(line) == first for line in _folded_lines(folded.summary))


def fold(ctx: ActiveContext, entries: list[Entry], *, allowance: int, now: str, number: int,
         count: Callable[[str], int], rank: Callable[[list[str]], list[float]] | None = None,
         date: Callable[[Message], str | None] | None = None) -> Checkpoint:
    """Move ``entries`` into the folded checkpoint (created or grown), keeping their words
    verbatim as far as ``allowance`` tokens allow: the best by ``rank`` (a worth per
    message text, higher first), else the newest; shown in their order, each labelled
    with its day when ``date`` gives one."""
    previous = next((cp for cp in ctx.checkpoints if cp.kind == "folded"), None)
    lines = [_folded_line(e, date) for e in entries]
    seqs = [e.seq for e in entries]
    prior_lines: list[str] = []
    if previous is not None:
        prior_lines = _folded_lines(previous.summary)
        seqs = previous.message_seqs + seqs
    kept_lines = _quoted(prior_lines + lines, _first_user_seq(ctx), allowance, count, rank)
    # Lines dropped by earlier folds are gone from the summary; the seqs are not.
    cp_id = previous.id if previous is not None else new_id()
    parts = [_folded_notice(seqs, kept_lines, cp_id)] + _render_lines(kept_lines)
    cp = Checkpoint(
        id=cp_id, kind="folded", level="compact",
        seq_from=min(seqs), seq_to=max(seqs), message_ranges=seq_ranges(seqs), summary="\n".join(parts),
        tokens=0, original_tokens=(previous.original_tokens if previous else 0) + sum(
            e.tokens.overhead + e.tokens.text for e in entries),  # (as pushed: a view may be shorter)
        created_at=previous.created_at if previous else now, compressed_at=now, compression_number=number,
        summarizer="fold", compression_count=(previous.compression_count + 1) if previous else 1,
    )
    measure(cp, count)
    folded = {e.seq for e in entries}
    ctx.kept = [e for e in ctx.kept if e.seq not in folded]
    ctx.state.clips = [c for c in ctx.state.clips if c.seq not in folded]  # (an excerpt of their words)
    ctx.state.kept_seqs = [e.seq for e in ctx.kept]
    retire_markers(ctx)
    ctx.checkpoints = [cp] + [c for c in ctx.checkpoints if c.kind != "folded"]
    ctx.state.lossy = True
    return cp


def unfold(ctx: ActiveContext, seq: int, count: Callable[[str], int]) -> bool:
    """Take message ``seq`` out of the folded checkpoint (it is being pinned, so it will be
    sent verbatim and must not appear twice). True if it was folded."""
    folded = next((cp for cp in ctx.checkpoints if cp.kind == "folded" and cp.covers(seq)), None)
    if folded is None:
        return False
    lines = [line for line in _folded_lines(folded.summary) if _line_seq(line) != seq]
    seqs = [s for s in folded.message_seqs if s != seq]
    if not seqs:
        ctx.checkpoints = [c for c in ctx.checkpoints if c.id != folded.id]
        return True
    folded.summary = "\n".join([_folded_notice(seqs, lines, folded.id)] + _render_lines(lines))
    folded.message_ranges = seq_ranges(seqs)
    folded.seq_from, folded.seq_to = min(seqs), max(seqs)
    measure(folded, count)
    return True
