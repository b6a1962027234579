"""The examples in clients/ run as documented against the real daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import daemon_env, storage_args

pytestmark = pytest.mark.usefixtures("storage_backend")

ROOT = Path(__file__).resolve().parents[2]


def test_agent_loop_example(tmp_path):
    storage = storage_args(tmp_path / "data")  # the ctxd it spawns inherits the environment
    env = daemon_env(CTXD_STORAGE_URL=storage[1].split("=", 1)[1]) if storage else daemon_env()
    result = subprocess.run(
        [sys.executable, str(ROOT / "clients" / "python" / "agent_loop.py"), "--ctxd", f"{sys.executable} -m ctxd",
         "--data-dir", str(tmp_path / "data"), "--turns", "30", "--window", "4096"],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    turns = re.findall(r"^turn +\d+: prompt +([\d,]+) / ([\d,]+) tokens", result.stdout, re.M)
    assert len(turns) == 30
    assert all(int(used.replace(",", "")) <= int(limit.replace(",", "")) for used, limit in turns)
    assert "compressed (" in result.stdout
    assert "done: 120 messages" in result.stdout
    assert (tmp_path / "data" / "ctxd.db").exists() == (not storage)
