"""Layer 3: the six stages of a compression, as pure
functions. The service runs them in order, calling the summarizer between
preparation and checkpoint creation:

    identification (0-15%)    which messages go: all but the newest ``keep_recent``,
                              cut only where no tool call is separated from its result
    preparation (15-25%)      level by size, target size per level
    summarization (25-70%)    (the service: summarizer chain, with its own window)
    checkpoint (70-80%)       the checkpoint record, with extracted facts
    update (80-90%)           boundary forward, checkpoint in, user words kept
    validation (90-100%)      the summary must be smaller than what it replaces, and
                              the prompt must fit

Also here: truncation (the last resort when no summary can be had), excerpts of
recent messages too big for any prompt, and which messages hold the other half of a
tool call. When to compress at all is ``engine/trigger.py``; folding the user's words
when even what may never be compressed no longer fits (the overflow policy) is
``engine/folding.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ctxd.engine.checkpoints import measure, new_id, truncation_notice
from ctxd.engine.context import ActiveContext, ClipEvent, Entry, never_compressed, retire_markers
from ctxd.engine.policy import CompressionPolicy, initial_level, target_tokens
from ctxd.protocol.compression import Checkpoint, ToolUse, merge_ranges, seq_ranges
from ctxd.protocol.context import Budget
from ctxd.protocol.message import Message
from ctxd.tokens import PROMPT_PRIMING

STAGES = {
    "identification": 0, "preparation": 15, "summarization": 25, "checkpoint": 70,
    "update": 80, "aging": 85, "validation": 90,
}


# --- identification and preparation ---------------------------------------------------


@dataclass
class Selection:
    cut: int
    """How many entries of ``recent`` leave the active context."""
    cut_seq: int
    removed: list[Entry]
    keep: list[Entry]
    """Of the removed: the user's words and pinned messages, which stay verbatim."""
    freed_tokens: int
    """What the removed entries cost as sent, less what stays (the checkpoint replaces this)."""
    level: str = "detailed"
    target_tokens: int = 0
    earlier_truncations: list[Checkpoint] = field(default_factory=list)
    """The active truncation checkpoints: a new truncation absorbs them (see
    :func:`truncation_checkpoint`), so notices of what was left out never pile up."""
    working: frozenset[int] = frozenset()
    """Of the pinned: the agent's working set (``engine/workset.py``), summarized like the
    user's words as well as sent whole, so that when the set moves on (a newer copy of the
    file, no room) the checkpoint stands for them."""

    @property
    def seq_from(self) -> int:
        return self.removed[0].seq

    @property
    def message_seqs(self) -> list[int]:
        # Pinned messages are sent whole, never summarized; only the user's words are both
        # (an Anthropic-style tool result is a user-role message but not the user's words).
        keep = {e.seq for e in self.keep if not e.has_user_text and e.seq not in self.working}
        return [e.seq for e in self.removed if e.seq not in keep]

    def summary_input(self) -> list[Message]:
        """What the summarizer reads: the removed messages as stored (user messages too,
        so the summary makes sense; they also stay verbatim in the prompt)."""
        verbatim = {k.seq for k in self.keep if not k.has_user_text and k.seq not in self.working}
        return [e.message for e in self.removed if e.seq not in verbatim]


def _safe_cut(recent: list[Entry], cut: int) -> int:
    """Move the cut back until no tool call before it has its result after it.

    A result answers the nearest call before it with its id (some clients number their
    calls per turn, so ids repeat within a session)."""
    last: dict[str, int] = {}
    answers: list[list[int]] = []  # per entry: the indexes of the calls its results answer
    for index, entry in enumerate(recent):
        answers.append([last[r] for r in entry.result_ids if r in last])
        for call_id in entry.call_ids:
            last[call_id] = index
    changed = True
    while changed and cut > 0:
        changed = False
        for index in range(cut, len(recent)):
            for call_index in answers[index]:
                if call_index < cut:
                    cut = call_index
                    changed = True
    return cut


def _safe_cut_forward(recent: list[Entry], cut: int, limit: int) -> int:
    """Move the cut forward, up to ``limit``, until no tool call before it has its result
    after it; -1 when that would pass ``limit``."""
    last: dict[str, int] = {}
    reach = [-1] * len(recent)  # per call index: the index of its last result
    for index, entry in enumerate(recent):
        for result_id in entry.result_ids:
            if result_id in last:
                reach[last[result_id]] = index
        for call_id in entry.call_ids:
            last[call_id] = index
    furthest = -1
    for index in range(len(recent)):
        if index >= cut and furthest < index:
            return index if index <= limit else -1
        furthest = max(furthest, reach[index])
    return len(recent) if len(recent) <= limit else -1


def estimated_checkpoint(freed: int, max_prompt: int) -> int:
    """What the checkpoint replacing ``freed`` tokens is expected to cost (its level's
    target plus its title line)."""
    return target_tokens(initial_level(freed, max_prompt), freed, max_prompt) + 16


def identify(ctx: ActiveContext, budget: Budget, policy: CompressionPolicy, *, keep_recent: int | None = None,
             min_freed: int = 0, goal_used: int | None = None) -> Selection | None:
    """Stage 1: the oldest messages after the boundary, just enough of them to bring the
    conversation down to ``goal_used`` tokens once their checkpoint is in (all but the
    newest ``keep_recent`` when no goal is given); ``keep_recent`` is a floor, never the
    target. None when nothing can go, or when it would free less than ``min_freed``
    (what a checkpoint itself costs: compressing less would make the prompt bigger). A
    negative ``min_freed`` also selects what frees nothing (see :func:`advance`)."""
    recent = ctx.recent
    n = len(recent)
    if n == 0:
        return None
    keep_n = min(policy.keep_recent if keep_recent is None else keep_recent, n)
    limit = n - keep_n
    cap = policy.recent_share * budget.available
    tail = sum(e.view_tokens for e in recent[limit:])
    while limit < n - 1 and tail > cap:
        tail -= recent[limit].view_tokens
        limit += 1
    pinned = ctx.pinned_set
    cut = limit
    if goal_used is not None:
        excess = ctx.used - goal_used
        if excess <= 0:
            return None
        freed = 0
        cut = 0
        while cut < limit:
            e = recent[cut]
            freed += _freed_by(e, pinned)
            cut += 1
            if freed - estimated_checkpoint(freed, budget.max_prompt_tokens) >= excess:
                break
        forward = _safe_cut_forward(recent, cut, limit)
        cut = forward if forward >= 0 else _safe_cut(recent, cut)
    else:
        cut = _safe_cut(recent, cut)
    if cut <= 0:
        return None
    removed = recent[:cut]
    # The user's words, system messages (instructions, like the system prompt) and pinned
    # messages stay verbatim; everything else goes into the checkpoint.
    keep = [e for e in removed if e.seq in pinned or never_compressed(e)]
    freed = sum(_freed_by(e, pinned) for e in removed)
    if freed <= min_freed:
        return None
    return Selection(cut, removed[-1].seq, removed, keep, freed,
                     earlier_truncations=[c for c in ctx.checkpoints if c.kind == "truncated"],
                     working=frozenset(ctx.state.working))


def _freed_by(e: Entry, pinned: set[int]) -> int:
    """What moving ``e`` behind the boundary frees: all of it, but for what stays verbatim."""
    if e.seq in pinned or e.role == "system":
        return 0
    if never_compressed(e):
        # (Not below nothing: the user's words sent as an excerpt cost less than they are.)
        return max(0, e.view_tokens - (e.tokens.overhead + e.tokens.text))
    return e.view_tokens


def prepare(selection: Selection, budget: Budget) -> Selection:
    """Stage 2: the level and target size of the new checkpoint."""
    level = initial_level(selection.freed_tokens, budget.max_prompt_tokens)
    selection.level = level
    selection.target_tokens = min(target_tokens(level, selection.freed_tokens, budget.max_prompt_tokens),
                                  max(1, selection.freed_tokens - 1))
    return selection


# --- checkpoint, update, validation ---------------------------------------------------


def make_checkpoint(selection: Selection, summary: str, summarizer: str, *, now: str, number: int,
                    count: Callable[[str], int], kind: str = "summary") -> Checkpoint:
    """Stage 4: the checkpoint record, with structured extraction (files, decisions, errors...)."""
    from ctxd.engine.extract import extract  # its regexes compile on first use, not at start-up

    facts = extract(selection.summary_input())
    cp = Checkpoint(
        id=new_id(), kind=kind, level=selection.level if kind == "summary" else "compact",  # type: ignore[arg-type]
        seq_from=selection.seq_from, seq_to=selection.cut_seq, message_ranges=seq_ranges(selection.message_seqs),
        summary=summary, tokens=0, original_tokens=selection.freed_tokens, created_at=now,
        compression_number=number, summarizer=summarizer,
        key_decisions=facts.key_decisions, files_modified=facts.files_modified,
        tools_used=[ToolUse(t.name, t.count, list(t.notable_uses)) for t in facts.tools_used],
        next_steps=facts.next_steps, errors=facts.errors,
    )
    measure(cp, count)
    return cp


def truncation_checkpoint(selection: Selection, *, now: str, number: int, count: Callable[[str], int]) -> Checkpoint:
    """The last resort: a checkpoint that only says what was left out (and where it is).
    Its ``message_ranges`` are exactly the messages left out: the user's words among the
    removed stay in the prompt, so they are neither counted nor covered."""
    from ctxd.engine.extract import extract

    covered = set(selection.message_seqs)
    removed = [e for e in selection.removed if e.seq in covered and not e.has_user_text]
    summarized = {e.seq for e in removed}
    facts = extract([e.message for e in removed])
    earlier = selection.earlier_truncations
    if not earlier:
        notice = truncation_notice(selection.seq_from, selection.cut_seq, len(removed), selection.freed_tokens,
                                   facts.files_modified)
        cp = make_checkpoint(selection, notice, "truncation", now=now, number=number, count=count,
                             kind="truncated")
        cp.message_ranges = seq_ranges(sorted(summarized))
        return cp
    # One notice for everything left out (like the one folded checkpoint): the oldest
    # truncation checkpoint grows, keeping its id, instead of a new one per pass.
    oldest = earlier[0]
    ranges = merge_ranges(seq_ranges(summarized), *(c.message_ranges for c in earlier))
    files = list(dict.fromkeys([f for c in earlier for f in c.files_modified] + facts.files_modified))
    tokens = selection.freed_tokens + sum(c.original_tokens for c in earlier)
    notice = truncation_notice(oldest.seq_from, selection.cut_seq, sum(b - a + 1 for a, b in ranges), tokens, files)
    cp = make_checkpoint(selection, notice, "truncation", now=now, number=number, count=count, kind="truncated")
    cp.id, cp.created_at, cp.compressed_at = oldest.id, oldest.created_at, now
    cp.seq_from, cp.message_ranges, cp.original_tokens, cp.files_modified = oldest.seq_from, ranges, tokens, files
    cp.compression_count = max(c.compression_count for c in earlier) + 1
    cp.merged_from = list(dict.fromkeys(oldest.merged_from + [c.id for c in earlier[1:]]))
    measure(cp, count)
    return cp


def summary_rejection(cp: Checkpoint) -> str | None:
    """Stage 6's first rule: a summary not smaller than what it replaces is refused."""
    if cp.tokens >= cp.original_tokens:
        return f"the summary ({cp.tokens} tokens) is not smaller than what it replaces ({cp.original_tokens})"
    return None


def apply_selection(ctx: ActiveContext, selection: Selection, checkpoint: Checkpoint, *,
                    new_pass: bool = True) -> None:
    """Stage 5: the boundary moves forward; the checkpoint replaces what was removed.
    ``new_pass``: the first change of a compression pass, which counts it in
    ``compression_count`` (a pass counts once, however many selections it applies)."""
    state = ctx.state
    # Pinned now, not when the selection was made (a pin may come while a summary is awaited).
    pinned = ctx.pinned_set
    selection.keep = [e for e in selection.removed if e.seq in pinned or never_compressed(e)]
    ctx.recent = ctx.recent[selection.cut:]
    ctx.kept = sorted(ctx.kept + selection.keep, key=lambda e: e.seq)
    absorbed = {c.id for c in selection.earlier_truncations} if checkpoint.kind == "truncated" else set()
    if absorbed:  # the grown truncation checkpoint takes the place of the oldest it absorbed
        index = next(i for i, c in enumerate(ctx.checkpoints) if c.id in absorbed)
        rest = [c for c in ctx.checkpoints if c.id not in absorbed]
        rest.insert(min(index, len(rest)), checkpoint)
        ctx.checkpoints = rest
    else:
        ctx.checkpoints.append(checkpoint)
    state.boundary = selection.cut_seq
    state.kept_seqs = [e.seq for e in ctx.kept]
    state.prunes = [p for p in state.prunes if p.through_seq > state.boundary]
    kept = set(state.kept_seqs)
    state.clips = [c for c in state.clips if c.keeps(state.boundary, kept)]
    if new_pass:
        state.compression_count += 1
    retire_markers(ctx)


def advance(ctx: ActiveContext, selection: Selection) -> bool:
    """Move the boundary over a selection that is only the user's words, system and
    pinned messages (nothing to summarize): they stay verbatim, as kept messages, where
    the overflow policy can fold them. False when the selection holds anything else."""
    if len(selection.keep) != len(selection.removed):
        return False
    state = ctx.state
    # Pinned now, not when the selection was made (a pin may come while a summary is awaited).
    pinned = ctx.pinned_set
    selection.keep = [e for e in selection.removed if e.seq in pinned or never_compressed(e)]
    ctx.recent = ctx.recent[selection.cut:]
    ctx.kept = sorted(ctx.kept + selection.keep, key=lambda e: e.seq)
    state.boundary = selection.cut_seq
    state.kept_seqs = [e.seq for e in ctx.kept]
    state.prunes = [p for p in state.prunes if p.through_seq > state.boundary]
    kept = set(state.kept_seqs)
    state.clips = [c for c in state.clips if c.keeps(state.boundary, kept)]
    retire_markers(ctx)
    return True


def plan_clips(ctx: ActiveContext, max_tokens: int, protected: tuple[str, ...] = ()) -> list[int]:
    """Recent messages bigger than ``max_tokens`` as sent: what :func:`apply_clips` sends
    as excerpts (tool output, assistant text, tool-call arguments). The user's words are
    never cut (the overflow policy folds them whole), nor are pinned messages; outputs
    the pruning horizon cleared are already small (protected tools' are never cleared)."""
    state = ctx.state
    pinned = ctx.pinned_set
    horizon = state.prune_horizon()
    names = ctx.call_names
    out = []
    for entry in ctx.recent:
        if entry.seq in pinned or entry.role == "system" or (entry.has_user_text and not entry.result_ids):
            continue
        # (The user's words next to tool results, as Claude Code sends them: only the
        # results are cut, see ActiveContext.view_entry.)
        if entry.result_ids and entry.seq <= horizon and not (
                protected and any(names.get(i, "") in protected for i in entry.result_ids)):
            continue
        if entry.seq < state.watermark_seq and (entry.call_ids or entry.result_ids):
            continue
        current = state.clip_for(entry.seq)
        if current is not None and current <= max_tokens:
            continue
        if entry.sent_tokens > max_tokens:
            out.append(entry.seq)
    return out


def apply_clips(ctx: ActiveContext, seqs: list[int], max_tokens: int, at: str, *, words: bool = False) -> None:
    """Record the excerpts (``words``: of the user's words, :func:`plan_word_excerpts`);
    the caller refreshes the views."""
    chosen = set(seqs)
    ctx.state.clips = [c for c in ctx.state.clips if c.seq not in chosen or c.words != words] + [
        ClipEvent(seq, max_tokens, at, words) for seq in seqs]


def plan_word_excerpts(ctx: ActiveContext, need: int) -> dict[int, int] | None:
    """The last resort of a prompt that does not fit once everything else is summarized
    and folded: older user messages sent as excerpts (``{seq: max_tokens}``), the largest
    first, as few as free ``need`` tokens, each keeping at least ``EXCERPT_KEEP``. Never the
    newest message (the request being answered) nor pinned ones. An agent's task is the
    usual one: its only user message, followed by its own steps, can be neither summarized
    nor folded. None when they cannot free ``need``."""
    if need <= 0:
        return None
    pinned = ctx.pinned_set
    entries = ctx.kept + ctx.recent
    newest = entries[-1].seq if entries else None
    candidates = sorted((e for e in entries if e.has_user_text and e.seq not in pinned and e.seq != newest
                         and e.view_tokens - e.tokens.overhead > EXCERPT_KEEP + EXCERPT_SLACK),
                        key=lambda e: (-e.view_tokens, e.seq))
    limits: dict[int, int] = {}
    for entry in candidates:
        words = entry.view_tokens - entry.tokens.overhead
        room = words - EXCERPT_KEEP
        take = min(room, need + EXCERPT_SLACK)
        limits[entry.seq] = words - take
        need -= take - EXCERPT_SLACK
        if need <= 0:
            return limits
    return None


EXCERPT_KEEP = 256
"""The least of a message worth sending as an excerpt rather than summarizing it."""
EXCERPT_SLACK = 32
"""An excerpt's notice and cut points are measured after the fact: aim this much lower."""


def excerpts_instead(ctx: ActiveContext, selection: Selection, excess: int,
                     max_prompt: int) -> tuple[Selection | None, dict[int, int]] | None:
    """Stage 1's alternative for a selection that ends in large messages (an agent's
    big tool-call arguments and their output) when summarizing them would free far more
    than the ``excess`` the pass must free: the part before them is summarized (None
    when it would free less than its checkpoint costs) and they stay, sent as head/tail
    excerpts that free the rest (``{seq: max_tokens}``, :func:`apply_clips`' limits).
    None when an excerpt would keep less than the checkpoint would say, or less than
    ``EXCERPT_KEEP`` of any of them."""
    removed = selection.removed
    pinned = ctx.pinned_set
    tail: list[Entry] = []
    for entry in reversed(removed):
        if entry.seq in pinned or entry.role == "system" or entry.has_user_text or entry.view_tokens < 2 * EXCERPT_KEEP:
            break
        tail.append(entry)
    if not tail:
        return None
    tail.reverse()
    head_n = len(removed) - len(tail)
    if head_n and _safe_cut(ctx.recent, head_n) != head_n:
        return None
    head_freed = sum(_freed_by(e, pinned) for e in removed[:head_n])
    head = None
    need = excess
    if head_n and head_freed > estimated_checkpoint(head_freed, max_prompt):
        need = excess - (head_freed - estimated_checkpoint(head_freed, max_prompt))
        kept = removed[head_n - 1].seq
        head = Selection(head_n, kept, removed[:head_n], [k for k in selection.keep if k.seq <= kept], head_freed,
                         earlier_truncations=selection.earlier_truncations, working=selection.working)
    if need <= 0:
        return None
    total = sum(e.view_tokens for e in tail)
    if total - need < estimated_checkpoint(total, max_prompt):
        return None
    limits = plan_excerpts(tail, need)
    return None if limits is None else (head, limits)


def clippable(ctx: ActiveContext) -> list[Entry]:
    """Recent messages that may be sent as excerpts: not the user's words, not system
    messages, not pinned, big enough for an excerpt to be worth it."""
    pinned = ctx.pinned_set
    return [e for e in ctx.recent if e.seq not in pinned and e.role != "system" and not e.has_user_text
            and e.view_tokens >= 2 * EXCERPT_KEEP]


def plan_excerpts(entries: list[Entry], need: int) -> dict[int, int] | None:
    """Excerpt limits (``{seq: max_tokens}``) that free ``need`` tokens from ``entries``,
    each cut in proportion to its size; None when that would keep less than
    ``EXCERPT_KEEP`` of one of them."""
    total = sum(e.view_tokens for e in entries)
    if need <= 0 or not entries:
        return None
    limits: dict[int, int] = {}
    for entry in entries:
        share = -(-need * entry.view_tokens // total)
        limit = entry.view_tokens - share - EXCERPT_SLACK
        if limit < EXCERPT_KEEP:
            return None
        limits[entry.seq] = limit
    return limits


def fits(ctx: ActiveContext, budget: Budget) -> bool:
    return ctx.prompt_tokens <= budget.max_prompt_tokens


def irreducible(ctx: ActiveContext) -> int:
    """What no compression can take out of the prompt: priming, the system prompt and goal,
    the pins of the user and of the client's current context, and the newest user
    message's own words. Not the agent's working set: it is pinned by ctxd, and yields
    (``workset.plan_yield``) before a prompt that fits without it is refused."""
    newest = next((e for e in reversed(ctx.recent) if e.has_user_text), None)
    pinned = ctx.pinned_set
    words = 0
    if newest is not None and newest is ctx.recent[-1] and newest.seq not in pinned:
        words = newest.tokens.overhead + newest.tokens.text
    working = set(ctx.state.working) & pinned
    yields = sum(e.view_tokens for e in ctx.entries() if e.seq in working)
    return PROMPT_PRIMING + ctx.system_tokens + ctx.pinned_tokens - yields + words


def tool_partners(entries: list[Entry], seq: int) -> list[int]:
    """Messages holding the other half of ``seq``'s tool calls or results (pinning one
    half alone would send a call without its result, or a result without its call)."""
    target = next((e for e in entries if e.seq == seq), None)
    if target is None:
        return []
    partners = []
    for entry in entries:
        if entry.seq == seq:
            continue
        if set(target.call_ids) & set(entry.result_ids) or set(target.result_ids) & set(entry.call_ids):
            partners.append(entry.seq)
    return partners


def newest_turn(ctx: ActiveContext) -> list[Entry]:
    """The client's newest turn among the recent messages: from the newest assistant
    message on (its calls and their results), or the newest message alone."""
    recent = ctx.recent
    for i in range(len(recent) - 1, -1, -1):
        if recent[i].role == "assistant":
            return recent[i:]
    return recent[-1:]


def plan_widen(ctx: ActiveContext, room: int) -> dict[int, int | None]:
    """The newest turn's excerpts widened into ``room`` free tokens, newest message
    first: ``{seq: max_tokens}``, None where the message now fits whole. A squeeze cuts
    a big output to its share of the prompt before the older conversation goes; what
    that leaves free afterwards is the newest turn's, the part the model needs now."""
    pinned = ctx.pinned_set
    state = ctx.state
    out: dict[int, int | None] = {}
    for entry in reversed(newest_turn(ctx)):
        limit = state.clip_for(entry.seq)
        if room < EXCERPT_SLACK or limit is None or entry.seq in pinned:
            continue
        grow = entry.sent_tokens - entry.view_tokens
        if grow <= room:
            out[entry.seq] = None
            room -= max(0, grow)
        else:
            # (An excerpt comes out at most at its limit, often below: the caller checks
            # that the prompt still fits and tries a smaller room when it does not.)
            out[entry.seq] = max(limit, entry.view_tokens) + room - EXCERPT_SLACK
            room = 0
    return out


def apply_widen(ctx: ActiveContext, widen: dict[int, int | None], at: str) -> None:
    """Record :func:`plan_widen`'s limits (dropping the excerpt of a message now whole);
    the caller refreshes the views."""
    ctx.state.clips = [c for c in ctx.state.clips if c.words or c.seq not in widen] + [
        ClipEvent(seq, limit, at) for seq, limit in widen.items() if limit is not None]
