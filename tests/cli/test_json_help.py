"""``--json``'s help says what it does on every command, including those that never ask
the daemon anything (config, paths, doctor)."""

from __future__ import annotations

from tests.cli.conftest import Cli


def test_json_help_does_not_speak_of_a_daemon_result(cli: Cli) -> None:
    for command in (("config",), ("paths",), ("history",), ("sessions", "list")):
        text = " ".join(cli(*command, "--help").stdout.split())
        assert "--json Print the result as JSON (and nothing else) on stdout; errors too" in text, (command, text)
        assert "daemon's result" not in text, (command, text)
