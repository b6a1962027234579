"""Per-session state held in memory: the session row, its token counter, its lock, and
(loaded on first use) its active context.

The lock orders everything that changes one session (pushes, compression updates,
pins, deletion), so per-session totals are kept incrementally without races. Active
contexts are cached up to a token budget and evicted least-recently-used; the budget
figures are kept on the row, so stats and pushes never need the context loaded.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgspec

from ctxd.config import Config
from ctxd.engine import calibration
from ctxd.engine.billing import BillingTable, CacheRules, ModelRules, Tracker
from ctxd.engine.budget import BudgetPolicy, budget_for
from ctxd.engine.context import ActiveContext, CompressionState, Entry, sent_tokens
from ctxd.engine.goals import render_goal
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.render import IncrementalRenderer, Pairing, Rendered
from ctxd.models import model_facts
from ctxd.protocol.compression import Checkpoint, Reliability
from ctxd.protocol.context import Budget
from ctxd.protocol.errors import session_not_found
from ctxd.protocol.goal import Goal
from ctxd.protocol.message import Message
from ctxd.service.encoded import Fragments
from ctxd.store import checkpoints as checkpoint_store
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store.backend import Storage
from ctxd.store.messages import StoredMessage
from ctxd.store.sessions import SessionRow
from ctxd.store.state import Figures, StoredState, decode_stored
from ctxd.tokens import PROMPT_PRIMING, TokenCounter

_encode = msgspec.json.Encoder().encode


class StaleSession(Exception):
    """Another daemon changed the session since this one read it (shared storage only)."""


@dataclass(eq=False)
class SessionState:
    row: SessionRow
    counter: TokenCounter
    context_window: int
    output_limit: int | None
    stored: StoredState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    compress_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ctx: ActiveContext | None = None
    compression_task: asyncio.Task[object] | None = None
    deleted: bool = False
    unfinished: bool = False
    """Rows of a staged push that failed may lie above ``last_seq`` (``ingest.py``): the next
    push removes them first."""
    skip_reason: str | None = None
    rendered: dict[str, tuple[tuple[object, ...], Rendered]] = field(default_factory=dict)
    """The last prompt rendered per format, with the context version it was made from."""
    renderers: dict[str, IncrementalRenderer] = field(default_factory=dict)
    """Per format, what was rendered of the conversation so far (reused after pushes)."""
    encoded: dict[str, Fragments] = field(default_factory=dict)
    """Per format, the last prompt's messages and their JSON, for the wire (``service/encoded.py``)."""
    last_prompt_tokens: int | None = None
    """The size of the last prompt handed out (ctxd's count), until a reply's usage is paired
    with it (engine/calibration.py)."""
    handed_out: dict[str, tuple[object, ...]] = field(default_factory=dict)
    """Per format, what the last prompt handed out was made from (``PromptCacheStats``)."""
    prompts: int = 0
    prompts_followed: int = 0
    """Prompts after the first of their format, and of those the ones that started with the
    previous prompt of that format."""
    prefix_kept: int = 0
    budget_memo: tuple[tuple[object, ...], Budget] | None = None
    """The last budget computed and what it was computed from (``SessionCache.budget``)."""
    policy_memo: tuple[tuple[object, ...], CompressionPolicy] | None = None
    """The last compression policy and the settings it was made from (``SessionCache.policy``)."""
    billing: Tracker = field(default_factory=Tracker)
    """What the requests cost so far, between prompts (``service/billing.py``)."""
    rules_memo: tuple[tuple[object, ...], CacheRules] | None = None
    reliability_memo: tuple[tuple[object, ...], Reliability] | None = None
    """The last reliability and what it was computed from (``notify.session_reliability``)."""

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def cstate(self) -> CompressionState:
        return self.stored.compression

    def sync_figures(self) -> None:
        """Copy the loaded context's figures to the stored state and the row."""
        ctx = self.ctx
        if ctx is not None:
            self.stored.compression = ctx.state
            self.stored.figures = Figures(ctx.system_tokens, ctx.checkpoint_tokens, ctx.pinned_tokens, ctx.used,
                                          len(ctx.checkpoints), list(ctx.pairing.open))
        self.row.context_tokens = self.stored.figures.prompt

    def drop_context(self) -> None:
        """Forget the loaded context and what was rendered from it (reloaded on next use)."""
        self.ctx = None
        self.rendered.clear()
        self.renderers.clear()
        self.encoded.clear()

    def encoded_state(self) -> bytes:
        return _encode(self.stored)


def figures_after(figures: Figures, messages: Iterable[Message], added_context: int,
                  count: Callable[[str], int]) -> Figures:
    """The figures once ``messages`` (``added_context`` tokens as sent) are appended to the
    conversation, without the context loaded: with what rendering adds to pair their tool
    calls and results (``engine.render.Pairing``), as the loaded context counts it."""
    used = figures.used + added_context
    open_calls = figures.open_calls
    if open_calls is not None:
        pairing = Pairing(list(open_calls))
        for message in messages:
            used += pairing.add(message, count)
        open_calls = pairing.open
    return Figures(figures.system, figures.checkpoints, figures.pinned, used, figures.checkpoint_count, open_calls)


HOSTED_PROVIDERS = ("openai", "anthropic", "google", "gemini", "azure", "bedrock", "vertex", "mistral")
HOSTED_MODELS = ("gpt-", "o1", "o3", "o4", "chatgpt", "claude", "gemini")


def is_hosted(row: SessionRow) -> bool:
    """A hosted API (exact windows) rather than a local runtime (85%: its headroom)."""
    provider = (row.provider or "").lower()
    if provider:
        return provider in HOSTED_PROVIDERS
    return (row.model or "").lower().split("/")[-1].startswith(HOSTED_MODELS)


def budget_policy(config: Config, row: SessionRow, lent: int = 0) -> BudgetPolicy:
    """``lent``: tokens of the reply's reserve lent to the newest turn (``CompressionState.lent``)."""
    b = config.budget
    trigger_fraction = row.settings.trigger_fraction
    return BudgetPolicy(
        usable_fraction=b.hosted_usable_fraction if is_hosted(row) else b.usable_fraction,
        reserved_output_cap=b.reserved_output_cap,
        reserved_output_fraction=b.reserved_output_fraction,
        safety_margin_fraction=b.safety_margin_fraction,
        trigger_fraction=trigger_fraction if trigger_fraction is not None else b.trigger_fraction,
        output_tokens=row.settings.output_tokens,
        output_lent=lent,
    )


def billing_table(config: Config) -> BillingTable:
    """``[billing]`` as the engine's plain table."""
    b = config.billing
    return BillingTable(
        providers={name: CacheRules(provider=name, cache=p.cache, min_tokens=p.min_tokens, step=p.step, read=p.read,
                                    write=p.write, ttl_seconds=p.ttl_seconds, max_breakpoints=p.max_breakpoints,
                                    input_price=p.input_price)
                   for name, p in b.providers.items()},
        models={prefix: ModelRules(provider=m.provider, min_tokens=m.min_tokens, read=m.read, write=m.write,
                                   input_price=m.input_price)
                for prefix, m in b.models.items()})


def compression_policy(config: Config, row: SessionRow, caches: bool = False) -> CompressionPolicy:
    """``caches``: the session's provider caches prompts (its passes go deeper)."""
    c = config.compression
    s = row.settings
    return CompressionPolicy(
        auto=c.auto if s.auto_compress is None else s.auto_compress,
        strategy=s.strategy or c.strategy,
        overflow_policy=s.overflow_policy or c.overflow_policy,
        keep_recent=(c.cached_keep_recent if caches else c.keep_recent) if s.keep_recent is None else s.keep_recent,
        low_water_fraction=c.cached_low_water_fraction if caches else c.low_water_fraction,
        room_fraction=c.low_water_fraction,
        min_growth_fraction=c.min_growth_fraction,
        pass_interval=c.cached_pass_interval if caches else 0,
        prune_minimum=c.prune_minimum,
        prune_protect=c.prune_protect,
        prune_minimum_fraction=c.prune_minimum_fraction,
        prune_protect_fraction=c.prune_protect_fraction,
        protected_tools=tuple(c.protected_tools),
        watermark_tools=tuple(c.watermark_tools),
        max_checkpoints=c.max_checkpoints,
        fold_share=c.fold_share,
        user_share=c.user_share,
        fold_floor=c.cached_fold_floor if caches else 0.5,
        checkpoint_share=c.checkpoint_share,
        working_share=c.working_share,
    )


def resolve_window(row: SessionRow, config: Config) -> tuple[int, int | None]:
    """The session's window: its own setting, else configuration, else what the backend
    said about the model, else the model table, else the configured default."""
    facts = model_facts(row.model, config.models.context_windows, config.models.output_limits)
    backend_window = row.model_info.get("contextLength")
    if facts.source == "config":
        window = facts.context_window
    else:
        window = backend_window or facts.context_window
    window = row.context_window or window or config.budget.default_context_window
    output = facts.output_limit or row.model_info.get("outputLimit")
    return int(window), output


def _prompt_shape(c: CompressionState) -> tuple[object, ...]:
    """What of the stored state the prompt is made from. Compared whole, not by ``revision``:
    two daemons each bump their own count, so another's pin can leave it where this one's
    memory already is."""
    return (c.boundary, c.kept_seqs, c.pinned, c.watermark_seq, c.watermark_tool_use_id, c.prunes,
            c.compression_count, c.rolled_back, c.clips, c.superseded)


def context_moved(state: SessionState, stored: CompressionState, goal: Goal | None) -> bool:
    """Whether the stored context (another daemon's change) differs from memory's in what
    the prompt is made of: the views and the goal."""
    return _prompt_shape(stored) != _prompt_shape(state.cstate) or goal != state.row.goal


class SessionCache:
    def __init__(self, db: Storage, config: Config, max_cached_tokens: int = 8_000_000) -> None:
        self.db = db
        self.config = config
        self.max_cached_tokens = max_cached_tokens
        self._states: dict[str, SessionState] = {}
        self._loaded: OrderedDict[str, int] = OrderedDict()
        self._loaded_tokens = 0
        self.billing = billing_table(config)

    def adopt(self, row: SessionRow) -> SessionState:
        """The cached state of a stored session (created from ``row`` if not cached)."""
        existing = self._states.get(row.id)
        if existing is not None:
            return existing
        state = self.adopt_new(row)
        self._states[row.id] = state
        return state

    def register(self, state: SessionState) -> None:
        """Cache the state of a session that was just stored."""
        self._states[state.id] = state

    def adopt_new(self, row: SessionRow) -> SessionState:
        """A state for ``row``, not cached yet (``register`` it once it is stored)."""
        window, output_limit = resolve_window(row, self.config)
        stored = decode_stored(row.context_state)
        if stored.figures == Figures() and row.context_tokens:
            # A session row from before compression state existed: its totals are the figures.
            stored.figures = Figures(system=row.system_tokens,
                                     used=row.context_tokens - PROMPT_PRIMING - row.system_tokens)
        return SessionState(row=row, counter=TokenCounter.for_encoding(row.encoding, row.tokens_estimated),
                            context_window=window, output_limit=output_limit, stored=stored)

    async def get(self, session_id: str) -> SessionState:
        state = self._states.get(session_id)
        if state is not None and not state.deleted:
            return state
        row = await self.db.read(session_store.get_session, session_id)
        if row is None:
            raise session_not_found(session_id)
        return self.adopt(row)

    async def reload(self, state: SessionState) -> None:
        """Replace what memory holds of the session (row, figures, active context) with
        what is stored: another daemon changed it. The caller holds the session lock; the
        state object, its locks and its tasks stay."""
        row = await self.db.read(session_store.get_session, state.id)
        if row is None:
            self.forget(state.id)
            raise session_not_found(state.id)
        self.adopt_reloaded(state, self.adopt_new(row))

    def adopt_reloaded(self, state: SessionState, fresh: SessionState) -> None:
        """Make ``state`` what ``fresh`` (a state made from the stored row) says; the state
        object, its locks and its tasks stay. The active context is rebuilt on next use."""
        state.row, state.stored = fresh.row, fresh.stored
        state.context_window, state.output_limit = fresh.context_window, fresh.output_limit
        state.last_prompt_tokens = None
        state.drop_context()
        tokens = self._loaded.pop(state.id, None)
        if tokens is not None:
            self._loaded_tokens -= tokens

    async def catch_up(self, state: SessionState) -> None:
        """On shared storage: reload the session if another daemon pushed to it, compressed
        it or changed its context (pins, goal) since this one read it, so no stale prompt
        is handed out and a compression pass starts from what is stored. What is stored
        is ahead of memory only through another daemon (this one stores each change as it
        makes it). Nothing to do on a store only this daemon writes."""
        if not self.db.shared:
            return
        async with state.lock:
            row = await self.db.read(session_store.get_session, state.id)
            if row is None:
                self.forget(state.id)
                raise session_not_found(state.id)
            # Stored behind memory, or created at another time: another daemon deleted the
            # session and created it again under the same id (its seqs start over).
            if self.moved(state, row) or row.last_seq < state.row.last_seq:
                self.adopt_reloaded(state, self.adopt_new(row))

    def moved(self, state: SessionState, row: SessionRow) -> bool:
        """Whether ``row`` (what is stored) says another daemon changed the session since
        this one read it: pushed, compressed, changed its context, or created it anew."""
        stored = decode_stored(row.context_state).compression
        return (row.created_at != state.row.created_at or row.last_seq > state.row.last_seq
                or stored.revision > state.cstate.revision or context_moved(state, stored, row.goal))

    async def current(self, session_id: str) -> SessionState:
        """The session as stored now, for an answer that only reads it (``session/get``,
        ``context/stats``, the goal, history's statuses, an export): on shared storage another
        daemon may have changed it since this one read it. Then the answer comes from a state
        made from the stored row, not cached and not waiting for this daemon's own work on
        the session (its next push or prompt catches memory up). A pass of this daemon that
        is mid-way leaves memory ahead, not behind: then memory is the answer."""
        state = await self.get(session_id)
        if not self.db.shared or state.compress_lock.locked():
            return state
        row = await self.db.read(session_store.get_session, session_id)
        if row is None:
            self.forget(session_id)
            raise session_not_found(session_id)
        return self.adopt_new(row) if self.moved(state, row) else state

    @asynccontextmanager
    async def changing(self, state: SessionState) -> AsyncIterator[None]:
        """A pin, watermark, goal or restore: on shared storage one daemon at a time per
        session, starting from what is stored; otherwise two daemons changing one session
        at once would each save their own copy of its context, and one change would be lost."""
        if not self.db.shared:
            yield
            return
        async with self.db.exclusive(f"change:{state.id}"):
            await self.catch_up(state)
            yield

    def forget(self, session_id: str) -> None:
        state = self._states.pop(session_id, None)
        if state is not None:
            state.deleted = True
            if state.compression_task is not None:
                state.compression_task.cancel()
        tokens = self._loaded.pop(session_id, None)
        if tokens is not None:
            self._loaded_tokens -= tokens

    def cached(self) -> int:
        return len(self._states)

    def holds(self, session_id: str) -> bool:
        """Whether a session of this id is cached (so stored): known without a read."""
        state = self._states.get(session_id)
        return state is not None and not state.deleted

    def states(self) -> list[SessionState]:
        return list(self._states.values())

    # --- the active context ------------------------------------------------------

    # The policy and the budget are asked for several times per request (a turn's push and
    # prompt: ~8 budgets, each with a calibration fit). Each is kept with what it was computed
    # from, compared by value on every call (a push changes the figures in place, a reply's
    # usage the calibration samples, ``session/update`` the settings or the window); the
    # configuration is fixed for the daemon's life.

    def policy(self, state: SessionState) -> CompressionPolicy:
        caches = self.rules(state).caches
        key = (*msgspec.structs.astuple(state.row.settings), caches)
        memo = state.policy_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        policy = compression_policy(self.config, state.row, caches)
        state.policy_memo = (key, policy)
        return policy

    def rules(self, state: SessionState) -> CacheRules:
        """How the session's provider bills and caches its prompts (``[billing]``)."""
        key = (state.row.provider, state.row.model)
        memo = state.rules_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        rules = self.billing.rules(state.row.provider, state.row.model)
        state.rules_memo = (key, rules)
        return rules

    def budget(self, state: SessionState) -> Budget:
        """The session's budget (the same object while nothing it depends on changed:
        callers never modify it)."""
        f = state.stored.figures
        row = state.row
        samples = row.stats.drift.usage_samples
        lent = state.cstate.lent_now(row.last_seq)
        key = (f.system, f.pinned, f.checkpoints, f.used, state.context_window, state.output_limit,
               msgspec.structs.astuple(row.settings), row.provider, row.model, tuple(samples), lent)
        memo = state.budget_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        budget = budget_for(
            budget_policy(self.config, row, lent),
            context_window=state.context_window,
            output_limit=state.output_limit,
            system_tokens=f.system,
            pinned_tokens=f.pinned,
            checkpoint_tokens=f.checkpoints,
            used=f.used,
            calibration=calibration.fit(samples, state.context_window),
        )
        state.budget_memo = (key, budget)
        return budget

    def refresh(self, state: SessionState, *, system: bool = False, changed: bool = True) -> None:
        """Recompute the loaded context's views (and system part) after a state change
        (``changed=False``: after loading it, when nothing changed)."""
        ctx = state.ctx
        assert ctx is not None
        if changed:
            ctx.state.revision += 1  # (what "the newest snapshot already holds this" compares)
        if system:
            ctx.goal_text = render_goal(state.row.goal)
            ctx.refresh_system(state.counter.count)
        ctx.refresh(state.counter.count, self.policy(state).protected_tools)
        state.sync_figures()
        self._track(state)

    async def context(self, state: SessionState) -> ActiveContext:
        """The active context, rebuilt from history on first use."""
        if state.ctx is not None:
            self._loaded.move_to_end(state.id, last=True)
            return state.ctx
        cstate = state.cstate
        db = self.db
        checkpoints = await db.read(checkpoint_store.load_active, state.id)
        kept = await db.read(message_store.load_seqs, state.id, list(cstate.kept_seqs)) if cstate.kept_seqs else []
        recent = await db.read(message_store.load_range, state.id, cstate.boundary, None, None)
        # A push may have committed while we read; catch up with what the row says exists
        # (a push committed but not yet applied to the row is appended, deduplicated, later).
        loaded = recent[-1].seq if recent else cstate.boundary
        while loaded < state.row.last_seq:
            more = await db.read(message_store.load_range, state.id, loaded, None, None)
            if not more:
                break
            recent += more
            loaded = more[-1].seq
        if cstate.rolled_back or cstate.superseded:
            recent = [m for m in recent if not cstate.is_out(m.seq)]
        if state.ctx is not None:  # loaded by another request meanwhile
            return state.ctx
        return self._install(state, checkpoints, kept, recent)

    def context_of_new(self, state: SessionState) -> ActiveContext:
        """The active context of a session this daemon has just inserted: empty, as its
        storage is (``session/create``), so built without reading it (two storage reads
        on a new session's path)."""
        assert state.row.last_seq == 0 and state.ctx is None
        return self._install(state, [], [], [])

    def _install(self, state: SessionState, checkpoints: list[Checkpoint], kept: list[StoredMessage],
                 recent: list[StoredMessage]) -> ActiveContext:
        ctx = ActiveContext(
            system_prompt=state.row.system_prompt,
            state=msgspec.structs.replace(state.cstate),
            checkpoints=checkpoints,
            kept=[Entry.of(m.seq, m.message, m.tokens) for m in kept],
            recent=[Entry.of(m.seq, m.message, m.tokens) for m in recent],
        )
        state.ctx = ctx
        state.rendered.clear()
        state.renderers.clear()
        state.encoded.clear()
        self.refresh(state, system=True, changed=False)
        return ctx

    def appended(self, state: SessionState, stored: list[StoredMessage]) -> None:
        """Keep the figures (and a loaded context) in step with a committed push."""
        if state.ctx is not None:
            state.ctx.append([Entry.of(m.seq, m.message, m.tokens) for m in stored], state.counter.count)
            state.sync_figures()
            self._track(state)
        else:  # nothing to keep in step but the figures (a context loads when first needed)
            state.stored.figures = figures_after(state.stored.figures, (m.message for m in stored),
                                                 sum(sent_tokens(m.message, m.tokens) for m in stored),
                                                 state.counter.count)
            state.row.context_tokens = state.stored.figures.prompt

    def _track(self, state: SessionState) -> None:
        tokens = state.row.context_tokens
        self._loaded_tokens += tokens - self._loaded.pop(state.id, 0)
        self._loaded[state.id] = tokens
        while self._loaded_tokens > self.max_cached_tokens and len(self._loaded) > 1:
            victim, victim_tokens = next(iter(self._loaded.items()))
            evicted = self._states.get(victim)
            if evicted is not None and (evicted.lock.locked() or evicted.compress_lock.locked()
                                        or evicted.compression_task is not None):
                break  # in use: try again on the next change
            self._loaded.popitem(last=False)
            self._loaded_tokens -= victim_tokens
            if evicted is not None:
                evicted.drop_context()
