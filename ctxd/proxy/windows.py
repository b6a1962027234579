"""Which window a request's model gets (``proxy.context_window``, docs/proxy.md).

One number applies to every model; a table applies by model, and a model it does not
name is the client's business: its requests pass through unchanged (no session) while
they fit the model's own window. An agent often talks to more than one model (aider's
summarizer, Claude Code's small fast model): a window chosen for the main model must not
squeeze the others' requests into it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxd.models import model_facts

PATTERN_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Managed:
    """Put the request through a session; ``window`` None: ctxd's own rule for the model."""

    window: int | None


@dataclass(frozen=True)
class Unlisted:
    """A model the table does not name; ``own``: its own window as ctxd knows it (None:
    unknown, so nothing says the request is too long)."""

    own: int | None


def lookup(table: int | dict[str, int], model: str | None) -> Managed | Unlisted:
    """The table's answer for ``model``: an exact name (case-insensitive, with or without
    a ``provider/`` prefix), else the longest pattern that matches it."""
    if isinstance(table, int):
        return Managed(table or None)
    if not table:
        return Managed(None)
    name = (model or "").lower()
    names = {name, name.split("/")[-1]}
    best: tuple[int, int] | None = None  # (specificity, window)
    for key, window in table.items():
        pattern = key.lower()
        if not PATTERN_CHARS & set(pattern):
            if pattern in names:
                return Managed(window or None)
            continue
        if any(fnmatch.fnmatchcase(n, pattern) for n in names):
            specificity = len(pattern.replace("*", "").replace("?", ""))
            if best is None or specificity > best[0]:
                best = (specificity, window)
    if best is not None:
        return Managed(best[1] or None)
    return Unlisted(None)


class Windows:
    """``proxy.context_window`` with the model facts (``[models]``, ctxd's table) it needs
    for models the table leaves out."""

    def __init__(self, table: int | dict[str, int], *, known: Callable[[str | None], int | None] | None = None,
                 counter: Callable[[str | None, str], int] | None = None) -> None:
        self.table = table
        self._known = known or (lambda model: model_facts(model).context_window)
        self._count = counter or _count

    @classmethod
    def from_config(cls, config: Any) -> Windows:
        models = config.models
        return cls(config.proxy.context_window,
                   known=lambda model: model_facts(model, models.context_windows,
                                                   models.output_limits).context_window)

    def decide(self, model: str | None, raw: bytes, reply: int | None) -> Managed | None:
        """The window to manage a request with, or None: pass it through unchanged (a model
        the table does not name, whose request fits its own window with the reply it
        asks for, or whose window ctxd does not know). One that outgrew its own window is
        managed at that window, as this proxy's configuration knows it."""
        answer = lookup(self.table, model)
        if isinstance(answer, Managed):
            return answer
        own = self._known(model)
        if own is None:
            return None
        room = own - (reply or 0)
        # A token is at least one byte (byte-level BPE), so a body no longer than the room
        # fits whatever the tokenizer; only a longer one is counted.
        if len(raw) <= room or self._count(model, raw.decode("utf-8", "replace")) <= room:
            return None
        return Managed(own)


def _count(model: str | None, text: str) -> int:
    from ctxd.tokens import TokenCounter

    return TokenCounter.for_model(model or "").count(text)
