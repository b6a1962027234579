"""ctxd-cli as people use it: empty lists said, tables within 80 columns, session ids by
prefix or ``last``, one denominator (the prompt against the largest prompt), -v and
--debug, ``config`` and ``paths``, errors as JSON, the autostart said, ``watch`` across
a daemon restart, ``--tcp``, and one autostart shared with the Python client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import Cli
from tests.cli.test_watch_live import Lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_an_empty_list_says_so(cli: Cli) -> None:
    empty = cli("sessions", "list")
    assert empty.stdout.startswith("no sessions yet") and "--create" in empty.stdout
    cli("push", "s", "--create", "--content", "hi")
    assert cli("sessions", "list", "--tag", "nothing-has-it").stdout.strip() == "no sessions tagged 'nothing-has-it'"


def test_tables_fit_80_columns(cli: Cli) -> None:
    long_one = cli.json("import", str(FIXTURES / "claude_code_session.jsonl"))["sessionIds"][0]
    cli("push", "short", "--create", "--content", "hi")
    listing = cli("sessions", "list").stdout
    lines = listing.splitlines()
    assert max(map(len, lines)) <= 80 and all(line == line.rstrip() for line in lines), listing
    row = next(line for line in lines if line.startswith(long_one[:8]))
    assert "Add a function called" in row and row.rstrip().endswith("just now")
    assert "…" in row  # the title gave way, nothing else did
    assert long_one not in listing  # ctxd's own ids: the unique prefix
    assert next(line for line in lines if line.startswith("short ")).split()[:2] == ["short", "hi"]

    wide = cli("sessions", "list", env={"COLUMNS": "120"}).stdout
    assert 80 < max(map(len, wide.splitlines())) <= 120 and "multiply_numbers" in wide

    for args in (("history", long_one), ("checkpoints", long_one), ("stats", long_one), ("snapshot", "list", "short"),
                 ("config",)):
        out = cli(*args).stdout
        table = out[out.index("KEY"):] if args == ("config",) else out  # (the file's path above it may be long)
        assert max(map(len, table.splitlines()), default=0) <= 80, (args, out)


def test_ids_ctxd_proxy_makes_up_are_shortened_too(cli: Cli) -> None:
    """The proxy's ``proxy-openai-<16 hex>`` ids whole took 29 columns: the prompt column
    was cut ("7 / 111,616 (0…"). They are shown as their name and a unique part of the
    hash, which ctxd-cli takes back as a prefix."""
    ids = ["proxy-openai-b72a1c4831a4fda8", "proxy-openai-b72a1d0000000000"]
    for sid in ids:
        cli("push", sid, "--create", "--content", "hi there, a title long enough to give way in the table")
    lines = cli("sessions", "list").stdout.splitlines()
    assert max(map(len, lines)) <= 80
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"proxy-openai-b72a1c", "proxy-openai-b72a1d"}
    assert all(row.rstrip().endswith("just now") and "/ " in row and ")" in row for row in rows.values())
    assert cli.json("sessions", "show", "proxy-openai-b72a1c")["sessionId"] == ids[0]


def test_session_ids_take_prefixes_and_last(cli: Cli) -> None:
    imported = cli.json("import", str(FIXTURES / "mini_swe_agent.traj.json"))["sessionIds"][0]
    shown = next(line.split()[0] for line in cli("sessions", "list").stdout.splitlines()[1:])
    assert len(shown) >= 8 and imported.startswith(shown) and shown != imported
    assert cli.json("sessions", "show", shown)["sessionId"] == imported
    assert cli.json("stats", imported[:11])["sessionId"] == imported
    assert cli.json("sessions", "show", "last")["sessionId"] == imported

    cli("push", "proj-1", "--create", "--content", "one")
    cli("push", "proj-2", "--create", "--content", "two")
    ambiguous = cli("sessions", "show", "proj", expect=2).error_line()
    assert "proj-1" in ambiguous and "proj-2" in ambiguous and "give more of it" in ambiguous
    assert cli.json("prompt", "last")["sessionId"] == "proj-2"  # the most recently active
    pushed = cli.json("push", "last", "--content", "three")
    assert pushed["sessionId"] == "proj-2" and pushed["messageCount"] == 2
    created = cli.json("push", "proj", "--create", "--content", "a session of its own")  # --create: exact
    assert created["sessionId"] == "proj" and created["messageCount"] == 1
    assert cli.json("search", "three", "--session", "proj-2")["hits"][0]["sessionId"] == "proj-2"
    missing = cli("sessions", "show", "zzz", expect=1).error_line()
    assert missing == "error: session 'zzz' does not exist (-33001)"  # nothing starts so: the daemon's answer


def test_search_shows_ids_in_full(cli: Cli) -> None:
    sid = cli.json("import", str(FIXTURES / "claude_code_session.jsonl"))["sessionIds"][0]
    found = cli("search", "multiply_numbers")
    assert sid in found.stdout and "[multiply_numbers]" in found.stdout
    assert max(map(len, found.stdout.splitlines())) <= 80


def test_every_view_shows_the_prompt_against_the_max_prompt(cli: Cli) -> None:
    cli("replay", str(FIXTURES / "mini_swe_agent.traj.json"), "--session", "d", "--context-window", "4096")
    budget = cli.json("stats", "d")["budget"]
    figure = f"{budget['promptTokens']:,} / {budget['maxPromptTokens']:,} ("
    window = f"window {budget['contextWindow']:,}"
    for args in (("sessions", "list"), ("sessions", "show", "d"), ("stats", "d"), ("prompt", "d", "--summary")):
        out = cli(*args).stdout
        assert figure in out, (args, out)
        assert window in out or f"{budget['contextWindow']:,}" in out, (args, out)
    assert figure in cli("sessions", "show", "d").stdout.split("prompt / max", 1)[1].splitlines()[0]
    pushed = cli("push", "d", "--content", "one more").stdout
    after = cli.json("stats", "d")["budget"]
    assert f"prompt {after['promptTokens']:,} / {after['maxPromptTokens']:,} (" in pushed and window in pushed
    # "used" and "prompt" are told apart once, in the help.
    help_text = " ".join(cli("stats", "--help").stdout.split())
    assert "prompt everything sent next" in help_text and "used the conversation alone" in help_text


def test_verbose_and_debug(cli: Cli) -> None:
    cli("push", "v", "--create", "--content", "hello")
    verbose = cli("-v", "sessions", "show", "last")
    assert str(cli.socket) in verbose.stderr and "configuration:" in verbose.stderr
    assert re.search(r"session/get #\d+ answered in [\d.]+ ms", verbose.stderr)
    assert "'last' is v (the most recently active)" in verbose.stderr
    assert '"sessionId"' not in verbose.stderr  # -v: what happens, not the bodies
    debug = cli("--debug", "stats", "v")
    assert '-> context/stats #' in debug.stderr and '{"sessionId":"v"}' in debug.stderr
    assert '"budget"' in debug.stderr  # the answer too
    assert cli("-vv", "stats", "v").stderr.count("-> ") >= 2
    assert verbose.stdout == cli("sessions", "show", "v").stdout  # stdout is the same


def test_config_and_paths(cli: Cli) -> None:
    config_dir = cli.root / "config" / "ctxd"
    config_dir.mkdir(parents=True)
    (config_dir / "config.toml").write_text("[compression]\nkeep_recent = 7\n\n[storage]\ndurability = \"normal\"\n")
    cli.env["CTXD_STORAGE_DURABILITY"] = "full"
    other = cli.root / "other.sock"
    result = cli.json("--socket", str(other), "config")
    assert result["file"] == str(config_dir / "config.toml") and result["fileExists"]
    by_key = {entry["key"]: entry for entry in result["settings"]}
    assert by_key["compression.keep_recent"] == {"key": "compression.keep_recent", "value": 7, "source": "file",
                                                 "file": str(config_dir / "config.toml")}
    assert by_key["storage.durability"] == {"key": "storage.durability", "value": "full", "source": "env",
                                            "variable": "CTXD_STORAGE_DURABILITY"}  # env over the file
    assert by_key["daemon.socket"]["source"] == "flag" and by_key["daemon.socket"]["value"] == str(other)
    assert by_key["budget.trigger_fraction"] == {"key": "budget.trigger_fraction", "value": 1.0,
                                                 "source": "default"}
    changed = cli("config", "--changed").stdout
    assert re.search(r"compression\.keep_recent +7 +file", changed)
    assert re.search(r'storage\.durability +"full" +env', changed) and "budget." not in changed

    paths = cli.json("paths")
    assert paths["socket"] == {"path": str(cli.socket), "exists": False}
    assert paths["data"]["path"] == str(cli.data_dir) and paths["log"]["path"] == str(cli.log)
    assert paths["config"] == {"path": str(config_dir / "config.toml"), "exists": True}
    assert paths["token"]["path"].endswith("tcp-token") and paths["database"]["path"].endswith("ctxd.db")
    text = cli("paths").stdout
    assert str(cli.socket) in text and str(cli.log) in text and "token" in text
    assert not cli.socket.exists()  # neither needs (or starts) a daemon

    cli.env["CTXD_DAEMON_LOG_FILE"] = str(cli.root / "elsewhere.log")
    assert cli.json("paths")["log"]["path"] == str(cli.root / "elsewhere.log")  # where the daemon logs then


def test_errors_as_json(cli: Cli) -> None:
    unreachable = cli("--json", "--no-autostart", "sessions", "list", expect=3)
    error = json.loads(unreachable.stdout)["error"]
    assert error["exitCode"] == 3 and str(cli.socket) in error["message"]
    assert unreachable.error_line().startswith("error: no ctxd daemon")  # stderr says it as before

    refused = cli("sessions", "show", "nope", "--json", expect=1)
    assert json.loads(refused.stdout) == {"error": {
        "message": "session 'nope' does not exist (-33001)", "exitCode": 1, "code": -33001,
        "data": {"field": "sessionId", "sessionId": "nope"}}}
    usage = json.loads(cli("--json", "push", "s", "--model", "m", "--content", "x", expect=2).stdout)
    assert usage["error"]["exitCode"] == 2 and "--model" in usage["error"]["message"]
    (cli.root / "notes.txt").write_text("not a transcript\n")
    bad = json.loads(cli("--json", "replay", str(cli.root / "notes.txt"), expect=4).stdout)
    assert bad["error"]["exitCode"] == 4 and "notes.txt" in bad["error"]["message"]
    assert cli("sessions", "show", "nope", expect=1).stdout == ""  # without --json: stderr only


def test_autostart_is_said(cli: Cli) -> None:
    first = cli("sessions", "list")  # stderr is a pipe here: said all the same
    pid = cli.daemon_pid()
    assert f"started ctxd in the background (pid {pid}) on {cli.socket}" in first.stderr
    assert f"it logs to {cli.log}" in first.stderr and "15 min" in first.stderr
    assert "started" not in cli("sessions", "list").stderr  # one was running: nothing to say


@pytest.mark.process("Ctrl-C to a watching ctxd-cli; the daemon restarted under it")
def test_watch_carries_on_after_a_daemon_restart(cli: Cli) -> None:
    cli("push", "w", "--create", "--content", "before")
    watcher = cli.popen("watch", "w", "--json")
    assert watcher.stdout is not None and watcher.stderr is not None
    out, err = Lines(watcher.stdout), Lines(watcher.stderr)
    err.until("watching session w")
    cli("daemon", "stop")
    err.until("waiting for it to come back")
    assert watcher.poll() is None
    cli("daemon", "start")
    err.until("reconnected")  # subscribed again
    cli("push", "w", "--content", "after the restart")
    event = json.loads(out.until('"session/updated"')[-1])
    assert event["params"]["sessionId"] == "w" and event["params"]["messageCount"] == 2
    watcher.send_signal(2)  # Ctrl-C
    assert watcher.wait(timeout=10) == 0


@pytest.mark.process("ctxd-cli watch read while it runs, then Ctrl-C")
def test_watch_plain_lines_show_the_prompt_against_the_max(cli: Cli) -> None:
    cli("push", "p", "--create", "--content", "before")
    watcher = cli.popen("watch", "p")
    assert watcher.stdout is not None and watcher.stderr is not None
    Lines(watcher.stderr).until("watching session p")
    cli("push", "p", "--content", "after")
    budget = cli.json("stats", "p")["budget"]
    line = Lines(watcher.stdout).until("session/updated")[-1]
    assert f"prompt {budget['promptTokens']:,} / {budget['maxPromptTokens']:,}" in line
    assert f"window {budget['contextWindow']:,}" in line
    watcher.send_signal(2)
    assert watcher.wait(timeout=10) == 0


def start_tcp_daemon(cli: Cli) -> tuple[subprocess.Popen[bytes], int]:
    log = cli.root / "tcp.log"
    proc = subprocess.Popen([sys.executable, "-m", "ctxd", "--tcp", "0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=cli.env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = re.search(r"listening on tcp 127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return proc, int(found.group(1))
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(log.read_text())


@pytest.mark.process("a TCP daemon process")
def test_tcp(cli: Cli) -> None:
    token = cli.root / "state" / "tcp-token"
    cli.env["CTXD_DAEMON_TOKEN_FILE"] = str(token)
    daemon, port = start_tcp_daemon(cli)
    try:
        pushed = cli.json("--tcp", str(port), "push", "t", "--create", "--content", "over tcp")
        assert pushed["sessionId"] == "t"
        assert "over tcp" in cli("--tcp", str(port), "sessions", "list").stdout
        assert cli.json("--tcp", str(port), "daemon", "status")["transports"] == [f"tcp:127.0.0.1:{port}"]
        assert not cli.socket.exists()  # the socket was never involved, nor autostart

        wrong = cli.root / "wrong-token"
        wrong.write_text("0" * 64)
        wrong.chmod(0o600)
        refused = cli("--tcp", str(port), "--token-file", str(wrong), "sessions", "list", expect=1).error_line()
        assert "(-33006)" in refused and str(wrong) in refused  # the token file it sent
        missing = cli("--tcp", str(port), "--token-file", str(cli.root / "none"), "sessions", "list", expect=3)
        assert str(cli.root / "none") in missing.error_line()
        assert cli("--tcp", "1", "sessions", "list", expect=3).error_line().endswith("ctxd --tcp 1)")
        assert "stopped ctxd" in cli("--tcp", str(port), "daemon", "stop").stdout
        assert daemon.wait(timeout=20) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.mark.process("the pid of the daemon ctxd-cli autostarts")
def test_one_autostart_for_ctxd_cli_and_the_python_client(tmp_path: Path) -> None:
    from ctxd import client
    from ctxd.cli import main

    assert main.start_daemon is client.start_daemon and not hasattr(main, "wait_for_daemon")
    # The Python client's autostart fails as ctxd-cli's does: naming the socket, the reason, the log.
    (tmp_path / "a-file").write_text("")
    socket = tmp_path / "s.sock"
    with pytest.raises(client.DaemonUnavailable) as failed:
        asyncio.run(client.connect_or_start(socket, data_dir=str(tmp_path / "a-file")))
    message = str(failed.value)
    assert f"could not start on {socket}" in message and str(tmp_path / "daemon.log") in message
    assert os.path.exists(tmp_path / "daemon.log")
