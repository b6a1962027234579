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

# Sizes of what a request may store beside messages (messages have limits.max_message_bytes):
# a field past its size is refused (-32602 naming it and both sizes) before anything is
# stored or counted, so a huge value costs one decode, never a session that no longer fits.
MAX_NAME_CHARS = 200
"""A model, a provider, a tag."""
MAX_TITLE_CHARS = 1_000
"""A session's title."""
MAX_LABEL_CHARS = 65_536
"""A snapshot's label (shown in lists, never sent in a prompt)."""
MAX_TAGS = 100
"""Tags of one session."""
MAX_METADATA_BYTES = 64 * 1024
"""A session's metadata, encoded as JSON."""
MAX_GOAL_CHARS = 4_000
"""A goal's description, a compression's focus."""
MAX_GOAL_ITEM_CHARS = 1_000
"""A goal's milestone, decision, next step, or an artifact's path."""
MAX_GOAL_ITEMS = 100
"""Milestones, decisions, artifacts or next steps one ``goal/set`` or ``goal/update`` gives."""
MAX_GOAL_SHARE = 0.25
"""The most of a session's largest prompt its goal block may take (``goal/set``/``goal/update``)."""


class SessionRef(msgspec.Struct, rename="camel"):
    """Params of methods that only name a session."""

    session_id: str


class Empty(msgspec.Struct):
    """Params or result of methods that carry nothing (``null`` and ``{}`` are both accepted)."""
