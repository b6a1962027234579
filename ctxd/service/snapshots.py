"""Snapshots: taking them (on request, at the usage threshold, before compressions,
before restores), listing, reading, restoring and rolling cleanup.

A snapshot is taken under the session lock, so it never sees half of a push; it is
written in one transaction, so it exists whole or not at all.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from datetime import timedelta
from typing import Any

import msgspec

from ctxd.protocol.common import MAX_LABEL_CHARS
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.snapshot import (
    SnapshotContent,
    SnapshotCreated,
    SnapshotCreateParams,
    SnapshotDeleted,
    SnapshotDeleteResult,
    SnapshotError,
    SnapshotInfo,
    SnapshotListResult,
    SnapshotMessage,
    SnapshotRef,
    SnapshotRestored,
    SnapshotRestoreResult,
)
from ctxd.service import compression, fields, notify
from ctxd.service.clock import now_iso, parse_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store import snapshots as store
from ctxd.store.sessions import counted_role
from ctxd.store.snapshots import SnapshotRow
from ctxd.store.state import decode_stored

log = logging.getLogger(__name__)


def _new_id() -> str:
    return "snap_" + uuid.uuid4().hex[:12]


def _cleanup_job(conn: Any, session_id: str, keep: int, older_than: str | None) -> list[str]:
    victims = store.rolling_victims(conn, session_id, keep, older_than)
    return store.delete_snapshots(conn, session_id, victims)


async def _take(svc: Service, state: SessionState, trigger: str, label: str | None) -> SnapshotInfo:
    """Write a snapshot of the loaded context; the caller holds the session lock."""
    ctx = await svc.cache.context(state)
    state.sync_figures()
    row = state.row
    cstate = ctx.state
    history = max(row.token_count, 1)
    info = SnapshotInfo(
        snapshot_id=_new_id(), session_id=state.id, created_at=now_iso(), trigger=trigger,  # type: ignore[arg-type]
        last_seq=row.last_seq, message_count=row.message_count, token_count=row.token_count,
        context_tokens=row.context_tokens, checkpoint_count=len(ctx.checkpoints),
        compression_count=cstate.compression_count,
        user_message_count=row.stats.by_role["user"].messages if "user" in row.stats.by_role else 0,
        context_window=state.context_window, compression_ratio=round(row.context_tokens / history, 4),
        label=label, model=row.model, watermark_seq=cstate.watermark_seq,
    )
    cstate.snapshot_seq, cstate.snapshot_revision = row.last_seq, cstate.revision
    snap = SnapshotRow(info, state.encoded_state(), list(ctx.checkpoints), row.goal)
    cfg = svc.config.snapshots
    older = None
    if cfg.max_age_days > 0:
        older = (parse_iso(info.created_at) - timedelta(days=cfg.max_age_days)).isoformat().replace("+00:00", "Z")

    marker = (cstate.snapshot_seq, cstate.snapshot_revision)

    def job(conn: Any) -> list[str]:
        store.insert_snapshot(conn, snap)
        # The session remembers which context its newest snapshot holds, across restarts:
        # only those two fields of the stored state change (a pass under way stores its own).
        row = conn.execute("SELECT context_state FROM sessions WHERE id = ?", (state.id,)).fetchone()
        if row is not None:
            stored = decode_stored(row[0])
            stored.compression.snapshot_seq, stored.compression.snapshot_revision = marker
            session_store.save_context(conn, state.id, context_state=msgspec.json.encode(stored))
        return _cleanup_job(conn, state.id, cfg.keep, older)

    try:
        deleted = await svc.db.write(job)
    except CtxdError as exc:
        svc.events.emit(state.id, SnapshotError(session_id=state.id, operation="create",
                                                                  reason=exc.message))
        raise CtxdError(ErrorCode.SnapshotFailed, f"snapshot not written: {exc.message}") from exc
    svc.events.emit(state.id, SnapshotCreated(session_id=state.id, snapshot=info))
    deleted = [d for d in deleted if d != info.snapshot_id]
    if deleted:
        svc.events.emit(state.id, SnapshotDeleted(session_id=state.id, snapshot_ids=deleted,
                                                                      reason="rolling"))
    return info


async def auto_at_threshold(svc: Service, state: SessionState) -> None:
    """After a push (under the lock): one automatic snapshot per rise above the threshold."""
    cfg = svc.config.snapshots
    if not cfg.auto:
        return
    budget = svc.cache.budget(state)
    cstate = state.cstate
    above = budget.prompt_tokens >= math.floor(cfg.auto_threshold * budget.max_prompt_tokens)
    if above and cstate.snapshot_armed:
        cstate.snapshot_armed = False
        cstate.snapshot_seq = state.row.last_seq
        await _take(svc, state, "auto", f"context at {budget.prompt_tokens}/{budget.max_prompt_tokens} tokens")
    elif not above and not cstate.snapshot_armed:
        cstate.snapshot_armed = True


async def before_compression(svc: Service, state: SessionState) -> None:
    """Before a compression pass changes anything: a restore point, unless nothing changed
    since the last automatic snapshot."""
    cfg = svc.config.snapshots
    if not (cfg.auto and cfg.before_compression):
        return
    async with state.lock:
        cstate = state.cstate
        if cstate.snapshot_seq >= state.row.last_seq and cstate.snapshot_revision == cstate.revision:
            return  # the newest snapshot (of any kind) already holds this very context
        await _take(svc, state, "auto", "before compression")


async def create(svc: Service, params: SnapshotCreateParams) -> SnapshotInfo:
    fields.text(params.label, "label", MAX_LABEL_CHARS)
    state = await svc.cache.get(params.session_id)
    async with state.lock:
        return await _take(svc, state, "manual", params.label)


async def list_snapshots(svc: Service, session_id: str) -> SnapshotListResult:
    state = await svc.cache.get(session_id)
    return SnapshotListResult(session_id=state.id, snapshots=await svc.db.read(store.list_snapshots, state.id))


async def _row(svc: Service, state: SessionState, snapshot_id: str) -> SnapshotRow:
    row = await svc.db.read(store.get_snapshot, state.id, snapshot_id)
    if row is None:
        raise CtxdError(ErrorCode.SnapshotNotFound, f"no snapshot {snapshot_id!r} in session {state.id!r}",
                        {"field": "snapshotId", "snapshotId": snapshot_id})
    return row


async def get(svc: Service, params: SnapshotRef) -> SnapshotContent:
    """A snapshot's content, materialised from history (which never changes)."""
    state = await svc.cache.get(params.session_id)
    snap = await _row(svc, state, params.snapshot_id)
    stored = decode_stored(snap.state).compression
    last = snap.info.last_seq
    recent = await svc.db.read(message_store.load_range, state.id, stored.boundary, last, None)
    kept = await svc.db.read(message_store.load_seqs, state.id, list(stored.kept_seqs)) if stored.kept_seqs else []
    context_seqs = {m.seq for m in kept} | {m.seq for m in recent if not stored.is_out(m.seq)}
    all_users = await svc.db.read(_user_messages, state.id, last)
    users = [SnapshotMessage(seq=m.seq, message=m.message, tokens=m.tokens.total, in_context=m.seq in context_seqs)
             for m in all_users if not stored.is_rolled_back(m.seq)]
    others = [SnapshotMessage(seq=m.seq, message=m.message, tokens=m.tokens.total, in_context=True)
              for m in sorted(kept + recent, key=lambda m: m.seq)
              if m.seq in context_seqs and counted_role(m.message) != "user"]
    thinking = sum(m.tokens.thinking for m in kept + recent if m.seq in context_seqs)
    return SnapshotContent(info=snap.info, user_messages=users, messages=others, checkpoints=snap.checkpoints,
                           goal=snap.goal, watermark_seq=stored.watermark_seq, pinned=list(stored.pinned),
                           thinking_tokens=thinking)


def _user_messages(conn: Any, session_id: str, through: int) -> list[message_store.StoredMessage]:
    """The user's messages up to ``through``: what the user wrote, not the tool results an
    agent sends in user messages (``store.sessions.counted_role``)."""
    rows = conn.execute("SELECT seq FROM messages WHERE session_id = ? AND role = 'user' AND seq <= ? ORDER BY seq",
                        (session_id, through)).fetchall()
    return [m for m in message_store.load_seqs(conn, session_id, [seq for (seq,) in rows])
            if counted_role(m.message) == "user"]


async def delete(svc: Service, params: SnapshotRef) -> SnapshotDeleteResult:
    state = await svc.cache.get(params.session_id)
    deleted = await svc.db.write(store.delete_snapshots, state.id, [params.snapshot_id])
    if not deleted:
        raise CtxdError(ErrorCode.SnapshotNotFound, f"no snapshot {params.snapshot_id!r} in session {state.id!r}",
                        {"field": "snapshotId", "snapshotId": params.snapshot_id})
    svc.events.emit(state.id, SnapshotDeleted(session_id=state.id, snapshot_ids=deleted,
                                                                  reason="request"))
    return SnapshotDeleteResult(session_id=state.id, deleted=deleted)


async def restore(svc: Service, params: SnapshotRef) -> SnapshotRestoreResult:
    """The active context becomes the snapshot's. History keeps everything; messages
    pushed after the snapshot are marked rolled back, not removed. A snapshot of the
    current context is taken first, so a restore can itself be undone."""
    state = await svc.cache.get(params.session_id)
    async with svc.cache.changing(state):  # shared storage: one daemon at a time, from what is stored
        task = state.compression_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        async with state.compress_lock, state.lock:
            snap = await _row(svc, state, params.snapshot_id)
            previous_goal = state.row.goal
            backup = await _take(svc, state, "restore", f"before restoring {params.snapshot_id}")
            restored = decode_stored(snap.state)
            cstate = restored.compression
            last = state.row.last_seq
            rolled: tuple[int, int] | None = None
            if last > snap.info.last_seq:
                rolled = (snap.info.last_seq + 1, last)
                cstate.rolled_back = [*cstate.rolled_back, rolled]
            cstate.snapshot_seq, cstate.snapshot_revision = last, cstate.revision  # it is a snapshot
            cstate.snapshot_armed = False
            encoded = msgspec.json.encode(restored)
            now = now_iso()

            def job(conn: Any) -> None:
                checkpoint_store.save_active(conn, state.id, snap.checkpoints)
                session_store.save_context(conn, state.id, context_state=encoded, goal=snap.goal)
                store.add_event(conn, state.id, now, "restore", last, {
                    "snapshotId": snap.info.snapshot_id, "backupSnapshotId": backup.snapshot_id,
                    "rolledBack": list(rolled) if rolled else None})

            try:
                await svc.db.write(job)
            except CtxdError as exc:
                svc.events.emit(state.id, SnapshotError(session_id=state.id, operation="restore",
                                                                          reason=exc.message))
                raise CtxdError(ErrorCode.SnapshotFailed, f"restore failed, nothing changed: {exc.message}") from exc
            state.stored = restored
            state.row.goal = snap.goal
            state.drop_context()
            await svc.cache.context(state)
            await svc.db.write(session_store.save_context, state.id, context_state=state.encoded_state(),
                               context_tokens=state.row.context_tokens)
            budget = svc.cache.budget(state)
        svc.events.emit(state.id, SnapshotRestored(
            session_id=state.id, snapshot_id=snap.info.snapshot_id, backup_snapshot_id=backup.snapshot_id,
            rolled_back_from=rolled[0] if rolled else None, rolled_back_to=rolled[1] if rolled else None))
        notify.updated(svc, state, "restored")
        notify.after_change(svc, state, budget)
    # A context that does not fit is compressed now, as the next prompt would do: otherwise
    # every view (sessions list, stats) showed a prompt that will never be sent
    # ("17,274 / 4,157 (416%)"). Over the trigger only: in the background, as after a push.
    compressed = False
    if budget.prompt_tokens > budget.max_prompt_tokens and svc.cache.policy(state).auto:
        try:
            await compression.compress(svc, state, trigger="auto")
            compressed = True
        except CtxdError as exc:  # (the restore stands; the next prompt says why it cannot fit)
            log.warning("session %s: the restored context does not fit and was not compressed: %s",
                        state.id, exc.message)
    else:
        compression.schedule(svc, state)
    return SnapshotRestoreResult(session_id=state.id, snapshot_id=snap.info.snapshot_id,
                                 backup_snapshot_id=backup.snapshot_id,
                                 rolled_back_from=rolled[0] if rolled else None,
                                 rolled_back_to=rolled[1] if rolled else None,
                                 context_tokens=state.row.context_tokens,
                                 goal_changed=snap.goal != previous_goal, goal=snap.goal,
                                 previous_goal=previous_goal, compressed=compressed)

