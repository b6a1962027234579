"""``session/push``: validate, count, write, acknowledge.

A push is all-or-nothing: every message is checked (schema, tool-call shape, size)
before anything is written, the batch is written in one transaction, and the
result is returned only after that transaction committed. Messages carrying an
``idempotencyKey`` already stored in the session are answered with their original
sequence number and token count and are not stored again.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import anyio
import msgspec

from ctxd.engine import calibration
from ctxd.engine.context import Entry
from ctxd.engine.goals import apply_markers, parse_markers
from ctxd.engine.watermark import find_checkpoint_call
from ctxd.protocol.compression import CompressedNotification
from ctxd.protocol.goal import Goal
from ctxd.protocol.common import MAX_COUNT
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params, session_not_found
from ctxd.protocol.message import Message, TextBlock, ToolResultBlock, ToolUseBlock
from ctxd.protocol.session import PushedMessage, PushResult, SessionPushParams
from ctxd.service.clock import now_iso, parse_iso
from ctxd.service.core import Service
from ctxd.service import compression, notify, snapshots
from ctxd.service.state import SessionState, StaleSession
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store.messages import NewMessage, StoredMessage
from ctxd.store.sessions import DriftTotals, KindTotals, RoleTotals, SessionStats
from ctxd.store.state import Figures, StoredState
from ctxd.tokens import PROMPT_PRIMING, MessageTokens, TokenCounter

MAX_KEY_LENGTH = 200
STALE_RETRIES = 50
# Counting a large batch on the event loop would stall every other client.
THREAD_COUNT_BYTES = 256 * 1024

_encode = msgspec.json.Encoder().encode


_FIELDS: dict[type, tuple[msgspec.structs.FieldInfo, ...]] = {}


def check_message(message: Message, index: int) -> None:
    """Rules the schema cannot express; each error names the offending field."""
    where = f"messages[{index}]"
    role = message.role
    if message.tool_calls is not None and role != "assistant":
        raise invalid_params(f"{where}.toolCalls: only assistant messages make tool calls",
                             f"{where}.toolCalls")
    if role == "tool" and not message.tool_call_id and not (
        isinstance(message.content, list) and any(isinstance(b, ToolResultBlock) for b in message.content)
    ):
        raise invalid_params(f"{where}.toolCallId: required for role 'tool'", f"{where}.toolCallId")
    if message.tool_call_id is not None and role != "tool":
        raise invalid_params(f"{where}.toolCallId: only tool messages answer a tool call",
                             f"{where}.toolCallId")
    call_ids = [c.id for c in message.tool_calls or ()]
    if isinstance(message.content, list):
        call_ids += [b.id for b in message.content if isinstance(b, ToolUseBlock)]
    if len(set(call_ids)) != len(call_ids):
        raise invalid_params(f"{where}: tool call ids repeat within one message ({', '.join(call_ids)}); "
                             "providers reject that", f"{where}.toolCalls")
    if isinstance(message.content, list):
        for j, block in enumerate(message.content):
            if isinstance(block, ToolUseBlock) and role != "assistant":
                raise invalid_params(f"{where}.content[{j}]: tool_use blocks belong to assistant messages",
                                     f"{where}.content[{j}]")
            if isinstance(block, ToolResultBlock) and role not in ("user", "tool"):
                raise invalid_params(f"{where}.content[{j}]: tool_result blocks belong to user or tool messages",
                                     f"{where}.content[{j}]")
    if message.timestamp is not None:
        try:
            parse_iso(message.timestamp)
        except ValueError:
            raise invalid_params(f"{where}.timestamp: {message.timestamp!r} is not an ISO 8601 timestamp",
                                 f"{where}.timestamp") from None
    usage = message.usage
    if usage is not None:
        fields = _FIELDS.get(type(usage))
        if fields is None:  # (msgspec.structs.fields evaluates the annotations on each call: ~0.3 ms)
            fields = _FIELDS[type(usage)] = msgspec.structs.fields(usage)
        for field in fields:
            value = getattr(usage, field.name)
            if value is not None and not 0 <= value <= MAX_COUNT:
                raise invalid_params(f"{where}.usage.{field.encode_name}: {value} is not a token count "
                                     f"(0 to {MAX_COUNT})", f"{where}.usage.{field.encode_name}")
    key = message.idempotency_key
    if key is not None and not (0 < len(key) <= MAX_KEY_LENGTH):
        raise invalid_params(f"{where}.idempotencyKey: must be 1 to {MAX_KEY_LENGTH} characters",
                             f"{where}.idempotencyKey")


def prepare(svc: Service, params: SessionPushParams) -> list[tuple[Message, bytes, str | None]]:
    """Validate the whole batch and encode each message as it will be stored."""
    limits = svc.config.limits
    count = len(params.messages)
    if count == 0:
        raise invalid_params("messages: at least one message is required", "messages")
    if count > limits.max_batch_messages:
        raise CtxdError(ErrorCode.BatchTooLarge,
                        f"messages: {count} messages in one push; the limit is {limits.max_batch_messages}",
                        {"field": "messages", "count": count, "limit": limits.max_batch_messages})
    out = []
    for index, message in enumerate(params.messages):
        check_message(message, index)
        key = message.idempotency_key
        body = _encode(msgspec.structs.replace(message, idempotency_key=None) if key else message)
        if len(body) > limits.max_message_bytes:
            raise CtxdError(ErrorCode.MessageTooLarge,
                            f"messages[{index}]: {len(body)} bytes; the limit is {limits.max_message_bytes}",
                            {"field": f"messages[{index}]", "size": len(body),
                             "limit": limits.max_message_bytes})
        out.append((message, body, key))
    return out


def rough_size(messages: list[Message], enough: int) -> int:
    """About how many bytes of text ``messages`` carry, counted only until ``enough``:
    decides, before any encoding, whether preparing a push is worth a thread."""
    size = 0
    for message in messages:
        content = message.content
        if isinstance(content, str):
            size += len(content)
        elif content:
            for block in content:
                value = (getattr(block, "text", None) or getattr(block, "thinking", None)
                         or getattr(block, "content", None))
                size += len(value) if isinstance(value, str) else 256
        for call in message.tool_calls or ():
            size += len(call.function.arguments)
        if size > enough:
            break
    return size


def _count_all(counter: TokenCounter, messages: list[Message]) -> list[MessageTokens]:
    return [counter.count_message(m) for m in messages]


@dataclass(slots=True)
class _Derived:
    """What pushed messages change besides history: the goal (markers) and the watermark
    (a checkpoint tool call). Computed inside the push transaction so both are stored
    atomically with the messages that caused them."""

    goal: Goal | None | bool = False
    watermark: tuple[int, str] | None = None


@dataclass(slots=True)
class _Outcome:
    results: list[PushedMessage]
    stored: list[StoredMessage]
    stats: SessionStats
    added_tokens: int
    last_seq: int
    now: str
    derived: _Derived
    title: str | None


def _derive(state: SessionState, watermark_tools: tuple[str, ...], inserted: list[tuple[int, Message]],
            now: str) -> _Derived:
    out = _Derived()
    goal = state.row.goal
    changed = False
    for seq, message in inserted:
        if message.role != "assistant":
            continue
        markers = parse_markers(message, seq)
        if markers:
            goal = apply_markers(goal, markers, now)
            changed = True
        if watermark_tools and (message.tool_calls or isinstance(message.content, list)):
            entry = Entry.of(seq, message, _NO_TOKENS)
            found = find_checkpoint_call([entry], watermark_tools, state.cstate.watermark_seq)
            if found is not None:
                out.watermark = found
    if changed:
        out.goal = goal
    return out


_NO_TOKENS = MessageTokens(0, 0, 0, 0, 0, 0)
TITLE_LENGTH = 80


def _title_of(message: Message) -> str | None:
    """A session's default title: the first line of its first user message."""
    if message.role != "user":
        return None
    content = message.content
    text = content if isinstance(content, str) else "\n".join(
        b.text for b in content or () if isinstance(b, TextBlock))
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return None
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "\u2026"


def _add_stats(stats: SessionStats, message: Message, tokens: MessageTokens, context_before: int,
               history_before: int, window: int) -> None:
    stats.add_message(message, tokens)
    if message.usage is not None:
        _add_usage(stats, message, tokens, context_before, history_before, window)
    stats.drift.history_context += tokens.context


def _add_usage(stats: SessionStats, message: Message, tokens: MessageTokens, context_before: int,
               history_before: int, window: int) -> None:
    """The drift figures of a message that carries the provider's usage report."""
    usage = message.usage
    assert usage is not None
    drift = stats.drift
    drift.messages += 1
    if usage.output_tokens is not None and message.role == "assistant":
        drift.reported_output += usage.output_tokens
        drift.counted_output += tokens.text + tokens.tool_call + tokens.thinking
    if usage.input_tokens is not None:
        reported = usage.input_tokens + (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
        drift.reported_input += reported
        drift.counted_input += context_before
        current = calibration.fit(drift.usage_samples, window)
        drift.usage_samples = calibration.remember(
            drift.usage_samples, calibration.pair(reported, (context_before, history_before), current, window))


def _copy_stats(stats: SessionStats) -> SessionStats:
    return SessionStats(
        by_role={k: RoleTotals(v.messages, v.tokens) for k, v in stats.by_role.items()},
        by_kind={k: KindTotals(v.blocks, v.tokens) for k, v in stats.by_kind.items()},
        drift=DriftTotals(**msgspec.structs.asdict(stats.drift)),
    )


def _write_job(conn: sqlite3.Connection, state: SessionState, prepared: list[tuple[Message, bytes, str | None]],
               counts: list[MessageTokens], now: str, watermark_tools: tuple[str, ...],
               shared: bool = False) -> _Outcome:
    """Runs on the writer thread inside the transaction; pure except for SQL. ``shared``:
    another daemon may have pushed since this one read the session (the row is locked now;
    :class:`StaleSession` if so, and the caller reloads and tries again)."""
    last_seq = session_store.last_seq_for_push(conn, state.id)
    if last_seq is None:
        raise session_not_found(state.id)
    if shared and last_seq != state.row.last_seq:
        raise StaleSession(state.id)
    keys = [key for _, _, key in prepared if key is not None]
    seen = message_store.find_keys(conn, state.id, keys) if keys else {}
    stats = _copy_stats(state.row.stats)
    results: list[PushedMessage] = []
    to_insert: list[tuple[int, NewMessage]] = []
    stored: list[StoredMessage] = []
    added_tokens = added_context = 0
    context_before = state.stored.figures.prompt
    counted: list[tuple[Message, MessageTokens]] = []
    drift = stats.drift
    history_context = drift.history_context
    for (message, body, key), tokens in zip(prepared, counts):
        if key is not None:
            if key in seen:
                seq, total = seen[key]
                results.append(PushedMessage(seq=seq, tokens=total, duplicate=True))
                continue
            seen[key] = (last_seq + 1, tokens.total)
        last_seq += 1
        clean = msgspec.structs.replace(message, idempotency_key=None) if key else message
        to_insert.append((last_seq, NewMessage(message, body, tokens, key, now)))
        stored.append(StoredMessage(last_seq, now, tokens, clean))
        counted.append((message, tokens))
        context = tokens.context
        if message.usage is not None:  # (what _add_stats does, the role and kind totals after the loop)
            sent = context_before + added_context
            if state.last_prompt_tokens is not None:
                # The reply to the prompt ctxd handed out: that is what the provider counted
                # (a pass may have changed the context since).
                sent, state.last_prompt_tokens = state.last_prompt_tokens, None
            _add_usage(stats, message, tokens, sent,
                       PROMPT_PRIMING + state.stored.figures.system + history_context, state.context_window)
        history_context += context
        added_context += context
        added_tokens += tokens.total
        results.append(PushedMessage(seq=last_seq, tokens=tokens.total))
    drift.history_context = history_context
    stats.add_messages(counted)
    derived = _derive(state, watermark_tools, [(m.seq, m.message) for m in stored], now)
    title = None
    if state.row.title is None:
        title = next((t for t in (_title_of(m.message) for m in stored) if t), None)
        if title is not None:
            session_store.update_metadata(conn, state.id, title=title)
    figures = state.stored.figures
    new_state = StoredState(
        compression=msgspec.structs.replace(state.cstate, watermark_seq=derived.watermark[0],
                                            watermark_tool_use_id=derived.watermark[1])
        if derived.watermark else state.cstate,
        figures=Figures(figures.system, figures.checkpoints, figures.pinned, figures.used + added_context,
                        figures.checkpoint_count),
    )
    if to_insert:
        message_store.insert_messages(conn, state.id, to_insert)
    session_store.update_totals(conn, state.id, last_activity=now, added_messages=len(to_insert),
                                added_tokens=added_tokens, context_tokens=new_state.figures.prompt,
                                last_seq=last_seq, stats=stats, context_state=msgspec.json.encode(new_state))
    if derived.goal is not False:
        session_store.save_context(conn, state.id, goal=derived.goal)
    return _Outcome(results, stored, stats, added_tokens, last_seq, now, derived, title)


async def push(svc: Service, params: SessionPushParams) -> PushResult:
    if rough_size(params.messages, THREAD_COUNT_BYTES) > THREAD_COUNT_BYTES:
        # Validating and encoding 100 MB takes long enough to stall every other client.
        prepared = await anyio.to_thread.run_sync(prepare, svc, params)
    else:
        prepared = prepare(svc, params)
    state = await svc.cache.get(params.session_id)
    messages = [m for m, _, _ in prepared]
    if sum(len(body) for _, body, _ in prepared) > THREAD_COUNT_BYTES:
        counts = await anyio.to_thread.run_sync(_count_all, state.counter, messages)
    else:
        counts = _count_all(state.counter, messages)
    watermark_tools = svc.cache.policy(state).watermark_tools
    async with state.lock:
        if state.deleted:
            raise session_not_found(params.session_id)
        outcome = await _write(svc, state, prepared, counts, watermark_tools)
        if outcome.stored:
            svc.indexer.stored(len(outcome.stored))
        row = state.row
        row.message_count += len(outcome.stored)
        row.token_count += outcome.added_tokens
        row.last_seq = outcome.last_seq
        row.last_activity = outcome.now
        row.stats = outcome.stats
        if outcome.title is not None:
            row.title = outcome.title
        svc.cache.appended(state, outcome.stored)
        await _adopt_derived(svc, state, outcome.derived)
        await snapshots.auto_at_threshold(svc, state)
        budget = svc.cache.budget(state)
    notify.updated(svc, state, "push", pushed=len(outcome.stored))
    notify.after_change(svc, state, budget)
    compression.schedule(svc, state)
    return PushResult(
        session_id=state.id, messages=outcome.results, message_count=row.message_count,
        token_count=row.token_count, context_tokens=row.context_tokens,
        tokens_estimated=state.counter.estimated, budget=budget,
    )


async def _write(svc: Service, state: SessionState, prepared: list[tuple[Message, bytes, str | None]],
                 counts: list[MessageTokens], watermark_tools: tuple[str, ...]) -> _Outcome:
    """The push transaction (caller holds the session lock). On a shared store, a session
    another daemon pushed to meanwhile is reloaded from what is stored (so totals, stats and
    the active context include those pushes) and the push is tried again."""
    shared = svc.db.shared
    for _ in range(STALE_RETRIES):
        try:
            return await svc.db.write(_write_job, state, prepared, counts, now_iso(), watermark_tools, shared)
        except StaleSession:
            await svc.cache.reload(state)
    raise CtxdError(ErrorCode.StorageError, f"session {state.id!r} kept changing through other daemons; "
                                            f"nothing was stored, try again")


async def _adopt_derived(svc: Service, state: SessionState, derived: _Derived) -> None:
    """Apply a committed goal change or watermark move to the live context (under the lock)."""
    if derived.goal is False and derived.watermark is None:
        return
    cache = svc.cache
    ctx = await cache.context(state)
    before = ctx.prompt_tokens
    if derived.goal is not False:
        state.row.goal = derived.goal  # type: ignore[assignment]
    if derived.watermark is not None:
        ctx.state.watermark_seq, ctx.state.watermark_tool_use_id = derived.watermark
    cache.refresh(state, system=derived.goal is not False)
    encoded = state.encoded_state()
    await svc.db.write(session_store.save_context, state.id, context_state=encoded,
                       context_tokens=state.row.context_tokens)
    if derived.watermark is not None:
        after = ctx.prompt_tokens
        svc.events.emit(state.id, CompressedNotification(
            session_id=state.id, layers=["watermark"], before_tokens=before, after_tokens=after,
            freed_tokens=before - after, ratio=round(after / before, 4) if before else 1.0, checkpoint_ids=[],
            duration_ms=0.0, compression_number=ctx.state.compression_count, summarizer=None, trigger="auto"))
