"""The history benchmarks: snapshots, full-text search and export on large sessions.

    python -m tests.bench.history                 # full run
    python -m tests.bench.history --quick         # CI-sized
    python -m tests.bench.history --only 2        # some benchmarks
    python -m tests.bench.history --strict        # exit 1 when a target is missed

1. ``snapshot/create`` and ``snapshot/restore`` on 10,000-message sessions (one whose
   whole history is the active context, one compressed in a 128k window); baseline:
   ``session/get`` on the same session, same rounds. Target: create < 100 ms.
2. ``session/search`` p50/p99 over 100,000 messages in 100 sessions (Zipf-distributed
   vocabulary; queries of 1-3 words from very common to absent), against a plain
   ``LIKE`` scan of the same table (the daemon's database opened read-only here,
   ``ctxd.store.search.like_scan``), same queries, alternating. Targets: p50 < 20 ms,
   and >= 10x faster than the scan.
3. ``session/export`` of a 10,000-message session as json, markdown and jsonl: time and
   size; baseline: ``msgspec.json.encode`` of the same messages in this process.

Servers and client as in the spine benchmarks (``spine.py``, docs/performance.md).
A measurement, not a test: exit code 0 unless ``--strict``.
"""

from __future__ import annotations

import argparse
import random
import re
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from tests.bench.compression import AgentSession
from tests.bench.compression import Plan as CompressionPlan
from tests.bench.framed import frame, result_of
from tests.bench.harness import NotifyingProcess, common_args, percentile, run_suite, spawn_notifying
from tests.bench.spine import Lab, Quiet, Result, check_bodies, cpu_seconds, median, time_calls
from tests.bench.workloads import AgentWorkload, ProseWorkload

Log = Callable[[str], None]
MODEL = "gpt-4"
FLAT_WINDOW = 10_000_000     # no budget or compression ever applies: the whole history is active


@dataclass
class Plan:
    rounds: int = 11
    snapshot_messages: int = 10_000
    compressed_window: int = 131_072
    creates_per_round: int = 10
    gets_per_round: int = 10
    restores_per_round: int = 2
    search_sessions: int = 100
    search_per_session: int = 1_000
    search_rounds: int = 5
    export_messages: int = 10_000
    export_rounds: int = 7


QUICK = Plan(rounds=5, search_sessions=30, search_rounds=3, export_rounds=3, creates_per_round=5,
             gets_per_round=5, restores_per_round=1)
FULL = Plan()


def push_batches(proc: NotifyingProcess, sid: str, messages: list[dict[str, Any]], batch: int) -> None:
    for start in range(0, len(messages), batch):
        proc.request("session/push", {"sessionId": sid, "messages": messages[start:start + batch]})


def timed(proc: NotifyingProcess, method: str, params: dict[str, Any], n: int) -> tuple[list[float], bytes]:
    _, lat, bodies = time_calls(proc, [frame(proc.next_id(), method, params) for _ in range(n)])
    check_bodies(bodies, method)
    return lat, bodies[-1]


# --- 1. snapshots -------------------------------------------------------------------------

def bench_snapshots(lab: Lab, plan: Plan, log: Log) -> list[Result]:
    proc = spawn_notifying(lab, "h1-ctxd")
    messages = AgentWorkload(seed=31).messages(plan.snapshot_messages)
    # The flat session: every message in the active context (the worst case for a restore,
    # which reloads the active context from history).
    proc.request("session/create", {"sessionId": "flat", "model": MODEL, "contextWindow": FLAT_WINDOW})
    t = time.perf_counter()
    push_batches(proc, "flat", messages, 500)
    log(f"  flat: {len(messages):,} messages pushed in {time.perf_counter() - t:.1f} s")
    # The compressed session: the same messages pushed as an agent would, in a 128k window.
    cplan = CompressionPlan(window=plan.compressed_window, push_batch=20)
    s = AgentSession(proc, "compressed", cplan, messages)
    t = time.perf_counter()
    while s.pushed < len(messages):
        s.push(min(cplan.push_batch, len(messages) - s.pushed))
    s.settle()
    proc.request("session/unsubscribe", {"sessionId": "compressed"})
    proc.pump(0.1)
    proc.notes.clear()
    log(f"  compressed: {s.pushed:,} messages pushed in {time.perf_counter() - t:.1f} s, "
        f"{len(s.waits)} compression passes")
    sessions = ("flat", "compressed")
    info = {sid: proc.request("context/stats", {"sessionId": sid}) for sid in sessions}
    target = {sid: proc.request("snapshot/create", {"sessionId": sid, "label": "restore target"})["snapshotId"]
              for sid in sessions}
    for sid in sessions:  # warm-up
        timed(proc, "session/get", {"sessionId": sid}, 5)
        timed(proc, "snapshot/create", {"sessionId": sid, "label": "warm-up"}, 3)
        timed(proc, "snapshot/restore", {"sessionId": sid, "snapshotId": target[sid]}, 1)
    ops = {
        "get": ("session/get", lambda sid: {"sessionId": sid}, plan.gets_per_round),
        "create": ("snapshot/create", lambda sid: {"sessionId": sid, "label": "bench"}, plan.creates_per_round),
        "restore": ("snapshot/restore", lambda sid: {"sessionId": sid, "snapshotId": target[sid]},
                    plan.restores_per_round),
    }
    lat: dict[tuple[str, str], list[float]] = {(op, sid): [] for op in ops for sid in sessions}
    cpu: dict[tuple[str, str], float] = dict.fromkeys(lat, 0.0)
    bodies: dict[tuple[str, str], bytes] = {}
    order = list(ops)
    for r in range(plan.rounds):
        for sid in (sessions if r % 2 == 0 else sessions[::-1]):
            for op in order[r % 3:] + order[:r % 3]:
                method, params, n = ops[op]
                before = cpu_seconds(proc.pid)
                took, body = timed(proc, method, params(sid), n)
                cpu[(op, sid)] += cpu_seconds(proc.pid) - before
                lat[(op, sid)] += took
                bodies[(op, sid)] = body
    listing = {sid: len(proc.request("snapshot/list", {"sessionId": sid})["snapshots"]) for sid in sessions}
    after = {sid: proc.request("context/stats", {"sessionId": sid}) for sid in sessions}
    lab.close(proc)
    results = []
    for sid in sessions:
        g = percentile(lat[("get", sid)], 50) * 1e3
        desc = ("whole history active" if sid == "flat" else f"compressed, {plan.compressed_window // 1024}k window")
        common = {"session": sid, "messages": info[sid]["messageCount"], "history_tokens": info[sid]["tokenCount"],
                  "context_tokens": info[sid]["contextTokens"], "compressions": info[sid]["compressionCount"],
                  "checkpoints": info[sid]["checkpointCount"], "snapshots_at_end": listing[sid],
                  "context_tokens_after": after[sid]["contextTokens"],
                  "get_p50_ms": g, "get_p99_ms": percentile(lat[("get", sid)], 99) * 1e3}
        for op in ("create", "restore"):
            samples = lat[(op, sid)]
            p50 = percentile(samples, 50) * 1e3
            target_text, passed = ("< 100 ms", p50 < 100) if op == "create" else ("(figure only)", None)
            results.append(Result(
                "1", f"snapshot/{op} p50, {plan.snapshot_messages // 1000}k msgs, {desc}", p50, "ms", g,
                "session/get p50, same session and rounds", p50 / g, target_text, passed,
                {**common, "p99_ms": percentile(samples, 99) * 1e3, "samples": len(samples),
                 "daemon_cpu_ms_per_call": cpu[(op, sid)] / len(samples) * 1e3,
                 "response_bytes": len(bodies[(op, sid)])}))
    return results


# --- 2. search ----------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def choose_queries(texts: list[str], rng: random.Random) -> dict[str, list[str]]:
    """Queries of 1-3 words by document frequency: common (in > 20% of messages),
    medium (0.5-5%), rare (10-100 messages), very rare (1-3: ids), absent (none); and
    combinations of them (all words required)."""
    df: Counter[str] = Counter()
    for text in texts:
        df.update(set(_WORD.findall(text.lower())))
    n = len(texts)
    by = {
        "common": [w for w, c in df.items() if c > 0.20 * n],
        "medium": [w for w, c in df.items() if 0.005 * n <= c <= 0.05 * n and len(w) > 3],
        "rare": [w for w, c in df.items() if 10 <= c <= 100 and len(w) > 4],
        "very rare": [w for w, c in df.items() if 1 <= c <= 3 and len(w) > 5],
    }
    for k in by:
        by[k].sort()
    pick = rng.choice
    queries: dict[str, list[str]] = {
        "1 word, common": [pick(by["common"]) for _ in range(4)],
        "1 word, medium": [pick(by["medium"]) for _ in range(4)],
        "1 word, rare": [pick(by["rare"]) for _ in range(4)],
        "1 word, very rare": [pick(by["very rare"]) for _ in range(4)],
        "1 word, absent": ["zzqxv" + str(rng.randint(100, 999)) for _ in range(2)],
        "2 words, common+common": [f"{pick(by['common'])} {pick(by['common'])}" for _ in range(4)],
        "2 words, common+rare": [f"{pick(by['common'])} {pick(by['rare'])}" for _ in range(4)],
        "2 words, medium+medium": [f"{pick(by['medium'])} {pick(by['medium'])}" for _ in range(4)],
        "3 words, common+medium+rare": [f"{pick(by['common'])} {pick(by['medium'])} {pick(by['rare'])}"
                                        for _ in range(4)],
        "3 words, medium x3": [" ".join(pick(by["medium"]) for _ in range(3)) for _ in range(2)],
    }
    return queries


def scan(conn: sqlite3.Connection, query: str, limit: int = 20) -> list[tuple[str, int]]:
    """The baseline: a plain LIKE over the stored bodies, every word required, stopping
    at ``limit`` rows like the search does.

    ``body`` is a BLOB (the message's JSON): SQLite's LIKE never matches a BLOB operand,
    so it is read as text, as ``ctxd.store.search.like_scan`` reads it too."""
    words = query.split()
    sql = ("SELECT session_id, seq FROM messages WHERE "
           + " AND ".join(["CAST(body AS TEXT) LIKE ?"] * len(words)) + " LIMIT ?")
    return conn.execute(sql, [f"%{w}%" for w in words] + [limit]).fetchall()


def like_scan_finds_nothing(conn: sqlite3.Connection, word: str) -> bool | None:
    """Whether ``ctxd.store.search.like_scan`` misses a word the text scan finds."""
    try:
        from ctxd.store.search import like_scan
    except ImportError:
        return None
    return not like_scan(conn, word, 1) and bool(scan(conn, word, 1))


def bench_search(lab: Lab, plan: Plan, log: Log) -> list[Result]:
    proc = spawn_notifying(lab, "h2-ctxd")
    assert proc.data_dir is not None
    data_dir = proc.data_dir
    prose = ProseWorkload()
    texts: list[str] = []
    t = time.perf_counter()
    total = 0
    for s in range(plan.search_sessions):
        sid = f"chat-{s:03d}"
        proc.request("session/create", {"sessionId": sid, "model": MODEL, "contextWindow": 1_000_000_000})
        messages = prose.messages(plan.search_per_session)
        texts += [m["content"] for m in messages]
        push_batches(proc, sid, messages, 500)
        total += len(messages)
    build = time.perf_counter() - t
    log(f"  {total:,} messages in {plan.search_sessions} sessions pushed in {build:.0f} s")
    queries = choose_queries(texts, random.Random(5))
    flat = [(cls, q) for cls, qs in queries.items() for q in qs]
    # The first search indexes what the background indexer has not yet (the backlog of a
    # bulk import): timed once, reported apart.
    t = time.perf_counter()
    first = proc.request("session/search", {"query": flat[0][1]})
    first_ms = (time.perf_counter() - t) * 1e3
    db = data_dir / "ctxd.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, check_same_thread=False)
    like_scan_broken = like_scan_finds_nothing(conn, queries["1 word, common"][0])
    for _, q in flat:  # warm-up: page cache for both
        proc.request("session/search", {"query": q})
        scan(conn, q)
    lat: dict[str, list[float]] = {"search": [], "scan": []}
    by_class: dict[tuple[str, str], list[float]] = {}
    hits: dict[str, tuple[int, int]] = {}
    took_ms: list[float] = []
    rng = random.Random(9)
    cpu = 0.0
    for r in range(plan.search_rounds):
        order = list(flat)
        rng.shuffle(order)
        for cls, q in order:
            for kind in (("search", "scan") if r % 2 == 0 else ("scan", "search")):
                if kind == "search":
                    f = frame(proc.next_id(), "session/search", {"query": q})
                    before = cpu_seconds(proc.pid)
                    with Quiet():
                        t0 = time.perf_counter()
                        body = proc.call(f)
                        dt = time.perf_counter() - t0
                    cpu += cpu_seconds(proc.pid) - before
                    check_bodies([body], "session/search")
                    res = result_of(body)
                    took_ms.append(res["tookMs"])
                    n = len(res["hits"])
                else:
                    with Quiet():
                        t0 = time.perf_counter()
                        rows = scan(conn, q)
                        dt = time.perf_counter() - t0
                    n = len(rows)
                lat[kind].append(dt)
                by_class.setdefault((cls, kind), []).append(dt)
                prev = hits.get(q, (0, 0))
                hits[q] = (n, prev[1]) if kind == "search" else (prev[0], n)
    size_mb = db.stat().st_size / 2**20
    wal = db.with_name(db.name + "-wal")
    conn.close()
    lab.close(proc)
    s50, s99 = percentile(lat["search"], 50) * 1e3, percentile(lat["search"], 99) * 1e3
    b50, b99 = percentile(lat["scan"], 50) * 1e3, percentile(lat["scan"], 99) * 1e3
    classes = {cls: {"queries": queries[cls],
                     "search_p50_ms": percentile(by_class[(cls, "search")], 50) * 1e3,
                     "scan_p50_ms": percentile(by_class[(cls, "scan")], 50) * 1e3,
                     "hits_search_scan": [hits[q] for q in queries[cls]]} for cls in queries}
    details = {"messages": total, "sessions": plan.search_sessions, "queries": len(flat),
               "samples_each": len(lat["search"]), "build_seconds": build,
               "first_search_ms_with_index_backlog": first_ms, "first_search_hits": len(first["hits"]),
               "daemon_took_ms_p50": percentile(took_ms, 50),
               "daemon_cpu_ms_per_search": cpu / len(lat["search"]) * 1e3,
               "database_mb": size_mb, "wal_mb": wal.stat().st_size / 2**20 if wal.exists() else 0,
               "by_class": classes, "scan_p99_ms": b99,
               "vocabulary": len(ProseWorkload().words),
               "ctxd_like_scan_finds_nothing_on_blob_bodies": like_scan_broken,
               "baseline_sql": "SELECT session_id, seq FROM messages WHERE CAST(body AS TEXT) LIKE ? "
                               "[AND ...] LIMIT 20"}
    return [
        Result("2", f"session/search p50, {total // 1000}k msgs in {plan.search_sessions} sessions", s50, "ms", b50,
               f"LIKE scan p50, same queries (sqlite3, read-only); scan/search {b50 / s50:.1f}x", s50 / b50,
               "< 20 ms and <= 0.1x the scan",
               s50 < 20 and b50 / s50 >= 10, details),
        Result("2", "session/search p99", s99, "ms", b99, "LIKE scan p99", s99 / b99, "(figure only)", None,
               {"search_p99_ms": s99, "scan_p99_ms": b99}),
    ]


# --- 3. export ----------------------------------------------------------------------------

def bench_export(lab: Lab, plan: Plan, log: Log) -> list[Result]:
    proc = spawn_notifying(lab, "h3-ctxd")
    messages = AgentWorkload(seed=41).messages(plan.export_messages)
    proc.request("session/create", {"sessionId": "big", "model": MODEL, "contextWindow": FLAT_WINDOW,
                                    "title": "export benchmark"})
    push_batches(proc, "big", messages, 500)
    structs = None
    try:
        from ctxd.protocol.message import Message

        structs = [msgspec.convert(m, Message) for m in messages]
    except ImportError:
        pass
    formats = ("json", "markdown", "jsonl")
    for fmt in formats:  # warm-up
        timed(proc, "session/export", {"sessionId": "big", "format": fmt}, 1)
    lat: dict[str, list[float]] = {k: [] for k in (*formats, "encode")}
    sizes: dict[str, tuple[int, int]] = {}
    cpu = dict.fromkeys(formats, 0.0)
    kinds = [*formats, "encode"]
    for r in range(plan.export_rounds):
        for kind in kinds[r % 4:] + kinds[:r % 4]:
            if kind == "encode":
                with Quiet():
                    t0 = time.perf_counter()
                    encoded = msgspec.json.encode(structs if structs is not None else messages)
                    lat[kind].append(time.perf_counter() - t0)
                sizes[kind] = (len(encoded), len(encoded))
                continue
            before = cpu_seconds(proc.pid)
            took, body = timed(proc, "session/export", {"sessionId": "big", "format": kind}, 1)
            cpu[kind] += cpu_seconds(proc.pid) - before
            lat[kind] += took
            if kind not in sizes:
                doc = result_of(body)
                sizes[kind] = (len(doc["document"].encode()), len(body))
                assert doc["messageCount"] == len(messages), (doc["messageCount"], len(messages))
    lab.close(proc)
    e50 = median(lat["encode"]) * 1e3
    results = []
    for fmt in formats:
        p50 = median(lat[fmt]) * 1e3
        results.append(Result(
            "3", f"session/export {fmt}, {len(messages):,} msgs ({sizes[fmt][0] / 2**20:.1f} MB)", p50, "ms",
            e50, f"msgspec.json.encode of the messages ({sizes['encode'][0] / 2**20:.1f} MB)", p50 / e50,
            "(figure only)", None,
            {"document_bytes": sizes[fmt][0], "response_bytes": sizes[fmt][1], "rounds_ms": [x * 1e3 for x in lat[fmt]],
             "daemon_cpu_ms_per_export": cpu[fmt] / len(lat[fmt]) * 1e3, "encode_bytes": sizes["encode"][0],
             "encode_rounds_ms": [x * 1e3 for x in lat["encode"]], "messages": len(messages)}))
    return results


BENCHES: dict[str, Callable[[Lab, Plan, Log], list[Result]]] = {
    "1": bench_snapshots, "2": bench_search, "3": bench_export}
TITLES = {"1": "snapshot/create and snapshot/restore, 10k messages", "2": "session/search over 100k messages",
          "3": "session/export, 10k messages"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.history", description=__doc__.split("\n\n")[0])
    common_args(p, "bench-results/history.json")
    args = p.parse_args(argv)
    return run_suite("history", args, BENCHES, TITLES, QUICK if args.quick else FULL)


if __name__ == "__main__":
    sys.exit(main())
