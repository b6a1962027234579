"""What a new user found with ``ctxd-cli`` on real transcripts, each fixed: one token count
for a prompt; tool results are not the user's messages; a restore says when it changes the
goal and leaves no impossible figure behind; the reliability score says what it is made
of; ``ctxd --help`` names ``proxy`` and ``mcp``; an imported OpenAI chat is titled from its
first user message, not "document"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def test_prompt_summary_gives_one_count(cli: Cli) -> None:
    """The bundled example ends on a tool call without its result: the prompt carries a
    stand-in result for it, and every figure counts it (it printed "tokens 3,327" and
    "prompt 3,314 / 4,157" for one prompt)."""
    cli("replay", "--example")
    summary = cli("prompt", "last", "--summary").stdout
    fields = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in summary.splitlines() if line.strip()}
    tokens = fields["tokens"].split()[0]
    assert fields["prompt"].split(" / ")[0] == tokens, summary
    result = cli.json("prompt", "last")
    stats = cli.json("stats", "last")
    listed = cli.json("sessions", "list")["sessions"][0]
    assert result["tokens"] == result["budget"]["promptTokens"] == stats["budget"]["promptTokens"] \
        == listed["contextTokens"] == int(tokens.replace(",", ""))


def test_tool_results_are_not_counted_as_the_users_messages(cli: Cli) -> None:
    """A Claude Code session: 2 messages of the user's, 8 user-role messages that only carry
    tool results (Anthropic's shape). ``stats`` said "user 10", ``snapshot show`` listed the
    tool results as user messages."""
    cli("replay", str(FIXTURES / "claude_code_session.jsonl"))
    stats = cli.json("stats", "last")
    assert stats["byRole"]["user"]["messages"] == 2 and stats["byRole"]["tool"]["messages"] == 8
    snapshot = cli.json("snapshot", "create", "last")["snapshotId"]
    content = cli.json("snapshot", "show", "last", snapshot)
    assert [m["seq"] for m in content["userMessages"]] == [1, 11]
    assert content["info"]["userMessageCount"] == 2
    shown = cli("snapshot", "show", "last", snapshot).stdout
    assert "user messages   2 " in shown and "8 tool" in shown, shown
    table = cli("stats", "last").stdout
    assert any(line.split()[:2] == ["user", "2"] for line in table.splitlines()), table


def test_a_restore_that_changes_the_goal_says_so_and_the_figures_are_the_prompts(cli: Cli) -> None:
    """Restoring the snapshot taken before the example's compression: the goal set since is
    the snapshot's (none) again, and the context did not fit: it is compressed right away,
    so ``sessions list`` shows the prompt to be sent, not "17,274 / 4,157 (416%)"."""
    cli("replay", "--example")
    cli("goal", "set", "last", "fix the username validator")
    (auto,) = [s for s in cli.json("snapshot", "list", "last")["snapshots"] if s["trigger"] == "auto"]
    restored = cli.json("snapshot", "restore", "last", auto["snapshotId"], "--yes")
    assert restored["goalChanged"] and restored["previousGoal"]["description"] == "fix the username validator"
    assert "goal" not in restored and restored["compressed"]
    listed = cli.json("sessions", "list")["sessions"][0]
    stats = cli.json("stats", "last")
    assert listed["contextTokens"] == stats["budget"]["promptTokens"] <= stats["budget"]["maxPromptTokens"]
    assert cli.json("prompt", "last")["tokens"] == listed["contextTokens"]
    # In words, on a terminal's output: the goal line.
    cli("goal", "set", "last", "again")
    (manual,) = [cli.json("snapshot", "create", "last")]
    cli("goal", "set", "last", "changed after the snapshot")
    text = cli("snapshot", "restore", "last", manual["snapshotId"], "--yes").stdout
    assert "goal         changed: changed after the snapshot -> again" in text, text


def test_reliability_says_what_it_is_made_of(cli: Cli) -> None:
    cli("replay", "--example")
    stats = cli("stats", "last").stdout
    lines = [line.strip() for line in stats.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("reliability"))
    assert lines[at].split() == ["reliability", "low", "(score", "0.59)"], lines[at]
    assert lines[at + 1:at + 4] == ["= model 0.70 (size unknown: counted as 13B)", "x compressions 0.85 (1 pass)",
                                    "x context 1.00"], stats
    assert lines[at + 4].startswith("advice")
    assert "= model 0.70" in cli("sessions", "show", "last").stdout
    help_text = " ".join(cli("stats", "--help").stdout.split())
    assert "score = model x compressions x context" in help_text and "Levels: high from 0.85" in help_text


def test_ctxd_help_names_proxy_and_mcp() -> None:
    from ctxd.__main__ import build_parser

    text = build_parser().format_help()
    commands = text.split("commands:", 1)[1]
    assert "proxy" in commands and "mcp" in commands and "ctxd proxy --help" in commands, text
    assert "ctxd proxy" in text.split("\n\n", 1)[0]  # in the usage lines too


def test_an_imported_openai_chat_is_titled_from_its_first_user_message(cli: Cli, tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Why is the build red?\nIt passed yesterday."},
            {"role": "assistant", "content": "A flaky test."}]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat))
    (sid,) = cli.json("import", str(path))["sessionIds"]
    info = cli.json("sessions", "show", sid)
    assert info["title"] == "Why is the build red?", info["title"]
    assert "sourceFile" not in (info.get("metadata") or {})
