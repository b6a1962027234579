"""Per-session state held in memory: the session row, its token counter, its lock,
and (loaded on first use) the messages of its active context.

The lock orders everything that changes one session (pushes, compression, deletion),
so per-session totals can be kept incrementally without races. Active contexts are
cached up to a token budget and evicted least-recently-used, so memory stays bounded
however many sessions the daemon holds.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from ctxd.config import Config
from ctxd.engine.budget import BudgetPolicy, budget_for
from ctxd.models import model_facts
from ctxd.protocol.context import Budget
from ctxd.protocol.errors import session_not_found
from ctxd.store import messages as message_store
from ctxd.store import sessions as session_store
from ctxd.store.db import Database
from ctxd.store.messages import StoredMessage
from ctxd.store.sessions import SessionRow
from ctxd.tokens import PROMPT_PRIMING, TokenCounter


@dataclass(eq=False)
class SessionState:
    row: SessionRow
    counter: TokenCounter
    context_window: int
    output_limit: int | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    entries: list[StoredMessage] | None = None
    deleted: bool = False

    @property
    def id(self) -> str:
        return self.row.id

    def conversation_tokens(self) -> int:
        """Tokens of the conversation part of the prompt (what the budget calls ``used``)."""
        return self.row.context_tokens - PROMPT_PRIMING - self.row.system_tokens


def budget_policy(config: Config) -> BudgetPolicy:
    b = config.budget
    return BudgetPolicy(
        usable_fraction=b.usable_fraction,
        reserved_output_cap=b.reserved_output_cap,
        reserved_output_fraction=b.reserved_output_fraction,
        safety_margin_fraction=b.safety_margin_fraction,
        trigger_fraction=b.trigger_fraction,
    )


def resolve_window(row: SessionRow, config: Config) -> tuple[int, int | None]:
    """The session's window: its own setting, else configuration, else the model table,
    else the configured default; and the model's output limit when known."""
    facts = model_facts(row.model, config.models.context_windows, config.models.output_limits)
    window = row.context_window or facts.context_window or config.budget.default_context_window
    return window, facts.output_limit


class SessionCache:
    def __init__(self, db: Database, config: Config, max_cached_tokens: int = 8_000_000) -> None:
        self.db = db
        self.config = config
        self.policy = budget_policy(config)
        self.max_cached_tokens = max_cached_tokens
        self._states: dict[str, SessionState] = {}
        self._loaded: OrderedDict[str, int] = OrderedDict()
        self._loaded_tokens = 0

    def adopt(self, row: SessionRow) -> SessionState:
        existing = self._states.get(row.id)
        if existing is not None:
            return existing
        window, output_limit = resolve_window(row, self.config)
        state = SessionState(row=row, counter=TokenCounter.for_encoding(row.encoding, row.tokens_estimated),
                             context_window=window, output_limit=output_limit)
        self._states[row.id] = state
        return state

    async def get(self, session_id: str) -> SessionState:
        state = self._states.get(session_id)
        if state is not None and not state.deleted:
            return state
        row = await self.db.read(session_store.get_session, session_id)
        if row is None:
            raise session_not_found(session_id)
        return self.adopt(row)

    def forget(self, session_id: str) -> None:
        state = self._states.pop(session_id, None)
        if state is not None:
            state.deleted = True
        tokens = self._loaded.pop(session_id, None)
        if tokens is not None:
            self._loaded_tokens -= tokens

    def cached(self) -> int:
        return len(self._states)

    async def entries(self, state: SessionState) -> list[StoredMessage]:
        """The active context's messages, loading them from history on first use."""
        if state.entries is None:
            state.entries = await self.db.read(message_store.load_range, state.id, 0, None, None)
            self._track(state)
        else:
            self._loaded.move_to_end(state.id, last=True)
        return state.entries

    def appended(self, state: SessionState, new: list[StoredMessage]) -> None:
        """Keep a loaded active context in step with a committed push."""
        if state.entries is None:
            return
        state.entries.extend(new)
        self._track(state)

    def _track(self, state: SessionState) -> None:
        tokens = state.row.context_tokens
        self._loaded_tokens += tokens - self._loaded.pop(state.id, 0)
        self._loaded[state.id] = tokens
        while self._loaded_tokens > self.max_cached_tokens and len(self._loaded) > 1:
            victim, victim_tokens = self._loaded.popitem(last=False)
            self._loaded_tokens -= victim_tokens
            evicted = self._states.get(victim)
            if evicted is not None and not evicted.lock.locked():
                evicted.entries = None
            elif evicted is not None:
                self._loaded[victim] = victim_tokens
                self._loaded_tokens += victim_tokens
                self._loaded.move_to_end(victim, last=False)
                break

    def budget(self, state: SessionState) -> Budget:
        return budget_for(
            self.policy,
            context_window=state.context_window,
            output_limit=state.output_limit,
            system_tokens=state.row.system_tokens,
            used=state.conversation_tokens(),
        )
