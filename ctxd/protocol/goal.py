"""Goals (goal-aware compression): what the session is working toward.

The active goal, its checkpoints, locked and architecture decisions, artifacts and next
steps are rendered into the prompt's system part and are never compressed. They are
set with ``goal/set``/``goal/update`` or by markers in assistant output
(``[GOAL]``, ``[CHECKPOINT] ... - STATUS``, ``[DECISION] ... - LOCKED``,
``[ARTIFACT] Created|Modified path``, ``[NEXT] ...``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

GoalStatus = Literal["active", "paused", "completed"]
StepStatus = Literal["pending", "in-progress", "completed"]
Priority = Literal["high", "medium", "low"]
ArtifactAction = Literal["created", "modified", "deleted"]


class GoalCheckpoint(msgspec.Struct, rename="camel", omit_defaults=True):
    """A milestone of the goal (not to be confused with a compression checkpoint)."""

    description: str
    status: StepStatus = "pending"


class Decision(msgspec.Struct, rename="camel", omit_defaults=True):
    description: str
    locked: bool = False
    architecture: bool = False
    seq: int | None = None


class Artifact(msgspec.Struct, rename="camel", omit_defaults=True):
    path: str
    action: ArtifactAction = "modified"
    seq: int | None = None


class Goal(msgspec.Struct, rename="camel", omit_defaults=True):
    id: str
    description: str
    created_at: str
    priority: Priority = "medium"
    status: GoalStatus = "active"
    completed_at: str | None = None
    checkpoints: list[GoalCheckpoint] = []
    decisions: list[Decision] = []
    artifacts: list[Artifact] = []
    next_steps: list[str] = []


class GoalSetParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Start a new goal (the previous one, if any, is replaced)."""

    session_id: str
    description: str
    priority: Priority = "medium"
    checkpoints: list[GoalCheckpoint] = []
    decisions: list[Decision] = []


class GoalUpdateParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Change the active goal: each field given is applied, others are left alone.

    Checkpoints and decisions are matched by description (case-insensitive): an
    existing one is updated, a new one is added.
    """

    session_id: str
    description: str | None = None
    priority: Priority | None = None
    status: GoalStatus | None = None
    checkpoints: list[GoalCheckpoint] = []
    decisions: list[Decision] = []
    artifacts: list[Artifact] = []
    next_steps: list[str] | None = None


class GoalResult(msgspec.Struct, rename="camel"):
    session_id: str
    goal: Goal | None
    tokens: int
