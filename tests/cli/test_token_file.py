"""The TCP token is read only from a private file of this user's, never through a symbolic
link: ``ctxd-cli --tcp`` (and ``ctxd --remote tcp:...``) send what they read to whatever
listens on the port, so a link planted where ``daemon.token_file`` points (a shared
directory) must not make them read, and send, another of the user's files."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.cli.conftest import Cli
from tests.e2e.helpers import run_ctxd

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not a token"


class Listener:
    """Whatever a client sends to a loopback port (in place of a daemon)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(0.2)
            with conn:
                while not self._stop.is_set():
                    try:
                        chunk = conn.recv(65536)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not chunk:
                        break
                    self.received += chunk

    def close(self) -> bytes:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
        return bytes(self.received)


def _private_file(path: Path) -> Path:
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def test_cli_does_not_send_a_file_reached_through_a_link(cli: Cli, tmp_path: Path) -> None:
    secret = _private_file(tmp_path / "id_ed25519")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    link = shared / "tcp-token"
    link.symlink_to(secret)
    listener = Listener()
    try:
        result = cli("--tcp", str(listener.port), "--token-file", str(link), "sessions", "list", expect=3)
    finally:
        received = listener.close()
    assert "symbolic link" in result.error_line() and str(link) in result.error_line()
    assert b"OPENSSH" not in received and b"initialize" not in received


def test_cli_refuses_a_token_file_others_can_read(cli: Cli, tmp_path: Path) -> None:
    token = tmp_path / "tcp-token"
    token.write_text("a" * 64)
    token.chmod(0o644)
    listener = Listener()
    try:
        result = cli("--tcp", str(listener.port), "--token-file", str(token), "sessions", "list", expect=3)
    finally:
        received = listener.close()
    assert "readable by other users" in result.error_line() and "chmod 600" in result.error_line()
    assert b"a" * 64 not in received


@pytest.mark.process("ctxd's exit code and stderr when it cannot start")
def test_daemon_does_not_take_its_token_through_a_link(tmp_path: Path) -> None:
    secret = _private_file(tmp_path / "id_ed25519")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "tcp-token").symlink_to(secret)
    result = run_ctxd(["--tcp", "0", "--data-dir", str(tmp_path / "d"),
                       "--set", f"daemon.token_file={state / 'tcp-token'}"])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "symbolic link" in lines[0], lines
    assert os.readlink(state / "tcp-token") == str(secret)  # left alone
