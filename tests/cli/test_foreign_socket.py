"""ctxd-cli (and the forwarder, and every ``ctxd.client`` user) talks only to a daemon of
the same user: a socket served by another user's process (one planted where a shared
``daemon.socket`` points, or a path another user took over) is refused before anything
is sent, and no daemon is started in its place. The serving process's uid is the
kernel's (``SO_PEERCRED``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import Cli
from tests.e2e.helpers import short_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                                reason="runs a listener as another user (needs root) and SO_PEERCRED (Linux)")

NOBODY = 65534

LISTENER = f"""
import os, socket, sys
path, out = sys.argv[1], sys.argv[2]
os.setgid({NOBODY}); os.setuid({NOBODY})
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen()
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    with conn, open(out, "ab") as f:
        conn.settimeout(2)
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                f.write(chunk)
                f.flush()
        except OSError:
            pass
"""


@pytest.mark.process("ctxd --remote and a listener as processes")
def test_a_socket_served_by_another_user_gets_nothing(cli: Cli) -> None:
    shared = short_dir()
    try:
        shared.chmod(0o1777)  # a shared directory, like /tmp
        sock, received = shared / "ctxd.sock", shared / "received"
        listener = subprocess.Popen([sys.executable, "-c", LISTENER, str(sock), str(received)],
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
            for args in (("--socket", str(sock), "sessions", "list"),
                         ("--socket", str(sock), "--no-autostart", "push", "s", "--create", "--content", "secret")):
                refused = cli(*args, expect=3)
                line = refused.error_line()
                assert "served by a process of uid 65534" in line and "nothing was sent" in line, line
            forwarder = subprocess.run([sys.executable, "-m", "ctxd", "--remote", f"unix:{sock}"], input=b"",
                                       capture_output=True, env=cli.env, timeout=60)
            assert forwarder.returncode != 0 and b"uid 65534" in forwarder.stderr, forwarder.stderr
            time.sleep(0.3)
            assert not received.exists() or received.read_bytes() == b""
            assert not list(shared.glob("*.lock"))  # no daemon was started in its place
        finally:
            listener.kill()
            listener.wait()
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


def test_our_own_daemon_is_still_reached(cli: Cli) -> None:
    assert cli.json("push", "mine", "--create", "--content", "hello")["sessionId"] == "mine"
    assert "mine" in cli("sessions", "list").stdout
