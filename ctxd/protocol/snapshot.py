"""Snapshots: the active context at a point in time, for rollback.

A snapshot records what the active context was (its state, checkpoints, goal and
figures) and refers to history by sequence number; history is append-only, so the
snapshot's content (``snapshot/get``) is exact however long ago it was taken.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ctxd.protocol.compression import Checkpoint
from ctxd.protocol.goal import Goal
from ctxd.protocol.message import Message

SnapshotTrigger = Literal["auto", "manual", "restore"]


class SnapshotInfo(msgspec.Struct, rename="camel", omit_defaults=True):
    snapshot_id: str
    session_id: str
    created_at: str
    trigger: SnapshotTrigger
    last_seq: int
    message_count: int
    token_count: int
    context_tokens: int
    checkpoint_count: int
    compression_count: int
    user_message_count: int
    context_window: int
    compression_ratio: float
    """Tokens sent / tokens in history at that point."""
    label: str | None = None
    model: str | None = None
    watermark_seq: int = 0


class SnapshotCreateParams(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    label: str | None = None


class SnapshotRef(msgspec.Struct, rename="camel"):
    session_id: str
    snapshot_id: str


class SnapshotListResult(msgspec.Struct, rename="camel"):
    session_id: str
    snapshots: list[SnapshotInfo]


class SnapshotMessage(msgspec.Struct, rename="camel", omit_defaults=True):
    seq: int
    message: Message
    tokens: int
    in_context: bool
    """False for user messages that were only kept in the snapshot's checkpoints' ranges
    (folded), True for messages the snapshot's prompt contained verbatim."""


class SnapshotContent(msgspec.Struct, rename="camel", omit_defaults=True):
    """A snapshot's content: every user message in full, the other messages of the active
    context, checkpoints, goal, reasoning (thinking blocks travel with their messages),
    the watermark, and the metadata."""

    info: SnapshotInfo
    user_messages: list[SnapshotMessage]
    messages: list[SnapshotMessage]
    checkpoints: list[Checkpoint]
    goal: Goal | None = None
    watermark_seq: int = 0
    pinned: list[int] = []
    thinking_tokens: int = 0


class SnapshotRestoreResult(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    snapshot_id: str
    backup_snapshot_id: str
    rolled_back_from: int | None = None
    rolled_back_to: int | None = None
    context_tokens: int = 0
    """The prompt's size now (after the pass below, if one ran)."""
    goal_changed: bool = False
    """The snapshot's goal (``goal``, none when null) replaced the one the session had
    (``previousGoal``; the backup snapshot keeps it)."""
    goal: Goal | None = None
    previous_goal: Goal | None = None
    compressed: bool = False
    """The restored context did not fit the largest prompt: it was compressed right away (as
    the next prompt would have been), so every figure is the one of the prompt to be sent."""


class SnapshotDeleteResult(msgspec.Struct, rename="camel"):
    session_id: str
    deleted: list[str]


class SnapshotCreated(msgspec.Struct, rename="camel"):
    session_id: str
    snapshot: SnapshotInfo


class SnapshotRestored(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    snapshot_id: str
    backup_snapshot_id: str
    rolled_back_from: int | None = None
    rolled_back_to: int | None = None


class SnapshotDeleted(msgspec.Struct, rename="camel"):
    session_id: str
    snapshot_ids: list[str]
    reason: Literal["request", "rolling", "age", "session"]


class SnapshotError(msgspec.Struct, rename="camel"):
    session_id: str
    operation: Literal["create", "restore", "delete"]
    reason: str
