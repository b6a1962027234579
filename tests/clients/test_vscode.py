"""The VS Code extension (clients/vscode): its node tests, run from here so README's test
command runs them.

`npm test` compiles the TypeScript and runs `node --test`: the protocol client, the
forwarder (`ctxd --remote auto` on a socket of the test's own) and the exports API
against real ctxd daemons each test starts (temporary data directories, never the
user's daemon), and the UI modules against a fake of the `vscode` module. The ctxd they
run is this venv's (CTXD_BIN), importing this checkout (PYTHONPATH).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import daemon_env

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "clients" / "vscode"
NODE = shutil.which("node")
NPM = shutil.which("npm")
CTXD_BIN = Path(sys.executable).with_name("ctxd")


def _skip_reason() -> str | None:
    if NODE is None or NPM is None:
        return "node/npm are not on PATH (Debian: apt-get install -y nodejs npm)"
    if not (EXTENSION / "node_modules").is_dir():
        return "clients/vscode/node_modules is missing: run `npm ci` in clients/vscode"
    if not CTXD_BIN.exists():
        return f"no ctxd beside {sys.executable} (pip install . into this venv)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def test_extension_node_tests() -> None:
    assert NPM is not None
    env = daemon_env(CTXD_BIN=str(CTXD_BIN))
    run = subprocess.run([NPM, "test"], cwd=EXTENSION, env=env, capture_output=True, text=True, timeout=900,
                         stdin=subprocess.DEVNULL)
    report = f"exit {run.returncode}\n--- stdout\n{run.stdout[-12000:]}\n--- stderr\n{run.stderr[-4000:]}"
    assert run.returncode == 0, report
    assert "\n# fail 0" in run.stdout, report
    # Every suite ran and passed (a renamed or unloaded file would drop out silently).
    for suite in ("CtxdClient against ctxd --stdio", "CtxdSupervisor", "through ctxd --remote auto", "locateCtxd",
                  "UI against ctxd", "activate", "status bar", "notifications as messages", "layering"):
        assert f" - {suite}\n" in run.stdout, f"suite {suite!r} missing\n{report}"
    assert "not ok" not in run.stdout, report
