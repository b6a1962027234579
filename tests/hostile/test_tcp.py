"""TCP mode under another local user (issue 23, 1 and 4): the token goes only to a server
the kernel names as the owner's, and another user's unauthenticated connections fill only
their own waiting slots."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxd.client import Client, ForeignDaemon
from tests.e2e.helpers import CTXD, Daemon, daemon_env, frame
from tests.hostile.conftest import NOBODY, Attacker

CLI = [sys.executable, "-m", "ctxd.cli.main"]


def _token_file(base: Path) -> Path:
    path = base / "tcp-token"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def test_the_token_never_goes_to_another_users_listener(base: Path) -> None:
    """Another user listens on the port first: ctxd-cli --tcp, ctxd --remote tcp: and the
    client library send it nothing, the token least of all, and say who holds the port."""
    token_file = _token_file(base)
    token = token_file.read_text().strip()
    thief = Attacker("listen", "20")
    try:
        port = thief.line()
        cli = subprocess.run([*CLI, "--tcp", port, "--token-file", str(token_file), "sessions", "list"],
                             capture_output=True, text=True, timeout=60, env=daemon_env())
        remote = subprocess.run([*CTXD, "--remote", f"tcp:127.0.0.1:{port}", "--set",
                                 f"daemon.token_file={token_file}"],
                                input=frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                             "params": {"processId": None}}).decode(),
                                capture_output=True, text=True, timeout=60, env=daemon_env())

        async def library() -> str:
            with pytest.raises(ForeignDaemon) as refused:
                await Client.connect_tcp(int(port))
            return str(refused.value)

        said = asyncio.run(library())
        stolen = thief.result()
    finally:
        thief.stop()
    assert cli.returncode != 0 and "Traceback" not in cli.stderr
    assert f"127.0.0.1:{port} is served by uid {NOBODY}" in cli.stderr, cli.stderr
    assert "nothing was sent" in cli.stderr
    assert remote.returncode == 2 and f"is served by uid {NOBODY}" in remote.stderr, remote.stderr
    assert f"is served by uid {NOBODY}" in said
    assert stolen["connections"] >= 1  # they connected (the last may still be queued) ...
    assert stolen["bytes"] == 0 and token not in stolen["data"]  # ... and sent nothing


def test_the_owners_own_tcp_daemon_is_still_served(base: Path) -> None:
    token_file = _token_file(base)
    daemon = Daemon(base / "data", tcp=True, token_file=token_file).start()
    try:
        cli = subprocess.run([*CLI, "--tcp", str(daemon.port), "--token-file", str(token_file), "sessions", "list"],
                             capture_output=True, text=True, timeout=60, env=daemon_env())
    finally:
        daemon.stop()
    assert cli.returncode == 0, cli.stderr


def test_another_user_cannot_fill_the_waiting_slots(base: Path) -> None:
    """Another user keeps 300 connections open without the token (the daemon waits 64 at
    most per user for their initialize, and parks the rest unread): the owner's clients
    are served all along."""
    token_file = _token_file(base)
    daemon = Daemon(base / "data", tcp=True, token_file=token_file,
                    args=["--set", "limits.initialize_timeout_seconds=30"]).start()
    squatter = Attacker("hold", str(daemon.port), "300", "25", "--data", "")
    try:
        time.sleep(3)  # the squatter's connections are in

        async def owner() -> list[bool | str]:
            served = []
            for _ in range(20):
                try:
                    client = await Client.connect_tcp(daemon.port)
                    await asyncio.wait_for(client.initialize(token=token_file.read_text().strip()), 10)
                    await client.request("session/list", {}, timeout=10)
                    await client.close()
                    served.append(True)
                except Exception as exc:
                    served.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)
            return served

        served = asyncio.run(owner())
        held = squatter.result()
    finally:
        squatter.stop()
        daemon.stop()
    assert held["most_open"] >= 300, held  # the squatter held its 300 (64 waiting, the rest parked) ...
    assert served == [True] * 20  # ... and the owner was never turned away
    log = daemon.stderr_text()
    assert f"tcp (uid {NOBODY}) connections are waiting for initialize" in log, log[-2000:]


def test_tcp_waiting_slots_are_per_user_even_for_the_owner(base: Path) -> None:
    """The owner's own slots are the owner's: past them the owner is turned away as
    before (the limit still holds per user)."""
    token_file = _token_file(base)
    daemon = Daemon(base / "data", tcp=True, token_file=token_file,
                    args=["--set", "limits.max_pending_connections=4"]).start()
    try:
        async def crowd() -> bool:
            held = [await asyncio.open_connection("127.0.0.1", daemon.port) for _ in range(6)]
            await asyncio.sleep(0.5)
            closed = [await asyncio.wait_for(reader.read(1), 5) == b"" for reader, _ in held[4:]]
            for _, writer in held:
                writer.close()
            return all(closed)

        assert asyncio.run(crowd())
    finally:
        daemon.stop()
    assert f"tcp (uid {os.geteuid()}) connections are waiting for initialize" in daemon.stderr_text()
