"""``ctxd --tcp 0``: loopback only, a private token file, and a token checked on
``initialize`` before anything else is served."""

from __future__ import annotations

import os
import re
import shutil
import stat

import psutil
import pytest

from tests.e2e.helpers import Daemon, RawClient, request_frame, run_ctxd, short_dir

pytestmark = pytest.mark.usefixtures("storage_backend")


@pytest.fixture(scope="module")
def tcp_daemon():
    base = short_dir()
    daemon = Daemon(base / "data", tcp=True, token_file=base / "state" / "tcp-token")
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_listens_on_loopback_only_and_logs_the_port(tcp_daemon):
    daemon = tcp_daemon
    assert re.search(rf"listening on tcp 127\.0\.0\.1:{daemon.port}\b", daemon.stderr_text())
    listening = [c for c in psutil.Process(daemon.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert [(c.laddr.ip, c.laddr.port) for c in listening] == [("127.0.0.1", daemon.port)]


def test_token_file_is_created_private(daemon_factory, base_dir):
    daemon = daemon_factory(socket=False, tcp=True, name="t")
    token_file = base_dir / "statet" / "tcp-token"
    assert daemon.token_file == token_file
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(token_file.parent).st_mode) == 0o700
    assert re.fullmatch(r"[0-9a-f]{64}", daemon.token())
    # A restart keeps the token.
    token = daemon.token()
    daemon.stop()
    daemon.start()
    assert daemon.token() == token


async def test_initialize_requires_the_right_token(tcp_daemon):
    daemon = tcp_daemon

    # No token at all.
    client = await RawClient.tcp(daemon.port)
    error = await client.error("initialize", {"processId": None})
    assert error["code"] == -33006
    assert error["data"] == {"field": "initializationOptions.token"}
    assert await client.closed_by_peer()
    await client.close()

    # A wrong token, with a request pipelined right behind it: the request is refused
    # (the connection is not initialized) or never read, and the connection is closed.
    client = await RawClient.tcp(daemon.port)
    await client.send_raw(
        request_frame(1, "initialize", {"initializationOptions": {"token": "0" * 64}})
        + request_frame(2, "session/create", {"sessionId": "sneaky"}))
    answers = {}
    while (message := await client.read_frame()) is not None:
        answers[message["id"]] = message
    assert answers[1]["error"]["code"] == -33006
    assert set(answers) <= {1, 2}
    if 2 in answers:
        assert answers[2]["error"]["code"] == -32002
    await client.close()

    # Requests before initialize are refused as on any transport.
    client = await RawClient.tcp(daemon.port)
    assert (await client.error("session/list", {}))["code"] == -32002
    # The right token works.
    result = await client.initialize(token=daemon.token())
    assert result["serverInfo"]["name"] == "ctxd"
    listed = await client.result("session/list", {})
    assert listed["sessions"] == []  # "sneaky" was never created
    status = await client.result("daemon/status")
    assert status["transports"] == [f"tcp:127.0.0.1:{daemon.port}"]
    await client.close()


def test_token_file_readable_by_others_is_refused(base_dir):
    token_file = base_dir / "state" / "tcp-token"
    token_file.parent.mkdir(mode=0o700)
    token_file.write_text("a" * 64 + "\n")
    os.chmod(token_file, 0o644)
    result = run_ctxd(["--tcp", "0", "--data-dir", str(base_dir / "d"),
                       "--set", f"daemon.token_file={token_file}"])
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert str(token_file) in lines[0]
    assert "chmod 600" in lines[0]
    assert "Traceback" not in result.stderr.decode()


def test_empty_token_file_is_refused(base_dir):
    token_file = base_dir / "state" / "tcp-token"
    token_file.parent.mkdir(mode=0o700)
    token_file.write_text("")
    os.chmod(token_file, 0o600)
    result = run_ctxd(["--tcp", "0", "--data-dir", str(base_dir / "d"),
                       "--set", f"daemon.token_file={token_file}"])
    assert result.returncode == 2
    assert "empty" in result.stderr.decode()
