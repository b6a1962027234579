"""Issue 12: ``ctxd-cli --socket OTHER`` on a data directory a daemon already uses started a
second daemon on the same SQLite file, and each daemon's memory went stale ("session twin2:
2 messages" after seq 3). The autostarted one now refuses, and ctxd-cli says why: the data
directory, the pid and the socket of the daemon using it, and how to reach that one."""

from __future__ import annotations

from tests.cli.conftest import Cli


def test_autostart_on_a_data_directory_in_use_is_refused(cli: Cli) -> None:
    first = cli("push", "twin2", "--create", "--content", "A")
    assert "session twin2: 1 message" in first.stdout
    pid = cli.daemon_pid()
    assert pid is not None

    other = cli.root / "other.sock"
    try:
        refused = cli("--socket", str(other), "push", "twin2", "--content", "B", expect=None)
    finally:  # (before the fix, a second daemon started there: never leave it behind)
        cli("--socket", str(other), "daemon", "stop", expect=None)
    assert refused.returncode == 3, refused
    line = refused.error_line()
    assert f"ctxd could not start on {other}" in line, line
    assert str(cli.data_dir) in line and f"pid {pid}" in line and str(cli.socket) in line, line
    assert f"ctxd-cli --socket {cli.socket}" in line, line
    assert not other.exists()

    third = cli("push", "twin2", "--content", "C")
    assert "seq 2" in third.stdout and "session twin2: 2 messages" in third.stdout, third.stdout
    history = cli("history", "twin2")
    assert "2 messages of 2" in history.stderr + history.stdout
    assert cli.daemon_pid() == pid
