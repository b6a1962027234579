"""Small shapes shared by several methods."""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_COUNT = 2**53 - 1
"""The largest integer JSON carries exactly (and far below SQLite's 2^63)."""
Seq = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
"""A message's sequence number in its session (the first is 1)."""
WindowSize = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
"""A context window in tokens."""
UsageCount = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
"""A token count of one call (``usageSamples``)."""


class SessionRef(msgspec.Struct, rename="camel"):
    """Params of methods that only name a session."""

    session_id: str


class Empty(msgspec.Struct):
    """Params or result of methods that carry nothing (``null`` and ``{}`` are both accepted)."""
