"""Fairness: how long other clients wait while one client makes ctxd do heavy work.

    python -m tests.bench.fairness              # full run (~2 minutes on 2 cores)
    python -m tests.bench.fairness --quick      # smaller heavy requests (~1 minute)
    python -m tests.bench.fairness --only push,llm
    python -m tests.bench.fairness --strict     # exit 1 when a p99 is over the target
    python -m tests.bench.fairness --ctxd-path /tmp/old   # the daemons from another tree
    python -m tests.bench.fairness --storage postgresql   # on a throwaway PostgreSQL server

One socket daemon, two clients on it. A *light* client (a thread of this process, its
own connection and session) sends a ``session/get`` every 10 ms (the event loop
alone), another one a one-message ``session/push`` every 10 ms (the event loop and the
writer), and each latency is counted from when the request was due (so a stall
counts once per request it held up, not once). Meanwhile the *heavy*
client sends one large request per scenario:

- ``idle``: nothing (the light client's own floor);
- ``push``: a legal push near the frame limit (40 messages of just under
  ``limits.max_message_bytes`` = 160 MB; quick: 10 = 40 MB);
- ``import``: ``session/import`` of a 200,000-message document (refused by the
  ``limits.max_batch_messages`` cap), then of a legal 10,000-message one (after a
  3-message import: the document modules load on first use);
- ``import-large`` (only when named): a legal ``session/import`` of a ctxd export of the
  push's messages (40 x 4 MB; quick: 10);
- ``llm``: ``context/compress`` through an Ollama-compatible summarizer (the real HTTP
  server of ``tests/llm_servers.py``, in a process of its own) answering 20 MB of text
  (quick: 8 MB), which ctxd stops reading at ``summarizer.max_response_bytes`` and falls
  back from (after a first pass with a sane answer: the summarizer modules load with a
  daemon's first compression, once).

Reported per scenario, over the light requests sent while the heavy one ran: count,
p50, p99 and max latency, the heavy request's own time and outcome, and the daemon's
peak RSS (``VmHWM``; each scenario gets a fresh daemon). Target: light p99 < 100 ms.
With ``--storage postgresql`` each daemon gets a new database on a PostgreSQL server the
benchmark starts from the system's binaries (``tests/pgserver.py``), and the server's
processes count as the benchmark's own, not as other load.
A measurement, not a test: it prints the table, writes ``bench-results/fairness.json``
and exits 0 unless ``--strict``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tests.llm_servers import FakeLLMServer

REPO = Path(__file__).resolve().parents[2]
TARGET_P99_MS = 100.0
INTERVAL = 0.01
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

WORDS = ("the cache layer retries a request when the upstream answers slowly and the test suite "
         "checks that every reply carries its sequence number before the writer commits").split()


# --- a blocking framed client over a Unix socket ----------------------------------------------

class SocketClient:
    """Requests and responses over one Unix socket connection; notifications are skipped."""

    def __init__(self, path: Path, name: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = bytearray()
        self.ids = 0
        self.notes: list[tuple[str, Any]] = []
        self.request("initialize", {"processId": None, "clientInfo": {"name": name}})
        self.send(b"", notification=("initialized", {}))

    def send(self, data: bytes, notification: tuple[str, Any] | None = None) -> None:
        if notification is not None:
            body = _encode({"jsonrpc": "2.0", "method": notification[0], "params": notification[1]})
            data = b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        self.sock.sendall(data)

    def frame(self, method: str, params: Any) -> tuple[int, bytes]:
        self.ids += 1
        body = _encode({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params})
        return self.ids, b"Content-Length: %d\r\n\r\n%b" % (len(body), body)

    def _read_frame(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                length = int(bytes(self.buf[:end]).split(b":", 1)[1])
                if len(self.buf) >= end + 4 + length:
                    body = bytes(self.buf[end + 4:end + 4 + length])
                    del self.buf[:end + 4 + length]
                    return body
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buf += chunk

    def wait(self, msg_id: int) -> dict[str, Any]:
        while True:
            message = _decode(self._read_frame())
            if "method" in message:
                self.notes.append((message["method"], message.get("params")))
            elif message.get("id") == msg_id:
                return message

    def request(self, method: str, params: Any) -> Any:
        msg_id, data = self.frame(method, params)
        self.send(data)
        message = self.wait(msg_id)
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return message["result"]

    def close(self) -> None:
        self.sock.close()


# --- the daemon ------------------------------------------------------------------------------

class Daemon:
    def __init__(self, root: Path, name: str, sets: list[str], env: dict[str, str]) -> None:
        base = root / name
        base.mkdir()
        self.socket = base / "s.sock"
        (base / "empty.toml").write_text("")
        argv = [sys.executable, "-m", "ctxd", "--config", str(base / "empty.toml"), "--socket", str(self.socket),
                "--data-dir", str(base / "data")]
        for assignment in sets:
            argv += ["--set", assignment]
        self.log = open(base / "stderr.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env=env, cwd=str(base))
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ctxd exited with {self.proc.returncode}; see {base / 'stderr.log'}")
            try:
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                probe.connect(str(self.socket))
                probe.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("ctxd did not listen within 30 s") from None
                time.sleep(0.02)

    def peak_rss_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


# --- the light client --------------------------------------------------------------------------

class Light(threading.Thread):
    """Small requests of one kind on a fixed schedule (one every ``INTERVAL``) over their
    own connection; ``samples`` holds (when it was due, seconds from then to its answer).

    Latency counts from when a request was due, not from when it could be sent: a
    client stuck behind a 2 s stall would have sent 100 requests meanwhile, and each
    counts as waiting (no coordinated omission; one sample per stall would hide it)."""

    def __init__(self, client: SocketClient, session_id: str, method: str) -> None:
        super().__init__(name=f"light-{method}", daemon=True)
        self.client = client
        self.session_id = session_id
        self.method = method
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()
        self.until = float("inf")
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        start = time.perf_counter() + (INTERVAL / 2 if self.method == "session/push" else 0)
        try:
            while True:
                due = start + n * INTERVAL
                if self.stopping.is_set() and due > self.until:
                    break
                n += 1
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                if self.method == "session/get":
                    params: dict[str, Any] = {"sessionId": self.session_id}
                else:
                    params = {"sessionId": self.session_id, "messages": [
                        {"role": "user" if n % 2 else "assistant", "content": f"light message {n}"}]}
                msg_id, data = self.client.frame(self.method, params)
                self.client.send(data)
                message = self.client.wait(msg_id)
                took = time.perf_counter() - due
                if "error" in message:
                    raise RuntimeError(f"{self.method}: {message['error']}")
                self.samples.append((due, took))
        except BaseException as exc:  # noqa: BLE001 - reported by the scenario
            self.error = exc

    def finish(self, until: float = 0.0) -> None:
        """Stop once every request due up to ``until`` was sent: a client held up past
        the end of the heavy request still sends (and counts) what fell due meanwhile."""
        self.until = until
        self.stopping.set()
        self.join(120)
        if self.error is not None:
            raise RuntimeError(f"the light client failed: {self.error}")


class OtherLoad:
    """CPU used by processes other than this benchmark and its children while a scenario
    ran, in cores (/proc/stat; None elsewhere): on a shared machine, the noise floor."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                parts = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        busy = (sum(parts[:8]) - parts[3] - parts[4]) / tick
        t = os.times()
        return time.monotonic(), busy, t.user + t.system + t.children_user + t.children_system

    def cores(self, daemon_cpu: float) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        other = (end[1] - self.start[1]) - (end[2] - self.start[2]) - daemon_cpu
        return round(max(0.0, other) / (end[0] - self.start[0]), 2)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Row:
    scenario: str
    heavy: str
    heavy_seconds: float
    outcome: str
    light_requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    p99_get_ms: float
    p99_push_ms: float
    peak_rss_mb: float | None
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)


# --- scenarios ---------------------------------------------------------------------------------

@dataclass
class Plan:
    push_messages: int = 40
    llm_reply_bytes: int = 20_000_000
    import_refused: int = 200_000
    import_legal: int = 10_000


QUICK = Plan(push_messages=10, llm_reply_bytes=8_000_000)
FULL = Plan()


def prose(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def measure(lab: Lab, scenario: str, heavy_name: str, heavy: Callable[[SocketClient], str],
            sets: list[str] | None = None, prepare: Callable[[SocketClient], None] | None = None,
            helpers: tuple[int, ...] = ()) -> Row:
    """``helpers``: pids of this benchmark's own servers (not counted as other load)."""
    daemon = lab.daemon(scenario, sets or [])
    try:
        getter = SocketClient(daemon.socket, "fairness-light-get")
        pusher = SocketClient(daemon.socket, "fairness-light-push")
        heavy_client = SocketClient(daemon.socket, "fairness-heavy")
        for client, sid in ((getter, "light-get"), (pusher, "light-push")):
            client.request("session/create", {"sessionId": sid, "model": "gpt-4", "contextWindow": 1_000_000})
        if prepare is not None:
            prepare(heavy_client)
        lights = [Light(getter, "light-get", "session/get"), Light(pusher, "light-push", "session/push")]
        for light in lights:
            light.start()
        time.sleep(0.5)  # the light clients' own rhythm first
        pids = (daemon.proc.pid, *helpers, *lab.server_pids())
        load = OtherLoad()
        ours = sum(cpu_seconds(pid) for pid in pids)
        started = time.perf_counter()
        outcome = heavy(heavy_client)
        ended = time.perf_counter()
        other = load.cores(sum(cpu_seconds(pid) for pid in pids) - ours)
        time.sleep(0.3)
        for light in lights:
            light.finish(until=ended)

        def during(light: Light) -> list[float]:
            got = [s * 1000 for t, s in light.samples if started <= t <= ended]
            return got if len(got) >= 5 else [s * 1000 for _, s in light.samples]  # too short to sample

        gets, pushes = during(lights[0]), during(lights[1])
        lat = gets + pushes
        p99 = percentile(lat, 99)
        rss = daemon.peak_rss_mb()
        row = Row(scenario, heavy_name, round(ended - started, 2), outcome, len(lat), round(percentile(lat, 50), 2),
                  round(p99, 2), round(max(lat), 2), round(percentile(gets, 99), 2), round(percentile(pushes, 99), 2),
                  None if rss is None else round(rss, 1), p99 < TARGET_P99_MS,
                  {"other_processes_cpu_cores": other, "heavy_started_perf_counter": started,
                   "slow": slow_requests(lights, started, ended)})
        for client in (getter, pusher, heavy_client):
            client.close()
        return row
    finally:
        daemon.stop()


SLOW_MS = 50.0
"""Light requests at least this slow are listed with when they fell due (``details.slow``)."""


def slow_requests(lights: list[Light], started: float, ended: float, most: int = 3000) -> list[list[Any]]:
    """The slow light requests due while the heavy one ran, in time order: seconds after the
    heavy request started, latency in ms, which kind. ``details.heavy_started_perf_counter``
    is that start on this machine's monotonic clock (``time.perf_counter``, the same clock in
    every process), to line them up with timestamps an instrumented daemon logs."""
    out = sorted([round(t - started, 3), round(s * 1000, 1), light.method.split("/")[1]]
                 for light in lights for t, s in light.samples if started <= t <= ended and s * 1000 >= SLOW_MS)
    return out[:most]


def scenario_idle(lab: Lab, plan: Plan) -> list[Row]:
    def heavy(_: SocketClient) -> str:
        time.sleep(3)
        return "-"
    return [measure(lab, "idle", "nothing (3 s)", heavy)]


def send_prepared(client: SocketClient, holder: dict[str, Any]) -> dict[str, Any]:
    """Send the frame built before the clock started (``holder["frame"]``), wait for its answer."""
    client.send(holder["frame"])
    return client.wait(holder["id"])


def scenario_push(lab: Lab, plan: Plan) -> list[Row]:
    rng = random.Random(7)
    size = 4 * 1024 * 1024 - 2048  # each message's JSON just under limits.max_message_bytes
    messages = [{"role": "tool" if i % 2 else "user", "content": prose(rng, size),
                 **({"toolCallId": f"call_{i}"} if i % 2 else {})} for i in range(plan.push_messages)]
    holder: dict[str, Any] = {}

    def prepare(client: SocketClient) -> None:
        client.request("session/create", {"sessionId": "heavy", "model": "gpt-4", "contextWindow": 1_000_000,
                                          "settings": {"autoCompress": False}})
        msg_id, data = client.frame("session/push", {"sessionId": "heavy", "messages": messages})
        holder["frame"], holder["id"] = data, msg_id

    def heavy(client: SocketClient) -> str:
        message = send_prepared(client, holder)
        if "error" in message:
            return f"error {message['error']['code']}"
        return f"{len(message['result']['messages'])} messages stored"

    mb = sum(len(m["content"]) for m in messages) / 1e6
    return [measure(lab, "push", f"session/push {plan.push_messages} x 4 MB ({mb:.0f} MB)", heavy, prepare=prepare)]


def import_document(n: int) -> str:
    messages = [{"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
                 "message": {"role": "user" if i % 2 == 0 else "assistant",
                             "content": f"message {i} about the cache layer and its retries"}} for i in range(n)]
    return json.dumps({"format": "ctxd.session", "version": 1, "exportedAt": "2025-01-01T00:00:00Z",
                       "session": {"sessionId": f"imported-{n}", "createdAt": "2025-01-01T00:00:00Z",
                                   "model": "gpt-4", "contextWindow": 1_000_000},
                       "messages": messages, "checkpoints": [], "compressions": [], "events": []})


def import_request(document: str) -> tuple[Callable[[SocketClient], None], Callable[[SocketClient], str]]:
    """(prepare, heavy) for a ``session/import`` of ``document``. The frame is built before
    the clock starts, as the push's is: encoding a 30 MB document (escaping its quotes) holds
    this process's interpreter lock ~80 ms, and the light clients are threads of this
    process (before e41e80b that counted against the daemon). A small import first: the
    document modules load on first use."""
    holder: dict[str, Any] = {}

    def prepare(client: SocketClient) -> None:
        client.request("session/import", {"document": import_document(3), "format": "json", "sessionId": "warm-up"})
        holder["id"], holder["frame"] = client.frame("session/import", {"document": document, "format": "json"})

    def heavy(client: SocketClient) -> str:
        message = send_prepared(client, holder)
        if "error" in message:
            return f"refused {message['error']['code']}: {message['error']['message'][:60]}"
        return f"{message['result']['messageCount']} messages imported"

    return prepare, heavy


def scenario_import(lab: Lab, plan: Plan) -> list[Row]:
    rows = []
    for n in (plan.import_refused, plan.import_legal):
        document = import_document(n)
        prepare, heavy = import_request(document)
        rows.append(measure(lab, "import", f"session/import of {n:,} messages ({len(document) / 1e6:.0f} MB)",
                            heavy, sets=["compression.auto=false"], prepare=prepare))
    return rows


def scenario_import_large(lab: Lab, plan: Plan) -> list[Row]:
    """(Not in the default set.) A legal import near the frame limit: ``push_messages``
    messages of just under ``limits.max_message_bytes``, as the push's, in a ctxd export."""
    rng = random.Random(11)
    size = 4 * 1024 * 1024 - 2048
    messages = [{"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
                 "message": {"role": "user" if i % 2 == 0 else "assistant", "content": prose(rng, size)}}
                for i in range(plan.push_messages)]
    document = json.dumps({"format": "ctxd.session", "version": 1, "exportedAt": "2025-01-01T00:00:00Z",
                           "session": {"sessionId": "imported-large", "createdAt": "2025-01-01T00:00:00Z",
                                       "model": "gpt-4", "contextWindow": 1_000_000},
                           "messages": messages, "checkpoints": [], "compressions": [], "events": []})
    del messages
    prepare, heavy = import_request(document)
    return [measure(lab, "import-large", f"session/import of {plan.push_messages} x 4 MB "
                    f"({len(document) / 1e6:.0f} MB)", heavy, sets=["compression.auto=false"], prepare=prepare)]


class LLMServerProcess:
    """The fake LLM server of ``tests/llm_servers.py`` in a process of its own: building a
    20 MB answer holds the interpreter for a while, and in this process that would stall
    the light clients' threads and be counted against the daemon. Commands on stdin:
    ``ok`` and ``huge`` switch its mode; it prints its port first."""

    def __init__(self, env: dict[str, str], model: str, huge_bytes: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.fairness", "--serve-llm", model,
                                      str(huge_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=str(REPO))
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def mode(self, name: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == name

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def serve_llm(model: str, huge_bytes: int) -> int:
    with FakeLLMServer(model=model, huge_bytes=huge_bytes) as server:
        print(server.port, flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "huge":
                server.garbage("huge")
            elif command == "ok":
                server.ok()
            print(command, flush=True)
    return 0


def scenario_llm(lab: Lab, plan: Plan) -> list[Row]:
    server = LLMServerProcess(lab.env, "fair-llm", plan.llm_reply_bytes)
    try:
        sets = ["summarizer.backend=ollama", f"summarizer.base_url={server.url}", "summarizer.model=fair-llm",
                "summarizer.max_retries=0", "compression.auto=false"]
        rng = random.Random(3)

        def push_turns(client: SocketClient, start: int) -> None:
            for i in range(start, start + 40):
                client.request("session/push", {"sessionId": "heavy", "messages": [
                    {"role": "user", "content": f"step {i}: " + prose(rng, 300)},
                    {"role": "assistant", "content": prose(rng, 600)}]})

        def prepare(client: SocketClient) -> None:
            client.request("session/create", {"sessionId": "heavy", "model": "fair-llm", "contextWindow": 8192})
            # A first pass with a sane answer: the summarizer modules load with the first
            # compression, once per daemon; what is measured is a runaway answer later on.
            server.mode("ok")
            push_turns(client, 0)
            client.request("context/compress", {"sessionId": "heavy"})
            push_turns(client, 40)
            server.mode("huge")

        def heavy(client: SocketClient) -> str:
            client.request("session/subscribe", {"sessionId": "heavy"})
            result = client.request("context/compress", {"sessionId": "heavy"})
            failed = [p for m, p in client.notes if m == "context/compressionFailed"]
            why = f"; fell back: {failed[0].get('reason', '')}" if failed else ""
            return f"summarizer {result.get('summarizer')}{why}"[:110]

        return [measure(lab, "llm", f"context/compress, {plan.llm_reply_bytes / 1e6:.0f} MB LLM reply", heavy,
                        sets=sets, prepare=prepare, helpers=(server.proc.pid,))]
    finally:
        server.stop()


SCENARIOS: dict[str, Callable[[Lab, Plan], list[Row]]] = {
    "idle": scenario_idle, "push": scenario_push, "import": scenario_import, "llm": scenario_llm,
}
EXTRA: dict[str, Callable[[Lab, Plan], list[Row]]] = {"import-large": scenario_import_large}
"""Scenarios run only when ``--only`` names them."""


class Lab:
    def __init__(self, keep: bool, ctxd_path: str | None = None, storage: str = "sqlite") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-fair-", dir="/tmp"))
        self.keep = keep
        self.pg: Any = None
        if storage == "postgresql":
            from tests.pgserver import start_server

            self.pg = start_server()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
        for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state"),
                         ("XDG_RUNTIME_DIR", "run"), ("XDG_CACHE_HOME", "cache")):
            (self.root / sub).mkdir(mode=0o700)
            env[var] = str(self.root / sub)
        tree = str(Path(ctxd_path).resolve()) if ctxd_path else str(REPO)  # whose ctxd the daemons run
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
        self.env = env
        self.n = 0

    def daemon(self, name: str, sets: list[str]) -> Daemon:
        self.n += 1
        if self.pg is not None:
            sets = [*sets, f"storage.url={self.pg.create_database()}"]
        return Daemon(self.root, f"{self.n:02d}-{name}", sets, self.env)

    def server_pids(self) -> tuple[int, ...]:
        """The PostgreSQL server's processes (its postmaster and backends), if any."""
        if self.pg is None:
            return ()
        try:
            out = subprocess.run(["pgrep", "-f", str(self.pg.root)], capture_output=True, text=True, timeout=5,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return ()
        found = {int(pid) for pid in out.split()}
        for pid in list(found):  # its backends carry the postmaster's pid as their parent, not its path
            try:
                children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=5,
                                          check=False).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            found.update(int(c) for c in children.split())
        return tuple(sorted(found))

    def close(self) -> None:
        if self.pg is not None:
            from tests.pgserver import stop_server

            stop_server(self.pg)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def table(rows: list[Row]) -> str:
    head = ["scenario", "heavy request", "heavy s", "outcome", "light n", "p50 ms", "p99 ms", "max ms",
            "p99 get", "p99 push", "peak RSS MB", "other cpu", "p99 < 100 ms"]
    cells = [head] + [[r.scenario, r.heavy, f"{r.heavy_seconds:.2f}", r.outcome, str(r.light_requests),
                       f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", f"{r.max_ms:.1f}", f"{r.p99_get_ms:.1f}",
                       f"{r.p99_push_ms:.1f}", "-" if r.peak_rss_mb is None else f"{r.peak_rss_mb:,.0f}",
                       _cores(r.details.get("other_processes_cpu_cores")), "PASS" if r.passed else "FAIL"]
                      for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-llm"]:  # (the LLM server process of scenario llm)
        return serve_llm(argv[1], int(argv[2]))
    p = argparse.ArgumentParser(prog="python -m tests.bench.fairness", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller heavy requests")
    p.add_argument("--only", default="", help=f"comma-separated scenarios ({', '.join(SCENARIOS)}; "
                   f"also {', '.join(EXTRA)})")
    p.add_argument("--out", default="bench-results/fairness.json", help="JSON results file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a p99 is over the target")
    p.add_argument("--keep", action="store_true", help="keep the temp tree (data dirs, daemons' stderr)")
    p.add_argument("--storage", choices=("sqlite", "postgresql"), default="sqlite",
                   help="the daemons' storage (postgresql: a throwaway server, tests/pgserver.py)")
    p.add_argument("--ctxd-path", metavar="DIR", help="run the daemons from the ctxd package in DIR (an exported "
                   "commit, say) instead of this checkout's")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SCENARIOS)
    unknown = [s for s in chosen if s not in SCENARIOS and s not in EXTRA]
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join([*SCENARIOS, *EXTRA])}")
    lab = Lab(args.keep, args.ctxd_path, args.storage)
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        for name in chosen:
            print(f"[fairness {time.strftime('%H:%M:%S')}] {name}", file=sys.stderr, flush=True)
            rows += {**SCENARIOS, **EXTRA}[name](lab, plan)
    finally:
        lab.close()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=5, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    meta = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
            "python": platform.python_version(), "nproc": os.cpu_count(), "mode": "quick" if args.quick else "full",
            "plan": asdict(plan), "seconds": round(time.perf_counter() - started, 1), "target_p99_ms": TARGET_P99_MS,
            "ctxd_path": str(Path(args.ctxd_path).resolve()) if args.ctxd_path else None, "storage": args.storage}
    print()
    print(f"ctxd fairness ({meta['mode']}, {args.storage}), {meta['date_utc']}, {meta['nproc']} cpu, "
          f"commit {commit}, ctxd from {meta['ctxd_path'] or 'this checkout'}")
    print(table(rows))
    print("p99 get: the event loop (session/get); p99 push: the loop and the single writer (session/push); "
          "other cpu: cores other processes used meanwhile (noise)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    print(f"results: {out}")
    return 1 if args.strict and not all(r.passed for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
