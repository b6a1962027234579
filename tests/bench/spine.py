"""The spine benchmarks: what ctxd costs per request, per message, per session.

    python -m tests.bench.spine                 # full run (~4-5 min on 2 cores)
    python -m tests.bench.spine --quick         # CI-sized (< 2 min)
    python -m tests.bench.spine --only 1,4      # some benchmarks
    python -m tests.bench.spine --strict        # exit 1 when a target is missed

Every figure is compared with a baseline measured in the same run, on the same
machine, a few seconds apart, and reported as a ratio; the servers under test are
spawned over stdio and driven by one minimal framed client (``framed.py``). See
docs/performance.md for what each benchmark measures and why.

It is a measurement, not a test: it prints PASS/FAIL per target and exits 0
regardless, unless ``--strict``. Results go to ``bench-results/spine.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tests.bench.corpus import Corpus, text_tokens
from tests.bench.framed import FramedProcess, ServerError, frame, result_of

ECHO_SERVER = str(Path(__file__).with_name("echo_server.py"))
REPO = Path(__file__).resolve().parents[2]
# Windows far above anything pushed, so no budget or compression policy ever kicks in:
# these benchmarks measure the spine (frames, validation, counting, commit, totals).
HUGE_WINDOW = 1_000_000_000
PROMPT_WINDOW = 1_000_000
MODEL = "gpt-4"  # counted exactly with cl100k_base, no "estimated" flag


# --- plan --------------------------------------------------------------------------------

@dataclass
class Plan:
    rounds: int                  # alternated measurement rounds per throughput benchmark
    single_warmup: int           # bench 1: requests per server before timing
    single_per_round: int        # bench 1: requests per server per round
    batch_warmup: int            # bench 2: batches per server before timing
    batch_per_round: int         # bench 2: batches per server per round
    batch_size: int = 100
    latency_warmup: int = 50     # bench 3: requests before timing, per method and session
    latency_per_round: int = 100  # bench 3: requests per method, session and round
    small_session: int = 1_000
    big_session: int = 100_000
    prompt_messages: int = 1_000
    prompt_samples: int = 40
    encode_samples: int = 40
    cold_spawns: int = 10        # bench 4: spawns per server (plus one untimed each)
    rss_sessions: int = 100      # bench 5
    rss_messages: int = 1_000


QUICK = Plan(rounds=5, single_warmup=300, single_per_round=400, batch_warmup=10, batch_per_round=30,
             latency_warmup=30, latency_per_round=60, prompt_samples=25, encode_samples=25, cold_spawns=10)
FULL = Plan(rounds=11, single_warmup=1000, single_per_round=1500, batch_warmup=30, batch_per_round=100,
            latency_warmup=100, latency_per_round=300, prompt_samples=150, encode_samples=150, cold_spawns=30)


# --- results -----------------------------------------------------------------------------

@dataclass
class Result:
    bench: str
    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None   # None: no target, reported for information
    details: dict[str, Any] = field(default_factory=dict)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Quiet:
    """No garbage collection in the benchmark process while it times something."""

    def __enter__(self) -> None:
        gc.collect()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        gc.enable()


def log(msg: str) -> None:
    print(f"[spine {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process, all its threads (from /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


class MachineLoad:
    """How much CPU processes other than this benchmark (and its children) used while a
    benchmark ran, in cores (steal time, the hypervisor's share, counts too): the noise
    floor of its figures. Linux only; None elsewhere."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                parts = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        busy = (sum(parts[:8]) - parts[3] - parts[4]) / _TICK  # all but idle and iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy, own

    def other_cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        busy = end[1] - self.start[1]
        own = end[2] - self.start[2]
        return round(max(0.0, busy - own) / (end[0] - self.start[0]), 2)


# --- servers -----------------------------------------------------------------------------

class Lab:
    """A private temp tree: data dirs, XDG dirs, server logs. Nothing of the user's is read."""

    def __init__(self, keep: bool = False, ctxd_path: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-spine-"))
        self.keep = keep
        self._n = 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
        for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                         ("XDG_STATE_HOME", "state"), ("XDG_RUNTIME_DIR", "run"),
                         ("XDG_CACHE_HOME", "cache")):
            (self.root / sub).mkdir(mode=0o700)
            env[var] = str(self.root / sub)
        self.env = env
        # ctxd from another tree (a commit exported with `git archive`, a patched copy):
        # only the ctxd children see it, the echo server never imports ctxd.
        self.ctxd_env = dict(env)
        if ctxd_path:
            self.ctxd_env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(ctxd_path).resolve())] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.procs: list[FramedProcess] = []

    def fresh(self, name: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:03d}-{name}"

    def ctxd_argv(self, data_dir: Path, durability: str | None = None) -> list[str]:
        argv = [sys.executable, "-m", "ctxd", "--data-dir", str(data_dir)]
        if durability:
            argv += ["--durability", durability]
        return argv

    def spawn(self, argv: list[str], name: str) -> FramedProcess:
        env = self.ctxd_env if argv[1:3] == ["-m", "ctxd"] else self.env
        proc = FramedProcess(argv, env=env, cwd=str(self.root),
                             stderr_path=str(self.root / f"{name}.stderr"))
        self.procs.append(proc)
        return proc

    def ctxd(self, name: str, durability: str | None = None) -> FramedProcess:
        proc = self.spawn(self.ctxd_argv(self.fresh(name), durability), name)
        proc.request("initialize", {"processId": None, "clientInfo": {"name": "spine-bench"}})
        proc.notify("initialized", {})
        return proc

    def echo(self, name: str) -> FramedProcess:
        return self.spawn([sys.executable, ECHO_SERVER], name)

    def close(self, proc: FramedProcess, graceful: bool = True) -> None:
        proc.close(graceful=graceful)
        if proc in self.procs:
            self.procs.remove(proc)

    def shutdown(self) -> None:
        for proc in list(self.procs):
            try:
                proc.close(graceful=False, timeout=5)
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log(f"could not stop {proc.argv[1:3]}: {exc}")
        self.procs.clear()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def create_session(proc: FramedProcess, session_id: str, window: int = HUGE_WINDOW) -> dict[str, Any]:
    return proc.request("session/create", {"sessionId": session_id, "model": MODEL, "contextWindow": window})


def push_all(proc: FramedProcess, session_id: str, messages: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for start in range(0, len(messages), batch):
        result = proc.request("session/push", {"sessionId": session_id, "messages": messages[start:start + batch]})
    return result


def cycle(pool: list[Any], start: int, n: int) -> list[Any]:
    return [pool[(start + i) % len(pool)] for i in range(n)]


def check_bodies(bodies: Iterable[bytes], what: str) -> None:
    for body in bodies:
        if b'"error":' in body[:80]:
            raise ServerError(f"{what}: {body[:300]!r}")


def time_calls(proc: FramedProcess, frames: list[bytes]) -> tuple[float, list[float], list[bytes]]:
    """Send frames one at a time; (elapsed seconds, per-request seconds, response bodies)."""
    lat: list[float] = []
    bodies: list[bytes] = []
    clock = time.perf_counter
    call = proc.call
    with Quiet():
        start = clock()
        for f in frames:
            t = clock()
            bodies.append(call(f))
            lat.append(clock() - t)
        elapsed = clock() - start
    return elapsed, lat, bodies


# --- 1. session/push, one message per request ---------------------------------------------

def bench_push_single(lab: Lab, plan: Plan, corpus: Corpus) -> list[Result]:
    pool = corpus.chat_messages(600)
    sizes = text_tokens(pool, corpus.count)
    ctxd = lab.ctxd("b1-ctxd")
    create_session(ctxd, "push-single")
    echo = lab.echo("b1-echo")
    servers = {"ctxd": ctxd, "echo": echo}
    cursor = {"ctxd": 0, "echo": 0}

    def frames(kind: str, n: int) -> list[bytes]:
        proc = servers[kind]
        out = [frame(proc.next_id(), "session/push",
                     {"sessionId": "push-single", "messages": [m]}) for m in cycle(pool, cursor[kind], n)]
        cursor[kind] += n
        return out

    for kind, server in servers.items():
        _, _, bodies = time_calls(server, frames(kind, plan.single_warmup))
        check_bodies(bodies, f"{kind} warm-up")
    rates: dict[str, list[float]] = {"ctxd": [], "echo": []}
    lats: dict[str, list[float]] = {"ctxd": [], "echo": []}
    cpu = {"ctxd": 0.0, "echo": 0.0}
    for r in range(plan.rounds):
        for kind in (("ctxd", "echo") if r % 2 == 0 else ("echo", "ctxd")):
            batch = frames(kind, plan.single_per_round)
            before = cpu_seconds(servers[kind].pid)
            elapsed, lat, bodies = time_calls(servers[kind], batch)
            cpu[kind] += cpu_seconds(servers[kind].pid) - before
            check_bodies(bodies, kind)
            rates[kind].append(plan.single_per_round / elapsed)
            lats[kind] += lat
    timed = plan.rounds * plan.single_per_round
    cpu_us = {k: v / timed * 1e6 for k, v in cpu.items()}
    stored = ctxd.request("session/get", {"sessionId": "push-single"})
    pushed = cursor["ctxd"]
    assert stored["messageCount"] == pushed, (stored["messageCount"], pushed)
    frame_bytes = statistics.mean(len(frame(1, "session/push", {"sessionId": "push-single", "messages": [m]}))
                                  for m in pool)
    lab.close(ctxd)
    lab.close(echo, graceful=False)
    c, e = median(rates["ctxd"]), median(rates["echo"])
    ratio = c / e
    return [Result(
        "1", "session/push x1 over stdio", c, "req/s", e, "pygls echo, same frames", ratio,
        "ctxd >= 0.8x echo", ratio >= 0.8,
        {"rounds_req_s": rates, "paired_ratios": [a / b for a, b in zip(rates["ctxd"], rates["echo"])],
         "ctxd_latency_ms": {"p50": percentile(lats["ctxd"], 50) * 1e3, "p99": percentile(lats["ctxd"], 99) * 1e3},
         "echo_latency_ms": {"p50": percentile(lats["echo"], 50) * 1e3, "p99": percentile(lats["echo"], 99) * 1e3},
         "server_cpu_us_per_request": cpu_us,
         "cpu_ratio_echo_over_ctxd": cpu_us["echo"] / cpu_us["ctxd"] if cpu_us["ctxd"] else None,
         "message_text_tokens": {"min": min(sizes), "median": median(sizes), "max": max(sizes)},
         "mean_frame_bytes": round(frame_bytes), "messages_committed": stored["messageCount"]},
    )]


# --- 2. session/push, batches of 100 ------------------------------------------------------

class DecodeCountFloor:
    """The unavoidable work of a push, in this process: decode the frame into ctxd's
    Structs and count every message's tokens. No I/O, no validation, no SQLite."""

    def __init__(self) -> None:
        from ctxd.protocol.session import SessionPushParams
        from ctxd.tokens import TokenCounter

        self.params_type = SessionPushParams
        self.counter = TokenCounter.for_model(MODEL)
        self.decoder = msgspec.json.Decoder()

    cpu = 0.0
    """CPU seconds the floor's rounds used (this thread's: it is all in one thread)."""

    def run(self, batch_frames: list[bytes]) -> tuple[float, int]:
        with Quiet():
            cpu = time.thread_time()
            start = time.perf_counter()
            n = 0
            for f in batch_frames:
                n += self.batch(self.decode(f))
            elapsed = time.perf_counter() - start
            self.cpu += time.thread_time() - cpu
        self.after_round()
        return elapsed, n

    def batch(self, params: Any) -> int:
        """One push's work; how many messages it had."""
        for m in params.messages:
            self.counter.count_message(m)
        return len(params.messages)

    def after_round(self) -> None:
        """Outside the clock, after each round."""

    def decode(self, request_frame: bytes) -> Any:
        """The frame's params as ctxd's Structs (its body decoded, then converted)."""
        body = request_frame[request_frame.index(b"\r\n\r\n") + 4:]
        return msgspec.convert(self.decoder.decode(body)["params"], self.params_type)


class DecodeCountWriteFloor(DecodeCountFloor):
    """Issue 11's floor: the decode and count above, then the messages written as ctxd
    writes them, in one WAL transaction per batch (a fresh SQLite file with ctxd's own
    schema, ``synchronous = NORMAL``, ctxd's INSERT; no server, no thread, no totals).
    The WAL is checkpointed between rounds, outside the clock (the daemon's checkpoints
    run on a thread of their own)."""

    def __init__(self, directory: Path) -> None:
        import sqlite3

        from ctxd.store.db import migrations
        from ctxd.store.messages import _INSERT

        super().__init__()
        self.encode = msgspec.json.Encoder().encode
        self.insert = _INSERT
        directory.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(directory / "floor.db", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA wal_autocheckpoint = 0")
        self.conn.execute("PRAGMA foreign_keys = ON")
        for _, _, sql in migrations():
            self.conn.executescript(sql)
        self.conn.execute("INSERT INTO sessions (id, created_at, last_activity, encoding, tokens_estimated) "
                          "VALUES ('floor', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 'cl100k_base', 0)")
        self.seq = 0

    def batch(self, params: Any) -> int:
        count, encode = self.counter.count_message, self.encode
        rows = []
        for m in params.messages:
            t = count(m)
            self.seq += 1
            rows.append(("floor", self.seq, m.role, "2026-01-01T00:00:00Z", t.total, t.overhead, t.text,
                         t.tool_call, t.tool_result, t.thinking, None, encode(m)))
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(self.insert, rows)
        self.conn.execute("COMMIT")
        return len(rows)

    def after_round(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def bench_push_batch(lab: Lab, plan: Plan, corpus: Corpus) -> list[Result]:
    pool = corpus.mixed(3000)
    size = plan.batch_size
    normal = lab.ctxd("b2-normal")
    full = lab.ctxd("b2-full", durability="full")
    echo = lab.echo("b2-echo")
    servers = {"normal": normal, "full": full, "echo": echo}
    for kind in ("normal", "full"):
        create_session(servers[kind], "push-batch")
    cursor = dict.fromkeys(list(servers) + ["floor", "wfloor"], 0)
    floors: dict[str, DecodeCountFloor] = {}
    try:
        floors["floor"] = DecodeCountFloor()
        floors["wfloor"] = DecodeCountWriteFloor(lab.fresh("b2-floor"))
    except ImportError as exc:  # ctxd not importable in this process: report the rest
        log(f"  in-process floor skipped: {exc}")
        floors = {}

    def frames(kind: str, batches: int) -> list[bytes]:
        proc = servers.get(kind, normal)
        out = []
        for _ in range(batches):
            out.append(frame(proc.next_id() if kind in servers else 1, "session/push",
                             {"sessionId": "push-batch", "messages": cycle(pool, cursor[kind], size)}))
            cursor[kind] += size
        return out

    for kind, server in servers.items():
        _, _, bodies = time_calls(server, frames(kind, plan.batch_warmup))
        check_bodies(bodies, f"{kind} warm-up")
    kinds = list(servers) + list(floors)
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    lats: dict[str, list[float]] = {k: [] for k in servers}
    cpu = dict.fromkeys(servers, 0.0)
    last_body = b""
    for r in range(plan.rounds):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            batch = frames(kind, plan.batch_per_round)
            if kind in floors:
                elapsed, n = floors[kind].run(batch)
                rates[kind].append(n / elapsed)
                continue
            before = cpu_seconds(servers[kind].pid)
            elapsed, lat, bodies = time_calls(servers[kind], batch)
            cpu[kind] += cpu_seconds(servers[kind].pid) - before
            check_bodies(bodies, kind)
            rates[kind].append(plan.batch_per_round * size / elapsed)
            lats[kind] += lat
            if kind == "normal":
                last_body = bodies[-1]
    # Tokens counted and committed: the daemon's answer carries each message's count,
    # and the session's stored totals match what was pushed.
    answer = result_of(last_body)
    counted = [m["tokens"] for m in answer["messages"]]
    checks = {}
    for kind in ("normal", "full"):
        info = servers[kind].request("session/get", {"sessionId": "push-batch"})
        assert info["messageCount"] == cursor[kind], (kind, info["messageCount"], cursor[kind])
        checks[kind] = {"messages_committed": info["messageCount"], "tokens_committed": info["tokenCount"]}
    for proc in (normal, full):
        lab.close(proc)
    lab.close(echo, graceful=False)
    timed = plan.rounds * plan.batch_per_round * size
    cpu_us = {k: v / timed * 1e6 for k, v in cpu.items()}
    rn, rf, re_ = median(rates["normal"]), median(rates["full"]), median(rates["echo"])
    common = {"batch_size": size, "mean_counted_tokens_per_message": round(statistics.mean(counted), 1),
              "roles": {r: sum(1 for m in pool if m["role"] == r) / len(pool) for r in ("user", "assistant", "tool")}}
    lat_ms = {k: {"p50": percentile(v, 50) * 1e3, "p99": percentile(v, 99) * 1e3} for k, v in lats.items()}
    results = [
        Result("2", "session/push x100, durability normal", rn, "msg/s", re_, "pygls echo, same frames", rn / re_,
               ">= 15000 msg/s", rn >= 15_000,
               {**common, "rounds_msg_s": rates["normal"], "echo_rounds_msg_s": rates["echo"],
                "batch_latency_ms": lat_ms, **checks["normal"], "server_cpu_us_per_message": cpu_us,
                "messages_per_daemon_cpu_second": 1e6 / cpu_us["normal"] if cpu_us["normal"] else None}),
        Result("2", "session/push x100, durability full", rf, "msg/s", rn, "durability normal", rf / rn,
               "(figure only)", None, {"rounds_msg_s": rates["full"], **checks["full"],
                                       "server_cpu_us_per_message": cpu_us["full"]}),
    ]
    if "wfloor" in floors:
        wf = median(rates["wfloor"])
        floor_cpu_us = floors["wfloor"].cpu / timed * 1e6
        results.append(Result(
            "2", "push x100: daemon CPU per message vs the floor's", cpu_us["normal"], "us/msg", floor_cpu_us,
            "floor's CPU (decode+count+commit)", floor_cpu_us / cpu_us["normal"], "(figure only)", None,
            {"floor_cpu_us_per_message": floor_cpu_us, "daemon_cpu_us_per_message": cpu_us["normal"],
             "what": "the floor's CPU (decode+count+commit, one thread) over the daemon's CPU (all its "
                     "threads, /proc) per message: what the ratio of rates would be on an idle machine, "
                     "and much less moved by other processes' load"}))
        results.append(Result(
            "2", "push x100 vs in-process decode+count+commit", rn, "msg/s", wf, "decode+count+WAL commit", rn / wf,
            ">= 0.6x (goal 0.7x)", rn / wf >= 0.6,
            {"floor_rounds_msg_s": rates["wfloor"],
             "paired_ratios": [a / b for a, b in zip(rates["normal"], rates["wfloor"])],
             "what": "issue 11's floor: msgspec decode into SessionPushParams + TokenCounter.count_message + "
                     "msgspec encode of each message + ctxd's INSERT of the batch in one WAL transaction "
                     "(synchronous=NORMAL) on a plain sqlite3 connection, in the benchmark process, "
                     "interleaved with the daemon rounds"}))
    if "floor" in floors:
        fl = median(rates["floor"])
        results.append(Result(
            "2", "push x100 vs in-process decode+count", rn, "msg/s", fl, "decode+count only", rn / fl,
            "(figure only)", None,
            {"floor_rounds_msg_s": rates["floor"],
             "paired_ratios": [a / b for a, b in zip(rates["normal"], rates["floor"])],
             "what": "msgspec decode into SessionPushParams + TokenCounter.count_message, in the benchmark "
                     "process, interleaved with the daemon rounds: the share of the daemon's rate that is "
                     "bounded by counting"}))
    return results


# --- 3. context/stats, session/get, context/prompt latency ---------------------------------

def bench_latency(lab: Lab, plan: Plan, corpus: Corpus) -> list[Result]:
    proc = lab.ctxd("b3-ctxd")
    pool = corpus.mixed(5000)
    sizes = {"small": plan.small_session, "big": plan.big_session}
    build: dict[str, float] = {}
    for label, n in sizes.items():
        create_session(proc, label)
        start = time.perf_counter()
        done = 0
        batch = 1000 if n <= 10_000 else 5000
        while done < n:
            k = min(batch, n - done)
            proc.request("session/push", {"sessionId": label, "messages": cycle(pool, done, k)})
            done += k
        build[label] = n / (time.perf_counter() - start)
        log(f"  session {label}: {n} messages pushed at {build[label]:,.0f} msg/s")
    infos = {label: proc.request("session/get", {"sessionId": label}) for label in sizes}
    rss_built = _status_kb(proc.pid, "VmRSS") / 1024
    for label, n in sizes.items():
        assert infos[label]["messageCount"] == n

    methods = {"context/stats": "context/stats", "session/get": "session/get"}
    lat: dict[tuple[str, str], list[float]] = {(m, s): [] for m in methods for s in sizes}
    for m in methods:
        for s in sizes:
            _, _, bodies = time_calls(proc, [frame(proc.next_id(), m, {"sessionId": s})
                                             for _ in range(plan.latency_warmup)])
            check_bodies(bodies, m)
    for r in range(plan.rounds):
        for m in methods:
            for s in (("small", "big") if r % 2 == 0 else ("big", "small")):
                requests = [frame(proc.next_id(), m, {"sessionId": s}) for _ in range(plan.latency_per_round)]
                _, took, bodies = time_calls(proc, requests)
                check_bodies(bodies, m)
                lat[(m, s)] += took
    results = []
    for m in methods:
        small, big = lat[(m, "small")], lat[(m, "big")]
        p50s, p50b = percentile(small, 50) * 1e3, percentile(big, 50) * 1e3
        results.append(Result(
            "3", f"{m} p50 @ {plan.big_session // 1000}k msgs", p50b, "ms", p50s,
            f"same @ {plan.small_session // 1000}k msgs", p50b / p50s, "<= 1.5x the 1k figure", p50b / p50s <= 1.5,
            {"p50_ms": {"small": p50s, "big": p50b},
             "p99_ms": {"small": percentile(small, 99) * 1e3, "big": percentile(big, 99) * 1e3},
             "samples": len(small), "session_sizes": sizes,
             "session_tokens": {k: v["tokenCount"] for k, v in infos.items()}, "build_msg_s": build,
             "daemon_rss_mb_after_build": rss_built},
        ))

    lab.close(proc)
    results.append(prompt_over_socket(lab, plan))
    return results


def prompt_over_socket(lab: Lab, plan: Plan) -> Result:
    """``context/prompt`` on a ~200k-token, 1,000-message session of a daemon on its Unix
    socket (where editors, agents and the proxy reach it), against ``msgspec.json.encode``
    of the same result: what a prompt costs beyond writing its answer.

    Timed as a turn is: one small message pushed (untimed), then the prompt. A prompt asked
    again with nothing pushed is answered from what the daemon kept of the previous one,
    which no client's turn is."""
    from tests.bench.remote import FramedSocket, start_daemon

    daemon, sock = start_daemon(lab)
    proc = FramedSocket(sock)
    turns = 0

    def turn() -> tuple[float, bytes]:
        """Push one small message, then time the prompt: (seconds, its body)."""
        nonlocal turns
        turns += 1
        role = "user" if turns % 2 else "assistant"
        text = f"Turn {turns}: " + ("what next?" if role == "user" else "done; the tests pass.")
        check_bodies([proc.call(frame(proc.next_id(), "session/push",
                                      {"sessionId": "prompt", "messages": [{"role": role, "content": text}]}))],
                     "session/push")
        request = frame(proc.next_id(), "context/prompt", {"sessionId": "prompt"})
        t = time.perf_counter()
        body = proc.call(request)
        took = time.perf_counter() - t
        check_bodies([body], "context/prompt")
        return took, body

    try:
        proc.request("initialize", {"processId": None, "clientInfo": {"name": "spine-bench"}})
        proc.notify("initialized", {})
        prompt_pool = Corpus(seed=7).mixed(plan.prompt_messages, 150, 250)
        create_session(proc, "prompt", window=PROMPT_WINDOW)
        push_all(proc, "prompt", prompt_pool, 1000)

        first_elapsed, _, first = time_calls(proc, [frame(proc.next_id(), "context/prompt", {"sessionId": "prompt"})])
        check_bodies(first, "context/prompt")
        for _ in range(5):
            _, body = turn()
        result = result_of(body)
        encode = msgspec.json.encode
        prompt_lat: list[float] = []
        enc: list[float] = []
        for _ in range(5):
            encode(result)
        # Alternated in small blocks: the machine's noise falls on both sides of the ratio.
        rounds = max(1, plan.prompt_samples // 5)
        for _ in range(rounds):
            with Quiet():
                for _ in range(5):
                    took, body = turn()
                    prompt_lat.append(took)
            result = result_of(body)  # (the baseline encodes the prompt just handed out)
            with Quiet():
                for _ in range(max(1, plan.encode_samples // rounds)):
                    t = time.perf_counter()
                    encode(result)
                    enc.append(time.perf_counter() - t)
    finally:
        proc.close()
        daemon.terminate()
        daemon.wait(timeout=30)
    p50, e50 = percentile(prompt_lat, 50) * 1e3, percentile(enc, 50) * 1e3
    return Result(
        "3", f"context/prompt p50 @ {plan.prompt_messages} msgs, socket, a turn", p50, "ms", e50,
        "msgspec.json.encode of the result", p50 / e50, "<= 3x the encode", p50 / e50 <= 3,
        {"p99_ms": percentile(prompt_lat, 99) * 1e3, "first_call_ms": first_elapsed * 1e3,
         "prompt_tokens": result["tokens"], "prompt_messages": len(result["messages"]),
         "compression_count": result.get("compressionCount", 0),
         "response_bytes": len(body), "encode_p99_ms": percentile(enc, 99) * 1e3,
         "samples": len(prompt_lat), "pushes_per_prompt": 1},
    )


# --- 4. cold start ------------------------------------------------------------------------

def bench_cold_start(lab: Lab, plan: Plan, corpus: Corpus) -> list[Result]:
    init = {"processId": None, "clientInfo": {"name": "spine-bench"}}

    def once(kind: str) -> tuple[float, float]:
        if kind == "ctxd":
            argv, request = lab.ctxd_argv(lab.fresh("cold")), frame(1, "initialize", init)
        else:
            argv, request = [sys.executable, ECHO_SERVER], frame(1, "bench/echo", init)
        with Quiet():
            start = time.perf_counter()
            proc = lab.spawn(argv, f"cold-{kind}")
            proc.write(request)
            body = proc.read_frame()
            elapsed = time.perf_counter() - start
            # CPU to this point (the child's whole life would add its shutdown).
            cpu = cpu_seconds(proc.pid)
        check_bodies([body], f"{kind} cold start")
        lab.close(proc, graceful=(kind == "ctxd"))
        return elapsed, cpu

    times: dict[str, list[float]] = {"ctxd": [], "echo": []}
    cpus: dict[str, list[float]] = {"ctxd": [], "echo": []}
    once("ctxd"), once("echo")  # untimed: page cache, bytecode
    for i in range(plan.cold_spawns):
        for kind in (("ctxd", "echo") if i % 2 == 0 else ("echo", "ctxd")):
            elapsed, cpu = once(kind)
            times[kind].append(elapsed)
            cpus[kind].append(cpu)
    c, e = median(times["ctxd"]) * 1e3, median(times["echo"]) * 1e3
    cc, ce = median(cpus["ctxd"]) * 1e3, median(cpus["echo"]) * 1e3
    return [Result(
        "4", "cold start: spawn -> initialize result", c, "ms", e, "pygls echo: spawn -> answer", c / e,
        "<= 1.5x echo", c / e <= 1.5,
        {"ctxd_ms": [t * 1e3 for t in times["ctxd"]], "echo_ms": [t * 1e3 for t in times["echo"]],
         "cpu_ms_median": {"ctxd": cc, "echo": ce}, "cpu_ratio": cc / ce if ce else None,
         "spawns_each": plan.cold_spawns, "fresh_data_dir": True},
    )]


# --- 5. peak RSS --------------------------------------------------------------------------

def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


class RssPoller(threading.Thread):
    def __init__(self, pid: int, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.peak = pid, every, 0
        self._stop_event = threading.Event()
        self._rss: Callable[[], int]
        try:
            import psutil

            process = psutil.Process(pid)
            self._rss = lambda: process.memory_info().rss
        except ImportError:  # psutil is a test extra; /proc works without it
            self._rss = lambda: _status_kb(pid, "VmRSS") * 1024

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.peak = max(self.peak, self._rss())
            except Exception:  # noqa: BLE001 - the process went away
                return
            self._stop_event.wait(self.every)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def bench_rss(lab: Lab, plan: Plan, corpus: Corpus) -> list[Result]:
    pool = corpus.mixed(5000)
    echo = lab.echo("b5-echo")
    echo.request("bench/echo", {})
    echo_idle = _status_kb(echo.pid, "VmHWM") / 1024
    lab.close(echo, graceful=False)
    proc = lab.ctxd("b5-ctxd")
    idle = _status_kb(proc.pid, "VmHWM") / 1024
    poller = RssPoller(proc.pid)
    poller.start()
    start = time.perf_counter()
    tokens = 0
    for s in range(plan.rss_sessions):
        sid = f"rss-{s:03d}"
        create_session(proc, sid, window=PROMPT_WINDOW * 10)
        answer = push_all(proc, sid, cycle(pool, s * 397, plan.rss_messages), 1000)
        tokens += answer["tokenCount"]
    pushed = time.perf_counter() - start
    after_push = _status_kb(proc.pid, "VmRSS") / 1024
    compressed = 0
    for s in range(plan.rss_sessions):
        sid = f"rss-{s:03d}"
        prompt = proc.request("context/prompt", {"sessionId": sid})
        compressed += bool(prompt.get("compressionCount"))
        assert len(prompt["messages"]) >= plan.rss_messages * 0.9, (sid, len(prompt["messages"]))
        proc.request("context/stats", {"sessionId": sid})
    polled = poller.stop() / 2**20
    hwm = _status_kb(proc.pid, "VmHWM") / 1024
    final = _status_kb(proc.pid, "VmRSS") / 1024
    lab.close(proc)
    peak = max(hwm, polled)
    return [Result(
        "5", f"peak RSS, {plan.rss_sessions} sessions x {plan.rss_messages} msgs", peak, "MB", idle,
        "same daemon idle after initialize", peak / idle, "< 200 MB", peak < 200,
        {"vmhwm_mb": hwm, "psutil_polled_peak_mb": polled, "rss_after_push_mb": after_push,
         "rss_final_mb": final, "echo_idle_mb": echo_idle, "tokens_stored": tokens,
         "sessions_compressed": compressed,
         "push_seconds": pushed},
    )]


BENCHES: dict[str, Callable[[Lab, Plan, Corpus], list[Result]]] = {
    "1": bench_push_single, "2": bench_push_batch, "3": bench_latency, "4": bench_cold_start, "5": bench_rss,
}
TITLES = {"1": "session/push, one message per request", "2": "session/push, batches of 100",
          "3": "stats/get/prompt latency", "4": "cold start", "5": "peak RSS"}


# --- report -------------------------------------------------------------------------------

def ctxd_tree(ctxd_path: str | None) -> dict[str, Any]:
    """Where the measured ctxd lives and a digest of its sources: HEAD alone does not say
    what ran when the working tree has changes (no git command is run for this)."""
    import hashlib
    from importlib.util import find_spec

    if ctxd_path:
        root = Path(ctxd_path).resolve() / "ctxd"
    else:
        spec = find_spec("ctxd")
        root = Path(spec.origin).parent if spec and spec.origin else Path("?")
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".sql") and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return {"path": str(root), "files": len(files), "sha256": digest.hexdigest()[:16]}


def machine(ctxd_path: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
            info["ram_gb"] = round(kb / 2**20, 1)
    except OSError:
        pass
    from importlib import metadata

    info["packages"] = {}
    for name in ("ctxd", "pygls", "msgspec", "tiktoken", "aiosqlite"):
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:  # read-only
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO,
                                        capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    import sqlite3

    info["sqlite"] = sqlite3.sqlite_version
    info["ctxd_tree"] = ctxd_tree(ctxd_path)
    info["loadavg_start"] = os.getloadavg()
    return info


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit in ("req/s", "msg/s"):
        return f"{value:,.0f} {unit}"
    if unit == "ms":
        return f"{value:.3g} ms" if value < 10 else f"{value:,.1f} ms"
    if unit == "MB":
        return f"{value:,.1f} MB"
    return f"{value:.3g} {unit}".strip()


def table(results: list[Result]) -> str:
    head = ["#", "benchmark", "ctxd", "baseline", "ratio", "target", "result"]
    rows = [head]
    for r in results:
        verdict = "-" if r.passed is None else ("PASS" if r.passed else "FAIL")
        rows.append([r.bench, r.name, fmt(r.value, r.unit), f"{fmt(r.baseline, r.unit)} ({r.baseline_name})",
                     "-" if r.ratio is None else f"{r.ratio:.2f}x", r.target, verdict])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.spine", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run (< 2 minutes)")
    p.add_argument("--only", default="", help="comma-separated benchmark numbers, e.g. 1,4")
    p.add_argument("--out", default="bench-results/spine.json", help="JSON results file")
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed")
    p.add_argument("--keep", action="store_true", help="keep the temp tree (data dirs, server stderr)")
    p.add_argument("--ctxd-path", metavar="DIR",
                   help="run the ctxd package found in DIR (e.g. `git archive HEAD ctxd | tar -x -C DIR`) "
                        "instead of the installed one")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    chosen = [b.strip() for b in args.only.split(",") if b.strip()] or list(BENCHES)
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHES)}")

    if args.ctxd_path:  # the in-process floor of benchmark 2 imports ctxd too
        sys.path.insert(0, str(Path(args.ctxd_path).resolve()))
    meta = machine(args.ctxd_path)
    meta["mode"] = "quick" if args.quick else "full"
    meta["ctxd_path"] = str(Path(args.ctxd_path).resolve()) if args.ctxd_path else None
    lab = Lab(keep=args.keep, ctxd_path=args.ctxd_path)
    corpus = Corpus()
    results: list[Result] = []
    errors: dict[str, str] = {}
    started = time.perf_counter()
    try:
        for b in chosen:
            log(f"benchmark {b}: {TITLES[b]}")
            t = time.perf_counter()
            load = MachineLoad()
            try:
                got = BENCHES[b](lab, plan, corpus)
            except Exception as exc:  # noqa: BLE001 - report it, run the others
                errors[b] = f"{type(exc).__name__}: {exc}"
                log(f"benchmark {b} failed: {errors[b]}")
                continue
            other = load.other_cores()
            meta.setdefault("other_cpu_cores", {})[b] = other
            if other is not None and other > 0.3:
                log(f"  note: other processes used {other:.2f} of {meta.get('nproc')} cores meanwhile")
            for r in got:
                r.details["other_processes_cpu_cores"] = other
            results += got
            for r in got:
                verdict = "" if r.passed is None else (" PASS" if r.passed else " FAIL")
                log(f"  {r.name}: {fmt(r.value, r.unit)} vs {fmt(r.baseline, r.unit)} -> "
                    f"{'-' if r.ratio is None else f'{r.ratio:.2f}x'}{verdict}  ({time.perf_counter() - t:.0f} s)")
    finally:
        lab.shutdown()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["loadavg_end"] = os.getloadavg()
    meta["plan"] = asdict(plan)

    print()
    print(f"ctxd spine benchmarks ({meta['mode']}), {meta['date_utc']}, {meta.get('nproc')} cpu "
          f"{meta.get('cpu', '?')}, {meta.get('ram_gb', '?')} GB, Python {meta['python']}, "
          f"{meta['seconds']:.0f} s")
    print(table(results))
    loads = {b: v for b, v in meta.get("other_cpu_cores", {}).items() if v is not None}
    if loads:
        print("CPU used by other processes meanwhile (cores): "
              + ", ".join(f"#{b} {v:.2f}" for b, v in loads.items())
              + ("  <- absolute figures are depressed; ratios hold better" if max(loads.values()) > 0.3 else ""))
    for b, err in errors.items():
        print(f"benchmark {b} did not complete: {err}")
    failed = [r.name for r in results if r.passed is False] + [f"benchmark {b} (error)" for b in errors]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results], "errors": errors,
                               "failed": failed}, indent=2) + "\n")
    print(f"\n{len(results)} figures, {sum(r.passed is True for r in results)} targets met, "
          f"{len(failed)} missed; JSON: {out}")
    return 1 if (args.strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
