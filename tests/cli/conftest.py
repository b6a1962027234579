"""Fixtures for the ctxd-cli tests: every test gets its own socket and data directory,
runs ``ctxd-cli`` as a subprocess (so autostart spawns a real daemon), and stops every
daemon it started, by ``daemon stop`` and then by pid as a fallback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

import ctxd

CLI = [sys.executable, "-m", "ctxd.cli.main"]


def _interruptible() -> None:
    """In the child: Ctrl-C (SIGINT) does what it does at a terminal, even when pytest itself
    runs with SIGINT ignored (started in the background by a non-interactive shell, as a CI
    script may be), which a child would otherwise inherit and never see the tests' Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def error_line(self) -> str:
        """The single ``error: ...`` line an exit code 1/3/4 must come with (besides the
        note that a daemon was started in the background, when the command started one)."""
        assert "Traceback" not in self.stderr, self.stderr
        lines = [line for line in self.stderr.strip().splitlines()
                 if not line.startswith("started ctxd in the background")]
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith("error: "), self.stderr
        return lines[0]


@dataclass
class Cli:
    """``ctxd-cli`` bound to one temporary socket and data directory."""

    root: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.root / "s.sock"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60, expect: int | None = 0) -> Result:
        proc = subprocess.run([*CLI, *args], check=False, input=input, capture_output=True, text=True, env=self.env,
                              timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)
        result = Result(proc.returncode, proc.stdout, proc.stderr)
        if expect is not None:
            assert result.returncode == expect, (args, result)
        return result

    def json(self, *args: str, input: str | None = None) -> Any:
        return self("--json", *args, input=input).json()

    def popen(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, preexec_fn=_interruptible)
        self.processes.append(proc)
        return proc

    def daemon_pid(self) -> int | None:
        """The pid in the socket's lock file, if that process is a ctxd serving this socket."""
        try:
            pid = int((self.root / "s.sock.lock").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self.socket).encode() in cmdline else None


def _cli_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env.update({
        "CTXD_DAEMON_SOCKET": str(root / "s.sock"),
        "CTXD_DAEMON_DATA_DIR": str(root / "data"),
        "XDG_CONFIG_HOME": str(root / "config"),  # never read the developer's config.toml
        "PYTHONUNBUFFERED": "1",
    })
    # The CLI and the daemons it starts must import the same ctxd as this test process.
    repo = str(Path(ctxd.__file__).parents[1])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def stop_everything(cli: Cli) -> None:
    if cli.socket.exists() or cli.daemon_pid() is not None:
        subprocess.run([*CLI, "daemon", "stop"], check=False, env=cli.env, capture_output=True, timeout=20,
                       stdin=subprocess.DEVNULL)
    for proc in cli.processes:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    pid = cli.daemon_pid()
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while cli.daemon_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture
def cli() -> Iterator[Cli]:
    root = Path(tempfile.mkdtemp(prefix="ctxcli-", dir="/tmp"))
    instance = Cli(root=root, env=_cli_env(root))
    try:
        yield instance
    finally:
        stop_everything(instance)
        shutil.rmtree(root, ignore_errors=True)
