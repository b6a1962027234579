"""Goal markers and the goal block (goal-aware compression)."""

from __future__ import annotations

from ctxd.engine.goals import (
    SHOW_ARTIFACTS,
    SHOW_UNLOCKED,
    Markers,
    apply_markers,
    new_goal,
    parse_markers,
    render_goal,
)
from ctxd.protocol.goal import Artifact, Decision, Goal, GoalCheckpoint
from ctxd.protocol.message import Message, TextBlock, ToolUseBlock

from ._engine_helpers import NOW, assistant, user

MARKED_REPLY = """[GOAL] Implement user authentication system
[CHECKPOINT] Design authentication flow - COMPLETED
[CHECKPOINT] Implement login endpoint - COMPLETED
[CHECKPOINT] Add JWT token generation - IN PROGRESS
[DECISION] Use JWT for authentication - LOCKED
[DECISION] Store tokens in httpOnly cookies - LOCKED
[ARTIFACT] Created src/auth/login.ts
[ARTIFACT] Created src/auth/jwt.ts
[ARTIFACT] Modified src/routes/api.ts
[NEXT] Complete JWT token generation, then move to user registration"""


def test_goal_markers():
    m = parse_markers(assistant(MARKED_REPLY), seq=42)
    assert m.goal == "Implement user authentication system"
    assert m.checkpoints == [
        GoalCheckpoint("Design authentication flow", "completed"),
        GoalCheckpoint("Implement login endpoint", "completed"),
        GoalCheckpoint("Add JWT token generation", "in-progress"),
    ]
    assert m.decisions == [
        Decision("Use JWT for authentication", locked=True, seq=42),
        Decision("Store tokens in httpOnly cookies", locked=True, seq=42),
    ]
    assert m.artifacts == [
        Artifact("src/auth/login.ts", "created", seq=42),
        Artifact("src/auth/jwt.ts", "created", seq=42),
        Artifact("src/routes/api.ts", "modified", seq=42),
    ]
    assert m.next_steps == ["Complete JWT token generation, then move to user registration"]
    assert bool(m)


def test_checkpoint_statuses():
    text = "\n".join([
        "[CHECKPOINT] a - COMPLETED", "[CHECKPOINT] b - IN PROGRESS", "[CHECKPOINT] c - PENDING",
        "[CHECKPOINT] d - in-progress", "[CHECKPOINT] e: done", "[CHECKPOINT] f \u2014 TODO",
        "[CHECKPOINT] g",
    ])
    m = parse_markers(assistant(text))
    assert [(c.description, c.status) for c in m.checkpoints] == [
        ("a", "completed"), ("b", "in-progress"), ("c", "pending"), ("d", "in-progress"),
        ("e", "completed"), ("f", "pending"), ("g", "pending")]


def test_decisions_locked_unlocked_architecture():
    m = parse_markers(assistant("[DECISION] Use bcrypt for password hashing\n"
                                "[DECISION] Postgres for storage - ARCHITECTURE\n"
                                "[DECISION] Tabs - locked"))
    assert [(d.description, d.locked, d.architecture) for d in m.decisions] == [
        ("Use bcrypt for password hashing", False, False),
        ("Postgres for storage", True, True),
        ("Tabs", True, False),
    ]


def test_artifact_variants():
    m = parse_markers(assistant("[ARTIFACT] Deleted old/thing.py\n[ARTIFACT] Updated: a b.txt\n"
                                "[ARTIFACT] README.md"))
    assert [(a.path, a.action) for a in m.artifacts] == [
        ("old/thing.py", "deleted"), ("a b.txt", "modified"), ("README.md", "modified")]


def test_markers_in_lists_quotes_and_blocks():
    message = Message(role="assistant", content=[
        TextBlock(text="Progress:\n- [CHECKPOINT] Write tests - DONE\n> [NEXT] ship it"),
        ToolUseBlock(id="t", name="bash", input={"cmd": "[GOAL] not a marker in a tool call"}),
        TextBlock(text="  * [DECISION] Keep the API - LOCKED  "),
    ])
    m = parse_markers(message)
    assert m.goal is None
    assert m.checkpoints == [GoalCheckpoint("Write tests", "completed")]
    assert m.next_steps == ["ship it"]
    assert m.decisions[0].description == "Keep the API" and m.decisions[0].locked


def test_markers_inside_code_fences_are_examples_not_markers():
    m = parse_markers(assistant(
        "Here is how to record one:\n```\n[ARTIFACT] Modified /etc/passwd\n[GOAL] example goal\n```\n"
        "~~~~text\n[DECISION] quoted - LOCKED\n```\n~~~~\n"
        "[NEXT] Document the marker format"))
    assert m.artifacts == [] and m.goal is None and m.decisions == []
    assert m.next_steps == ["Document the marker format"]
    # "```python" inside a block opens nothing and closes nothing (CommonMark).
    m = parse_markers(assistant("```\nsee:\n```python\n[GOAL] still code\n```\n[NEXT] after the block"))
    assert m.goal is None and m.next_steps == ["after the block"]
    # An unclosed fence hides what follows it (it is all code).
    assert not parse_markers(assistant("```python\n[GOAL] x = 1\n"))


def test_markers_only_at_line_start():
    m = parse_markers(assistant("As I said, [GOAL] is how markers look. See [DECISION] docs."))
    assert not m


def test_markers_only_from_assistant_messages():
    for message in (user(MARKED_REPLY), Message(role="system", content=MARKED_REPLY),
                    Message(role="tool", tool_call_id="x", content=MARKED_REPLY)):
        assert not parse_markers(message)
    assert not parse_markers(Message(role="assistant"))
    assert not parse_markers(assistant("no markers here"))


def test_apply_markers_builds_a_goal():
    goal = apply_markers(None, parse_markers(assistant(MARKED_REPLY), 1), NOW)
    assert goal.description == "Implement user authentication system"
    assert goal.status == "active" and goal.created_at == NOW and goal.id.startswith("goal_")
    assert len(goal.checkpoints) == 3 and len(goal.decisions) == 2 and len(goal.artifacts) == 3
    assert goal.next_steps == ["Complete JWT token generation, then move to user registration"]


def test_apply_markers_without_markers_changes_nothing():
    assert apply_markers(None, Markers(), NOW) is None
    goal = new_goal("x", NOW)
    assert apply_markers(goal, Markers(), NOW) is goal


def test_apply_markers_without_a_goal_marker_starts_an_unstated_goal():
    goal = apply_markers(None, parse_markers(assistant("[DECISION] Use JWT - LOCKED")), NOW)
    assert goal.description == "(goal not stated)"
    assert goal.decisions[0].locked


def test_updates_match_by_description_and_do_not_mutate():
    goal = apply_markers(None, parse_markers(assistant(MARKED_REPLY), 1), NOW)
    before = goal
    snapshot = (list(goal.checkpoints), list(goal.decisions), list(goal.artifacts))
    update = parse_markers(assistant("[CHECKPOINT] add jwt  token generation - COMPLETED\n"
                                     "[CHECKPOINT] Create user registration - PENDING\n"
                                     "[ARTIFACT] Modified src/auth/login.ts"), 2)
    goal = apply_markers(goal, update, "later")
    assert [(c.description, c.status) for c in goal.checkpoints] == [
        ("Design authentication flow", "completed"), ("Implement login endpoint", "completed"),
        ("add jwt  token generation", "completed"), ("Create user registration", "pending")]
    # an artifact recorded again moves to the end with its new action
    assert [(a.path, a.action) for a in goal.artifacts] == [
        ("src/auth/jwt.ts", "created"), ("src/routes/api.ts", "modified"), ("src/auth/login.ts", "modified")]
    # the previous goal value is untouched
    assert (before.checkpoints, before.decisions, before.artifacts) == snapshot
    assert goal.next_steps == before.next_steps  # no [NEXT]: the old next steps stay


def test_locked_decisions_stay_locked():
    goal = apply_markers(None, parse_markers(assistant("[GOAL] g\n[DECISION] Use JWT - LOCKED\n"
                                                       "[DECISION] Postgres - ARCHITECTURE")), NOW)
    goal = apply_markers(goal, parse_markers(assistant("[DECISION] use jwt\n[DECISION] Postgres")), NOW)
    assert [(d.description, d.locked, d.architecture) for d in goal.decisions] == [
        ("use jwt", True, False), ("Postgres", True, True)]


def test_same_goal_marker_keeps_the_goal():
    goal = apply_markers(None, parse_markers(assistant(MARKED_REPLY), 1), NOW)
    again = apply_markers(goal, parse_markers(assistant("[GOAL] implement USER authentication system\n"
                                                        "[NEXT] registration")), "later")
    assert again.id == goal.id and len(again.decisions) == 2
    assert again.next_steps == ["registration"]


def test_goal_completes_when_every_milestone_is_done_and_nothing_is_next():
    goal = apply_markers(None, parse_markers(assistant("[GOAL] g\n[CHECKPOINT] a - IN PROGRESS")), NOW)
    goal = apply_markers(goal, parse_markers(assistant("[CHECKPOINT] a - COMPLETED")), "t2")
    assert goal.status == "completed" and goal.completed_at == "t2"
    busy = apply_markers(None, parse_markers(assistant("[GOAL] g\n[CHECKPOINT] a - DONE\n[NEXT] more")), NOW)
    assert busy.status == "active"


def test_render_goal_structure():
    goal = apply_markers(None, parse_markers(assistant(MARKED_REPLY), 1), NOW)
    goal = apply_markers(goal, parse_markers(assistant("[CHECKPOINT] Create user registration\n"
                                                       "[DECISION] Use bcrypt for password hashing")), NOW)
    text = render_goal(goal)
    assert text.splitlines() == [
        "## Active goal (kept verbatim by ctxd; never compressed)",
        "Goal: Implement user authentication system (priority medium, active)",
        "Milestones:",
        "- [done] Design authentication flow",
        "- [done] Implement login endpoint",
        "- [in progress] Add JWT token generation",
        "- [pending] Create user registration",
        "Decisions:",
        "- [locked] Use JWT for authentication",
        "- [locked] Store tokens in httpOnly cookies",
        "- Use bcrypt for password hashing",
        "Artifacts:",
        "- created: src/auth/login.ts",
        "- created: src/auth/jwt.ts",
        "- modified: src/routes/api.ts",
        "Next: Complete JWT token generation, then move to user registration",
    ]
    assert render_goal(None) is None


def test_goal_block_lists_every_locked_decision_and_bounds_the_rest():
    locked = [Decision(f"locked {i}", locked=True) for i in range(40)]
    arch = [Decision(f"arch {i}", architecture=True) for i in range(5)]
    unlocked = [Decision(f"open {i}") for i in range(25)]
    artifacts = [Artifact(f"src/f{i}.py", "created") for i in range(45)]
    goal = Goal(id="g", description="big", created_at=NOW, decisions=locked[:20] + unlocked + locked[20:] + arch,
                artifacts=artifacts)
    text = render_goal(goal)
    for d in locked:
        assert f"- [locked] {d.description}\n" in text + "\n"
    for d in arch:
        assert f"- [architecture] {d.description}" in text
    shown = [d for d in unlocked if f"- {d.description}\n" in text + "\n"]
    assert shown == unlocked[-SHOW_UNLOCKED:]
    assert f"- ({25 - SHOW_UNLOCKED} earlier open decisions not shown)" in text
    assert [a for a in artifacts if f": {a.path}\n" in text + "\n"] == artifacts[-SHOW_ARTIFACTS:]
    assert f"- ({45 - SHOW_ARTIFACTS} earlier artifacts not shown)" in text


def test_goal_block_small_lists_have_no_hidden_note():
    goal = Goal(id="g", description="d", created_at=NOW, decisions=[Decision("x")],
                artifacts=[Artifact("a.py")])
    assert "not shown" not in render_goal(goal)


def test_a_dash_inside_a_word_is_no_status():
    m = parse_markers(assistant("[CHECKPOINT] Fix the auto-complete\n[DECISION] Make it self-locked"))
    assert [(c.description, c.status) for c in m.checkpoints] == [("Fix the auto-complete", "pending")]
    assert [(d.description, d.locked) for d in m.decisions] == [("Make it self-locked", False)]
    m = parse_markers(assistant("[DECISION] Use JWT: LOCKED"))
    assert [(d.description, d.locked) for d in m.decisions] == [("Use JWT", True)]
