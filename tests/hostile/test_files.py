"""Files another user plants where ctxd-cli would start a daemon (issue 23, 7): the
daemon's log beside the socket is opened only in a directory that is safe to share, never
through a link and never when it is another user's, so nothing of the owner's is written
through it and nothing the daemon logs goes to the other user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import daemon_env
from tests.hostile.conftest import NOBODY, plant
from tests.shared_fixtures import short_dir_fixture

CLI = [sys.executable, "-m", "ctxd.cli.main"]


base = short_dir_fixture("base", "ctxd-hostile-", mode=0o755)
"""(The conftest's, readable by the other user: its files are planted inside.)"""


def _cli(socket: Path, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--socket", str(socket), "--data-dir", str(data), "sessions", "list"],
                          capture_output=True, text=True, timeout=60, env=daemon_env())


def _victim(base: Path) -> Path:
    victim = base / "precious.txt"
    victim.write_text("the owner's file\n")
    return victim


def test_a_log_planted_in_another_users_directory_is_never_written(base: Path) -> None:
    victim = _victim(base)
    theirs = plant(base / "theirs", mode=0o755)
    plant(theirs / "daemon.log", symlink_to=victim)
    done = _cli(theirs / "ctxd.sock", base / "data")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"the socket directory {theirs} belongs to uid {NOBODY}" in done.stderr, done.stderr
    assert victim.read_text() == "the owner's file\n"
    assert not (theirs / "ctxd.sock").exists() and not (base / "data").exists()  # no daemon was started


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_log_planted_in_a_shared_sticky_directory_is_refused(base: Path, kind: str) -> None:
    victim = _victim(base)
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    log = shared / "daemon.log"
    if kind == "link":
        plant(log, symlink_to=victim)
    else:
        log.write_text("nobody's file\n")
        os.chown(log, NOBODY, NOBODY)
        log.chmod(0o666)
    done = _cli(shared / "ctxd.sock", base / "data")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    said = "is a symbolic link" if kind == "link" else f"belongs to uid {NOBODY}"
    assert f"the log file {log} {said}" in done.stderr, done.stderr
    assert victim.read_text() == "the owner's file\n"
    if kind == "file":
        assert log.read_text() == "nobody's file\n"  # nothing of the owner's daemon went to it


def test_a_private_socket_directory_still_autostarts(base: Path) -> None:
    mine = base / "mine"
    done = _cli(mine / "ctxd.sock", base / "data")
    try:
        assert done.returncode == 0, done.stderr
        assert oct((mine / "daemon.log").stat().st_mode & 0o777) == "0o600"
    finally:
        subprocess.run([*CLI, "--socket", str(mine / "ctxd.sock"), "daemon", "stop"], capture_output=True,
                       timeout=60, env=daemon_env())
