"""Request handlers, one module per feature; each registers itself in HANDLERS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ctxd.protocol.methods import METHODS

HANDLERS: dict[str, Callable[..., Awaitable[Any]]] = {}


def handles(method: str) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Register the handler of ``method``, which must be in the method table (``protocol/methods.py``)."""
    if method not in METHODS:
        raise KeyError(f"handler for {method!r}, which is not in ctxd.protocol.methods.METHODS")

    def register(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        HANDLERS[method] = fn
        return fn

    return register


from ctxd.server.handlers import (  # noqa: E402,F401  (registration)
    compression,
    context,
    goal,
    history,
    lifecycle,
    session,
    snapshot,
)
