"""Running a compression: the engine's decisions, the summarizer's I/O, storage, events.

One pass, cheapest layer first:

1. tool-output pruning (free); enough on its own when it brings the conversation
   down to the low-water mark;
2. summarization of the oldest turns into a checkpoint (the six stages, reported
   as ``context/compressing`` and ``$/progress``), falling back from the LLM to the
   extractive summarizer to truncation, so a pass always ends with a smaller prompt;
3. ageing of older checkpoints and merging of the oldest;
4. validation: if the prompt still does not fit, the overflow policy (fold the
   oldest user messages, or leave it to ``context/prompt`` to refuse with figures).

History is never touched. Passes of one session never overlap (``compress_lock``);
pushes go on meanwhile and only append after the part being compressed. Engine
state changes are made under the session lock, and stored in one transaction at the
end of the pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ctxd.engine import checkpoints as ckpts
from ctxd.engine.context import ActiveContext, Entry
from ctxd.engine.folding import (
    describe_seqs,
    fold,
    folded_summary,
    plan_fold,
    plan_fold_users,
    quotes_task,
    refit,
    task_seq,
    user_tokens,
)
from ctxd.engine.pipeline import (
    EXCERPT_SLACK,
    STAGES,
    Selection,
    advance,
    apply_clips,
    apply_selection,
    apply_widen,
    clippable,
    excerpts_instead,
    fits,
    identify,
    irreducible,
    make_checkpoint,
    newest_turn,
    plan_clips,
    plan_excerpts,
    plan_widen,
    plan_word_excerpts,
    prepare,
    summary_rejection,
    truncation_checkpoint,
)
from ctxd.engine.policy import LEVEL_CAP, MIN_TARGET, CompressionPolicy
from ctxd.engine.prune import apply_prune, plan_prune
from ctxd.engine.trigger import append_room, decide, room_to_make, weighs_economy
from ctxd.engine.trigger import low_water as low_water_mark
from ctxd.engine.workset import apply_working_set, missing, plan_working_set, plan_yield, working_changes
from ctxd.protocol.compression import (
    Checkpoint,
    CheckpointAgedNotification,
    CheckpointCreatedNotification,
    CheckpointMergedNotification,
    CompressedNotification,
    CompressingNotification,
    CompressionFailedNotification,
    CompressionSkippedNotification,
    CompressResult,
    OverflowNotification,
)
from ctxd.protocol.context import Budget
from ctxd.protocol.errors import CtxdError, ErrorCode, session_not_found
from ctxd.protocol.message import Message
from ctxd.service import billing, notify, snapshots
from ctxd.service.clock import now_iso
from ctxd.service.core import Service
from ctxd.service.events import NullProgress, Progress
from ctxd.service.state import SessionState
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store.state import decode_stored
from ctxd.tokens import MESSAGE_OVERHEAD, PROMPT_PRIMING

log = logging.getLogger(__name__)


@dataclass
class _Pass:
    """What one pass did, for the result, the notification and the compressions record."""

    trigger: str
    started: float
    before: int
    layers: list[str] = field(default_factory=list)
    created: list[Checkpoint] = field(default_factory=list)
    summarizer: str | None = None
    fallback: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    told_fallback: bool = False
    """A ``context/compressionFailed`` for a summarizer fallback was sent (once per pass)."""
    snapshotted: bool = False
    counted: bool = False
    """The pass made a checkpoint and counted itself in ``compressionCount`` (a pass counts
    once, however many selections or folds it makes)."""

    def number(self, state: SessionState) -> int:
        """The compression number of what this pass creates."""
        return state.cstate.compression_count + (0 if self.counted else 1)


async def _before_change(svc: Service, state: SessionState, run: _Pass) -> None:
    """The restore point of a pass, taken right before its first change to the context
    (a pass that changes nothing leaves no snapshot behind). Never under the lock."""
    if not run.snapshotted:
        run.snapshotted = True
        await snapshots.before_compression(svc, state)


class _Stages:
    """The six stages as ``context/compressing`` notifications and ``$/progress``."""

    def __init__(self, svc: Service, state: SessionState, progress: Progress) -> None:
        self.svc, self.state, self.progress = svc, state, progress

    def __call__(self, stage: str, message: str) -> None:
        percentage = STAGES[stage]
        self.svc.events.emit(self.state.id, CompressingNotification(
            session_id=self.state.id, stage=stage, percentage=percentage, message=message))  # type: ignore[arg-type]
        self.progress.report(percentage, message)


def append_room_of(svc: Service, state: SessionState, budget: Budget) -> int:
    """``appendRoom`` of a prompt or push result (``engine/trigger.append_room``); 0 while a
    pass runs or is due."""
    if state.compression_task is not None:
        return 0
    return append_room(budget, svc.cache.policy(state), caches=svc.cache.rules(state).caches)


def schedule(svc: Service, state: SessionState) -> None:
    """After a push: start a background pass when the budget says so (single flight)."""
    if state.compression_task is not None or state.deleted:
        return
    budget = svc.cache.budget(state)
    policy = svc.cache.policy(state)
    economy = billing.economy(svc, state) if weighs_economy(state.cstate, budget, policy) else None
    decision = decide(state.cstate, budget, policy, economy)
    if decision.compress:
        state.skip_reason = None
        task = asyncio.get_running_loop().create_task(_background(svc, state), name=f"compress-{state.id}")
        state.compression_task = task
        svc.tasks.add(task)
        task.add_done_callback(svc.tasks.discard)
    elif decision.skip_kind is not None and state.skip_reason != decision.skip_kind:
        state.skip_reason = decision.skip_kind
        svc.events.emit(state.id, CompressionSkippedNotification(
            session_id=state.id, reason=decision.reason, used=budget.used, trigger_at=budget.trigger_at))


async def _background(svc: Service, state: SessionState) -> None:
    started_at = state.row.last_seq
    failed = False
    try:
        await compress(svc, state, trigger="auto")
    except asyncio.CancelledError:
        failed = True
        raise
    except CtxdError as exc:
        failed = True
        log.warning("automatic compression of %s failed: %s", state.id, exc.message)
    except Exception:
        failed = True
        log.exception("automatic compression of %s failed", state.id)
    finally:
        state.compression_task = None
    # Pushes that arrived during the pass found it running and scheduled nothing: decide
    # for them now (the loop guard still applies, and without new pushes nothing runs).
    if not failed and state.row.last_seq != started_at:
        schedule(svc, state)


async def compress(svc: Service, state: SessionState, *, trigger: str, focus: str | None = None,
                   progress: Progress | None = None, force: bool = False) -> CompressResult:
    """One compression pass; ``force`` (``context/compress``) skips the trigger check."""
    progress = progress or NullProgress()
    # One pass per session at a time, in this daemon and (on shared storage) in any other.
    async with state.compress_lock, svc.db.exclusive(f"compress:{state.id}"):
        if state.deleted:
            raise session_not_found(state.id)
        await svc.cache.catch_up(state)
        ctx = await svc.cache.context(state)
        budget = svc.cache.budget(state)
        policy = svc.cache.policy(state)
        if not force:
            decision = decide(state.cstate, budget, policy, billing.economy(svc, state))
            if not decision.compress:
                return CompressResult(session_id=state.id, compressed=False, layers=[],
                                      before_tokens=ctx.prompt_tokens, after_tokens=ctx.prompt_tokens,
                                      reason=decision.reason)
        run = _Pass(trigger=trigger, started=time.perf_counter(), before=ctx.prompt_tokens)
        run.detail["why"] = "asked" if force else decision.reason
        run.detail["beforeParts"] = composition(ctx, budget, _low_water(svc, state, policy, budget))
        progress.begin("Compressing context", f"{ctx.prompt_tokens} tokens")
        stage = _Stages(svc, state, progress)
        try:
            await _run_layers(svc, state, ctx, run, stage, focus=focus, force=force)
        except asyncio.CancelledError:
            progress.end("cancelled")
            await _reload(svc, state)
            raise
        except Exception as exc:
            progress.end("failed")
            await _reload(svc, state)
            reason = exc.message if isinstance(exc, CtxdError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, CtxdError):
                log.exception("compression of %s failed", state.id)
            svc.events.emit(state.id, CompressionFailedNotification(
                session_id=state.id, reason=reason, fallback="the active context is unchanged"))
            raise CtxdError(ErrorCode.CompressionFailed, f"compression failed: {reason}") from exc
        result = await _finish(svc, state, ctx, run)
        progress.end(f"{result.before_tokens} -> {result.after_tokens} tokens")
        return result


def _low_water(svc: Service, state: SessionState, policy: CompressionPolicy, budget: Budget) -> int:
    """Where a pass leaves the conversation (``engine.trigger.low_water``: deeper where the
    provider caches and passes pay)."""
    return low_water_mark(policy, budget, billing.economy(svc, state))


async def _run_layers(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, stage: _Stages,
                      *, focus: str | None, force: bool) -> None:
    """A pass compresses to a target: the conversation at the low-water mark, no lower
    (``force``: everything but the newest ``keep_recent``, as ``context/compress`` asks)."""
    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    low_water = _low_water(svc, state, policy, budget)
    if irreducible(ctx) > budget.max_prompt_tokens:
        await _squeeze(svc, state, ctx, run, focus)  # (says so, and changes nothing)
        return

    # The agent's working set first: the newest read of each file it works on stays
    # verbatim (pinned with its call) ahead of the older conversation, while it fits.
    await _keep_working_set(svc, state, ctx, run)
    budget = cache.budget(state)
    low_water = _low_water(svc, state, policy, budget)

    # Layer 1: pruning, of the oldest outputs only as far as the low-water mark needs.
    minimum, protect = policy.prune_thresholds(budget.available)
    need = None if force else max(0, ctx.used - low_water)
    plan = plan_prune(ctx, minimum, protect, policy.protected_tools, need=need) if need != 0 else None
    if plan is not None:
        await _before_change(svc, state, run)
        async with state.lock:
            apply_prune(ctx, plan, now_iso())
            cache.refresh(state)
        run.layers.append("prune")
        run.detail["pruned"] = {"results": plan.results, "tokens": plan.tokens, "throughSeq": plan.through_seq}
        if plan.clip is not None:
            run.detail["pruned"]["excerpt"] = {"seq": plan.clip[0], "maxTokens": plan.clip[1]}
        budget = cache.budget(state)

    # Layer 3: summarization into a checkpoint (the watermark layer acts when it is set).
    # Pushes go on during a slow summary; if they alone overflow the prompt again, another
    # round summarizes them rather than truncating.
    for _ in range(MAX_ROUNDS):
        low_water = _low_water(svc, state, policy, budget)
        if not force and ctx.used <= low_water and fits(ctx, budget):
            break
        # The user's words past their share are folded after this (_fold_users): what that
        # frees is not summarized away too, or a pass over a long backlog (an import, a
        # first push of a whole conversation) leaves the prompt far below the low-water mark
        # with every assistant turn in a summary.
        folding = 0 if force else _fold_frees(ctx, policy, budget)
        goal = low_water + folding
        selection = identify(ctx, budget, policy, min_freed=_checkpoint_cost(state, ctx),
                             goal_used=None if force else goal)
        if selection is None and folding:
            # The words to fold are not behind the boundary yet: move it as for any pass.
            goal = low_water
            selection = identify(ctx, budget, policy, min_freed=_checkpoint_cost(state, ctx), goal_used=goal)
        if selection is None:
            break
        if not force:
            _, selection = await _excerpts_instead(svc, state, ctx, run, selection, goal)
            if selection is None:
                budget = cache.budget(state)
                continue
        prepare(selection, budget)
        await _summarize_selection(svc, state, ctx, selection, run, stage, focus, policy.strategy)
        if force:
            break
        await _fold_users(svc, state, ctx, run)
        budget = cache.budget(state)

    # Validation: the user's words past their share are folded first (that is due
    # anyway); only a prompt that still does not fit is squeezed, which shortens
    # summaries and summarizes down to the newest message.
    if run.layers:
        stage("validation", "checking the prompt fits")
    await _fold_users(svc, state, ctx, run)
    if not fits(ctx, cache.budget(state)):
        await _squeeze(svc, state, ctx, run, focus)
    if not force:
        await _make_room(svc, state, ctx, run)
    await _fit_checkpoints(svc, state, ctx, run)
    await _widen_newest(svc, state, ctx, run)


async def _fit_checkpoints(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """The promise: a prompt within the budget whenever the newest message fits. After
    everything else, what can still leave it over is the checkpoints (a newest message
    that nearly fills the window leaves less room than ``fold_share`` and the summaries'
    floor take). Least lossy first: the summaries shortened, the folded checkpoint's
    quoted words cut to the room (the task last, as a smaller excerpt, then not at all),
    the summaries and notices made one notice of what was left out, and at the very
    last the checkpoints leave the prompt (history keeps everything). Every step but the
    first is announced with ``context/overflow``."""
    cache = svc.cache
    budget = cache.budget(state)
    if fits(ctx, budget) or ctx.prompt_tokens - ctx.checkpoint_tokens > budget.max_prompt_tokens:
        return  # (not the checkpoints: nothing of theirs is given up for a prompt that cannot fit)
    await _shrink_checkpoints(svc, state, ctx, run)
    budget = cache.budget(state)
    if fits(ctx, budget) or not ctx.checkpoints:
        return
    figures = dict(prompt_tokens=ctx.prompt_tokens, max_prompt_tokens=budget.max_prompt_tokens,
                   system_tokens=ctx.system_tokens, pinned_tokens=ctx.pinned_tokens,
                   checkpoint_tokens=ctx.checkpoint_tokens, user_tokens=ctx.user_tokens,
                   recent_tokens=ctx.recent_tokens)
    said: list[str] = []
    seq = task_seq(ctx)  # (the task as stored: cut anew, not an excerpt of its excerpt)
    stored = await svc.db.read(message_store.load_seqs, state.id, [seq]) if seq is not None else []
    task = stored[0].message if stored else None
    await _before_change(svc, state, run)
    # The task's words outrank the summaries at their least: when cutting the folded
    # checkpoint to the room would cut the task out of it, the summaries become a notice first.
    async with state.lock:
        before, created, layers = list(ctx.checkpoints), len(run.created), len(run.layers)
        had_task = quotes_task(ctx)
        _refit_folded(svc, state, ctx, run, said, task)
        if had_task and not quotes_task(ctx) and any(c.kind == "summary" for c in ctx.checkpoints):
            ctx.checkpoints = before
            del said[:], run.created[created:], run.layers[layers:]
        cache.refresh(state, system=True)
    if not fits(ctx, cache.budget(state)):
        notice = ckpts.collapse(ctx.checkpoints, state.counter.count, now_iso(), run.number(state))
        if notice is not None:
            async with state.lock:
                gone = {c.id for c in ctx.checkpoints if c.kind in ("summary", "truncated")}
                rest = [c for c in ctx.checkpoints if c.id not in gone]
                ctx.checkpoints = rest + [notice]
                cache.refresh(state, system=True)
            run.created.append(notice)
            run.layers.append("truncate")
            said.append(f"the summaries {', '.join(sorted(gone))} became one notice of what was left out "
                        f"({notice.id})")
            svc.events.emit(state.id, CheckpointMergedNotification(
                session_id=state.id, merged_ids=notice.merged_from, into_id=notice.id, tokens=notice.tokens))
        async with state.lock:
            _refit_folded(svc, state, ctx, run, said, task)
    for kind in ("truncated", "summary", "folded"):  # the last resort: out of the prompt
        if fits(ctx, cache.budget(state)):
            break
        gone_cps = [c for c in ctx.checkpoints if c.kind == kind]
        if not gone_cps:
            continue
        async with state.lock:
            ctx.checkpoints = [c for c in ctx.checkpoints if c.kind != kind]
            cache.refresh(state, system=True)
        said.append(f"checkpoint{'s' if len(gone_cps) > 1 else ''} {', '.join(c.id for c in gone_cps)} "
                    f"left the prompt (messages {', '.join(f'{c.seq_from}-{c.seq_to}' for c in gone_cps)})")
    folded = next((c for c in ctx.checkpoints if c.kind == "folded"), None)
    if folded is not None and any(c.id == folded.id for c in run.created) and any(
            s.startswith("the folded checkpoint") for s in said):
        run.created = [c for c in run.created if c.id != folded.id] + [folded]
        svc.events.emit(state.id, CheckpointCreatedNotification(session_id=state.id, checkpoint=folded))
    if not said:
        return
    if not run.counted:
        ctx.state.compression_count += 1
        run.counted = True
    ctx.state.lossy = True
    policy = cache.policy(state)
    svc.events.emit(state.id, OverflowNotification(
        session_id=state.id, policy=policy.overflow_policy, **figures,  # type: ignore[arg-type]
        action=(f"the newest message leaves the checkpoints less room than they take at their least: "
                f"{'; '.join(said)}; history keeps every message whole (session/history)"),
        reason="prompt"))


def _refit_folded(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, said: list[str],
                  task: Message | None) -> None:
    """The folded checkpoint's quoted words cut to the room left (``folding.refit``), the
    task from ``task``, its stored message. (Caller holds the session lock.)"""
    from ctxd.summarize.salience import salience  # (with the first fold, not at start-up)

    cache = svc.cache
    for _ in range(FIT_ROUNDS):  # (measured after the cut: a few tries)
        over = ctx.prompt_tokens - cache.budget(state).max_prompt_tokens
        if over <= 0:
            return
        cp = refit(ctx, over, state.counter.count,
                   rank=lambda texts: salience(texts, state.counter.count, ctx.goal_text), task=task)
        cache.refresh(state, system=True)
        if cp is None:
            return
        if not any(c.id == cp.id for c in run.created):
            run.created.append(cp)
            run.layers.append("fold")
        said[:] = [s for s in said if not s.startswith("the folded checkpoint")] + [
            f"the folded checkpoint {cp.id} quotes fewer of the user's words ({folded_summary(cp)})"]


async def _widen_newest(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """The newest turn sent as an excerpt while the prompt has room left (a squeeze cut
    it to its share before the older conversation went): it takes that room, whole when
    it fits (issue 21: what the client's newest request shows the model arrives intact).
    Still cut, and the session allows it (``settings.outputFloor``), the reply's reserve
    lends it what makes it whole, down to that floor (:func:`_lend_reserve`)."""
    widened = await _widen_into_room(svc, state, ctx, run)
    widened.update(await _lend_reserve(svc, state, ctx, run))
    if not widened:
        return
    run.layers.append("clip")
    run.detail["widened"] = [{"seq": s, "maxTokens": m} for s, m in widened.items()]


async def _widen_into_room(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass,
                           *, guarded: bool = True) -> dict[int, int | None]:
    """The newest turn's excerpts widened into the prompt's free room. An excerpt is
    measured after it is cut and may come out smaller than its limit: a few rounds, each
    into the room the last one left. ``guarded=False`` (room lent by the reply's reserve,
    given back at the next push anyway): up to the largest prompt."""
    widened: dict[int, int | None] = {}
    share = 1.0
    guard = math.ceil(svc.cache.policy(state).min_growth_fraction * svc.cache.budget(state).available)
    for _ in range(WIDEN_ROUNDS):
        budget = svc.cache.budget(state)
        # (one loop guard's step stays free below the trigger: filled to the limit, the
        # next push would force a pass that drops what was just widened)
        free = budget.max_prompt_tokens - ctx.prompt_tokens
        if guarded:
            free = min(free, budget.trigger_at - guard - budget.used)
        room = math.floor(share * max(0, free))
        widen = plan_widen(ctx, room)
        if not widen:
            break
        if not widened:
            await _before_change(svc, state, run)
        async with state.lock:
            before = list(ctx.state.clips)
            apply_widen(ctx, widen, now_iso())
            svc.cache.refresh(state)
            if not fits(ctx, svc.cache.budget(state)):
                ctx.state.clips = before
                svc.cache.refresh(state)
                share /= 2
                continue
        widened.update(widen)
    return widened


def _cut_in_newest_turn(ctx: ActiveContext) -> list[Entry]:
    return [e for e in newest_turn(ctx) if ctx.state.clip_for(e.seq) is not None]


async def _lend_reserve(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> dict[int, int | None]:
    """The newest turn still cut after taking the room below the trigger, where the
    session allows it (``settings.outputFloor``): the reply's reserve lends it the tokens
    that make it whole, no more, and never below the floor, for this turn only
    (``CompressionState.lent``: void once a newer message is pushed); the room up to the
    largest prompt first, lending nothing (the loop guard's step below the trigger is for
    the older conversation: the next push compresses again anyway).
    A coding agent asks for 8-32K tokens of reply and writes a few hundred; the tool
    output it must read now is worth more than reply room it will not use. What cannot
    make the turn whole is not done (the reply keeps its reserve; the excerpt stays)."""
    floor = state.row.settings.output_floor
    cut = _cut_in_newest_turn(ctx)
    if floor is None or not cut or ctx.state.lent_now(state.row.last_seq):
        return {}
    budget = svc.cache.budget(state)
    can = budget.reserved_output - floor
    if can <= 0:
        return {}
    need = sum(max(0, e.sent_tokens - e.view_tokens) for e in cut) + EXCERPT_SLACK
    guess = max(1, min(can, need - max(0, budget.max_prompt_tokens - ctx.prompt_tokens)))
    clips, lent = list(ctx.state.clips), ctx.state.lent
    await _before_change(svc, state, run)
    for loan in dict.fromkeys((0, guess, can)):
        async with state.lock:
            ctx.state.lent = (state.row.last_seq, loan) if loan else lent
            svc.cache.refresh(state)
        widened = await _widen_into_room(svc, state, ctx, run, guarded=False)
        if not _cut_in_newest_turn(ctx):
            if loan:
                run.detail["lent"] = {"seq": state.row.last_seq, "tokens": loan,
                                      "reservedOutput": svc.cache.budget(state).reserved_output}
            return widened
        async with state.lock:
            ctx.state.clips = list(clips)
            svc.cache.refresh(state)
    async with state.lock:  # (it cannot be made whole: as it was)
        ctx.state.clips, ctx.state.lent = clips, lent
        svc.cache.refresh(state)
    return {}


async def _keep_working_set(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """Pin the agent's working set (``engine/workset.py``) within ``working_share`` of the
    largest prompt, reading back from history a read that left the prompt while there was
    no room for it; unpin what left the set."""
    cache = svc.cache
    seqs, reads = plan_working_set(ctx, cache.budget(state).max_prompt_tokens, cache.policy(state).working_share)
    absent = missing(ctx, seqs)
    loaded = [Entry.of(m.seq, m.message, m.tokens)
              for m in await svc.db.read(message_store.load_seqs, state.id, absent)] if absent else []
    if not working_changes(ctx, seqs):
        ctx.state.reads = reads  # (stored with the pass)
        return
    await _before_change(svc, state, run)
    async with state.lock:
        if apply_working_set(ctx, seqs, reads, loaded):
            cache.refresh(state, system=True)
            run.detail["workingSet"] = list(ctx.state.working)


async def _make_room(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """A pass that summarized all it could and still left the conversation within a loop
    guard's step of the trigger (what remains is mostly the user's words, verbatim)
    shortens the summary checkpoints until that step is free: otherwise every few turns
    compress again, each pass freeing a few tokens and breaking the prompt cache. (A
    step down to the low-water mark, but never less than one loop guard's: summaries are
    where older turns live, and shortening them further costs more than the passes it
    saves; docs/decisions.md. Where the provider caches, still the quality-first mark:
    ``policy.room_fraction``, and room for ``policy.pass_interval`` requests of the
    session's growth, the summaries kept to the merged level's cap at least.)"""
    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    share = min(budget.trigger_fraction - policy.min_growth_fraction, policy.room_fraction)
    need = 0
    if share > 0 and ctx.used > math.floor(share * budget.available):
        # Every token the checkpoints give back raises available by one, the goal by ``share``.
        need = math.ceil(ctx.used / share) - budget.available
    interval = room_to_make(policy, budget, billing.economy(svc, state))
    summaries = [c for c in ctx.checkpoints if c.kind == "summary"]
    if interval > need and len(summaries) > 1:
        # The newest summary stays as it is (its files and errors listed in full: a merged
        # one lists the newest few); the older ones are merged down to the merged cap.
        older = sum(c.tokens for c in summaries) - max(summaries, key=lambda c: c.seq_to).tokens
        room = min(interval, older - math.floor(LEVEL_CAP["ultra"] * budget.max_prompt_tokens))
        if room > need:
            await _shrink_checkpoints(svc, state, ctx, run, need=room, keep_newest=True)
            return
    if need > 0:
        await _shrink_checkpoints(svc, state, ctx, run, need=need)


async def _summarize_selection(svc: Service, state: SessionState, ctx: ActiveContext, selection: Selection,
                               run: _Pass, stage: _Stages, focus: str | None, strategy: str) -> None:
    """Stages 1-5 for one selection, then ageing and merging of the older checkpoints."""
    cache = svc.cache
    stage("identification", f"{len(selection.removed)} messages up to {selection.cut_seq}")
    stage("preparation", f"{selection.freed_tokens} tokens, {selection.level} level, "
                         f"target {selection.target_tokens}")
    checkpoint = await _checkpoint_for(svc, state, ctx, selection, run, stage, focus, strategy)
    stage("update", "updating the active context")
    await _before_change(svc, state, run)
    async with state.lock:
        apply_selection(ctx, selection, checkpoint, new_pass=not run.counted)
        run.counted = True
        cache.refresh(state, system=True)
    run.created.append(checkpoint)
    run.layers.append("truncate" if checkpoint.kind == "truncated" else "summarize")
    svc.events.emit(state.id, CheckpointCreatedNotification(session_id=state.id, checkpoint=checkpoint))
    stage("aging", "ageing older checkpoints")
    await _age_and_merge(svc, state, ctx, run, exclude=checkpoint.id)


MAX_ROUNDS = 3
FIT_ROUNDS = 4
"""How often the folded checkpoint is cut again into the room the last cut left."""
FOLD_NOTICE_COST = 64
"""About what the folded checkpoint's notice and title lines cost."""
MIN_CLIP = 256
WIDEN_ROUNDS = 3
"""How often the newest turn's excerpt is widened into the room the last try left."""
"""The smallest excerpt of a tool output worth sending."""


def _checkpoint_cost(state: SessionState, ctx: ActiveContext) -> int:
    """The least a new checkpoint adds to the prompt: its message with a title line and a
    minimal summary, plus the section header when it is the first."""
    cost = MIN_TARGET + 16 + MESSAGE_OVERHEAD
    if not ctx.checkpoints:
        cost += state.counter.count(ckpts.SECTION_HEADER) + 4
    return cost


async def _checkpoint_for(svc: Service, state: SessionState, ctx: ActiveContext, selection: Selection,
                          run: _Pass, stage: _Stages, focus: str | None, strategy: str) -> Checkpoint:
    """Stages 3-4 and 6's first rule: a summary smaller than its input, or truncation."""
    number = run.number(state)
    count = state.counter.count
    if strategy == "truncate":
        run.summarizer = "truncation"
        return truncation_checkpoint(selection, now=now_iso(), number=number, count=count)
    from ctxd.summarize import SummaryRequest  # loads with the first compression, not at start-up

    stage("summarization", f"summarizing {selection.freed_tokens} tokens into ~{selection.target_tokens}")
    chain = svc.summarizers.chain(state.counter, state.row.model)
    request = SummaryRequest(messages=selection.summary_input(), level=selection.level,  # type: ignore[arg-type]
                             target_tokens=selection.target_tokens, goal=ctx.goal_text, focus=focus)
    result = await chain.summarize(request)
    run.summarizer = result.summarizer
    run.fallback = result.fallback_reason
    _tell_fallback(svc, state, run, result.fallback_reason, result.summarizer)
    stage("checkpoint", f"checkpoint from {result.summarizer}")
    checkpoint = make_checkpoint(selection, result.text, result.summarizer, now=now_iso(), number=number, count=count)
    rejection = summary_rejection(checkpoint)
    if rejection is None:
        return checkpoint
    run.fallback = "; ".join(filter(None, [run.fallback, rejection]))
    svc.events.emit(state.id, CompressionFailedNotification(
        session_id=state.id, reason=rejection, fallback="truncation"))
    run.summarizer = "truncation"
    return truncation_checkpoint(selection, now=now_iso(), number=number, count=count)


def _tell_fallback(svc: Service, state: SessionState, run: _Pass, reason: str | None, used: str) -> None:
    """A summarizer let us down and another stood in: tell clients, once per pass."""
    if reason and not run.told_fallback:
        run.told_fallback = True
        svc.events.emit(state.id, CompressionFailedNotification(
            session_id=state.id, reason=reason, fallback=used))


async def _resummarize(svc: Service, state: SessionState, run: _Pass, texts: list[str], level: str, target: int,
                       goal: str | None) -> tuple[str, str] | None:
    from ctxd.summarize import SummaryRequest

    chain = svc.summarizers.chain(state.counter, state.row.model)
    request = SummaryRequest(messages=[Message(role="assistant", content=t) for t in texts], level=level,  # type: ignore[arg-type]
                             target_tokens=target, goal=goal, kind="checkpoint_merge")
    result = await chain.summarize(request)
    if result.fallback_reason:
        if result.fallback_reason not in (run.fallback or ""):
            run.fallback = "; ".join(filter(None, [run.fallback, result.fallback_reason]))
        _tell_fallback(svc, state, run, result.fallback_reason, result.summarizer)
    return result.text, result.summarizer


async def _age_and_merge(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, exclude: str,
                         share: float | None = None) -> None:
    """Checkpoint ageing, when the checkpoints take more than their share: older
    checkpoints one level down, oldest first; then the oldest merged."""
    cache = svc.cache
    count = state.counter.count
    budget = cache.budget(state)
    older = [cp for cp in ctx.checkpoints if cp.id != exclude]
    new = [cp for cp in ctx.checkpoints if cp.id == exclude]
    share = cache.policy(state).checkpoint_share if share is None else share
    # The new checkpoint counts toward the share, but only the older ones age.
    room = share - sum(cp.tokens for cp in new) / max(1, budget.max_prompt_tokens)
    for step in ckpts.plan_aging(older, budget.max_prompt_tokens, max(0.0, room)):
        cp = next(c for c in ctx.checkpoints if c.id == step.checkpoint_id)
        out = await _resummarize(svc, state, run, [cp.summary], step.to_level, step.target_tokens, ctx.goal_text)
        if out is None:
            continue
        text, summarizer = out
        if not text.strip():
            continue  # an empty re-summary says less than the checkpoint did: keep it
        aged = msgspec.structs.replace(cp, level=step.to_level, summary=text, compressed_at=now_iso(),
                                       compression_count=cp.compression_count + 1, summarizer=summarizer)
        ckpts.measure(aged, count)
        if aged.tokens >= cp.tokens:
            continue  # a re-summary that does not shrink is not an ageing
        async with state.lock:
            ctx.checkpoints = [aged if c.id == cp.id else c for c in ctx.checkpoints]
            cache.refresh(state, system=True)
        run.detail.setdefault("aged", []).append(cp.id)
        svc.events.emit(state.id, CheckpointAgedNotification(
            session_id=state.id, checkpoint_id=cp.id, from_level=cp.level, to_level=aged.level,
            before_tokens=cp.tokens, after_tokens=aged.tokens))
    policy = cache.policy(state)
    merged_notices = ckpts.merge_truncated(ctx.checkpoints, policy.max_checkpoints, count, now_iso())
    if merged_notices != ctx.checkpoints:
        async with state.lock:
            ctx.checkpoints = merged_notices
            cache.refresh(state, system=True)
    while True:
        merge = ckpts.plan_merge(ctx.checkpoints, policy.max_checkpoints, budget.max_prompt_tokens,
                                policy.checkpoint_share)
        if merge is None:
            break
        first = next(c for c in ctx.checkpoints if c.id == merge.checkpoint_ids[0])
        second = next(c for c in ctx.checkpoints if c.id == merge.checkpoint_ids[1])
        out = await _resummarize(svc, state, run, [first.summary, second.summary], "ultra", merge.target_tokens,
                                 ctx.goal_text)
        if out is None or not out[0].strip():
            break
        text, summarizer = out
        merged = ckpts.merged(first, second, text, 0, summarizer, now_iso(), state.cstate.compression_count)
        ckpts.measure(merged, count)
        if merged.tokens >= first.tokens + second.tokens:
            break  # a merge that does not shrink would make the prompt bigger: keep both
        async with state.lock:
            index = ctx.checkpoints.index(first)
            rest = [c for c in ctx.checkpoints if c.id not in merge.checkpoint_ids]
            rest.insert(index, merged)
            ctx.checkpoints = rest
            cache.refresh(state, system=True)
        run.created.append(merged)
        run.detail.setdefault("merged", []).append([first.id, second.id, merged.id])
        svc.events.emit(state.id, CheckpointMergedNotification(
            session_id=state.id, merged_ids=[first.id, second.id], into_id=merged.id, tokens=merged.tokens))


async def _squeeze(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, focus: str | None) -> None:
    """The prompt still does not fit. Cheapest and least lossy first: excerpts of any
    message too big for the prompt (never the user's words), checkpoints merged and
    shortened, the rest of the conversation summarized down to the newest message;
    only then the overflow policy folds the user's words."""
    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    floor = irreducible(ctx)
    if floor > budget.max_prompt_tokens:
        # The newest user message alone (with the system part and pins) is bigger than any
        # prompt: nothing ctxd may do would help, so it changes nothing; context/prompt
        # refuses with the figures.
        svc.events.emit(state.id, OverflowNotification(
            session_id=state.id, policy=policy.overflow_policy, prompt_tokens=ctx.prompt_tokens,  # type: ignore[arg-type]
            max_prompt_tokens=budget.max_prompt_tokens, system_tokens=ctx.system_tokens,
            pinned_tokens=ctx.pinned_tokens, checkpoint_tokens=ctx.checkpoint_tokens, user_tokens=ctx.user_tokens,
            recent_tokens=ctx.recent_tokens, folded_messages=0, reason="prompt",
            action=f"the newest user message needs {floor} tokens with the system part and pins, more than "
                   f"{budget.max_prompt_tokens} may be sent: context/prompt will answer with ContextOverflow"))
        return
    limit = max(MIN_CLIP, math.floor(policy.recent_share * budget.available))
    clips = plan_clips(ctx, limit, policy.protected_tools)
    if clips:
        await _before_change(svc, state, run)
        async with state.lock:
            apply_clips(ctx, clips, limit, now_iso())
            ctx.state.lossy = True
            cache.refresh(state)
        run.layers.append("clip")
        run.detail["clipped"] = {"seqs": clips, "maxTokens": limit}
        budget = cache.budget(state)
        if fits(ctx, budget):
            return
    await _shrink_checkpoints(svc, state, ctx, run)
    budget = cache.budget(state)
    if fits(ctx, budget):
        return
    selection = identify(ctx, budget, policy, keep_recent=1, goal_used=_low_water(svc, state, policy, budget))
    if selection is not None:
        changed, selection = await _excerpts_instead(svc, state, ctx, run, selection,
                                                     _low_water(svc, state, policy, budget))
        if changed and fits(ctx, cache.budget(state)):
            return
    if selection is not None:
        prepare(selection, budget)
        stage = _Stages(svc, state, NullProgress())
        await _summarize_selection(svc, state, ctx, selection, run, stage, focus, policy.strategy)
        budget = cache.budget(state)
        if fits(ctx, budget):
            return
    await _shrink_checkpoints(svc, state, ctx, run)
    budget = cache.budget(state)
    if fits(ctx, budget):
        return
    # The newest messages together still do not fit (an agent's big call and its
    # output, each under the limit above): excerpts of every large one, in proportion,
    # before the user's words are folded.
    limits = plan_excerpts(clippable(ctx), max(ctx.prompt_tokens - budget.max_prompt_tokens,
                                               ctx.used - _low_water(svc, state, policy, budget)))
    if limits:
        await _apply_excerpts(svc, state, ctx, run, limits, lossy=True)
        budget = cache.budget(state)
        if fits(ctx, budget):
            return
    # The agent's working set yields before the user's words are folded or cut: the reads
    # it wants least first, as many as the excess needs, then all of it. (What leaves the
    # set after the boundary is still in the prompt until it is summarized.)
    for everything in (False, True):
        if not ctx.state.working:
            break
        keep = [] if everything else plan_yield(ctx, budget.max_prompt_tokens)
        await _before_change(svc, state, run)
        async with state.lock:
            apply_working_set(ctx, keep)
            cache.refresh(state, system=True)
        run.detail["workingSet"] = list(ctx.state.working)
        budget = cache.budget(state)
        if fits(ctx, budget):
            return
        selection = identify(ctx, budget, policy, keep_recent=1, goal_used=_low_water(svc, state, policy, budget))
        if selection is not None:
            prepare(selection, budget)
            await _summarize_selection(svc, state, ctx, selection, run, _Stages(svc, state, NullProgress()),
                                       focus, policy.strategy)
            budget = cache.budget(state)
            if fits(ctx, budget):
                return
    await _overflow(svc, state, ctx, run, _low_water(svc, state, policy, budget), keep_recent=1)
    if policy.overflow_policy == "fold" and not fits(ctx, cache.budget(state)):
        await _excerpt_words(svc, state, ctx, run)


async def _excerpt_words(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """Everything else is summarized, excerpted and folded, and the prompt still does not
    fit: older user messages (an agent's task, the usual one: its only user message, with
    its own steps after it) are sent as excerpts, the largest first, down to the low-water
    mark (so the next steps do not cut them again at once) or at least to a prompt that
    fits. History keeps them whole; ``context/overflow`` names them. The newest message is
    never cut: alone too big, it gets ContextOverflow."""
    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    over = ctx.prompt_tokens - budget.max_prompt_tokens
    limits = (plan_word_excerpts(ctx, max(over, ctx.used - _low_water(svc, state, policy, budget)))
              or plan_word_excerpts(ctx, over))
    if not limits:
        return
    figures = dict(prompt_tokens=ctx.prompt_tokens, max_prompt_tokens=budget.max_prompt_tokens,
                   system_tokens=ctx.system_tokens, pinned_tokens=ctx.pinned_tokens,
                   checkpoint_tokens=ctx.checkpoint_tokens, user_tokens=ctx.user_tokens,
                   recent_tokens=ctx.recent_tokens)
    await _before_change(svc, state, run)
    async with state.lock:
        for seq, limit in limits.items():
            apply_clips(ctx, [seq], limit, now_iso(), words=True)
        ctx.state.lossy = True
        cache.refresh(state)
    seqs = sorted(limits)
    run.layers.append("clip")
    run.detail.setdefault("excerpts", []).extend({"seq": s, "maxTokens": m, "words": True} for s, m in limits.items())
    sizes = ", ".join(f"message {s} to about {limits[s]} tokens" for s in seqs)
    svc.events.emit(state.id, OverflowNotification(
        session_id=state.id, policy=policy.overflow_policy, **figures,  # type: ignore[arg-type]
        action=(f"the prompt did not fit even with everything else compressed: {describe_seqs(seqs)} of the "
                f"user's words sent as excerpts ({sizes}: beginning and end, with a notice); history keeps them "
                f"whole (session/history), message/pin sends one whole again"),
        reason="prompt", excerpted_seqs=seqs))


async def _excerpts_instead(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass,
                            selection: Selection, goal: int) -> tuple[bool, Selection | None]:
    """Large newest messages in ``selection`` that only part of must go (an agent's big
    tool-call arguments and output): excerpts of them rather than a summary that leaves
    the prompt far below ``goal`` (``engine/pipeline.excerpts_instead``). Returns whether
    excerpts were taken and what is still to summarize (None: nothing)."""
    instead = excerpts_instead(ctx, selection, ctx.used - goal, svc.cache.budget(state).max_prompt_tokens)
    if instead is None:
        return False, selection
    head, limits = instead
    await _apply_excerpts(svc, state, ctx, run, limits)
    return True, head


async def _apply_excerpts(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass,
                          limits: dict[int, int], *, lossy: bool = False) -> None:
    """Send the messages of ``limits`` (``{seq: max_tokens}``) as excerpts from now on."""
    await _before_change(svc, state, run)
    async with state.lock:
        for seq, limit in limits.items():
            apply_clips(ctx, [seq], limit, now_iso())
        if lossy:
            ctx.state.lossy = True
        svc.cache.refresh(state)
    run.layers.append("clip")
    run.detail.setdefault("excerpts", []).extend({"seq": s, "maxTokens": m} for s, m in limits.items())


async def _shrink_checkpoints(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass,
                             need: int | None = None, keep_newest: bool = False) -> None:
    """Make room from the checkpoints before touching the user's words: every summary
    checkpoint (but the newest, with ``keep_newest``) merged into one, re-summarized down
    by what the prompt is over (or by ``need`` tokens)."""
    cache = svc.cache
    budget = cache.budget(state)
    over = ctx.prompt_tokens - budget.max_prompt_tokens if need is None else need
    summaries = [c for c in ctx.checkpoints if c.kind == "summary"]
    if keep_newest and summaries:
        newest = max(summaries, key=lambda c: c.seq_to)
        summaries = [c for c in summaries if c is not newest]
    if over <= 0 or not summaries:
        return
    total = sum(c.tokens for c in summaries)
    target = max(MIN_TARGET, total - over - len(summaries) * 8)
    if target >= total:
        return
    out = await _resummarize(svc, state, run, [c.summary for c in summaries], "ultra", target, ctx.goal_text)
    if out is None or not out[0].strip():
        return  # an empty re-summary would say less than the checkpoints did
    text, summarizer = out
    merged = summaries[0]
    for other in summaries[1:]:
        merged = ckpts.merged(merged, other, text, 0, summarizer, now_iso(), state.cstate.compression_count)
    if len(summaries) == 1:
        merged = msgspec.structs.replace(merged, level="ultra", summary=text, compressed_at=now_iso(),
                                         compression_count=merged.compression_count + 1, summarizer=summarizer)
    else:
        merged = msgspec.structs.replace(merged, summary=text)
    ckpts.measure(merged, state.counter.count)
    if merged.tokens >= total:
        return
    ids = {c.id for c in summaries}
    await _before_change(svc, state, run)
    async with state.lock:
        index = next(i for i, c in enumerate(ctx.checkpoints) if c.id in ids)
        rest = [c for c in ctx.checkpoints if c.id not in ids]
        rest.insert(min(index, len(rest)), merged)
        ctx.checkpoints = rest
        cache.refresh(state, system=True)
    run.created.append(merged)
    run.layers.append("shrink")
    run.detail.setdefault("shrunk", []).append({"from": sorted(ids), "into": merged.id, "tokens": merged.tokens})
    if len(summaries) > 1:
        svc.events.emit(state.id, CheckpointMergedNotification(
            session_id=state.id, merged_ids=[c.id for c in summaries], into_id=merged.id, tokens=merged.tokens))


def _fold_frees(ctx: ActiveContext, policy: CompressionPolicy, budget: Budget) -> int:
    """About what :func:`_fold_users` will free once the boundary has passed the oldest user
    messages: their words beyond the share less the loop guard's step, less what the
    folded checkpoint grows by (up to ``fold_share``)."""
    if policy.overflow_policy != "fold":
        return 0
    cap = math.floor(policy.user_share * budget.max_prompt_tokens)
    words = user_tokens(ctx)
    if words <= cap:
        return 0
    excess = words - (cap - math.ceil(policy.min_growth_fraction * budget.available))
    allowance = math.floor(policy.fold_share * budget.max_prompt_tokens)
    prior = next((cp.tokens for cp in ctx.checkpoints if cp.kind == "folded"), 0)
    return max(0, excess - max(0, min(allowance, prior + excess) - prior))


async def _fold_users(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> None:
    """The user's words stay verbatim while they take at most ``user_share`` of the largest
    prompt. Past it, the oldest are folded, down to that share less the loop guard's step
    (so the next user message does not fold again at once)."""
    cache = svc.cache
    policy = cache.policy(state)
    if policy.overflow_policy != "fold":
        return
    budget = cache.budget(state)
    cap = math.floor(policy.user_share * budget.max_prompt_tokens)
    if user_tokens(ctx) <= cap:
        return
    # Fold in one big step, not one message per turn: down to the share less the loop
    # guard's step, and further (to ``fold_floor`` of the share at most: half, a quarter
    # where the provider caches) when that is what brings the conversation to the
    # low-water mark.
    words = user_tokens(ctx)
    allowance = math.floor(policy.fold_share * budget.max_prompt_tokens)
    prior = next((cp.tokens for cp in ctx.checkpoints if cp.kind == "folded"), 0)
    others = ctx.used - words
    goal = cap - math.ceil(policy.min_growth_fraction * budget.available)
    goal = max(math.floor(cap * policy.fold_floor), min(goal, _low_water(svc, state, policy, budget) - others))
    from ctxd.summarize.salience import salience  # (with the first fold, not at start-up)

    chosen = plan_fold_users(ctx, goal, rank=lambda texts: salience(texts, state.counter.count, ctx.goal_text))
    moved = sum(e.view_tokens for e in chosen)
    if not chosen:
        return
    freed = moved - max(0, min(allowance, prior + moved) - prior)
    if freed <= FOLD_NOTICE_COST:
        return  # the folded checkpoint would keep (nearly) every word: the prompt would not shrink
    await _apply_fold(svc, state, ctx, run, chosen, allowance, "user_share")


async def _apply_fold(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, chosen: list[Entry],
                      allowance: int, reason: str) -> None:
    """Fold ``chosen`` and say so (``context/overflow``, every time: which messages, the
    checkpoint that holds them, how to get them back)."""
    from ctxd.summarize.chat import session_date_of  # (with the first fold, not at start-up)
    from ctxd.summarize.salience import salience

    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    figures = dict(prompt_tokens=ctx.prompt_tokens, max_prompt_tokens=budget.max_prompt_tokens,
                   system_tokens=ctx.system_tokens, pinned_tokens=ctx.pinned_tokens,
                   checkpoint_tokens=ctx.checkpoint_tokens, user_tokens=ctx.user_tokens,
                   recent_tokens=ctx.recent_tokens)
    await _before_change(svc, state, run)
    async with state.lock:
        cp = fold(ctx, chosen, allowance=allowance, now=now_iso(), number=run.number(state),
                  count=state.counter.count, rank=lambda texts: salience(texts, state.counter.count, ctx.goal_text),
                  date=session_date_of)
        if not run.counted:
            ctx.state.compression_count += 1
            run.counted = True
        cache.refresh(state, system=True)
    run.created.append(cp)
    run.layers.append("fold")
    seqs = [e.seq for e in chosen]
    run.detail.setdefault("folded", []).extend(seqs)
    svc.events.emit(state.id, CheckpointCreatedNotification(session_id=state.id, checkpoint=cp))
    why = (f"the user's words took more than {policy.user_share:.0%} of the prompt" if reason == "user_share"
           else "the prompt did not fit even with everything else compressed")
    svc.events.emit(state.id, OverflowNotification(
        session_id=state.id, policy=policy.overflow_policy, **figures,  # type: ignore[arg-type]
        action=(f"{why}: folded {len(seqs)} user message{'s' if len(seqs) != 1 else ''} "
                f"({describe_seqs(seqs)}) out of the conversation into checkpoint {cp.id} "
                f"({folded_summary(cp)}); they are whole in history: checkpoint/expand {cp.id} returns them, "
                f"message/pin sends one verbatim again"),
        folded_messages=len(seqs), reason=reason, folded_seqs=seqs, checkpoint_id=cp.id))  # type: ignore[arg-type]


async def _overflow(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass, low_water: int,
                    *, keep_recent: int) -> None:
    """Nothing else is left: say so with the figures, then apply the overflow policy
    (fold the oldest user messages down to the low-water mark)."""
    cache = svc.cache
    policy = cache.policy(state)
    budget = cache.budget(state)
    # Goal: the conversation back at the low-water mark (not just barely fitting), so
    # the next turns do not overflow again at once.
    goal = max(0, budget.prompt_tokens - budget.used + low_water)
    allowance = math.floor(policy.fold_share * budget.max_prompt_tokens)
    chosen: list[Entry] = []
    if policy.overflow_policy == "fold":
        chosen = plan_fold(ctx, goal, allowance=allowance)
        if not chosen:
            # The user's words are all still after the boundary (a session of user
            # messages only, never summarized): move it over them first.
            selection = identify(ctx, budget, policy, keep_recent=keep_recent, min_freed=-1)
            if selection is not None and selection.freed_tokens == 0 and len(selection.keep) == len(selection.removed):
                await _before_change(svc, state, run)
                async with state.lock:
                    if advance(ctx, selection):
                        cache.refresh(state)
                chosen = plan_fold(ctx, goal, allowance=allowance)
    if chosen:
        await _apply_fold(svc, state, ctx, run, chosen, allowance, "prompt")
        return
    action = ("nothing can be folded: context/prompt will answer with ContextOverflow"
              if policy.overflow_policy == "fold" else "context/prompt will answer with ContextOverflow")
    svc.events.emit(state.id, OverflowNotification(
        session_id=state.id, policy=policy.overflow_policy, prompt_tokens=ctx.prompt_tokens,  # type: ignore[arg-type]
        max_prompt_tokens=budget.max_prompt_tokens, system_tokens=ctx.system_tokens,
        pinned_tokens=ctx.pinned_tokens, checkpoint_tokens=ctx.checkpoint_tokens, user_tokens=ctx.user_tokens,
        recent_tokens=ctx.recent_tokens, action=action, folded_messages=0, reason="prompt"))


def composition(ctx: ActiveContext, budget: Budget, low_water: int) -> dict[str, int]:
    """The prompt's parts, in ctxd's count, stored with a pass (before and after it): what
    a pass could free and what it may not, beside the marks it works to. The fixed prefix
    (the client's system part and ctxd's goal block), the user's words kept verbatim, the
    checkpoints, the pinned working set, the recent turns; ``used`` is the conversation
    (kept and recent), the figure the trigger and the low-water mark are about."""
    return {"prefix": PROMPT_PRIMING + ctx.system_tokens, "userWords": ctx.user_tokens,
            "checkpoints": ctx.checkpoint_tokens, "working": ctx.pinned_tokens, "recent": ctx.recent_tokens,
            "prompt": ctx.prompt_tokens, "maxPrompt": budget.max_prompt_tokens,
            "replyReserve": budget.reserved_output, "available": budget.available, "used": budget.used,
            "triggerAt": budget.trigger_at, "lowWater": low_water}


async def _finish(svc: Service, state: SessionState, ctx: ActiveContext, run: _Pass) -> CompressResult:
    """Store the pass in one transaction, then tell the clients."""
    duration = round((time.perf_counter() - run.started) * 1000, 2)
    compressed = bool(run.layers)
    ids = [cp.id for cp in run.created]

    def job(conn: Any) -> None:
        checkpoint_store.save_active(conn, state.id, active)
        session_store.save_context(conn, state.id, context_state=encoded, context_tokens=state.row.context_tokens)
        if compressed:
            checkpoint_store.record_compression(
                conn, state.id, at=now_iso(), trigger=run.trigger, last_seq=last_seq, layers=run.layers,
                before=run.before,
                after=after, checkpoint_ids=ids, summarizer=run.summarizer, duration_ms=duration,
                detail={**run.detail, **({"fallback": run.fallback} if run.fallback else {})})

    async with state.lock:
        after = ctx.prompt_tokens
        if compressed:
            budget = svc.cache.budget(state)
            run.detail["parts"] = composition(ctx, budget, _low_water(svc, state, svc.cache.policy(state), budget))
        # Even a pass that found nothing to compress resets the loop guard: the next automatic
        # pass waits for the conversation to grow instead of retrying on every push.
        ctx.state.last_after_used = ctx.used
        state.sync_figures()
        encoded = state.encoded_state()
        active = list(ctx.checkpoints)
        last_seq = state.row.last_seq
        try:
            await svc.db.write(job)
        except CtxdError:
            await _reset_from_storage(svc, state)
            raise
        budget = svc.cache.budget(state)
    if compressed:
        state.billing.passes += 1  # (what the next prompt's bill charges to a pass)
        freed = run.before - after
        svc.events.emit(state.id, CompressedNotification(
            session_id=state.id, layers=run.layers, before_tokens=run.before, after_tokens=after,  # type: ignore[arg-type]
            freed_tokens=freed, ratio=round(after / run.before, 4) if run.before else 1.0, checkpoint_ids=ids,
            duration_ms=duration, compression_number=ctx.state.compression_count, summarizer=run.summarizer,
            trigger=run.trigger))  # type: ignore[arg-type]
        notify.updated(svc, state, "compressed")
    else:
        svc.events.emit(state.id, CompressionSkippedNotification(
            session_id=state.id, reason="nothing could be compressed (everything left is recent, pinned "
                                        "or the user's own words)", used=budget.used, trigger_at=budget.trigger_at))
    notify.after_change(svc, state, budget)
    return CompressResult(session_id=state.id, compressed=compressed, layers=run.layers,  # type: ignore[arg-type]
                          before_tokens=run.before, after_tokens=after, checkpoint_ids=ids,
                          summarizer=run.summarizer, duration_ms=duration,
                          reason=run.fallback if compressed else "nothing could be compressed")


async def _reload(svc: Service, state: SessionState) -> None:
    """After a failed pass: forget the in-memory context, rebuild it from what is stored."""
    async with state.lock:
        await _reset_from_storage(svc, state)


async def _reset_from_storage(svc: Service, state: SessionState) -> None:
    """(Caller holds the session lock.)"""
    row = await svc.db.read(session_store.get_session, state.id)
    state.drop_context()
    if row is not None:
        state.stored = decode_stored(row.context_state)
        state.row.context_tokens = row.context_tokens


async def ensure_fits(svc: Service, state: SessionState, fmt: str = "anthropic") -> None:
    """Before handing out a prompt in ``fmt``: compress now if it would not fit (never hand
    out one that does not), or refuse with the figures when that is impossible or not
    allowed. (The context counts the Anthropic shape's opening user turn for every shape,
    ``ActiveContext.opener``: the other shapes, which send none, fit without it.)"""

    async def unsent() -> int:
        return 0 if fmt == "anthropic" else (await svc.cache.context(state)).opener

    budget = svc.cache.budget(state)
    if budget.prompt_tokens <= budget.max_prompt_tokens:  # (the usual prompt: it fits, whatever is unsent)
        return
    if budget.prompt_tokens - await unsent() <= budget.max_prompt_tokens:
        return
    policy = svc.cache.policy(state)
    if policy.auto:
        await compress(svc, state, trigger="prompt")
        budget = svc.cache.budget(state)
        if budget.prompt_tokens - await unsent() <= budget.max_prompt_tokens:
            return
        why = "it does not fit even after compression"
        floor = irreducible(await svc.cache.context(state))
        if floor > budget.max_prompt_tokens:
            why = (f"the newest user message alone needs {floor} tokens with the system part and pinned "
                   f"messages (history keeps it; send a shorter one, or use a larger window)")
        elif policy.overflow_policy == "error":
            why += " (overflow policy is 'error')"
    else:
        why = "automatic compression is off for this session; call context/compress"
    raise CtxdError(ErrorCode.ContextOverflow, f"the prompt needs {budget.prompt_tokens} tokens but at most "
                    f"{budget.max_prompt_tokens} may be sent: {why}", {
                        "promptTokens": budget.prompt_tokens, "maxPromptTokens": budget.max_prompt_tokens,
                        "contextWindow": budget.context_window, "systemTokens": budget.system_tokens,
                        "pinnedTokens": budget.pinned_tokens, "checkpointTokens": budget.checkpoint_tokens,
                        "used": budget.used})
