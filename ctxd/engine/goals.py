"""Goal state (goal-aware compression): markers, updates, and the goal block.

The goal block is part of the system prompt and never compressed: the goal, its
milestones, every locked and architecture decision, artifacts and next steps. To keep
a never-compressed block from growing without bound, unlocked decisions and
artifacts show only the newest ones (the rest stay in the goal's stored state).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

import msgspec

from ctxd.protocol.common import MAX_GOAL_CHARS, MAX_GOAL_ITEM_CHARS
from ctxd.protocol.goal import Artifact, Decision, Goal, GoalCheckpoint
from ctxd.protocol.message import Message, TextBlock

SHOW_UNLOCKED = 10
SHOW_ARTIFACTS = 30

_MARKER = re.compile(r"^[ \t>*\-]*\[(GOAL|CHECKPOINT|DECISION|ARTIFACT|NEXT)\][ \t]*+(.*[^ \t])[ \t]*$",
                     re.MULTILINE | re.IGNORECASE)
# "text - STATUS" (a dash needs a space before it: "auto-complete" is no status) or "text: STATUS".
_STATUS = re.compile(r"(?:\s+[-\u2013\u2014]|\s*:)\s*(COMPLETED|COMPLETE|DONE|IN[ -]PROGRESS|PENDING|TODO)\s*$",
                     re.IGNORECASE)
_LOCK = re.compile(r"(?:\s+[-\u2013\u2014]|\s*:)\s*(LOCKED|ARCHITECTURE)\s*$", re.IGNORECASE)
_TAIL = 64
"""A status or lock word is looked for in a marker's last characters only: searched from
every position of a long run of spaces, the patterns above cost its length squared."""
_ARTIFACT = re.compile(r"^(CREATED|MODIFIED|DELETED|UPDATED|EDITED)\s*:?\s+(\S.*)$", re.IGNORECASE)


@dataclass
class Markers:
    goal: str | None = None
    checkpoints: list[GoalCheckpoint] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.goal or self.checkpoints or self.decisions or self.artifacts or self.next_steps)


def _status(text: str) -> str:
    word = text.lower().replace(" ", "-")
    if word in ("completed", "complete", "done"):
        return "completed"
    if word == "in-progress":
        return "in-progress"
    return "pending"


_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def _outside_fences(text: str) -> str:
    """``text`` without its fenced code blocks: a marker quoted in an example (how to
    write one, a log being shown) is not one the assistant meant."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        found = _FENCE.match(line)
        if fence is None:
            if found:
                fence = found.group(1)
                continue
            out.append(line)
        elif (found and found.group(1)[0] == fence[0] and len(found.group(1)) >= len(fence)
              and not line[found.end():].strip()):  # a closing fence has nothing after it
            fence = None
    return "\n".join(out)


def parse_markers(message: Message, seq: int | None = None) -> Markers:
    """Goal markers (``[GOAL]``, ``[DECISION]``, ...) in an assistant message's text."""
    markers = Markers()
    if message.role != "assistant":
        return markers
    content = message.content
    if isinstance(content, str):
        text = content
    elif content:
        text = "\n".join(b.text for b in content if isinstance(b, TextBlock))
    else:
        return markers
    if "[" not in text:
        return markers
    if "```" in text or "~~~" in text:
        text = _outside_fences(text)
    for match in _MARKER.finditer(text):
        kind, body = match.group(1).upper(), match.group(2)
        # A marker's text is held to what goal/set and goal/update accept (a 4 MB line of
        # assistant output must not become a never-compressed goal block).
        if kind == "GOAL":
            markers.goal = body[:MAX_GOAL_CHARS]
            continue
        body = body[:MAX_GOAL_ITEM_CHARS]
        if kind == "CHECKPOINT":
            status = _STATUS.search(body, max(0, len(body) - _TAIL))
            description = body[: status.start()] if status else body
            markers.checkpoints.append(
                GoalCheckpoint(description.strip(), _status(status.group(1)) if status else "pending"))  # type: ignore[arg-type]
        elif kind == "DECISION":
            lock = _LOCK.search(body, max(0, len(body) - _TAIL))
            description = body[: lock.start()] if lock else body
            architecture = bool(lock and lock.group(1).upper() == "ARCHITECTURE")
            markers.decisions.append(
                Decision(description.strip(), locked=bool(lock), architecture=architecture, seq=seq))
        elif kind == "ARTIFACT":
            found = _ARTIFACT.match(body)
            if found:
                verb = found.group(1).lower()
                action = "created" if verb == "created" else "deleted" if verb == "deleted" else "modified"
                markers.artifacts.append(Artifact(found.group(2).strip(), action, seq=seq))  # type: ignore[arg-type]
            else:
                markers.artifacts.append(Artifact(body.strip(), "modified", seq=seq))
        elif kind == "NEXT":
            markers.next_steps.append(body)
    return markers


def new_goal(description: str, now: str, priority: str = "medium") -> Goal:
    return Goal(id="goal_" + uuid.uuid4().hex[:10], description=description, created_at=now, priority=priority)  # type: ignore[arg-type]


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def merge_checkpoints(goal: Goal, items: list[GoalCheckpoint]) -> None:
    by_key = {_key(c.description): i for i, c in enumerate(goal.checkpoints)}
    for item in items:
        index = by_key.get(_key(item.description))
        if index is None:
            by_key[_key(item.description)] = len(goal.checkpoints)
            goal.checkpoints.append(item)
        else:
            goal.checkpoints[index] = item


def merge_decisions(goal: Goal, items: list[Decision], *, keep_locks: bool = True) -> None:
    """Add or update decisions by description. With ``keep_locks`` (markers), a locked
    decision stays locked; only an explicit ``goal/update`` may unlock one."""
    by_key = {_key(d.description): i for i, d in enumerate(goal.decisions)}
    for item in items:
        index = by_key.get(_key(item.description))
        if index is None:
            by_key[_key(item.description)] = len(goal.decisions)
            goal.decisions.append(item)
        elif keep_locks:
            old = goal.decisions[index]
            goal.decisions[index] = msgspec.structs.replace(
                item, locked=item.locked or old.locked, architecture=item.architecture or old.architecture)
        else:
            goal.decisions[index] = item


def merge_artifacts(goal: Goal, items: list[Artifact]) -> None:
    for item in items:
        goal.artifacts = [a for a in goal.artifacts if a.path != item.path] + [item]


def apply_markers(goal: Goal | None, markers: Markers, now: str) -> Goal | None:
    """The goal after the markers of one message (None stays None without markers)."""
    if not markers:
        return goal
    if markers.goal and (goal is None or _key(goal.description) != _key(markers.goal)):
        previous = goal
        goal = new_goal(markers.goal, now)
        if previous is not None:
            # A new goal never loses a locked or architecture decision (goal preservation).
            goal.decisions = [d for d in previous.decisions if d.locked or d.architecture]
    elif goal is None:
        goal = new_goal("(goal not stated)", now)
    else:
        goal = msgspec.structs.replace(goal, checkpoints=list(goal.checkpoints), decisions=list(goal.decisions),
                                       artifacts=list(goal.artifacts), next_steps=list(goal.next_steps))
    merge_checkpoints(goal, markers.checkpoints)
    merge_decisions(goal, markers.decisions)
    merge_artifacts(goal, markers.artifacts)
    if markers.next_steps:
        goal.next_steps = markers.next_steps
    if goal.checkpoints and all(c.status == "completed" for c in goal.checkpoints) and markers.checkpoints \
            and not goal.next_steps:
        goal.status, goal.completed_at = "completed", now
    return goal


_STEP_MARK = {"completed": "done", "in-progress": "in progress", "pending": "pending"}


def render_goal(goal: Goal | None) -> str | None:
    """The goal block of the system prompt, ahead of the checkpoints."""
    if goal is None:
        return None
    lines = ["## Active goal (kept verbatim by ctxd; never compressed)",
             f"Goal: {goal.description} (priority {goal.priority}, {goal.status})"]
    if goal.checkpoints:
        lines.append("Milestones:")
        lines += [f"- [{_STEP_MARK[c.status]}] {c.description}" for c in goal.checkpoints]
    locked = [d for d in goal.decisions if d.locked or d.architecture]
    unlocked = [d for d in goal.decisions if not (d.locked or d.architecture)]
    if locked or unlocked:
        lines.append("Decisions:")
        for d in locked:
            tag = "architecture" if d.architecture else "locked"
            lines.append(f"- [{tag}] {d.description}")
        hidden = len(unlocked) - SHOW_UNLOCKED
        if hidden > 0:
            lines.append(f"- ({hidden} earlier open decisions not shown)")
        lines += [f"- {d.description}" for d in unlocked[-SHOW_UNLOCKED:]]
    if goal.artifacts:
        lines.append("Artifacts:")
        hidden = len(goal.artifacts) - SHOW_ARTIFACTS
        if hidden > 0:
            lines.append(f"- ({hidden} earlier artifacts not shown)")
        lines += [f"- {a.action}: {a.path}" for a in goal.artifacts[-SHOW_ARTIFACTS:]]
    if goal.next_steps:
        lines.append("Next: " + "; ".join(goal.next_steps))
    return "\n".join(lines)
