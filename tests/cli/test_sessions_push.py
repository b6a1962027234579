"""Autostart, sessions list/show/delete, and push from flags, stdin and JSON."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli


def test_autostart_then_list_show_delete(cli: Cli) -> None:
    assert not cli.socket.exists()
    empty = cli("sessions", "list")  # no daemon yet: this starts one
    assert empty.stdout.startswith("no sessions yet")  # said, not an empty output
    assert cli.socket.exists() and cli.daemon_pid() is not None
    assert cli.json("sessions", "list")["sessions"] == []

    cli("push", "alpha", "--create", "--model", "gpt-4o", "--content", "first session")
    cli("push", "beta", "--create", "--content", "second session")
    cli("push", "beta", "--content", "more", "--role", "assistant")

    listed = cli.json("sessions", "list")["sessions"]
    assert [s["sessionId"] for s in listed] == ["beta", "alpha"]  # most recent activity first
    table = cli("sessions", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "TITLE", "(MODEL)", "MSGS", "PROMPT", "/", "MAX", "WINDOW", "ACTIVE"]
    assert table[1].startswith("beta ") and table[2].startswith("alpha ")
    assert "gpt-4o" in table[2] and "just now" in table[2]
    assert "\x1b[" not in "".join(table)  # no colour codes when stdout is not a terminal
    assert len(cli.json("sessions", "list", "--limit", "1")["sessions"]) == 1

    shown = cli.json("sessions", "show", "beta")
    assert shown["sessionId"] == "beta" and shown["messageCount"] == 2
    text = cli("sessions", "show", "alpha").stdout
    assert "gpt-4o" in text and "history tokens" in text and "context" in text

    deleted = cli("sessions", "delete", "alpha", "--yes", "--json").json()
    assert deleted == {"sessionId": "alpha", "deletedMessages": 1}
    assert "deleted session beta (2 messages)" in cli("sessions", "delete", "beta", "--yes").stdout
    assert cli.json("sessions", "list")["sessions"] == []


def test_push_from_flags_stdin_and_json(cli: Cli) -> None:
    created = cli("push", "s", "--create", "--content", "hello")
    assert "created session s" in created.stdout and "seq 1" in created.stdout

    from_stdin = cli.json("push", "s", "--role", "assistant", input="hi there\n")
    assert [m["seq"] for m in from_stdin["messages"]] == [2]
    assert from_stdin["messageCount"] == 2 and from_stdin["budget"]["contextWindow"] > 0

    batch = [{"role": "user", "content": "run ls"},
             {"role": "assistant", "content": None,
              "toolCalls": [{"id": "c1", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
             {"role": "tool", "toolCallId": "c1", "content": "README.md"}]
    pushed = cli.json("push", "s", "--message-json", input=json.dumps(batch))
    assert [m["seq"] for m in pushed["messages"]] == [3, 4, 5]
    single = cli.json("push", "s", "--message-json", input=json.dumps({"role": "user", "content": "one"}))
    assert single["messages"][0]["seq"] == 6

    tool = cli.json("push", "s", "--role", "tool", "--tool-call-id", "c1", "--content", "again")
    assert tool["messages"][0]["seq"] == 7

    first = cli.json("push", "s", "--content", "retry me", "--idempotency-key", "k-1")
    again = cli("push", "s", "--content", "retry me", "--idempotency-key", "k-1")
    assert "duplicate" in again.stdout and f"seq {first['messages'][0]['seq']}" in again.stdout
    prompt = cli.json("prompt", "s", "--format", "openai")
    assert len(prompt["messages"]) == 8 and prompt["messages"][-1] == {"role": "user", "content": "retry me"}
    assert prompt["messages"][1]["content"] == "hi there"  # one trailing newline of stdin removed


def test_push_input_errors(cli: Cli) -> None:
    bad_json = cli("push", "s", "--message-json", input='{"role": ', expect=4)
    assert "not valid JSON" in bad_json.error_line()
    not_object = cli("push", "s", "--message-json", input="[1]", expect=4)
    assert "expected a message object" in not_object.error_line()
    mixed = cli("push", "s", "--message-json", "--role", "user", input="{}", expect=2)
    assert "--role" in mixed.stderr
    assert "--model" in cli("push", "s", "--model", "m", "--content", "x", expect=2).stderr
    empty = cli("push", "s", input="", expect=2)
    assert "no message text" in empty.error_line()
    assert not cli.socket.exists()  # nothing above needed the daemon

    missing = cli("push", "nope", "--content", "x", expect=1)
    assert missing.error_line() == "error: session 'nope' does not exist (-33001)"
    cli("push", "s", "--create", "--content", "x")
    invalid = cli("push", "s", "--message-json", input='{"role": "tool", "content": "x"}', expect=1)
    assert "toolCallId" in invalid.error_line() and "(-32602)" in invalid.error_line()
