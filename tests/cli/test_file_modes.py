"""Files ``ctxd-cli`` creates are private whatever umask it is started with: a new
export, and the log of a daemon it starts on demand (and the database that daemon
creates, -wal and -shm included)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from tests.cli.conftest import CLI, Cli


def run_with_umask(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=cli.env, timeout=60,
                            stdin=subprocess.DEVNULL, umask=0o022)
    assert result.returncode == 0, result
    return result


@pytest.mark.process("the umask ctxd-cli and its daemon start with")
def test_new_files_are_private_under_a_permissive_umask(cli: Cli) -> None:
    export = cli.root / "exports"
    export.mkdir(mode=0o755)
    run_with_umask(cli, "push", "s", "--create", "--content", "sk-secret-in-a-message")  # autostarts the daemon
    run_with_umask(cli, "export", "s", "-o", str(export / "s.json"))
    files = [export / "s.json", cli.log, cli.data_dir / "ctxd.db", cli.data_dir / "ctxd.db-wal",
             cli.data_dir / "ctxd.db-shm"]
    modes = {str(path): oct(stat.S_IMODE(os.stat(path).st_mode)) for path in files}
    assert set(modes.values()) == {"0o600"}, modes
