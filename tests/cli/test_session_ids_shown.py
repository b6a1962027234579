"""How sessions are shown and named back: tables at 80 columns through a pipe never cut a
column that is not the title, the proxy's forks (``<id>~2``) are shortened like their
first session and found back by those short forms, and ``--json`` never carries a raw
character a terminal acts on (the C1 controls: U+009B is CSI, U+009D OSC)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

from tests.cli.conftest import Cli, Result

ROOT = "proxy-openai-0123456789abcdef"
OTHER = "proxy-openai-0123ffffffffffff"  # shares "proxy-openai-0123" with ROOT
FORK = ROOT + "~2"


def narrow(cli: Cli) -> Callable[..., Result]:
    """The same ctxd-cli, its output through a pipe 80 columns wide."""
    return functools.partial(cli, env={"COLUMNS": "80"})


def rows_by_id(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines()[1:] if line.strip()}


def test_forks_are_listed_short_and_found_back_by_those_names(cli: Cli) -> None:
    for sid in (ROOT, FORK, OTHER):
        cli("push", sid, "--create", "--content", f"first message of {sid}")
    listed = narrow(cli)("sessions", "list").stdout
    rows = rows_by_id(listed)
    # The family's first session and its fork share the short form; OTHER has its own.
    assert set(rows) == {"proxy-openai-012345", "proxy-openai-012345~2", "proxy-openai-0123ff"}, listed
    for line in listed.splitlines():
        assert len(line) <= 80, (len(line), listed)
        assert "8,192" in line or line.startswith("ID"), listed  # the window, never cut

    # Each short form names its session: the prefix its first session, prefix~2 the fork.
    assert cli.json("sessions", "show", "proxy-openai-012345")["sessionId"] == ROOT
    assert cli.json("sessions", "show", "proxy-openai-012345~2")["sessionId"] == FORK
    assert cli.json("history", "proxy-openai-0123f")["sessionId"] == OTHER
    # A prefix that two families start with is still ambiguous, and says so.
    refused = cli("history", "proxy-openai-0123", expect=2)
    assert "is the start of 3 session ids" in refused.error_line()
    # Whole ids work as they always did, and a fork that does not exist is not made up.
    assert cli.json("sessions", "show", FORK)["sessionId"] == FORK
    assert "does not exist" in cli("history", "proxy-openai-012345~3", expect=1).error_line()


def test_a_table_too_wide_for_80_columns_is_wider_rather_than_cut(cli: Cli) -> None:
    long_id = "a-session-id-a-client-chose-that-is-rather-long-indeed"
    cli("push", long_id, "--create", "--content", "hello", "--model", "gpt-4o")
    cli("push", "short", "--create", "--content", "hello")
    listed = narrow(cli)("sessions", "list").stdout
    rows = rows_by_id(listed)
    row = rows[long_id]
    # Every column but the title whole: the id, the counts, the window, the time.
    for cell in (long_id, "128,000", "just now"):
        assert cell in row, listed
    assert row.startswith(long_id + "  ") and row.endswith("  just now"), listed  # (only the title may be cut)
    assert "just now" in rows["short"] and "8,192" in rows["short"], listed


def test_json_output_never_carries_a_raw_c1_control(cli: Cli) -> None:
    hostile = "osc \u009d52;c;cm0gLXJmIH4K\u009c csi \u009b2J del \x7f end"
    cli("push", "c1", "--create", "--content", hostile)
    for args in (("--json", "history", "c1"), ("prompt", "c1"), ("--json", "search", "osc"),
                 ("--json", "sessions", "show", "c1")):
        out = cli(*args).stdout
        assert not any("\x7f" <= c <= "\x9f" for c in out), (args, out)
        assert "\\u009d52;c;cm0gLXJmIH4K\\u009c" in out or args[1] == "sessions", (args, out)
    # ... and still says exactly what is stored.
    history = cli.json("history", "c1")
    assert history["messages"][0]["message"]["content"] == hostile
    assert json.loads(cli("prompt", "c1").stdout)["messages"][0]["content"] == hostile
    # An error quoting a C1 control, as JSON, escapes it as well.
    refused = cli("--json", "history", "no\u009d0;title\u009c", expect=1)
    assert not any("\x7f" <= c <= "\x9f" for c in refused.stdout), refused.stdout
    assert json.loads(refused.stdout)["error"]["data"]["sessionId"] == "no\u009d0;title\u009c"


def test_each_run_takes_the_width_its_own_environment_says(cli: Cli) -> None:
    """``$COLUMNS`` is read by each ctxd-cli run (each is a process of its own for a user):
    a narrower run before does not make a later one narrow too."""
    cli("push", "wide", "--create", "--content", "a title long enough to be cut at sixty columns " * 3)
    narrow_out = cli("sessions", "list", env={"COLUMNS": "60"}).stdout
    wide_out = cli("sessions", "list", env={"COLUMNS": "160"}).stdout
    assert max(map(len, narrow_out.splitlines())) <= 60, narrow_out
    assert max(map(len, wide_out.splitlines())) > 80, wide_out
