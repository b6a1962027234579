"""``ctxd --socket``: permissions, many clients at once, clients that crash or leave,
notification routing, one daemon per socket, and daemon/status + daemon/stop."""

from __future__ import annotations

import asyncio
import fcntl
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from ctxd.client import Client, DaemonUnavailable, connect_or_start
from tests.e2e.helpers import (
    REPLY_TIMEOUT,
    Daemon,
    RawClient,
    async_wait_for,
    daemon_env,
    db_query,
    db_rows,
    db_session,
    db_write,
    pg_url_of,
    process_gone,
    request_frame,
    run_ctxd,
    short_dir,
    user,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("module_backend")


@pytest.fixture(scope="module")
def daemon(module_backend):
    """One socket daemon for the tests of this module that leave it running (each works
    in sessions of its own); tests that stop or restart a daemon make their own."""
    base = short_dir()
    shared = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    try:
        yield shared.start()
    finally:
        shared.stop()
        shutil.rmtree(base, ignore_errors=True)


async def connections_become(client: Client, count: int, timeout: float = REPLY_TIMEOUT) -> None:
    """Wait until the daemon counts ``count`` connections (closed ones leave asynchronously)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (await client.request("daemon/status"))["connections"] != count:
        assert asyncio.get_running_loop().time() < deadline, f"the daemon never got to {count} connections"
        await asyncio.sleep(0.05)


async def connect(daemon) -> Client:
    client = await Client.connect_unix(daemon.socket_path)
    await client.initialize(client_name="e2e")
    return client


@pytest.mark.parametrize("existing_dir_mode", [None, 0o755], ids=["new-dir", "existing-open-dir"])
def test_socket_file_and_directory_are_private(daemon_factory, base_dir, existing_dir_mode):
    run_dir = base_dir / "runp"
    if existing_dir_mode is not None:
        run_dir.mkdir()
        os.chmod(run_dir, existing_dir_mode)
    daemon = daemon_factory(name="p")
    path = daemon.socket_path
    assert path.parent == run_dir
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    # A directory the daemon creates is 0700; one that exists is left as it is.
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == (existing_dir_mode or 0o700)
    lock = path.with_name(path.name + ".lock")
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    assert lock.read_text().strip() == str(daemon.pid)
    # The database is private too.
    if pg_url_of(daemon.data_dir) is None:
        assert stat.S_IMODE(os.stat(daemon.data_dir / "ctxd.db").st_mode) == 0o600


async def test_default_socket_path_under_xdg_runtime_dir(base_dir):
    """``ctxd --socket`` without a path listens on $XDG_RUNTIME_DIR/ctxd/ctxd.sock."""
    runtime = base_dir / "xdg-run"
    runtime.mkdir(mode=0o700)
    daemon = Daemon(base_dir / "data", socket_path=runtime / "ctxd" / "ctxd.sock", socket_flag_only=True,
                    env=daemon_env(XDG_RUNTIME_DIR=str(runtime)))
    try:
        daemon.start()
        assert stat.S_IMODE(os.stat(runtime / "ctxd").st_mode) == 0o700
        client = await daemon.client()
        try:
            status = await client.result("daemon/status")
            assert status["transports"] == [f"unix:{runtime / 'ctxd' / 'ctxd.sock'}"]
        finally:
            await client.close()
    finally:
        daemon.stop()


async def test_two_clients_push_concurrently(daemon):
    a, b = await connect(daemon), await connect(daemon)
    try:
        for sid in ("shared", "a-only", "b-only"):
            await a.request("session/create", {"sessionId": sid})
        rounds, per_push = 40, 10
        acks: dict[str, list[tuple[int, int, str]]] = {"shared": [], "a-only": [], "b-only": []}

        async def pusher(client: Client, name: str, own: str) -> None:
            for r in range(rounds):
                for sid in ("shared", own):
                    texts = [f"{name} round {r} msg {i} in {sid}" for i in range(per_push)]
                    # Two pushes in flight at once on the same connection, too.
                    result = await client.request("session/push", {"sessionId": sid,
                                                                    "messages": [user(t) for t in texts]})
                    for ack, text in zip(result["messages"], texts):
                        acks[sid].append((ack["seq"], ack["tokens"], text))

        await asyncio.gather(pusher(a, "A", "a-only"), pusher(b, "B", "b-only"),
                             pusher(a, "A2", "a-only"), pusher(b, "B2", "b-only"))

        for sid, expected in (("shared", 4 * rounds * per_push), ("a-only", 2 * rounds * per_push),
                              ("b-only", 2 * rounds * per_push)):
            seqs = sorted(seq for seq, _, _ in acks[sid])
            assert seqs == list(range(1, expected + 1)), sid
            info = await b.request("session/get", {"sessionId": sid})
            assert info["messageCount"] == expected and info["lastSeq"] == expected
            assert info["tokenCount"] == sum(tokens for _, tokens, _ in acks[sid])
            stored = {seq: body["content"] for seq, body, _ in db_rows(daemon.data_dir, sid)}
            assert stored == {seq: text for seq, _, text in acks[sid]}
        # Each writer's messages keep the order it pushed them in within the shared session.
        by_seq = [text for _, _, text in sorted(acks["shared"])]
        for name in ("A", "B", "A2", "B2"):
            mine = [text for text in by_seq if text.startswith(f"{name} round ")]
            assert mine == [f"{name} round {r} msg {i} in shared" for r in range(rounds) for i in range(per_push)]
    finally:
        await a.close()
        await b.close()
    assert "locked" not in daemon.stderr_text()


_CRASHING_CLIENT = textwrap.dedent("""
    import socket, sys, json
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(sys.argv[1])
    def frame(obj):
        body = json.dumps(obj).encode()
        return b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body
    sock.sendall(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
    sock.recv(65536)
    big = [{"role": "user", "content": "x" * 500 + str(i)} for i in range(5000)]
    sock.sendall(frame({"jsonrpc": "2.0", "id": 2, "method": "session/push",
                        "params": {"sessionId": "crash", "messages": big}}))
    print("sent", flush=True)
    import time
    time.sleep(600)
""")


async def test_client_crash_mid_request_does_not_disturb_others(daemon):
    survivor = await connect(daemon)
    try:
        await survivor.request("session/create", {"sessionId": "s"})
        await survivor.request("session/create", {"sessionId": "crash"})
        await survivor.request("session/push", {"sessionId": "s", "messages": [user("before")]})

        # 1. A connection reset halfway through a frame (SO_LINGER 0 makes close() send RST).
        half = await RawClient.unix(daemon.socket_path)
        await half.initialize()
        data = request_frame(1, "session/push", {"sessionId": "s", "messages": [user("half " * 1000)]})
        await half.send_raw(data[: len(data) // 2])
        sock = half.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        half.writer.transport.abort()

        # 2. A client process killed right after sending a large request, before reading
        #    the answer: the daemon ends up writing into a dead socket.
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CRASHING_CLIENT,
                                                    str(daemon.socket_path), stdout=asyncio.subprocess.PIPE)
        try:
            assert await asyncio.wait_for(proc.stdout.readline(), REPLY_TIMEOUT) == b"sent\n"
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

        # The survivor carries on, on its existing connection...
        result = await survivor.request("session/push", {"sessionId": "s", "messages": [user("after")]})
        assert [m["seq"] for m in result["messages"]] == [2]
        # ...and the daemon keeps accepting new ones.
        newcomer = await connect(daemon)
        try:
            info = await newcomer.request("session/get", {"sessionId": "s"})
            assert info["messageCount"] == 2  # nothing of the half frame was stored
            assert [b["content"] for _, b, _ in db_rows(daemon.data_dir, "s")] == ["before", "after"]

            # Both dead connections are gone from the daemon's books.
            await connections_become(newcomer, 2)
            # The killed client's push was all-or-nothing.
            crash = await newcomer.request("session/get", {"sessionId": "crash"})
            assert crash["messageCount"] in (0, 5000)
            assert len(db_rows(daemon.data_dir, "crash")) == crash["messageCount"]
        finally:
            await newcomer.close()
    finally:
        await survivor.close()
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.stderr_text()


async def test_exit_closes_only_that_connection(daemon):
    leaving = await daemon.client()
    staying = await daemon.client()
    rude = await daemon.client()
    try:
        await staying.result("session/create", {"sessionId": "exit-s"})
        assert await leaving.result("shutdown") is None
        await leaving.send({"jsonrpc": "2.0", "method": "exit"})
        assert await leaving.closed_by_peer()
        # exit without shutdown also closes just that connection.
        await rude.send({"jsonrpc": "2.0", "method": "exit"})
        assert await rude.closed_by_peer()

        pushed = await staying.result("session/push", {"sessionId": "exit-s", "messages": [user("still here")]})
        assert pushed["messageCount"] == 1
        assert daemon.proc.poll() is None
        fresh = await connect(daemon)
        try:
            await connections_become(fresh, 2)  # staying and fresh
        finally:
            await fresh.close()
    finally:
        for c in (leaving, staying, rude):
            await c.close()


async def first_about(client: RawClient, session_id: str) -> dict:
    """The first notification ``client`` receives about ``session_id``."""
    while True:
        message = await client.next_message()
        assert "method" in message, message
        if message["params"].get("sessionId") == session_id:
            return message


async def test_notifications_go_only_to_subscribers(daemon):
    watcher = await daemon.client()   # subscribed to s1
    everything = await daemon.client()  # subscribed to *
    pusher = await daemon.client()    # subscribed to nothing
    quitter = await daemon.client()   # subscribed to s1, then unsubscribed
    other = await daemon.client()     # subscribed to s2 only
    clients = (watcher, everything, pusher, quitter, other)
    try:
        for sid in ("s1", "s2"):
            await pusher.result("session/create", {"sessionId": sid})
        await watcher.result("session/subscribe", {"sessionId": "s1"})
        await everything.result("session/subscribe", {"sessionId": "*"})
        await quitter.result("session/subscribe", {"sessionId": "s1"})
        assert await quitter.result("session/unsubscribe", {"sessionId": "s1"}) == {"subscriptions": []}
        assert await other.result("session/subscribe", {"sessionId": "s2"}) == {"subscriptions": ["s2"]}

        pushed = await pusher.result("session/push", {"sessionId": "s1", "messages": [user("hello")]})
        expected = {"jsonrpc": "2.0", "method": "session/updated",
                    "params": {"sessionId": "s1", "reason": "push", "lastSeq": 1, "messageCount": 1,
                               "tokenCount": pushed["tokenCount"], "contextTokens": pushed["contextTokens"],
                               "pushed": 1}}
        assert await first_about(watcher, "s1") == expected
        # The wildcard also hears about other tests' sessions (e.g. background compression).
        assert await first_about(everything, "s1") == expected
        # The notification is written before the push is answered, so a round trip on each
        # other connection proves none was sent to it.
        for client in (pusher, quitter, other):
            await client.result("session/list", {})
            assert client.inbox == [], client.inbox
    finally:
        for c in clients:
            await c.close()


def test_second_daemon_on_same_socket_is_refused(daemon_factory, base_dir):
    first = daemon_factory(name="one")
    second = run_ctxd(["--socket", str(first.socket_path), "--data-dir", str(base_dir / "other")], timeout=60)
    assert second.returncode == 2
    lines = second.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "already serving" in lines[0]
    assert str(first.socket_path) in lines[0]
    assert f"pid {first.pid}" in lines[0]
    assert second.stdout == b""
    # The first one is untouched.
    assert first.proc.poll() is None

    async def still_serves() -> dict:
        client = await first.client()
        try:
            return await client.result("daemon/status")
        finally:
            await client.close()

    assert asyncio.run(still_serves())["pid"] == first.pid


async def test_daemon_status_and_stop(daemon_factory):
    daemon = daemon_factory(name="stop")
    a = await daemon.client()
    b = await daemon.client()
    try:
        await a.result("session/create", {"sessionId": "x"})
        status = await b.result("daemon/status")
        assert status["pid"] == daemon.pid
        assert status["transports"] == [f"unix:{daemon.socket_path}"]
        assert status["connections"] == 2
        assert status["sessions"] == 1
        assert status["durability"] == "normal"
        assert status["dataDir"] == str(daemon.data_dir)
        assert status["database"] == (pg_url_of(daemon.data_dir) or str(daemon.data_dir / "ctxd.db"))
        assert status["uptimeSeconds"] >= 0
        assert status["version"]

        assert await a.result("daemon/stop") is None
        assert await b.closed_by_peer()
        assert await a.closed_by_peer()
        assert daemon.wait() == 0
    finally:
        await a.close()
        await b.close()
    assert not daemon.socket_path.exists()
    assert "Traceback" not in daemon.stderr_text()


# A daemon whose SIGTERM comes the moment it serves (a service manager stopping it as it
# starts): the signal must find ctxd's handler, not the default action (killed, -15).
SIGTERM_AT_START = """
import asyncio, os, signal, sys
from ctxd.__main__ import build_parser, config_of
from ctxd.daemon import Daemon

class Early(Daemon):
    async def start(self):
        await super().start()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.2)

args = build_parser().parse_args(["--socket", sys.argv[1], "--data-dir", sys.argv[2]])
sys.exit(asyncio.run(Early(config_of(args), unix=True).run()))
"""


def test_sigterm_as_the_daemon_starts_stops_it_cleanly(base_dir):
    socket_path = base_dir / "early.sock"
    done = subprocess.run([sys.executable, "-c", SIGTERM_AT_START, str(socket_path), str(base_dir / "data")],
                          env=daemon_env(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert not socket_path.exists()


def test_sigterm_stops_cleanly_and_socket_is_reusable(daemon_factory):
    daemon = daemon_factory(name="t")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert not daemon.socket_path.exists()
    daemon.start()  # same socket path, same data dir
    assert daemon.proc.poll() is None


async def test_connect_or_start_autostarts_a_daemon(base_dir, monkeypatch):
    """``ctxd.client.connect_or_start`` (what ctxd-cli uses) starts a detached daemon
    when none answers, and the next call reuses it."""
    # connect_or_start spawns the daemon with this process's environment.
    for name in [k for k in os.environ if k.startswith("CTXD_")]:
        monkeypatch.delenv(name)
    for name, value in daemon_env().items():
        if name == "PYTHONPATH" or name.startswith("XDG_"):
            monkeypatch.setenv(name, value)
    path = base_dir / "auto" / "ctxd.sock"
    client = None
    pid = None
    try:
        client = await connect_or_start(path, data_dir=str(base_dir / "autodata"))
        pid = (await client.request("daemon/status"))["pid"]
        again = await connect_or_start(path, autostart=False)
        try:
            assert (await again.request("daemon/status"))["pid"] == pid
            assert (await again.request("daemon/status"))["connections"] == 2
        finally:
            await again.close()
    finally:
        if client is not None:
            if pid is not None:
                await client.request("daemon/stop")
            await client.close(shutdown=False)
        if pid is not None:
            await async_wait_for(lambda: process_gone(pid), what="the autostarted daemon to stop")
        else:
            # Never leave a daemon behind if the test failed before learning its pid.
            lock = path.with_name(path.name + ".lock")
            if lock.exists() and lock.read_text().strip().isdigit():
                try:
                    os.kill(int(lock.read_text().strip()), signal.SIGTERM)
                except ProcessLookupError:
                    pass


async def test_connect_without_daemon_is_a_clear_error(base_dir):
    with pytest.raises(DaemonUnavailable) as info:
        await connect_or_start(base_dir / "none" / "ctxd.sock", autostart=False)
    assert str(base_dir / "none" / "ctxd.sock") in str(info.value)


def test_socket_path_too_long_is_a_clear_error(base_dir):
    path = base_dir / ("x" * 200) / "ctxd.sock"
    result = run_ctxd(["--socket", str(path), "--data-dir", str(base_dir / "d")])
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "too long" in lines[0], lines


async def test_client_that_stops_reading_is_dropped(daemon):
    """A client that sends requests but never reads the answers cannot make the daemon
    buffer without bound: past the pending-output limit its connection is closed, and
    everyone else is served as before."""
    worker = await connect(daemon)
    try:
        # A window large enough that the whole 5 MB history is the prompt.
        await worker.request("session/create", {"sessionId": "big", "contextWindow": 10_000_000})
        await worker.request("session/push", {"sessionId": "big", "messages": [
            user("y" * 5000 + str(i)) for i in range(1000)]})
        lazy = await RawClient.unix(daemon.socket_path)
        await lazy.initialize()
        # Really stop reading: RawClient's StreamReader would otherwise take up to 128 MB
        # into this process whenever the daemon wrote slower than this loop read (on
        # PostgreSQL each prompt checks the stored session first), and the daemon, whose
        # output was being read, rightly kept the connection.
        lazy.writer.transport.pause_reading()
        for i in range(25):  # ~125 MB of answers, never read
            await lazy.send_raw(request_frame(i, "context/prompt", {"sessionId": "big"}))
        await connections_become(worker, 1, timeout=2 * REPLY_TIMEOUT)
        assert "not reading" in daemon.stderr_text()
        pushed = await worker.request("session/push", {"sessionId": "big", "messages": [user("still served")]})
        assert pushed["messageCount"] == 1001
        lazy.writer.transport.abort()
    finally:
        await worker.close()


async def test_sigterm_under_load_stops_cleanly(daemon_factory):
    """SIGTERM while six connections push: the daemon exits 0 without a traceback, and
    the database is consistent (every session's totals equal the sum over its rows)."""
    daemon = daemon_factory(name="load")
    setup = await connect(daemon)
    for i in range(3):
        await setup.request("session/create", {"sessionId": f"s{i}"})
    await setup.close()
    pushes = 0
    acked: dict[str, int] = {f"s{i}": 0 for i in range(3)}

    async def pusher(index: int) -> None:
        nonlocal pushes
        client = await connect(daemon)
        try:
            while True:
                sid = f"s{index % 3}"
                result = await client.request("session/push", {"sessionId": sid, "messages": [user("x" * 200)] * 5})
                acked[sid] = max(acked[sid], result["messageCount"])
                pushes += 1
        except (DaemonUnavailable, ConnectionError):
            return
        finally:
            await client.close(shutdown=False)

    tasks = [asyncio.create_task(pusher(i)) for i in range(6)]
    await async_wait_for(lambda: pushes >= 60, what="pushes to get going")
    daemon.proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert daemon.wait() == 0
    stderr = daemon.stderr_text()
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    assert not daemon.socket_path.exists()
    for sid, count in acked.items():
        row = db_session(daemon.data_dir, sid)
        assert row["message_count"] == row["rows"] == row["last_seq"] >= count
        assert row["token_count"] == row["row_tokens"]


@pytest.mark.parametrize("args", [["--idle-exit", "0.5"],
                                  ["--autostarted", "--set", "daemon.autostart_idle_exit_seconds=0.5"]],
                         ids=["flag", "autostarted"])
def test_idle_exit(daemon_factory, args):
    """``--idle-exit``, or ``--autostarted`` (how ctxd-cli starts one on demand) with the
    configured ``autostart_idle_exit_seconds``: once the last client has gone, the daemon
    exits by itself and removes its socket."""
    daemon = daemon_factory(name="idle", args=args)

    async def visit() -> None:
        client = await connect(daemon)
        await client.request("session/create", {"sessionId": "s"})
        await client.close()

    asyncio.run(visit())
    assert daemon.wait(60) == 0
    assert not daemon.socket_path.exists()


async def test_sigterm_while_search_index_catches_up(daemon_factory):
    """Stopping a background task by cancelling it must work even while it waits on a
    write that has started (regression: the search indexer swallowed the cancel and the
    daemon never exited). The index is reset in the file so the restarted daemon has a
    long catch-up to be interrupted in."""
    daemon = daemon_factory(name="idx")
    client = await connect(daemon)
    await client.request("session/create", {"sessionId": "s", "contextWindow": 10_000_000})
    for k in range(4):
        await client.request("session/push", {"sessionId": "s", "messages": [
            user(f"message {k} {i} about topic {i % 97}") for i in range(10_000)]})
    await client.close()
    assert daemon.stop() == 0
    if pg_url_of(daemon.data_dir) is None:
        db_write(daemon.data_dir, "DELETE FROM messages_fts", "UPDATE search_state SET indexed_through = 0")
        progress = "SELECT indexed_through FROM search_state"
    else:  # the queue of messages to index (store/search_pg.py)
        db_write(daemon.data_dir, "DELETE FROM messages_fts",
                 "INSERT INTO search_pending SELECT id FROM messages ON CONFLICT DO NOTHING")
        progress = "SELECT count(*) FROM messages_fts"

    daemon.start()
    wait_for(lambda: db_query(daemon.data_dir, progress)[0][0] > 0, interval=0.005,
             what="the search index to catch up")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait(60) == 0
    assert "Traceback" not in daemon.stderr_text()


async def test_cancel_racing_the_write_is_all_or_nothing(daemon):
    """``$/cancelRequest`` sent at varying moments behind small pushes lands before,
    during or after their write. Whatever happens, each push is answered exactly once;
    one answered with a result is stored, one answered -32800 is not, and the session's
    totals agree with the database."""
    client = await daemon.client()
    sid = "cancel-race"
    await client.result("session/create", {"sessionId": sid, "contextWindow": 10_000_000})
    rng = random.Random(7)
    texts = {}
    for i in range(150):
        texts[i] = f"push {i} " + "w " * rng.randint(1, 400)
        await client.send_raw(request_frame(i, "session/push", {"sessionId": sid, "messages": [user(texts[i])]}))
        if rng.random() < 0.5:
            await asyncio.sleep(rng.random() * 0.004)
        await client.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": i}})
    answers = {}
    while len(answers) < len(texts):
        message = await client.next_message()
        if "method" in message:
            continue
        assert message["id"] not in answers, f"push {message['id']} answered twice"
        answers[message["id"]] = message
    stored_ids = sorted(i for i, m in answers.items() if "result" in m)
    for m in answers.values():
        assert "result" in m or m["error"]["code"] == -32800, m
    rows = db_rows(daemon.data_dir, sid)
    assert [body["content"] for _, body, _ in rows] == [texts[i] for i in stored_ids]
    assert [seq for seq, _, _ in rows] == list(range(1, len(stored_ids) + 1))
    assert sorted(answers[i]["result"]["messages"][0]["seq"] for i in stored_ids) == list(
        range(1, len(stored_ids) + 1))
    info = await client.result("session/get", {"sessionId": sid})
    assert info["messageCount"] == info["lastSeq"] == len(rows)
    assert info["tokenCount"] == sum(answers[i]["result"]["messages"][0]["tokens"] for i in stored_ids)
    await client.close()


def _wmem_max() -> int:
    try:
        with open("/proc/sys/net/core/wmem_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


@pytest.mark.skipif(_wmem_max() < 2 << 20, reason="the kernel caps a socket's send buffer below 2 MiB "
                                                  "(net.core.wmem_max): nothing to widen")
def test_a_large_answer_leaves_whole_once_the_client_is_initialized(daemon):
    """A trusted client's ~1 MB prompt is handed to the kernel whole (its send buffer
    widened): it sits in the client's receive queue before the client reads a byte. A
    client that has not initialized gets the default buffer (errors only, 1 MiB at most)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REPLY_TIMEOUT)
    sock.connect(str(daemon.socket_path))
    buf = b""
    sid = f"large-answer-{time.time_ns()}"  # (the backend is shared by the module's tests)

    def reply() -> bytes:
        nonlocal buf
        while True:
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                length = int(head.split(b":")[1])
                if len(rest) >= length:
                    buf = rest[length:]
                    return rest[:length]
            buf += sock.recv(1 << 20)

    def call(msg_id: int, method: str, params: dict) -> bytes:
        sock.sendall(request_frame(msg_id, method, params))
        body = reply()
        assert b'"error"' not in body[:100], body[:300]
        return body

    try:
        call(1, "initialize", {"processId": None, "clientInfo": {"name": "big-answers"}})
        call(2, "session/create", {"sessionId": sid, "model": "gpt-4o", "contextWindow": 2_000_000})
        text = " ".join(f"word{i}" for i in range(800))  # ~6 kB a message
        for batch in range(4):
            call(3 + batch, "session/push", {"sessionId": sid, "messages": [
                {"role": "user" if i % 2 else "assistant", "content": f"{batch}.{i} {text}"} for i in range(50)]})
        sock.sendall(request_frame(9, "context/prompt", {"sessionId": sid}))
        queued = 0
        for _ in range(100):  # until the answer stops arriving (without reading any of it)
            time.sleep(0.05)
            now = int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), "little")
            if now == queued and now:
                break
            queued = now
        body = reply()
        assert len(body) > 1_000_000
        assert queued >= len(body)  # the whole frame, where the default buffer holds < 450 kB
    finally:
        sock.close()
