"""daemon start/status/stop, exit codes, --json everywhere, completion, and the autostart race."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import CLI, Cli


def test_daemon_start_status_stop(cli: Cli) -> None:
    assert "no ctxd daemon is running" in cli("daemon", "status", expect=3).error_line()
    not_running = cli.json("daemon", "stop")
    assert not_running == {"socket": str(cli.socket), "wasRunning": False, "pid": None}
    assert not cli.socket.exists()  # status and stop never start a daemon

    started = cli.json("daemon", "start")
    assert started["started"] and started["socket"] == str(cli.socket)
    assert started["dataDir"] == str(cli.data_dir)
    pid = started["pid"]
    assert cli.daemon_pid() == pid
    assert f"already running: ctxd (pid {pid})" in cli("daemon", "start").stdout

    status = cli.json("daemon", "status")
    assert status["pid"] == pid and status["transports"] == [f"unix:{cli.socket}"]
    assert f"unix:{cli.socket}" in cli("daemon", "status").stdout

    other = cli.root / "other-data"  # a data dir the running daemon does not serve
    line = cli("--data-dir", str(other), "sessions", "list", expect=3).error_line()
    assert str(cli.data_dir) in line and str(other) in line

    assert cli("daemon", "stop").stdout.strip() == f"stopped ctxd (pid {pid}) on {cli.socket}"
    assert cli.daemon_pid() is None and not cli.socket.exists()
    assert "no ctxd daemon was running" in cli("daemon", "stop").stdout


def test_unreachable_and_refused(cli: Cli) -> None:
    line = cli("--no-autostart", "sessions", "list", expect=3).error_line()
    assert str(cli.socket) in line
    assert not cli.socket.exists()

    unknown = cli("sessions", "show", "no-such-session", expect=1)
    assert unknown.error_line() == "error: session 'no-such-session' does not exist (-33001)"
    assert unknown.stdout == ""
    cli("sessions", "delete", "no-such-session", "--yes", expect=1).error_line()
    cli("watch", "no-such-session", expect=1).error_line()

    cli("daemon", "stop")
    (cli.root / "file").write_text("")
    cannot = cli("--data-dir", str(cli.root / "file"), "sessions", "list", expect=3).error_line()
    assert "could not start" in cannot and str(cli.log) in cannot

    bad_config = cli.root / "bad.toml"
    bad_config.write_text("daemon = [\n")
    assert "configuration" in cli("--config", str(bad_config), "sessions", "list", expect=2).error_line()


def test_json_flag_everywhere(cli: Cli) -> None:
    cli("push", "j", "--create", "--content", "hello")
    commands = [
        ["sessions", "list"], ["sessions", "show", "j"], ["push", "j", "--content", "x"],
        ["prompt", "j"], ["prompt", "j", "--summary"], ["stats", "j"], ["daemon", "status"],
    ]
    for i, args in enumerate(commands):  # global and per-command --json, alternately
        argv = ["--json", *args] if i % 2 else [*args, "--json"]
        assert isinstance(json.loads(cli(*argv).stdout), dict), argv


def test_help_and_completion(cli: Cli) -> None:
    help_text = cli("--help").stdout
    assert "Exit codes" in help_text and "bad input file" in help_text
    for shell in ("bash", "zsh", "fish"):
        script = cli("completion", shell).stdout
        assert "_CTXD_CLI_COMPLETE" in script, shell
    cli("completion", "tcsh", expect=2)
    cli("push", "completion-me", "--create", "--content", "x")
    env = {"COMP_WORDS": "ctxd-cli sessions show compl", "COMP_CWORD": "3", "_CTXD_CLI_COMPLETE": "bash_complete"}
    assert "completion-me" in cli(env=env, expect=None).stdout


@pytest.mark.process("ctxd-cli watch read while it runs, then Ctrl-C")
def test_watch_prints_notifications(cli: Cli) -> None:
    cli("push", "w", "--create", "--content", "before")
    watcher = cli.popen("watch", "w", "--json")
    assert watcher.stderr is not None and watcher.stdout is not None
    assert "watching session w" in watcher.stderr.readline()  # subscribed: safe to push now
    cli("push", "w", "--content", "after")
    event = json.loads(watcher.stdout.readline())
    assert event["method"] == "session/updated"
    assert event["params"]["sessionId"] == "w" and event["params"]["reason"] == "push"
    assert event["params"]["pushed"] == 1 and event["params"]["messageCount"] == 2

    cli("sessions", "delete", "w", "--yes")
    assert json.loads(watcher.stdout.readline())["method"] == "session/deleted"
    assert watcher.wait(timeout=10) == 0  # the watched session is gone: watch ends by itself

    everything = cli.popen("watch", "--all")
    assert everything.stderr is not None and everything.stdout is not None
    assert "watching all sessions" in everything.stderr.readline()
    cli("push", "w2", "--create", "--content", "x")
    line = everything.stdout.readline()
    assert "session/updated" in line and "w2" in line and "push +1" in line
    everything.send_signal(2)  # Ctrl-C
    assert everything.wait(timeout=10) == 0
    assert "Traceback" not in everything.stderr.read()


@pytest.mark.process("several ctxd-cli processes autostarting at once")
def test_concurrent_autostarts_share_one_daemon(cli: Cli) -> None:
    procs = [subprocess.Popen([*CLI, "sessions", "list", "--json"], env=cli.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) for _ in range(4)]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
    assert all(code == 0 and json.loads(out)["sessions"] == [] for out, _, code in results), results
    assert cli.log.read_text().count("listening on unix") == 1  # exactly one daemon served them all


# A process that holds the socket lock the way a slowly starting daemon does, until the
# daemon ctxd-cli spawned has given up ("already serving"); then it becomes the daemon.
SLOW_WINNER = r"""
import fcntl, os, sys, time
sock, log = sys.argv[1], sys.argv[2]
fd = os.open(sock + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    if os.path.exists(log) and "already serving" in open(log).read():
        break
    time.sleep(0.05)
os.close(fd)
os.execv(sys.executable, [sys.executable, "-m", "ctxd", "--socket", sock])
"""


@pytest.mark.process("several ctxd-cli processes autostarting at once")
def test_autostart_waits_for_the_daemon_that_won_the_race(cli: Cli) -> None:
    winner = subprocess.Popen([sys.executable, "-c", SLOW_WINNER, str(cli.socket), str(cli.log)], env=cli.env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    cli.processes.append(winner)
    assert winner.stdout is not None and winner.stdout.readline().strip() == "locked"
    started = time.monotonic()
    status = cli.json("sessions", "list")
    assert status["sessions"] == []
    assert "already serving" in cli.log.read_text()  # ctxd-cli's own daemon lost the race...
    assert cli.daemon_pid() == winner.pid  # ...and it connected to the winner instead of failing
    assert time.monotonic() - started < 30
