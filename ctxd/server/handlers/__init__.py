"""Request handlers, one module per feature; each registers itself in HANDLERS."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

HANDLERS: dict[str, Callable[..., Awaitable[Any]]] = {}


def handles(method: str) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
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
