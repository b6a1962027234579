"""sessions show (checkpoints, snapshots, goal, reliability), update, cleanup and clear."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def test_show_update_and_list_by_tag(cli: Cli) -> None:
    # A session that has been compressed: a small window makes the daemon compress on its own.
    cli("replay", str(FIXTURES / "mini_swe_agent.traj.json"), "--session", "r", "--context-window", "1024")
    cli("snapshot", "create", "r", "--label", "mark")
    cli("goal", "set", "r", "fix the bug", "--priority", "high")

    shown = cli.json("sessions", "show", "r")
    assert shown["sessionId"] == "r" and shown["messageCount"] == 12  # session/get's fields stay at the top
    assert shown["compressionCount"] >= 1 and shown["reliability"]["level"] in ("high", "medium", "low", "critical")
    assert shown["checkpoints"] and {"id", "kind", "level", "seqFrom", "seqTo", "tokens", "originalTokens"} \
        <= set(shown["checkpoints"][0])
    assert [s["label"] for s in shown["snapshots"] if s["trigger"] == "manual"] == ["mark"]
    assert shown["goal"]["description"] == "fix the bug" and shown["goalTokens"] > 0
    text = cli("sessions", "show", "r").stdout
    for words in ("reliability", "Checkpoints in the context", "TOKENS / ORIGINAL", "Snapshots", "mark",
                  "Goal", "fix the bug", shown["checkpoints"][0]["id"]):
        assert words in text, words
    assert "\x1b[" not in text
    assert cli("sessions", "view", "r").stdout == text  # the name other chat CLIs give it

    updated = cli.json("sessions", "update", "r", "--title", "Renamed", "--tag", "work", "--tag", "auth",
                       "--no-auto-compress", "--context-window", "4096")
    assert updated["title"] == "Renamed" and updated["tags"] == ["work", "auth"]
    assert updated["settings"]["autoCompress"] is False and updated["contextWindow"] == 4096
    again = cli.json("sessions", "update", "r", "--add-tag", "x", "--remove-tag", "work", "--auto-compress")
    assert again["tags"] == ["auth", "x"] and again["settings"]["autoCompress"] is True
    assert again["contextWindow"] == 4096  # left alone
    assert "nothing to change" in cli("sessions", "update", "r", expect=2).stderr
    assert "updated session r" in cli("sessions", "update", "r", "--title", "Third").stdout

    cli("push", "other", "--create", "--content", "hello")
    assert [s["sessionId"] for s in cli.json("sessions", "list", "--tag", "x")["sessions"]] == ["r"]


def test_cleanup_and_clear_confirmations(cli: Cli) -> None:
    for name in ("a", "b", "c"):
        cli("push", name, "--create", "--content", f"session {name}")

    # No terminal to ask on and no --yes: refuse (exit 2), say why, delete nothing.
    refused = cli("sessions", "cleanup", "--keep", "1", expect=2)
    assert "stdin is not a terminal" in refused.error_line() and "--yes" in refused.stderr
    refused = cli("sessions", "clear", "--all", expect=2)
    assert "not deleting every session" in refused.error_line()
    assert "--all" in cli("sessions", "clear", "--yes", expect=2).stderr
    assert len(cli.json("sessions", "list")["sessions"]) == 3

    kept = cli.json("sessions", "cleanup", "--keep", "1", "--yes")
    assert sorted(kept["deleted"]) == ["a", "b"]  # c is the most recently active
    assert [s["sessionId"] for s in cli.json("sessions", "list")["sessions"]] == ["c"]
    assert "nothing to delete" in cli("sessions", "cleanup", "--keep", "5", "--yes").stdout

    cli("push", "d", "--create", "--content", "one more")
    cleared = cli("sessions", "clear", "--all", "--yes")
    assert "deleted 2 sessions" in cleared.stdout
    assert cli.json("sessions", "list")["sessions"] == []
    assert cli.json("sessions", "clear", "--all", "--yes") == {"deleted": []}
