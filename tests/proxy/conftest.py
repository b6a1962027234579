"""Fixtures of the proxy suite: a fake upstream (tests/proxy/upstream.py), a real ctxd
daemon on a Unix socket, and ``ctxd proxy`` in a subprocess between them.

Two ways the proxy has its daemon (``proxy_mode``): ``socket``, a daemon process of its
own that the proxy connects to (``--no-autostart``), and ``in-process``, the daemon run
by the proxy itself (``proxy.in_process``), on the same data directory and socket, so that
the tests' own socket clients (``history``, ``sessions``) reach it while the proxy serves.
A test runs in both with ``@both_modes``; else in ``socket`` (``CTXD_PROXY_TEST_MODE``
says otherwise)."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxd.client import Client
from tests.e2e.helpers import CTXD, Daemon, daemon_env, storage_args
from tests.proxy.upstream import FakeUpstream
from tests.shared_fixtures import short_dir_fixture
from tests.shared_fixtures import upstream as upstream  # (a fixture: found where it is imported)


class ProxyProcess:
    """``ctxd proxy --port 0`` pointed at ``upstream`` for all three APIs."""

    def __init__(self, socket_path: Path, upstream: FakeUpstream, log_path: Path, args: list[str]) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        self.command = [*CTXD, "proxy", "--port", "0", "--socket", str(socket_path), "--no-autostart", "-vv",
                        "--set", f"proxy.openai_base_url={upstream.url}/v1",
                        "--set", f"proxy.anthropic_base_url={upstream.url}",
                        "--set", f"proxy.ollama_base_url={upstream.url}", *args]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> ProxyProcess:
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                         env=daemon_env(), close_fds=True)
        finally:
            log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                byte = os.read(self.proc.stdout.fileno(), 1)
                if not byte:
                    break
                line += byte
        if b"listening on " not in line:
            self.stop()
            raise AssertionError(f"ctxd proxy did not start: {line!r}\n{self.log()}")
        self.url = line.decode().split("listening on ", 1)[1].strip()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


base_dir = short_dir_fixture("base_dir", "ctxd-proxy-")


MODES = ("socket", "in-process")
both_modes = pytest.mark.parametrize("proxy_mode", MODES, indirect=True)
"""Run a test with the daemon in its own process and in the proxy's."""


@pytest.fixture
def proxy_mode(request: pytest.FixtureRequest) -> str:
    """``@both_modes``' parameter, else ``CTXD_PROXY_TEST_MODE`` (``in-process`` runs the
    whole suite that way), else ``socket``."""
    default = os.environ.get("CTXD_PROXY_TEST_MODE", "socket")
    if default not in MODES:
        raise pytest.UsageError(f"CTXD_PROXY_TEST_MODE={default!r}: one of {', '.join(MODES)}")
    return getattr(request, "param", default)


@pytest.fixture
def ctxd_daemon(base_dir: Path, proxy_mode: str) -> Iterator[Daemon]:
    """The daemon (in ``in-process`` mode not started: the proxy runs it; ``start()`` runs
    one apart on the same data directory and socket, e.g. once the proxy is gone). It runs
    in the test process (tests/inprocess.py): the proxy under test is the process."""
    daemon = Daemon(base_dir / "data", socket_path=base_dir / "run" / "ctxd.sock", process=False)
    if proxy_mode == "socket":
        daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture
def start_proxy(ctxd_daemon: Daemon, upstream: FakeUpstream, base_dir: Path, proxy_mode: str) -> Iterator[Any]:
    """``start_proxy(*extra_args)``: a running proxy (stopped after the test)."""
    proxies: list[ProxyProcess] = []

    def start(*args: str) -> ProxyProcess:
        assert ctxd_daemon.socket_path is not None
        own: list[str] = ["--data-dir", str(ctxd_daemon.data_dir), *storage_args(ctxd_daemon.data_dir)] \
            if proxy_mode == "in-process" else []
        proxy = ProxyProcess(ctxd_daemon.socket_path, upstream, base_dir / f"proxy{len(proxies)}.log",
                             [*own, *args])
        if proxy_mode == "in-process":
            proxy.command.remove("--no-autostart")
        # (in-process: a proxy started while another runs connects to that one's daemon)
        alone = not any(p.proc is not None and p.proc.poll() is None for p in proxies)
        proxies.append(proxy)
        proxy.start()
        in_process = "in this process" in proxy.log()
        assert in_process == (proxy_mode == "in-process" and alone), proxy.log()
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def proxy(start_proxy: Any) -> ProxyProcess:
    return start_proxy()


async def ctxd_client(daemon: Daemon) -> Client:
    assert daemon.socket_path is not None
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="proxy-test")
    return client


async def history(daemon: Daemon, session_id: str) -> list[dict[str, Any]]:
    """Every message of a session, as stored once it stopped changing: the proxy does not
    wait for a reply's push (the session's next request does), so right after a reply it
    may still be on its way."""
    client = await ctxd_client(daemon)
    try:
        previous: list[dict[str, Any]] | None = None
        while True:
            out: list[dict[str, Any]] = []
            seq: int | None = 1
            while seq is not None:
                page = await client.request("session/history", {"sessionId": session_id, "from": seq, "limit": 500})
                out += [entry["message"] for entry in page["messages"]]
                seq = page.get("nextSeq")
            if out == previous:
                return out
            previous = out
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def sessions(daemon: Daemon) -> list[dict[str, Any]]:
    client = await ctxd_client(daemon)
    try:
        return (await client.request("session/list", {}))["sessions"]
    finally:
        await client.close()
