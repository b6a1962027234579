"""The Neovim plugin (clients/nvim) in a headless Neovim against a real daemon.

Each test starts its own daemon (temp dir, own socket and data dir: never the user's),
then runs Neovim with nothing but the plugin on its runtimepath: the Lua specs through
the plugin's own runner (clients/nvim/tests/run.lua), and the exit cleanup from here,
where the processes can be watched from outside.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import CTXD, Daemon, daemon_env, process_gone, short_dir, wait_for

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "clients" / "nvim"
NVIM = shutil.which("nvim")
pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not on PATH (Debian: apt-get install -y neovim)")
NVIM_TIMEOUT = 240


@pytest.fixture
def base_dir() -> Iterator[Path]:
    path = short_dir("ctxd-nvim-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(base_dir: Path) -> Iterator[Daemon]:
    d = Daemon(base_dir / "data", socket_path=base_dir / "run" / "ctxd.sock").start()
    yield d
    d.stop()


def nvim(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Headless Neovim, no user config or plugins, running ``script`` (a Lua file)."""
    assert NVIM is not None
    return subprocess.run([NVIM, "--headless", "--clean", "-u", "NONE", "-i", "NONE", "-c", f"luafile {script}"],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=NVIM_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def test_plugin_specs(daemon: Daemon, base_dir: Path) -> None:
    results = base_dir / "results.txt"
    env = daemon_env(CTXD_NVIM_CMD=json.dumps([*CTXD, "--remote", f"unix:{daemon.socket_path}"]),
                     CTXD_NVIM_RESULTS=str(results), HOME=str(base_dir))
    run = nvim(str(PLUGIN / "tests" / "run.lua"), env, base_dir)
    report = results.read_text() if results.exists() else ""
    assert report, f"the runner wrote no report (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    lines = report.splitlines()
    planned = int(lines[0].removeprefix("1.."))
    passed = [line for line in lines if line.startswith("ok ")]
    failed = [line for line in lines if line.startswith("not ok ")]
    assert not failed, "\n".join(lines)
    assert len(passed) == planned >= 10, report
    assert run.returncode == 0, run.stderr


CLEANUP = """
vim.opt.runtimepath:prepend({plugin!r})
vim.cmd('runtime plugin/ctxd.lua')
local ctxd = require('ctxd')
ctxd.setup({{ cmd = vim.json.decode({cmd!r}) }})
local status, err = ctxd.request_sync('daemon/status', nil, 60000)
local f = io.open({out!r}, 'w')
f:write(vim.json.encode({{ forwarder = ctxd.info().pid, daemon = status and status.pid,
                          connections = status and status.connections, err = err and err.message }}))
f:close()
vim.cmd('qall!')
"""


def test_exit_closes_the_connection_and_leaves_the_daemon(base_dir: Path) -> None:
    """`--remote auto` from Neovim starts the daemon; quitting Neovim ends the forwarder
    (VimLeavePre) and its connection, not the daemon."""
    socket_path = base_dir / "run" / "ctxd.sock"
    cmd = [*CTXD, "--remote", "auto", "--set", f"daemon.socket={socket_path}", "--data-dir", str(base_dir / "data")]
    out = base_dir / "out.json"
    script = base_dir / "cleanup.lua"
    script.write_text(CLEANUP.format(plugin=str(PLUGIN), cmd=json.dumps(cmd), out=str(out)))
    run = nvim(str(script), daemon_env(HOME=str(base_dir)), base_dir)
    assert run.returncode == 0, run.stderr
    seen = json.loads(out.read_text())
    assert seen.get("err") is None and seen.get("daemon"), seen
    daemon_pid = seen["daemon"]
    try:
        assert seen["forwarder"] not in (daemon_pid, os.getpid())
        assert seen["connections"] == 1  # Neovim's forwarder only
        assert process_gone(seen["forwarder"]), "the forwarder outlived Neovim"
        assert not process_gone(daemon_pid), "the daemon must outlive Neovim"

        def connections() -> int:
            status = subprocess.run([*CTXD, "--remote", f"unix:{socket_path}"], input=_status_frames(),
                                    capture_output=True, env=daemon_env(), timeout=60)
            replies = [json.loads(body) for body in _bodies(status.stdout)]
            return next(r["result"]["connections"] for r in replies if r.get("id") == 2)

        # Only the asking connection is left: Neovim's closed with it.
        assert wait_for(lambda: connections() == 1, what="Neovim's connection to close")
    finally:
        if not process_gone(daemon_pid):
            os.kill(daemon_pid, signal.SIGTERM)
            wait_for(lambda: process_gone(daemon_pid), what="the daemon to stop")


RECONNECT = """
vim.opt.runtimepath:prepend({plugin!r})
vim.cmd('runtime plugin/ctxd.lua')
local notes = {{}}
vim.notify = function(message) table.insert(notes, message) end
local ctxd = require('ctxd')
ctxd.setup({{ cmd = vim.json.decode({cmd!r}) }})
local result = {{}}
local function finish()
  result.notes = notes
  local f = io.open({out!r}, 'w')
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd('qall!')
end
local ok, err = pcall(function()
  local first = assert(ctxd.request_sync('daemon/status', nil, 60000))
  result.first = first.pid
  assert(ctxd.request_sync('session/create', {{ sessionId = 'kept', model = 'gpt-4' }}))
  ctxd.use('kept')
  assert(vim.wait(20000, function() return ctxd.status().maxPromptTokens ~= nil end), 'stats of kept')
  vim.loop.kill(first.pid, 'sigkill')
  assert(vim.wait(20000, function() return not ctxd.info().running end), 'the forwarder to exit')
  result.off = ctxd.statusline()
  -- The next request starts a new forwarder, which starts a new daemon on the same data.
  local second = assert(ctxd.request_sync('daemon/status', nil, 60000))
  result.second = second.pid
  assert(vim.wait(20000, function() return ctxd.status().connected end), 'connected again')
  ctxd.push('kept', {{ {{ role = 'user', content = 'after the restart' }} }})
  assert(vim.wait(20000, function() return ctxd.status().messageCount == 1 end), 'session/updated again')
  result.on = ctxd.statusline()
end)
result.error = not ok and tostring(err) or nil
finish()
"""


def test_a_lost_daemon_is_reported_and_the_next_command_reconnects(base_dir: Path) -> None:
    """The daemon dies under Neovim: the user is told why (the forwarder's own words), the
    statusline says (off); the next request starts the forwarder again, `--remote auto`
    starts a daemon again, and the active session is followed again."""
    socket_path = base_dir / "run" / "ctxd.sock"
    cmd = [*CTXD, "--remote", "auto", "--set", f"daemon.socket={socket_path}", "--data-dir", str(base_dir / "data")]
    out = base_dir / "out.json"
    script = base_dir / "reconnect.lua"
    script.write_text(RECONNECT.format(plugin=str(PLUGIN), cmd=json.dumps(cmd), out=str(out)))
    run = nvim(str(script), daemon_env(HOME=str(base_dir)), base_dir)
    seen = json.loads(out.read_text()) if out.exists() else {}
    pids = [pid for pid in (seen.get("first"), seen.get("second")) if pid]
    try:
        assert run.returncode == 0 and seen and not seen.get("error"), (seen, run.stderr)
        assert seen["first"] != seen["second"]
        lost = [n for n in seen["notes"] if n.startswith("ctxd: lost the daemon: ")]
        assert lost and f"the daemon on {socket_path} closed the connection (it stopped or crashed" in lost[0], seen
        assert "(the next ctxd command reconnects)" in lost[0]
        assert seen["off"].startswith("ctxd kept ") and seen["off"].endswith(" (off)"), seen["off"]
        assert seen["on"].startswith("ctxd kept ") and "(off)" not in seen["on"], seen["on"]
    finally:
        for pid in pids:
            if not process_gone(pid):
                os.kill(pid, signal.SIGTERM)
                wait_for(lambda pid=pid: process_gone(pid), what="the daemon to stop")


def _frame(message: dict[str, object]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def _status_frames() -> bytes:
    return (_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None}})
            + _frame({"jsonrpc": "2.0", "method": "initialized", "params": {}})
            + _frame({"jsonrpc": "2.0", "id": 2, "method": "daemon/status"}))


def _bodies(data: bytes) -> list[bytes]:
    out = []
    while data:
        header, _, rest = data.partition(b"\r\n\r\n")
        length = int(header.split(b":")[1])
        out.append(rest[:length])
        data = rest[length:]
    return out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
