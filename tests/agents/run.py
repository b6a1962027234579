"""One run of an agent CLI on the task, direct or through ``ctxd proxy``, offline.

    python -m tests.agents.run CLI direct|proxy OUT.json [--window N] [--plan short|full]

runs inside a private network namespace (``unshare -n``; :func:`run_isolated` starts
it so): only loopback exists, brought up here. In it: the fixture repository, the
scripted upstream with its tap (tests/agents/upstream.py), for ``proxy`` a
``ctxd proxy`` (its daemon in its process, its own data directory) at ``--window``,
then the CLI itself. ``OUT.json`` gets everything the measures need: what the client
sent (the tap) and the upstream received, the repository's diff, the CLI's exit status
and output, and for ``proxy`` the ctxd sessions and their stored messages.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.agents import clis, fixture, script
from tests.agents.upstream import ScriptedUpstream, record_json

REPO_ROOT = Path(__file__).resolve().parents[2]
WINDOWS = {"claude": 48_000, "codex": 24_000, "opencode": 24_000, "aider": 16_000}
"""ctxd's window per CLI in the benchmark: below each one's conversation."""
CLI_TIMEOUT = 480.0


def loopback_up() -> None:
    """Bring ``lo`` up in this (new) network namespace: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack("16sH", fcntl.ioctl(sock, 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))


def _unshare_argv() -> list[str] | None:
    tool = shutil.which("unshare")
    if tool is None:
        return None
    return [tool, "-n"] if os.geteuid() == 0 else [tool, "-r", "-n"]


@lru_cache(maxsize=1)
def netns_missing() -> str | None:
    """Why a private network namespace cannot be made here, or None."""
    argv = _unshare_argv()
    if argv is None:
        return "unshare is missing (util-linux): the agent CLIs run only in a private network namespace"
    done = subprocess.run([*argv, "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"unshare -n is not permitted here: {done.stderr.strip()[:200]}"
    return None


def run_isolated(cli: str, via: str, out: Path, window: int | None = None, plan: str = "full",
                 timeout: float = CLI_TIMEOUT + 120) -> dict[str, Any]:
    """:func:`main` in a private network namespace; its result, read back from ``out``."""
    argv = _unshare_argv()
    assert argv is not None, netns_missing()
    command = [*argv, sys.executable, "-m", "tests.agents.run", cli, via, str(out), "--plan", plan]
    if window is not None:
        command += ["--window", str(window)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"the {cli} {via} run failed ({done.returncode}):\n{done.stdout[-4000:]}\n"
                           f"{done.stderr[-4000:]}")
    return json.loads(out.read_text())


class Proxy:
    """``ctxd proxy`` with its daemon in its process, on a data directory of its own."""

    def __init__(self, base: Path, upstream_url: str, window: int, model: str) -> None:
        self.socket_path = base / "run" / "ctxd.sock"
        self.log_path = base / "proxy.log"
        (base / "run").mkdir(parents=True, exist_ok=True)
        self.command = [sys.executable, "-m", "ctxd", "proxy", "--port", "0", "--socket", str(self.socket_path),
                        "--data-dir", str(base / "data"), "-v",
                        "--set", f"proxy.openai_base_url={upstream_url}/v1",
                        "--set", f"proxy.anthropic_base_url={upstream_url}",
                        # The window for the CLI's main model only, as its user would set it:
                        # its side models (aider's summarizer, Claude Code's small fast
                        # model) are passed through while their requests fit their own.
                        "--set", f"proxy.context_window={json.dumps({model: window})}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
        env.update(XDG_CONFIG_HOME=str(base / "config"), XDG_STATE_HOME=str(base / "state"),
                   XDG_DATA_HOME=str(base / "xdg-data"), XDG_RUNTIME_DIR=str(base / "run"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                         env=env)
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            if select.select([self.proc.stdout], [], [], 0.1)[0]:
                byte = os.read(self.proc.stdout.fileno(), 1)
                if not byte:
                    break
                line += byte
        if b"listening on " not in line:
            self.stop()
            raise RuntimeError(f"ctxd proxy did not start: {line!r}\n{self.log()}")
        self.url = line.decode().split("listening on ", 1)[1].strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def sessions(self) -> list[dict[str, Any]]:
        """Every session with its stored messages (read after the CLI exited and the
        proxy's last reply pushes landed)."""
        from ctxd.client import Client

        client = await Client.connect_unix(self.socket_path)
        await client.initialize(client_name="agents-bench")
        try:
            out = []
            previous = None
            for _ in range(50):  # until the stores stop changing (a reply push may be in flight)
                listed = (await client.request("session/list", {}))["sessions"]
                out = []
                for info in listed:
                    messages: list[Any] = []
                    seq: int | None = 1
                    while seq is not None:
                        page = await client.request("session/history",
                                                    {"sessionId": info["sessionId"], "from": seq, "limit": 500})
                        messages += [entry["message"] for entry in page["messages"]]
                        seq = page.get("nextSeq")
                    out.append({"info": info, "messages": messages})
                shape = [(s["info"]["sessionId"], len(s["messages"])) for s in out]
                if shape == previous:
                    break
                previous = shape
                await asyncio.sleep(0.2)
            return out
        finally:
            await client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def aider_input(turns: tuple[tuple[str, str], ...]) -> str:
    return "".join(prompt + "\n" for prompt, _ in turns) + "/exit\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cli", choices=clis.CLIS)
    parser.add_argument("via", choices=("direct", "proxy"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--window", type=int, default=None, help="ctxd's window (default: the benchmark's per CLI)")
    parser.add_argument("--plan", choices=("full", "short"), default="full")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (printed)")
    args = parser.parse_args(argv)
    loopback_up()
    window = args.window or WINDOWS[args.cli]
    base = Path(tempfile.mkdtemp(prefix=f"ctxd-agents-{args.cli}-", dir="/tmp"))
    try:
        result = _run(args.cli, args.via, window, base, args.plan)
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    args.out.write_text(json.dumps(result))
    return 0


def _run(cli: str, via: str, window: int, base: Path, plan: str) -> dict[str, Any]:
    repo = fixture.make_repo(base / "repo")
    private_home = base / "home"
    private_home.mkdir()
    turns = script.AIDER_PLANS[plan]
    playbook = script.for_cli(cli, str(repo), plan)
    result: dict[str, Any] = {"cli": cli, "via": via, "window": window, "plan": plan, "model": clis.MODELS[cli]}
    with ScriptedUpstream(playbook, repo) as upstream:
        proxy = Proxy(base / "ctxd", upstream.url, window, clis.MODELS[cli]) if via == "proxy" else None
        try:
            if proxy is not None:
                upstream.target = proxy.url
            how = clis.launch(cli, upstream.tap_url, private_home, repo, script.TASK,
                              stdin=aider_input(turns) if cli == "aider" else "")
            for path, text in how.files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            started = time.monotonic()
            try:
                done = subprocess.run(how.argv, cwd=repo, env=how.env, input=how.stdin, capture_output=True,
                                      text=True, timeout=CLI_TIMEOUT)
                result.update(returncode=done.returncode, stdout=done.stdout[-6000:], stderr=done.stderr[-6000:])
            except subprocess.TimeoutExpired as exc:
                result.update(returncode=None, stdout=str(exc.stdout or "")[-6000:],
                              stderr=str(exc.stderr or "")[-6000:] + f"\n(timed out after {CLI_TIMEOUT:.0f} s)")
            result["seconds"] = round(time.monotonic() - started, 2)
            result["diff"] = fixture.diff(repo)
            if proxy is not None:
                result["sessions"] = asyncio.run(proxy.sessions())
        finally:
            if proxy is not None:
                proxy.stop()
                result["proxy_log"] = proxy.log()[-20000:]
    result.update(record_json(upstream.record))
    return result


if __name__ == "__main__":
    raise SystemExit(main())
