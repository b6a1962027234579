"""``ctxd proxy`` under another local user (issue 23, 2 and 5): another user's connections,
however many and however half-sent, never starve the owner's requests nor the daemon the
proxy runs in its process; another user's huge body is never read."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from ctxd.client import Client
from tests.hostile.conftest import Attacker
from tests.proxy.conftest import ProxyProcess
from tests.proxy.upstream import MODEL, FakeUpstream

FILES = 600
"""The proxy's descriptor limit here: another user's connections would fill it long
before the 20,000 of the issue's probe (the same exhaustion, sooner)."""
LIMITED = ["-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
                 f"({FILES}, {FILES})); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"]


@pytest.fixture
def proxy(base: Path, upstream: FakeUpstream) -> Iterator[ProxyProcess]:
    """``ctxd proxy`` with its daemon in process (its socket for ctxd-cli), limited to
    ``FILES`` descriptors."""
    proc = ProxyProcess(base / "run" / "ctxd.sock", upstream, base / "proxy.log", ["--data-dir", str(base / "data")])
    proc.command.remove("--no-autostart")
    assert proc.command[0] == sys.executable
    proc.command[1:1] = LIMITED
    proc.start()
    assert "in this process" in proc.log()
    yield proc
    proc.stop()


async def _owner(proxy: ProxyProcess, rounds: int) -> list[bool | str]:
    """The owner's requests, each on a new connection, and a daemon request on the socket
    after each: True for each round served."""
    served: list[bool | str] = []
    for i in range(rounds):
        try:
            async with httpx.AsyncClient(base_url=proxy.url, timeout=10,
                                         limits=httpx.Limits(max_keepalive_connections=0)) as http:
                answer = await http.post("/v1/chat/completions", headers={"x-ctxd-session": "mine"},
                                         json={"model": MODEL, "messages": [{"role": "user", "content": f"turn {i}"}]})
                assert answer.status_code == 200, answer.text
            client = await Client.connect_unix(proxy.socket_path)
            await asyncio.wait_for(client.initialize(client_name="owner"), 10)
            await client.request("session/list", {}, timeout=10)
            await client.close()
            served.append(True)
        except Exception as exc:
            served.append(f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(0.2)
    return served


def test_half_sent_connections_of_another_user_starve_nothing(proxy: ProxyProcess) -> None:
    port = proxy.url.rsplit(":", 1)[1]
    attack = Attacker("hold", port, str(FILES * 2), "20")
    try:
        time.sleep(3)
        descriptors = []

        async def run() -> list[bool | str]:
            task = asyncio.ensure_future(_owner(proxy, 20))
            while not task.done():
                descriptors.append(len(os.listdir(f"/proc/{proxy.proc.pid}/fd")))
                await asyncio.sleep(0.2)
            return await task

        served = asyncio.run(run())
        held = attack.result()
    finally:
        attack.stop()
    assert held["opened"] > FILES * 2, held  # the attack went on ...
    assert served == [True] * 20  # ... and every owner's request and daemon request was served
    assert max(descriptors) < 100, descriptors
    log = proxy.log()
    assert "refused a request from uid 65534" in log
    assert log.count("uid 65534") < 20  # counted, not a line per connection
    assert "Traceback" not in log


def test_another_users_huge_body_is_never_read(proxy: ProxyProcess) -> None:
    port = proxy.url.rsplit(":", 1)[1]
    before = psutil.Process(proxy.proc.pid).memory_info().rss
    started = time.monotonic()
    result = Attacker("big", port, str(2 << 30)).result()
    assert result["status"] == "403", result
    assert result["sent"] < 512 << 20  # answered long before the body's end
    assert time.monotonic() - started < 30
    assert psutil.Process(proxy.proc.pid).memory_info().rss - before < 50 << 20
    assert asyncio.run(_owner(proxy, 2)) == [True, True]
