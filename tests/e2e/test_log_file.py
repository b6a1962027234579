"""The daemon's log file (``--log-file``, ``daemon.log_file``): created 0600, never opened
through a symbolic link, only a regular file of this user's. Its lines quote what clients
sent, so a link planted where a shared log path points must not make the daemon append
to another of the user's files (a shell's startup file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.e2e.helpers import run_ctxd


def _refused(result: object, *words: str) -> str:
    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    lines = result.stderr.decode().strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text("export PATH\n")
    link = tmp_path / "ctxd.log"
    link.symlink_to(bashrc)
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), "--log-file", str(link), "-v"])
    _refused(result, str(link), "symbolic link")
    assert bashrc.read_text() == "export PATH\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the log file to another user (needs root)")
def test_another_users_file_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "ctxd.log"
    log.write_text("")
    os.chown(log, 65534, 65534)
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), "--log-file", str(log), "-v"])
    _refused(result, str(log), "uid 65534")
    assert log.read_text() == ""


def test_a_new_log_is_private_and_written(tmp_path: Path) -> None:
    log = tmp_path / "ctxd.log"
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), "--log-file", str(log), "-v"],
                      stdin=b"")  # stdio at its end at once: the daemon starts and stops
    assert result.returncode in (0, 1), result.stderr
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert log.read_text().strip(), "nothing was logged"
