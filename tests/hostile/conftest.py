"""The hostile-user suite (issue 23): the owner runs ctxd as the tests' user (root here);
another local user, ``nobody`` (uid 65534), attacks it through what every local user has:
the loopback interface and directories others can write to.

The other user is a real process of uid 65534 (``tests/hostile/attacker.py``: it starts
as root, imports the standard library, drops to nobody before it makes a socket). Files
the other user plants are made by the test and given to uid 65534 (``plant``), so nothing
needs nobody to reach this checkout. Without root (or off Linux) the suite is skipped,
saying why.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.shared_fixtures import short_dir_fixture
from tests.shared_fixtures import upstream as upstream  # (a fixture: found where it is imported)

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]

SKIP = None if os.geteuid() == 0 and sys.platform.startswith("linux") else (
    "the hostile-user suite runs another user's process (uid 65534), which needs root on Linux; run it as "
    "root (e.g. in a container)")


base = short_dir_fixture("base", "ctxd-hostile-")


@pytest.fixture(autouse=True)
def _another_user_exists() -> None:
    if SKIP:
        pytest.skip(SKIP)


class Attacker:
    """One run of ``tests/hostile/attacker.py`` as nobody."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.hostile.attacker", *args], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def line(self, timeout: float = 30) -> str:
        """The next line it prints (``listen``'s port)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the attacker printed nothing"
        return self.proc.stdout.readline().strip()

    def result(self, timeout: float = 120) -> dict[str, Any]:
        """What it printed at the end (closing its stdin tells ``listen`` and ``hold`` to stop)."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def plant(path: Path, *, symlink_to: Path | None = None, mode: int | None = None) -> Path:
    """Make ``path`` as the other user would have: a symbolic link (``symlink_to``), or a
    directory; owned by uid 65534."""
    if symlink_to is not None:
        os.symlink(symlink_to, path)
        os.lchown(path, NOBODY, NOBODY)
    else:
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        if mode is not None:
            os.chmod(path, mode)
    return path


