"""``session/push``: validate, count, write, acknowledge.

A push is all-or-nothing: every message is checked (schema, tool-call shape, size)
before anything is written, the batch is written in one transaction, and the
result is returned only after that transaction committed. Messages carrying an
``idempotencyKey`` already stored in the session are answered with their original
sequence number and token count and are not stored again.

A large push on SQLite (over ``STAGE_BYTES`` of stored bodies) is *staged* instead, so that
it never holds the one writer for long (other clients' pushes wait for the writer): its rows
are written in transactions of about ``STAGE_CHUNK_BYTES`` (and at most ``STAGE_CHUNK_ROWS``
rows), above the session's committed ``last_seq`` where no reader looks, and a last small
transaction makes them part of the session exactly as the one transaction would have
(totals, stats, goal, watermark, ``last_seq``). It is still all-or-nothing for every reader,
acknowledged after that last COMMIT only, and ordered by the session lock, held throughout.
Rows of a staged push that failed are removed at once, else before the session's next push
or when the daemon next starts (``store/messages.py``, "Staged pushes"). PostgreSQL keeps
one transaction (other daemons may push to the session between two of ours), run on a second
writer connection beside the writer's other jobs: its writers do not wait for each other's
rows.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import msgspec

from ctxd.engine import calibration
from ctxd.engine.context import Entry, is_demonstration, is_observation, sent_tokens
from ctxd.engine.goals import apply_markers, parse_markers
from ctxd.engine.watermark import find_checkpoint_call
from ctxd.protocol.common import MAX_COUNT
from ctxd.protocol.compression import CompressedNotification
from ctxd.protocol.errors import CtxdError, ErrorCode, invalid_params, session_not_found
from ctxd.protocol.goal import Goal
from ctxd.protocol.message import Message, TextBlock, ToolResultBlock, ToolUseBlock
from ctxd.protocol.session import PushedMessage, PushResult, SessionPushParams
from ctxd.service import billing, compression, notify, snapshots, turns
from ctxd.service.clock import now_iso, parse_iso
from ctxd.service.core import Service
from ctxd.service.state import SessionState, StaleSession, context_moved, figures_after
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store.dialect import brief, pipeline_safe
from ctxd.store.messages import NewMessage, StoredMessage
from ctxd.store.sessions import KindTotals, RoleTotals, SessionRow, SessionStats
from ctxd.store.state import StoredState, decode_stored
from ctxd.tokens import PROMPT_PRIMING, MessageTokens, TokenCounter

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 200
STALE_RETRIES = 50
# Counting a large batch on the event loop would stall every other client.
THREAD_COUNT_BYTES = 256 * 1024
STAGE_BYTES = 4 * 1024 * 1024
"""A push storing more than this (its messages' stored bodies) on SQLite is staged (see the
module doc); smaller ones take one transaction, as they always did."""
STAGE_CHUNK_BYTES = 2 * 1024 * 1024
"""About how much of a staged push one transaction writes (at least one message, so up to
``limits.max_message_bytes``): what another client's push may find the writer busy with."""
STAGE_CHUNK_ROWS = 1000
"""At most this many rows in one staged transaction: a 10,000-message import is only 1.5 MB,
and its rows in one transaction held the writer 65-100 ms (``service/transfer.py``)."""
STAGE_YIELD = 2.0
"""While other writes come in, a staged push leaves the writer to them for this many times
as long as its last transaction took, before its next one (a third of the writer's time):
a client pushing every 10 ms would otherwise find the writer busy at every push, and fall
behind."""

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


STEP_ASIDE_BYTES = 256 * 1024
"""Work in a thread on a large push lets small requests run (:mod:`ctxd.service.turns`)
after about this many bytes of messages."""


def prepare(svc: Service, params: SessionPushParams,
            between: Callable[[], object] | None = None) -> list[tuple[Message, bytes, str | None]]:
    """Validate the whole batch and encode each message as it will be stored. ``between``:
    called after every ``STEP_ASIDE_BYTES`` or so of encoded messages (in a thread, the
    daemon's ``Turns.step_aside``)."""
    limits = svc.config.limits
    count = len(params.messages)
    if count == 0:
        raise invalid_params("messages: at least one message is required", "messages")
    if count > limits.max_batch_messages:
        raise CtxdError(ErrorCode.BatchTooLarge,
                        f"messages: {count} messages in one push; the limit is {limits.max_batch_messages}",
                        {"field": "messages", "count": count, "limit": limits.max_batch_messages})
    out = []
    done = 0
    for index, message in enumerate(params.messages):
        if between is not None and done >= STEP_ASIDE_BYTES:
            between()
            done = 0
        check_message(message, index)
        key = message.idempotency_key
        body = _encode(msgspec.structs.replace(message, idempotency_key=None) if key else message)
        if len(body) > limits.max_message_bytes:
            raise CtxdError(ErrorCode.MessageTooLarge,
                            f"messages[{index}]: {len(body)} bytes; the limit is {limits.max_message_bytes}",
                            {"field": f"messages[{index}]", "size": len(body),
                             "limit": limits.max_message_bytes})
        out.append((message, body, key))
        done += len(body)
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
            size += len(call.text)
        if size > enough:
            break
    return size


def _count_all(counter: TokenCounter, messages: list[Message], between: Callable[[], object] | None = None,
               sizes: list[int] | None = None) -> list[MessageTokens]:
    """Each message's tokens; ``between`` as in :func:`prepare` (``sizes``: the messages'
    encoded sizes, which say when)."""
    if between is None or sizes is None:
        return [counter.count_message(m) for m in messages]
    out = []
    done = 0
    for message, size in zip(messages, sizes):
        if done >= STEP_ASIDE_BYTES:
            between()
            done = 0
        out.append(counter.count_message(message))
        done += size
    return out


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
    fresh: SessionState | None = None
    """The session as stored when this push found that another daemon had changed it: read
    in the push's transaction, with the row locked, and what the push was computed from
    (the caller adopts it, ``SessionCache.adopt_reloaded``)."""


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


TITLE_SCAN_CHARS = 4096


def _first_line(text: str) -> str:
    """The first non-blank line, stripped (or enough of it to make a title), read from the
    text's start only: splitting a 4 MB message into its lines held the writer (this runs
    in the push's transaction) and the interpreter lock 5-10 ms. The whole text is split
    only when its start is blank, or ends inside a first line too short for a title."""
    head = text[:TITLE_SCAN_CHARS]
    cut = len(head) < len(text)
    lines = head.splitlines()
    for index, line in enumerate(lines):
        line = line.strip()
        if line:
            if index < len(lines) - 1 or not cut or len(line) > TITLE_LENGTH:
                return line
            break  # (it may go on past the head)
    else:
        if not cut:
            return ""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _title_of(message: Message) -> str | None:
    """A session's default title: the first line of its first user message (not tool output
    sent as one, nor a demonstration: a SWE-agent session was titled "Here is a demonstration
    of how to correctly accomplish this task.")."""
    if message.role != "user" or is_observation(message) or is_demonstration(message):
        return None
    content = message.content
    text = content if isinstance(content, str) else "\n".join(
        b.text for b in content or () if isinstance(b, TextBlock))
    line = _first_line(text)
    if not line:
        return None
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "\u2026"


def _add_stats(stats: SessionStats, message: Message, tokens: MessageTokens, context_before: int,
               history_before: int, window: int) -> None:
    stats.add_message(message, tokens)
    if message.usage is not None:
        _add_usage(stats, message, tokens, context_before, history_before, window)
    stats.drift.history_context += sent_tokens(message, tokens)


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
        drift=msgspec.structs.replace(stats.drift),
        bill=msgspec.structs.replace(stats.bill),
    )


@dataclass(frozen=True, slots=True)
class PushJob:
    """One push's transaction as the writer runs it (:func:`_write_job`): the messages and
    their counts, and how to check the session against what is stored."""

    state: SessionState
    prepared: list[tuple[Message, bytes, str | None]]
    """Each message, its encoded body, its idempotency key (``prepare``)."""
    counts: list[MessageTokens]
    now: str
    watermark_tools: tuple[str, ...]
    shared: bool = False
    """Another daemon may have pushed since this one read the session (the row is locked
    then). If so, with :attr:`fresh` the session is read again here, under the lock, made
    into a new state by ``fresh`` and the push computed from that (``_Outcome.fresh``), so
    pushes through several daemons wait for each other's transactions instead of racing
    them; without it, :class:`StaleSession` and the caller reloads and tries again."""
    staged: list[int] | None = None
    """The seqs whose rows a staged push already wrote (this is its last transaction: it
    writes everything else)."""
    clean: bool = False
    """First remove rows an unfinished push may have left."""
    check_context: bool = False
    """Also :class:`StaleSession` if another daemon changed the session's context (a pin,
    goal, watermark, restore, a pass) since this one read it: the push writes memory's
    context state and goal, and would undo that change."""
    between: Callable[[], object] | None = None
    """Called between the rows a large push sends (PostgreSQL's COPY; ``Turns.step_aside``)."""
    fresh: Callable[[SessionRow], SessionState] | None = None
    """Makes a state from the stored row when :attr:`shared` finds the session moved
    (``SessionCache.adopt_new``)."""


def _write_job(conn: sqlite3.Connection, job: PushJob) -> _Outcome:
    """Runs on the writer thread inside the transaction; pure except for SQL."""
    state, prepared, counts, now = job.state, job.prepared, job.counts, job.now
    if job.clean:
        message_store.drop_unfinished(conn, state.id)
    keys = [key for _, _, key in prepared if key is not None]
    head = session_store.read_for_push(conn, state.id, keys, context=job.check_context)
    if head is None:
        raise session_not_found(state.id)
    last_seq, seen = head.last_seq, head.seen
    reloaded: SessionState | None = None
    if (job.shared and last_seq != state.row.last_seq) or (
            head.context is not None and context_moved(state, decode_stored(head.context[0]).compression,
                                                       head.context[1])):
        fresh = job.fresh
        row = session_store.get_session(conn, state.id) if fresh is not None else None
        if fresh is None or row is None or row.last_seq != last_seq:
            # (no reader of its own, or cannot happen: the row is locked)
            raise StaleSession(state.id)
        state = reloaded = fresh(row)
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
        unkeyed = msgspec.structs.replace(message, idempotency_key=None) if key else message
        to_insert.append((last_seq, NewMessage(message, body, tokens, key, now)))
        stored.append(StoredMessage(last_seq, now, tokens, unkeyed))
        counted.append((message, tokens))
        context = sent_tokens(message, tokens)
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
    if counted and state.billing.pending is not None:
        # The push after a prompt (its reply, with the provider's usage when the client
        # passed it on): that request's bill joins the totals.
        billing.accrue(state, stats.bill, next((m.usage for m, _ in counted if m.usage is not None), None))
    stats.add_messages(counted)
    derived = _derive(state, job.watermark_tools, [(m.seq, m.message) for m in stored], now)
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
        figures=figures_after(figures, (m for m, _ in counted), added_context, state.counter.count),
    )
    if job.staged is not None:
        if [seq for seq, _ in to_insert] != job.staged:  # (cannot happen: the session lock was held throughout)
            raise CtxdError(ErrorCode.StorageError, f"session {state.id!r} changed while a large push was "
                                                    f"being written; nothing was stored, try again")
        message_store.end_staged(conn, state.id)
    elif to_insert:
        message_store.insert_messages(conn, state.id, to_insert, job.between)
    session_store.update_totals(conn, state.id, last_activity=now, added_messages=len(to_insert),
                                added_tokens=added_tokens, context_tokens=new_state.figures.prompt,
                                last_seq=last_seq, stats=stats, context_state=msgspec.json.encode(new_state))
    if derived.goal is not False:
        session_store.save_context(conn, state.id, goal=derived.goal)
    return _Outcome(results, stored, stats, added_tokens, last_seq, now, derived, title, reloaded)


PIPELINE_MESSAGES = 16
PIPELINE_BYTES = 64 * 1024
"""A push of at most this many messages and bytes runs in pipeline mode on PostgreSQL
(:func:`_write_job_pipelined`); a larger one keeps COPY, which a pipeline cannot hold
(row by row, or as arrays, a 100-message push went in at half the rate)."""


@brief
@pipeline_safe
def _write_job_pipelined(conn: sqlite3.Connection, job: PushJob) -> _Outcome:
    """:func:`_write_job` for a small push: on PostgreSQL the writer runs it in pipeline
    mode, waiting for the server where it reads (the session row, the keys) and at COMMIT,
    twice instead of seven times (``dialect.pipeline_safe``); SQLite runs it on the event
    loop's thread when its writer is idle (``dialect.brief``)."""
    return _write_job(conn, job)


async def push(svc: Service, params: SessionPushParams) -> PushResult:
    if rough_size(params.messages, THREAD_COUNT_BYTES) > THREAD_COUNT_BYTES:
        # Validating and encoding 100 MB takes long enough to stall every other client: in
        # a thread, which steps aside while their requests run, and rests while they are
        # active (counting, below, only steps aside: it runs without the lock).
        turns.TURNS.mark_heavy()
        prepared = await anyio.to_thread.run_sync(prepare, svc, params,
                                                  turns.TURNS.step_aside_and_rest)
    else:
        prepared = prepare(svc, params)
    state = await svc.cache.get(params.session_id)
    messages = [m for m, _, _ in prepared]
    sizes = [len(body) for _, body, _ in prepared]
    if sum(sizes) > THREAD_COUNT_BYTES:
        turns.TURNS.mark_heavy()
        counts = await anyio.to_thread.run_sync(_count_all, state.counter, messages, turns.TURNS.step_aside, sizes)
    else:
        counts = _count_all(state.counter, messages)
    watermark_tools = svc.cache.policy(state).watermark_tools
    large = sum(sizes) > STAGE_BYTES
    async with state.lock:
        if state.deleted:
            raise session_not_found(params.session_id)
        if large and svc.db.dialect == "sqlite":
            outcome = await _write_staged(svc, state, prepared, counts, watermark_tools)
        else:
            outcome = await _write(svc, state, prepared, counts, watermark_tools, apart=large)
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
        append_room=compression.append_room_of(svc, state, budget),
    )


async def _write(svc: Service, state: SessionState, prepared: list[tuple[Message, bytes, str | None]],
                 counts: list[MessageTokens], watermark_tools: tuple[str, ...], apart: bool = False) -> _Outcome:
    """The push transaction (caller holds the session lock). On a shared store, a session
    another daemon pushed to meanwhile is reloaded from what is stored (so totals, stats and
    the active context include those pushes) and the push is tried again. ``apart``: a
    large push on PostgreSQL, whose one transaction runs beside the writer's other jobs
    (``Storage.write_apart``) instead of holding them up."""
    shared = svc.db.shared
    write = svc.db.write_apart if apart else svc.db.write
    small = len(prepared) <= PIPELINE_MESSAGES and sum(len(body) for _, body, _ in prepared) <= PIPELINE_BYTES
    job = _write_job_pipelined if small and not apart else _write_job
    fresh = svc.cache.adopt_new if shared else None
    for _ in range(STALE_RETRIES):
        try:
            clean = state.unfinished
            # (A pass of this daemon mid-way: memory is ahead of what is stored, not behind.)
            check = shared and not state.compress_lock.locked()
            outcome = await write(job, PushJob(state, prepared, counts, now_iso(), watermark_tools, shared=shared,
                                               clean=clean, check_context=check,
                                               between=turns.TURNS.step_aside if apart else None,
                                               fresh=fresh))
            if clean:
                state.unfinished = False
            if outcome.fresh is not None:
                svc.cache.adopt_reloaded(state, outcome.fresh)
            return outcome
        except StaleSession:
            await svc.cache.reload(state)
    raise CtxdError(ErrorCode.StorageError, f"session {state.id!r} kept changing through other daemons; "
                                            f"nothing was stored, try again")


def _stage_plan(conn: sqlite3.Connection, session_id: str, keys: list[str | None], now: str
                ) -> tuple[int, list[int]]:
    """A staged push's first transaction: remove what an unfinished push left, read the
    session's ``last_seq``, decide which messages are stored (as :func:`_write_job` will:
    keys stored before, or earlier in the batch, are duplicates) and mark the push as
    unfinished. The session's last_seq, and the index in the batch of each message stored."""
    message_store.drop_unfinished(conn, session_id)
    last_seq = session_store.last_seq_for_push(conn, session_id)
    if last_seq is None:
        raise session_not_found(session_id)
    wanted = [key for key in keys if key is not None]
    seen: set[str] = set(message_store.find_keys(conn, session_id, wanted, last_seq)) if wanted else set()
    order: list[int] = []
    for index, key in enumerate(keys):
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        order.append(index)
    if order:
        message_store.begin_staged(conn, session_id, last_seq, now)
    return last_seq, order


def stage_chunks(rows: list[tuple[int, NewMessage]]) -> list[list[tuple[int, NewMessage]]]:
    """Rows to stage, cut into transactions of about ``STAGE_CHUNK_BYTES`` and at most
    ``STAGE_CHUNK_ROWS`` rows."""
    chunks: list[list[tuple[int, NewMessage]]] = []
    size = 0
    for row in rows:
        if not chunks or len(chunks[-1]) >= STAGE_CHUNK_ROWS or (
                size and size + len(row[1].body) > STAGE_CHUNK_BYTES):
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += len(row[1].body)
    return chunks


def _stage_rows(conn: sqlite3.Connection, session_id: str, rows: list[tuple[int, NewMessage]]) -> float:
    """One of a staged push's transactions; how long its writing took (seconds)."""
    started = time.perf_counter()
    message_store.insert_messages(conn, session_id, rows)
    return time.perf_counter() - started


async def write_stages(svc: Service, session_id: str, chunks: list[list[tuple[int, NewMessage]]]) -> None:
    """A staged push's or import's rows, a transaction per chunk, above the session's
    ``last_seq`` (marked unfinished before the first). While other writes come in, the
    writer is left to them between two transactions (``STAGE_YIELD``)."""
    db = svc.db
    seen, others_at = db.jobs, -1e9
    for chunk in chunks:
        took = await db.write(_stage_rows, session_id, chunk)
        now_s = time.monotonic()
        if db.jobs - seen > 1:
            others_at = now_s
        if now_s - others_at < 1.0:  # other writes came in lately: leave them room
            await anyio.sleep(STAGE_YIELD * took)
        seen = db.jobs


async def _write_staged(svc: Service, state: SessionState, prepared: list[tuple[Message, bytes, str | None]],
                        counts: list[MessageTokens], watermark_tools: tuple[str, ...]) -> _Outcome:
    """A large push in several transactions (the module doc; the caller holds the session
    lock, and the store is SQLite: one daemon, so nothing else writes this session)."""
    now = now_iso()
    base, order = await svc.db.write(_stage_plan, state.id, [key for _, _, key in prepared], now)
    state.unfinished = False  # (the plan removed what an earlier push left)
    if not order:  # every message is a duplicate: nothing to stage
        return await _write(svc, state, prepared, counts, watermark_tools)
    rows = [(base + 1 + j, NewMessage(prepared[i][0], prepared[i][1], counts[i], prepared[i][2], now))
            for j, i in enumerate(order)]
    state.unfinished = True
    svc.indexer.unfinished += len(rows)
    try:
        await write_stages(svc, state.id, stage_chunks(rows))
        outcome = await svc.db.write(_write_job, PushJob(state, prepared, counts, now, watermark_tools,
                                                         staged=[seq for seq, _ in rows]))
        state.unfinished = False
        return outcome
    except BaseException:
        try:  # nothing of it was acknowledged: its rows go now (else before the next push, or at start-up)
            await svc.db.write(message_store.drop_unfinished, state.id)
        except Exception as exc:
            log.warning("session %s: the rows of a failed push stay until its next push (%s)", state.id, exc)
        else:
            state.unfinished = False
        raise
    finally:
        svc.indexer.unfinished -= len(rows)


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
    if derived.goal is not False:  # (the goal block in the system part changed: subscribers are told)
        notify.updated(svc, state, "goal")
    if derived.watermark is not None:
        after = ctx.prompt_tokens
        svc.events.emit(state.id, CompressedNotification(
            session_id=state.id, layers=["watermark"], before_tokens=before, after_tokens=after,
            freed_tokens=before - after, ratio=round(after / before, 4) if before else 1.0, checkpoint_ids=[],
            duration_ms=0.0, compression_number=ctx.state.compression_count, summarizer=None, trigger="auto"))
