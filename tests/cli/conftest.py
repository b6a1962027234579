"""Fixtures for the ctxd-cli tests: every test gets its own socket and data directory, and
every daemon it started is stopped afterwards.

``cli``: ``ctxd-cli`` run in the test process, through its ``main()`` with its own stdin,
stdout, stderr and environment (click's ``CliRunner`` isolation); a daemon it autostarts
runs in the test process too (``tests/inprocess.py``), on the same socket, with the same
flags and log file as the process ``ctxd-cli`` would have spawned. Tests of what the CLI
does, fast.

A test that needs ``ctxd-cli`` and its daemon as processes (Ctrl-C, pids, a terminal,
umask, several CLIs at once, example scripts) is marked ``@pytest.mark.process("why")``:
its ``cli`` is then ``cli_process``, ``ctxd-cli`` as a subprocess whose autostart spawns
a real daemon process, and it runs in the suite's process part (tests/conftest.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ctxd
from tests.inprocess import InProcessDaemon

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
    """``ctxd-cli`` bound to one temporary socket and data directory, as a subprocess."""

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

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60, expect: int | None = 0,
                 env: dict[str, str] | None = None) -> Result:
        """``ctxd-cli ARGS`` (``env``: variables added to its environment)."""
        proc = subprocess.run([*CLI, *args], check=False, input=input, capture_output=True, text=True,
                              env={**self.env, **(env or {})},
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


class _Started:
    """What ``ctxd.client.spawn_daemon`` returns (a ``Popen``), for a daemon started in
    this process: its pid is ours, ``poll()`` its exit code once it stopped."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        self.daemon = daemon
        self.pid = os.getpid()

    def poll(self) -> int | None:
        return None if self.daemon.running else self.daemon.returncode


@dataclass
class InProcessCli(Cli):
    """``ctxd-cli`` run through ``ctxd.cli.main.main`` in this process; the daemons it
    autostarts run in this process too (``daemons``)."""

    daemons: list[InProcessDaemon] = field(default_factory=list)

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60, expect: int | None = 0,
                 env: dict[str, str] | None = None) -> Result:
        from ctxd.cli import render
        from ctxd.cli.main import main

        # A process starts without the consoles an earlier run made (each reads $COLUMNS
        # once, when made): the in-process run must too.
        for made in (render.console, render.plain_console, render.err_console):
            made.cache_clear()
        # The subprocess's environment exactly: ours, less what it did not have.
        environ: dict[str, str | None] = {k: None for k in os.environ if k not in self.env}
        environ.update(self.env)
        environ.update(env or {})
        umask = os.umask(0o077)  # (main() sets the process's umask: put ours back after)
        os.umask(umask)
        try:
            with CliRunner().isolation(input=input, env=environ) as (out, err, _):
                try:
                    code = main(list(args))
                except SystemExit as exc:  # (e.g. --help, --version: click exits)
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                sys.stdout.flush()
                sys.stderr.flush()
                stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
        finally:
            os.umask(umask)
            for name in ("ctxd.cli", "ctxd.client"):  # what -v set up on the CLI's stderr
                logger = logging.getLogger(name)
                logger.handlers.clear()
                logger.setLevel(logging.NOTSET)
                logger.propagate = True
        result = Result(code, stdout, stderr)
        if expect is not None:
            assert result.returncode == expect, (args, result)
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        raise TypeError("ctxd-cli as a process (Ctrl-C, a pipe read while it runs): use the cli_process fixture")

    def spawn_daemon(self, socket_path: Path, *, data_dir: str | None = None, config_file: str | None = None,
                     idle_exit: float | None = None, autostarted: bool = True,
                     log_path: Path | None = None) -> _Started:
        """``ctxd.client.spawn_daemon``, the daemon run in this process: the same flags,
        its log where the process's stderr would have gone."""
        argv = ["--socket", str(socket_path)]
        if idle_exit is not None:
            argv += ["--idle-exit", str(idle_exit)]
        elif autostarted:
            argv += ["--autostarted"]
        if data_dir:
            argv += ["--data-dir", data_dir]
        if config_file:
            argv += ["--config", config_file]
        stderr_path = socket_path.with_name("daemon.log") if log_path is None else log_path
        stderr_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # (Its environment is the CLI's, as a spawned process inherits it: ``CTXD_DAEMON_*`` included.)
        daemon = InProcessDaemon(argv, log_path=stderr_path, environ=dict(os.environ)).start(check=False)
        self.daemons.append(daemon)
        return _Started(daemon)

    def process_gone(self, pid: int) -> bool:
        """``ctxd.cli.daemon._process_gone``: our pid is "gone" once no daemon started
        here runs any more (``daemon stop`` waits for that)."""
        if pid == os.getpid():
            return not any(d.running for d in self.daemons)
        return self._process_gone(pid)

    @staticmethod
    def _process_gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def daemon_pid(self) -> int | None:
        """Our pid while a daemon started in this process serves this socket."""
        if any(d.running for d in self.daemons) and self.socket.exists():
            return os.getpid()
        return None


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
    if isinstance(cli, InProcessCli):
        for daemon in cli.daemons:
            daemon.stop()
        return
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
def cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """``ctxd-cli`` in this process; in a test marked ``process``, ``cli_process``."""
    if request.node.get_closest_marker("process") is not None:
        yield request.getfixturevalue("cli_process")
        return
    import ctxd.cli.daemon
    import ctxd.client

    root = Path(tempfile.mkdtemp(prefix="ctxcli-", dir="/tmp"))
    instance = InProcessCli(root=root, env=_cli_env(root))
    monkeypatch.setattr(ctxd.client, "spawn_daemon", instance.spawn_daemon)
    monkeypatch.setattr(ctxd.cli.daemon, "_process_gone", instance.process_gone)
    try:
        yield instance
    finally:
        stop_everything(instance)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cli_process() -> Iterator[Cli]:
    """``ctxd-cli`` as a subprocess, its daemons processes too."""
    root = Path(tempfile.mkdtemp(prefix="ctxcli-", dir="/tmp"))
    instance = Cli(root=root, env=_cli_env(root))
    try:
        yield instance
    finally:
        stop_everything(instance)
        shutil.rmtree(root, ignore_errors=True)
