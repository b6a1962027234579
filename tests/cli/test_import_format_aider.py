"""``ctxd-cli import --format aider``: the format its help names (aider's
``.aider.chat.history.md``) can be asked for by name, as ``replay --format aider`` can;
a file that is not aider's history is refused as bad input (exit 4), storing nothing."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def test_import_format_aider(cli: Cli, tmp_path: Path) -> None:
    # Named like aider names it, and under a name that says nothing (stdin).
    history = tmp_path / ".aider.chat.history.md"
    history.write_text((FIXTURES / "aider.chat.history.md").read_text())
    by_file = cli.json("import", "--format", "aider", str(history))
    assert by_file["format"] == "aider" and by_file["messageCount"] > 0
    by_stdin = cli.json("import", "--format", "aider", "-", input=history.read_text())
    assert by_stdin["format"] == "aider" and by_stdin["messageCount"] == by_file["messageCount"]
    assert "aider" in cli("import", "--help").stdout.split("--format [", 1)[1].split("]", 1)[0]

    before = len(cli.json("sessions", "list")["sessions"])
    refused = cli("import", "--format", "aider", str(FIXTURES / "claude_code_session.jsonl"), expect=4)
    assert "does not look like aider's chat history" in refused.error_line()
    assert len(cli.json("sessions", "list")["sessions"]) == before
