"""Small shapes shared by several methods."""

from __future__ import annotations

import msgspec


class SessionRef(msgspec.Struct, rename="camel"):
    """Params of methods that only name a session."""

    session_id: str


class Empty(msgspec.Struct):
    """Params or result of methods that carry nothing (``null`` and ``{}`` are both accepted)."""
