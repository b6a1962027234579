"""Client controls over the active context: ``context/compress``, ``context/watermark``,
``message/pin``, ``context/checkpoints`` and ``checkpoint/expand``."""

from __future__ import annotations

import math

from ctxd.engine.context import ActiveContext, Entry, never_compressed
from ctxd.engine.folding import unfold
from ctxd.engine.pipeline import tool_partners
from ctxd.engine.watermark import WatermarkMove, apply_watermark, plan_watermark
from ctxd.protocol.common import MAX_GOAL_CHARS
from ctxd.protocol.compression import (
    CheckpointRef,
    CheckpointsResult,
    CompressedNotification,
    CompressParams,
    CompressResult,
    ExpandResult,
    HistoryMessage,
    PinParams,
    PinResult,
    WatermarkParams,
    WatermarkResult,
)
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params
from ctxd.service import compression, fields, notify
from ctxd.service.core import Service
from ctxd.service.events import Progress
from ctxd.service.state import SessionState
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store


async def compress(svc: Service, params: CompressParams, progress: Progress | None = None) -> CompressResult:
    fields.text(params.focus, "focus", MAX_GOAL_CHARS)
    state = await svc.cache.get(params.session_id)
    return await compression.compress(svc, state, trigger="request", focus=params.focus, progress=progress,
                                      force=True)


async def checkpoints(svc: Service, session_id: str) -> CheckpointsResult:
    state = await svc.cache.get(session_id)
    if not state.compress_lock.locked():  # (a pass of this daemon is mid-way: memory is ahead, not behind)
        await svc.cache.catch_up(state)  # shared storage: another daemon may have changed it
    async with state.lock:
        ctx = await svc.cache.context(state)
        active = list(ctx.checkpoints)
    return CheckpointsResult(session_id=state.id, checkpoints=active, tokens=ctx.checkpoint_tokens)


async def expand(svc: Service, params: CheckpointRef) -> ExpandResult:
    """The original messages a checkpoint stands for, from history (never from a summary)."""
    state = await svc.cache.get(params.session_id)
    cp = await svc.db.read(checkpoint_store.get_checkpoint, state.id, params.checkpoint_id)
    if cp is None:
        raise CtxdError(ErrorCode.CheckpointNotFound,
                        f"no checkpoint {params.checkpoint_id!r} in session {state.id!r}",
                        {"field": "checkpointId", "checkpointId": params.checkpoint_id})
    stored = await svc.db.read(message_store.load_seqs, state.id, cp.message_seqs)
    return ExpandResult(session_id=state.id, checkpoint=cp, messages=[
        HistoryMessage(seq=m.seq, message=m.message, tokens=m.tokens.total, created_at=m.created_at)
        for m in stored])


async def watermark(svc: Service, params: WatermarkParams) -> WatermarkResult:
    if params.tool_use_id is None and params.seq is None:
        raise invalid_params("give toolUseId or seq", "toolUseId")
    state = await svc.cache.get(params.session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        async with state.lock:
            ctx = await svc.cache.context(state)
            planned = plan_watermark(ctx, tool_use_id=params.tool_use_id, seq=params.seq)
            if not isinstance(planned, WatermarkMove):
                return WatermarkResult(session_id=state.id, changed=False, watermark_seq=ctx.state.watermark_seq,
                                       tool_use_id=ctx.state.watermark_tool_use_id, reason=planned)
            before = ctx.prompt_tokens
            apply_watermark(ctx, planned)
            svc.cache.refresh(state)
            await svc.db.write(session_store.save_context, state.id, context_state=state.encoded_state(),
                               context_tokens=state.row.context_tokens)
            after = ctx.prompt_tokens
            budget = svc.cache.budget(state)
        svc.events.emit(state.id, CompressedNotification(
            session_id=state.id, layers=["watermark"], before_tokens=before, after_tokens=after,
            freed_tokens=before - after, ratio=round(after / before, 4) if before else 1.0, checkpoint_ids=[],
            duration_ms=0.0, compression_number=ctx.state.compression_count, trigger="request"))
        notify.updated(svc, state, "watermark")
        notify.after_change(svc, state, budget)
        return WatermarkResult(session_id=state.id, changed=True, watermark_seq=planned.seq,
                               tool_use_id=planned.tool_use_id, blocks_removed=planned.blocks,
                               tokens_freed=before - after)


PARTNER_WINDOW = 50


PIN_SHARE = 0.5
"""Pinned messages, the system prompt and the goal together may take at most this share
of the largest prompt: the conversation (the newest user message at least) needs room."""


def _check_pins_fit(svc: Service, state: SessionState, ctx: ActiveContext, adding: list[Entry]) -> None:
    budget = svc.cache.budget(state)
    extra = sum(e.sent_tokens for e in adding)
    after = ctx.pinned_tokens + extra
    limit = math.floor(PIN_SHARE * budget.max_prompt_tokens)
    if after + ctx.system_tokens > limit:
        raise CtxdError(ErrorCode.ContextOverflow,
                        f"seq: pinning {', '.join(str(e.seq) for e in adding)} ({extra} tokens) would make pinned "
                        f"messages {after} tokens; with the system prompt and goal ({ctx.system_tokens}) they may "
                        f"take at most {limit} of the {budget.max_prompt_tokens}-token prompt", {
                            "field": "seq", "pinTokens": extra, "pinnedTokens": after,
                            "systemTokens": ctx.system_tokens, "limit": limit,
                            "maxPromptTokens": budget.max_prompt_tokens})


async def pin(svc: Service, params: PinParams) -> PinResult:
    """Pinned messages are sent verbatim whatever compression does; a pinned message
    already behind the boundary comes back into the prompt. A tool call and its result
    are pinned (and unpinned) together."""
    state = await svc.cache.get(params.session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        if not 1 <= params.seq <= state.row.last_seq:
            raise CtxdError(ErrorCode.MessageNotFound, f"no message {params.seq} in session {state.id!r}",
                            {"field": "seq", "seq": params.seq})
        async with state.lock:
            ctx = await svc.cache.context(state)
            nearby = await svc.db.read(message_store.load_range, state.id, max(0, params.seq - PARTNER_WINDOW - 1),
                                       params.seq + PARTNER_WINDOW, None)
            entries = {m.seq: Entry.of(m.seq, m.message, m.tokens) for m in nearby}
            seqs = [params.seq] + tool_partners(list(entries.values()), params.seq)
            pinned = set(ctx.state.pinned)
            # A pin claims a working-set message (the user's pin now: it stays when the set moves
            # on); an unpin releases it from the set too (else the next change of the set pins it again).
            claimed = bool(set(seqs) & set(ctx.state.working))
            if claimed:
                ctx.state.working = [s for s in ctx.state.working if s not in seqs]
                if not params.pinned:
                    ctx.state.declined = sorted(set(ctx.state.declined) | set(seqs))
            if params.pinned and set(seqs) & set(ctx.state.declined):
                ctx.state.declined = [s for s in ctx.state.declined if s not in seqs]
            changed = claimed or any((seq in pinned) != params.pinned for seq in seqs)
            if changed and params.pinned:
                _check_pins_fit(svc, state, ctx, [entries[s] for s in seqs if s not in pinned and s in entries])
            if changed:
                kept_users = {e.seq for e in ctx.kept if never_compressed(e)}
                for seq in seqs:
                    if params.pinned:
                        pinned.add(seq)
                        unfold(ctx, seq, state.counter.count)
                        if seq <= ctx.state.boundary and not any(e.seq == seq for e in ctx.kept) \
                                and not ctx.state.is_out(seq):
                            ctx.kept.append(entries[seq])
                    else:
                        pinned.discard(seq)
                        ctx.kept = [e for e in ctx.kept if e.seq != seq or e.seq in kept_users]
                ctx.kept.sort(key=lambda e: e.seq)
                ctx.state.pinned = sorted(pinned)
                ctx.state.kept_seqs = [e.seq for e in ctx.kept]
                svc.cache.refresh(state, system=True)
                await svc.db.write(checkpoint_store.save_active, state.id, list(ctx.checkpoints))
                await svc.db.write(session_store.save_context, state.id, context_state=state.encoded_state(),
                                   context_tokens=state.row.context_tokens)
            budget = svc.cache.budget(state)
        if changed:
            notify.updated(svc, state, "pin")
            notify.after_change(svc, state, budget)
            compression.schedule(svc, state)
        return PinResult(session_id=state.id, seq=params.seq, pinned=params.pinned, pinned_tokens=ctx.pinned_tokens,
                         seqs=seqs)


async def supersede(svc: Service, session_id: str, keys: list[str]) -> list[int]:
    """Take the stored messages with these idempotency keys out of the active context (a
    client's working context it now sends a newer copy of: ``context/prompt``
    ``supersede``); history keeps them. A pin on them goes with them. The seqs newly
    superseded."""
    state = await svc.cache.get(session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        async with state.lock:
            found = await svc.db.read(message_store.find_keys, state.id, list(dict.fromkeys(keys)),
                                      state.row.last_seq)
            ctx = await svc.cache.context(state)
            seqs = sorted({seq for seq, _ in found.values()} - set(ctx.state.superseded))
            if not seqs:
                return []
            out = set(seqs)
            ctx.recent = [e for e in ctx.recent if e.seq not in out]
            ctx.kept = [e for e in ctx.kept if e.seq not in out]
            ctx.state.kept_seqs = [e.seq for e in ctx.kept]
            ctx.state.pinned = [seq for seq in ctx.state.pinned if seq not in out]
            ctx.state.current = [seq for seq in ctx.state.current if seq not in out]
            ctx.state.working = [seq for seq in ctx.state.working if seq not in out]
            # Those already behind the boundary and not kept stand in a checkpoint: only
            # the ones still shown need remembering.
            ctx.state.superseded = sorted(set(ctx.state.superseded) | {s for s in out if s > ctx.state.boundary}
                                          | {s for s in ctx.state.superseded if s > ctx.state.boundary})
            svc.cache.refresh(state, system=True)
            await svc.db.write(session_store.save_context, state.id, context_state=state.encoded_state(),
                               context_tokens=state.row.context_tokens)
    notify.updated(svc, state, "supersede")
    return seqs


async def keep_current(svc: Service, session_id: str, keys: list[str],
                       known: dict[str, tuple[int, int]] | None = None) -> list[int]:
    """Pin the stored messages with these idempotency keys as the client's current working
    context (``context/prompt`` ``current``), in the order named while the pins take at
    most ``PIN_SHARE`` of the prompt; unpin those an earlier call pinned that these keys no
    longer name (the user's own pins are left alone). The seqs pinned as current now.
    ``known``: key -> (seq, tokens) of messages the caller just pushed (its push result),
    not read again (a new session's first prompt names only those)."""
    state = await svc.cache.get(session_id)
    async with svc.cache.changing(state):
        async with state.lock:
            known = known or {}
            found = {k: known[k] for k in keys if k in known}
            missing = [k for k in dict.fromkeys(keys) if k not in found]
            if missing:
                found.update(await svc.db.read(message_store.find_keys, state.id, missing, state.row.last_seq))
            ctx = await svc.cache.context(state)
            cstate = ctx.state
            # In the order named (the client's priority), each once.
            out_of = set(cstate.superseded)
            wanted = list(dict.fromkeys(found[k][0] for k in keys if k in found and found[k][0] not in out_of))
            pinned = set(cstate.pinned)
            before = set(cstate.current)
            drop = before - set(wanted)
            budget = svc.cache.budget(state)
            room = math.floor(PIN_SHARE * budget.max_prompt_tokens) - ctx.system_tokens - ctx.pinned_tokens
            room += sum(e.tokens.context for e in ctx.entries() if e.seq in drop and e.seq in pinned)
            tokens = {seq: t for seq, t in found.values()}
            add: list[int] = []
            current: set[int] = set()
            for seq in wanted:
                if seq in before:
                    current.add(seq)  # pinned as current already
                    continue
                if seq in pinned or tokens[seq] > room:  # (a pin of the user's own stays theirs)
                    continue
                room -= tokens[seq]
                add.append(seq)
                current.add(seq)
            if not add and not drop:
                return sorted(current)
            kept_users = {e.seq for e in ctx.kept if never_compressed(e)}
            for seq in drop:
                pinned.discard(seq)
                ctx.kept = [e for e in ctx.kept if e.seq != seq or e.seq in kept_users]
            if add:
                behind = [s for s in add if s <= cstate.boundary and not any(e.seq == s for e in ctx.kept)]
                if behind:
                    for m in await svc.db.read(message_store.load_seqs, state.id, behind):
                        ctx.kept.append(Entry.of(m.seq, m.message, m.tokens))
                for seq in add:
                    pinned.add(seq)
                    unfold(ctx, seq, state.counter.count)
            ctx.kept.sort(key=lambda e: e.seq)
            cstate.pinned = sorted(pinned)
            cstate.current = sorted(current)
            cstate.kept_seqs = [e.seq for e in ctx.kept]
            svc.cache.refresh(state, system=True)
            await svc.db.write(session_store.save_context, state.id, context_state=state.encoded_state(),
                               context_tokens=state.row.context_tokens)
    notify.updated(svc, state, "pin")
    return sorted(current)
