"""The daemon as a process: startup failures are one clear stderr line and exit code
2, stdout in stdio mode carries nothing but frames, and a stdio daemon exits when the
process that spawned it dies."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from tests.e2e.helpers import (
    CTXD,
    REPLY_TIMEOUT,
    START_TIMEOUT,
    daemon_env,
    frame,
    one_line,
    parse_frames,
    process_gone,
    request_frame,
    run_ctxd,
    wait_for,
)

# --- startup failures ---------------------------------------------------------------------


@pytest.mark.parametrize("content, transport", [
    pytest.param(b"this is not a database\n" * 400, [], id="text-stdio"),
    pytest.param(b"SQLite format 3\x00" + bytes(range(256)) * 40, ["--socket", "{sock}"],
                 id="sqlite-header-then-garbage-socket"),
])
def test_corrupt_database_is_refused(tmp_path, content, transport, base_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "ctxd.db").write_bytes(content)
    sock = base_dir / "run" / "ctxd.sock"
    result = run_ctxd(["--data-dir", str(data), *[a.replace("{sock}", str(sock)) for a in transport]])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data / "ctxd.db") in line
    assert result.stdout == b""
    assert (data / "ctxd.db").read_bytes() == content  # left as it was, for recovery
    assert not sock.exists()


def test_database_from_a_newer_ctxd_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    conn = sqlite3.connect(data / "ctxd.db")
    conn.execute("PRAGMA user_version = 9999")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    result = run_ctxd(["--data-dir", str(data)])
    assert result.returncode == 2
    line = one_line(result)
    assert str(data / "ctxd.db") in line and "newer" in line


def test_data_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run_ctxd(["--data-dir", str(blocker / "data")])
    assert result.returncode == 2
    line = one_line(result)
    assert str(blocker / "data") in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to any directory")
def test_data_dir_without_write_permission(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o500)
    try:
        result = run_ctxd(["--data-dir", str(data)])
    finally:
        os.chmod(data, 0o700)
    assert result.returncode == 2
    assert str(data) in one_line(result)


def test_socket_path_that_is_not_a_socket_is_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    result = run_ctxd(["--socket", str(path), "--data-dir", str(tmp_path / "d")])
    assert result.returncode != 0
    line = one_line(result)
    assert str(path) in line and "not a socket" in line
    assert path.read_text() == "my notes\n"


def test_tcp_port_out_of_range_is_a_usage_error(tmp_path):
    result = run_ctxd(["--tcp", "99999", "--data-dir", str(tmp_path / "d")])
    assert result.returncode == 2
    text = result.stderr.decode()
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == "ctxd: error: argument --tcp: 99999 is not a port number (0-65535)"


@pytest.mark.parametrize("env, args, named", [
    ({"CTXD_STORAGE_DURABILITY": "bad"}, [], "CTXD_STORAGE_DURABILITY"),
    ({"CTXD_LIMITS_MAX_BATCH_MESSAGES": "many"}, [], "CTXD_LIMITS_MAX_BATCH_MESSAGES"),
    ({}, ["--set", "limits.no_such_key=1"], "limits.no_such_key"),
    ({}, ["--set", "nosection.key=1"], "nosection"),
    ({}, ["--set", "novalue"], "novalue"),
], ids=["env-durability", "env-int", "set-unknown-key", "set-unknown-section", "set-malformed"])
def test_bad_configuration(tmp_path, env, args, named):
    result = run_ctxd(["--data-dir", str(tmp_path / "d"), *args], env=daemon_env(**env))
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("ctxd: configuration error:")
    assert named in line
    assert not (tmp_path / "d").exists()  # nothing was started


def test_bad_configuration_file(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[storage]\ndurability = 'sometimes'\n")
    result = run_ctxd(["--config", str(config), "--data-dir", str(tmp_path / "d")])
    assert result.returncode == 2
    line = one_line(result)
    assert str(config) in line and "durability" in line
    config.write_text("[storage\n")
    result = run_ctxd(["--config", str(config), "--data-dir", str(tmp_path / "d")])
    assert result.returncode == 2
    assert str(config) in one_line(result)
    missing = tmp_path / "missing.toml"
    result = run_ctxd(["--config", str(missing), "--data-dir", str(tmp_path / "d")])
    assert result.returncode == 2
    assert str(missing) in one_line(result)


@pytest.mark.usefixtures("storage_backend")
async def test_configuration_file_is_applied(tmp_path, daemon_factory):
    config = tmp_path / "config.toml"
    config.write_text("[storage]\ndurability = 'full'\n[limits]\nmax_batch_messages = 3\n")
    daemon = daemon_factory(name="cfg", args=["--config", str(config)])
    client = await daemon.client()
    try:
        status = await client.result("daemon/status")
        assert status["durability"] == "full"
        assert status["dataDir"] == str(daemon.data_dir)
        await client.result("session/create", {"sessionId": "s"})
        error = await client.error("session/push", {"sessionId": "s", "messages": [
            {"role": "user", "content": str(i)} for i in range(4)]})
        assert error["code"] == -33004 and error["data"]["limit"] == 3
    finally:
        await client.close()


@pytest.mark.usefixtures("storage_backend")
def test_log_file_takes_the_logs(daemon_factory, base_dir):
    log = base_dir / "ctxd.log"
    daemon = daemon_factory(name="log", args=["--log-file", str(log), "-v"])
    wait_for(lambda: log.exists() and "listening on unix" in log.read_text(), what="the log file")
    assert str(daemon.socket_path) in log.read_text()
    assert daemon.stop() == 0
    assert daemon.stderr_text() == ""


# --- stdout hygiene -------------------------------------------------------------------------


async def test_stdout_carries_only_frames_even_at_debug_level(tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *CTXD, "-vv", "--data-dir", str(tmp_path / "d"), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=daemon_env())
    stdout = bytearray()
    stderr = bytearray()

    async def pump(stream: asyncio.StreamReader, into: bytearray) -> None:
        while chunk := await stream.read(1 << 16):
            into += chunk

    pumps = [asyncio.create_task(pump(proc.stdout, stdout)), asyncio.create_task(pump(proc.stderr, stderr))]

    def answered(msg_id: object) -> bool:
        return any(m.get("id") == msg_id and "method" not in m for m in parse_frames_lenient(bytes(stdout)))

    async def send(data: bytes, msg_id: object) -> None:
        proc.stdin.write(data)
        await proc.stdin.drain()
        deadline = asyncio.get_running_loop().time() + REPLY_TIMEOUT
        while not answered(msg_id):
            assert asyncio.get_running_loop().time() < deadline, f"no answer to {msg_id}"
            await asyncio.sleep(0.01)

    try:
        await send(request_frame(1, "initialize", {"processId": None}), 1)
        advertised = set(parse_frames(bytes(stdout))[0]["result"]["capabilities"]["notifications"])
        await send(request_frame(2, "session/create", {"sessionId": "s", "systemPrompt": "sys"}), 2)
        await send(request_frame(3, "session/subscribe", {"sessionId": "s"}), 3)
        await send(request_frame(4, "session/push", {"sessionId": "s", "messages": [
            {"role": "user", "content": "print('hello')"},
            {"role": "assistant", "toolCalls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "toolCallId": "c", "content": "done"}]}), 4)
        for i, fmt in enumerate(("openai", "anthropic", "ollama")):
            await send(request_frame(5 + i, "context/prompt", {"sessionId": "s", "format": fmt}), 5 + i)
        await send(request_frame(8, "context/stats", {"sessionId": "s"}), 8)
        await send(request_frame(9, "session/push", {"sessionId": "s", "messages": [{"role": "tool"}]}), 9)
        await send(b"Content-Length: 5\r\n\r\n{oops" + request_frame(10, "no/such/method"), 10)
        await send(request_frame(11, "daemon/status"), 11)
        await send(request_frame(12, "shutdown"), 12)
        proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), START_TIMEOUT) == 0
        await asyncio.wait_for(asyncio.gather(*pumps), START_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    messages = parse_frames(bytes(stdout))  # strict: every byte belongs to a frame
    responses = {m["id"]: m for m in messages if "id" in m and m["id"] is not None}
    assert sorted(responses) == list(range(1, 13))
    notified = [m["method"] for m in messages if "method" in m]
    assert "session/updated" in notified
    assert set(notified) <= advertised
    assert [m["error"]["code"] for m in messages if "error" in m and m["id"] is None] == [-32700]
    assert responses[9]["error"]["code"] == -32602
    assert responses[10]["error"]["code"] == -32601
    log = stderr.decode()
    assert " DEBUG " in log  # -vv did log, to stderr
    assert "connection" in log


# --- parent death -----------------------------------------------------------------------------

_PARENT = textwrap.dedent("""
    import subprocess, sys, time
    # ctxd inherits this process's stdin/stdout, so the test talks to it directly.
    child = subprocess.Popen(sys.argv[1:])
    sys.stderr.write(f"{child.pid}\\n")
    sys.stderr.flush()
    time.sleep(3600)
""")


async def test_stdio_daemon_exits_when_its_parent_dies(tmp_path):
    env = daemon_env()
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PARENT, *CTXD, "--data-dir", str(tmp_path / "d"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    ctxd_pid = None
    try:
        ctxd_pid = int(await asyncio.wait_for(parent.stderr.readline(), START_TIMEOUT))
        parent.stdin.write(request_frame(1, "initialize", {"processId": parent.pid}))
        await parent.stdin.drain()
        header = await asyncio.wait_for(parent.stdout.readline(), START_TIMEOUT)
        assert header.startswith(b"Content-Length:")
        await parent.stdout.readline()
        body = await parent.stdout.readexactly(int(header.split(b":")[1]))
        assert b'"serverInfo"' in body
        assert not process_gone(ctxd_pid)

        parent.send_signal(signal.SIGKILL)
        await parent.wait()  # reaped: the pid is gone, as when an editor crashes
        # ctxd's stdin stays open (this test holds the pipe), so only the parent watch
        # can make it leave.
        wait_for(lambda: process_gone(ctxd_pid), START_TIMEOUT, what="ctxd to notice its parent died")
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
        if ctxd_pid is not None and not process_gone(ctxd_pid):
            os.kill(ctxd_pid, signal.SIGKILL)
        parent.stdin.close()


async def test_stdio_daemon_exits_when_stdin_closes(tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *CTXD, "--data-dir", str(tmp_path / "d"), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=daemon_env())
    try:
        proc.stdin.write(request_frame(1, "initialize", {}) + request_frame(2, "session/create", {"sessionId": "s"}))
        await proc.stdin.drain()
        proc.stdin.close()
        code = await asyncio.wait_for(proc.wait(), START_TIMEOUT)
        out = await proc.stdout.read()
        err = await proc.stderr.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 1  # no shutdown before the end of input
    assert b"Traceback" not in err
    assert {m["id"] for m in parse_frames(out)} <= {1, 2}


def parse_frames_lenient(data: bytes) -> list[dict]:
    """The complete frames at the start of ``data`` (a stream still being read)."""
    out = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out
        length = int(data[:end].split(b":")[1])
        if len(data) < end + 4 + length:
            return out
        out += parse_frames(data[:end + 4 + length])
        data = data[end + 4 + length:]


def test_parse_frames_is_strict():
    data = frame({"jsonrpc": "2.0", "id": 1, "result": None}) * 2
    assert len(parse_frames(data)) == 2
    for bad in (data + b"junk", data[:-1], b"Content-Type: x\r\n" + data, b"\n" + data):
        with pytest.raises(AssertionError):
            parse_frames(bad)


@pytest.mark.parametrize("process_id", [2**40, 0, -1])
async def test_process_id_that_is_no_pid_is_not_watched(tmp_path, process_id):
    """A processId that cannot name a parent (0 and negatives are process groups to
    kill(); a huge one overflows it) is ignored: no traceback, and the daemon serves on."""
    proc = await asyncio.create_subprocess_exec(
        *CTXD, "--data-dir", str(tmp_path / "d"), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=daemon_env())
    try:
        proc.stdin.write(request_frame(1, "initialize", {"processId": process_id}))
        await proc.stdin.drain()
        header = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        blank = await proc.stdout.readline()
        first = header + blank + await proc.stdout.readexactly(int(header.split(b":")[1]))
        proc.stdin.write(request_frame(2, "session/list", {}) + request_frame(3, "shutdown"))
        await proc.stdin.drain()
        # exit only once shutdown is answered (ids 2 and 3 are answered in order here).
        rest = b""
        while len(parse_frames_lenient(rest)) < 2:
            chunk = await asyncio.wait_for(proc.stdout.read(1 << 16), START_TIMEOUT)
            assert chunk, "ctxd closed stdout early"
            rest += chunk
        proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
        await proc.stdin.drain()
        code = await asyncio.wait_for(proc.wait(), START_TIMEOUT)
        out, err = first + rest + await proc.stdout.read(), await proc.stderr.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0
    assert {m["id"]: "result" in m for m in parse_frames(out)} == {1: True, 2: True, 3: True}
    assert b"Traceback" not in err, err.decode()


# --- stdio fed by a pipe or a file --------------------------------------------------------


def test_frames_piped_in_without_waiting_are_all_answered_in_order(tmp_path):
    """An agent (or ``cat frames | ctxd``) writes initialize, create and pushes at once
    and closes its end: each request runs after the ones before it, every one is
    answered, and the pushes are stored before the daemon exits."""
    data = tmp_path / "d"
    pushes = [request_frame(10 + i, "session/push", {"sessionId": "piped", "messages": [
        {"role": "user", "content": f"message {i}"}]}) for i in range(20)]
    stdin = b"".join([
        request_frame(1, "initialize", {"processId": None, "capabilities": {}}),
        frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
        request_frame(2, "session/create", {"sessionId": "piped"}),
        *pushes,
        request_frame(99, "session/get", {"sessionId": "piped"}),
    ])
    result = run_ctxd(["--data-dir", str(data)], stdin=stdin)
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    answers = parse_frames(result.stdout)
    assert [a["id"] for a in answers] == [1, 2, *range(10, 30), 99]
    assert all("result" in a for a in answers), [a for a in answers if "error" in a]
    assert [a["result"]["messages"][0]["seq"] for a in answers[2:22]] == list(range(1, 21))
    assert answers[-1]["result"]["messageCount"] == 20
    with sqlite3.connect(data / "ctxd.db") as conn:
        assert conn.execute("SELECT count(*) FROM messages WHERE session_id = 'piped'").fetchone()[0] == 20


def test_stdin_from_dev_null_or_a_file_exits_cleanly(tmp_path):
    with open(os.devnull, "rb") as null:
        result = subprocess.run([*CTXD, "--data-dir", str(tmp_path / "d")], stdin=null, capture_output=True,
                                timeout=60, env=daemon_env())
    assert result.stdout == b"" and b"Traceback" not in result.stderr, result.stderr.decode()
    frames = tmp_path / "frames.bin"
    frames.write_bytes(request_frame(1, "initialize", {"processId": None, "capabilities": {}})
                       + request_frame(2, "session/list", {}))
    with open(frames, "rb") as source:
        result = subprocess.run([*CTXD, "--data-dir", str(tmp_path / "d")], stdin=source, capture_output=True,
                                timeout=60, env=daemon_env())
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    assert [a["id"] for a in parse_frames(result.stdout)] == [1, 2]
