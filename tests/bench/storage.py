"""SQLite against PostgreSQL, same run, same machine: batch push throughput and
``context/prompt`` p50 through the service (in process: the store is what differs);
two daemons against one on one PostgreSQL database; search p50 over 100k messages.

    python -m tests.bench.storage                # 40 batches of 100 messages per backend
    python -m tests.bench.storage --batches 100
    python -m tests.bench.storage --only daemons # two daemons vs one (PostgreSQL)
    python -m tests.bench.storage --only search --search-messages 100000

Two daemons are two processes, each a Service on the same database, with clients
pushing batches to the same sessions through both (what a fleet does); one daemon is one
such process with as many clients. Search fills a fresh store per backend, waits for the
index, then times ``session/search`` for rare words, common words and two-word queries.

PostgreSQL is a throwaway server started from the system's binaries (tests/pgserver.py),
on a Unix socket with ``fsync = on``; SQLite runs with the default durability (WAL,
synchronous=NORMAL). Each backend gets the same messages, in the same order, into a
fresh store; the order of the two runs alternates between rounds. It is a measurement,
not a test: it prints the figures and the ratio, and writes bench-results/storage.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from ctxd.config import Config, DaemonConfig, StorageConfig
from ctxd.protocol.methods import METHODS
from ctxd.service import ingest, prompt, sessions
from ctxd.service.core import Service
from tests.pgserver import start_server, stop_server


def _params(method: str, **raw: Any) -> Any:
    return msgspec.convert(raw, METHODS[method].params)


def _batch(n: int, size: int) -> list[dict[str, Any]]:
    out = []
    for k in range(size):
        i = n * size + k
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": f"message {i}: " + " ".join(f"word{(i * 7 + j) % 997}"
                                                                         for j in range(40))})
    return out


async def run_backend(url: str, data_dir: Path, batches: int, size: int, sessions_n: int) -> dict[str, float]:
    config = Config(daemon=DaemonConfig(data_dir=str(data_dir)), storage=StorageConfig(url=url))
    svc = await Service.open(config)
    try:
        sids = [f"s{i}" for i in range(sessions_n)]
        for sid in sids:
            await sessions.create_session(svc, _params("session/create", sessionId=sid, contextWindow=10_000_000))
        payloads = [_params("session/push", sessionId=sids[n % sessions_n], messages=_batch(n, size))
                    for n in range(batches)]
        started = time.perf_counter()
        for p in payloads:
            await ingest.push(svc, p)
        push_seconds = time.perf_counter() - started
        # Concurrent pushers (one per session): what group commit is for.
        more = [_params("session/push", sessionId=sids[n % sessions_n], messages=_batch(batches + n, size))
                for n in range(batches)]
        started = time.perf_counter()
        for start in range(0, len(more), sessions_n):
            await asyncio.gather(*(ingest.push(svc, p) for p in more[start:start + sessions_n]))
        concurrent_seconds = time.perf_counter() - started
        prompts = []
        for n in range(60):
            sid = sids[n % sessions_n]
            await ingest.push(svc, _params("session/push", sessionId=sid, messages=_batch(10_000 + n, 1)))
            t = time.perf_counter()
            await prompt.prompt(svc, _params("context/prompt", sessionId=sid, format="openai"))
            prompts.append(time.perf_counter() - t)
        return {"push_msg_per_s": batches * size / push_seconds,
                "concurrent_push_msg_per_s": batches * size / concurrent_seconds,
                "prompt_p50_ms": statistics.median(prompts) * 1000}
    finally:
        await svc.close()


# --- two daemons vs one ------------------------------------------------------------------


def _daemon_worker(url: str, data_dir: str, worker: int, workers: int, batches: int, size: int, sessions_n: int,
                   clients: int, shared: bool, ready: Any, go: Any, out: Any) -> None:
    """One daemon (a process with its own Service) whose ``clients`` push its share of the
    batches: to every session (``shared``) or to its own sessions only; reports (start,
    end) wall-clock times."""

    async def run() -> None:
        config = Config(daemon=DaemonConfig(data_dir=data_dir), storage=StorageConfig(url=url))
        svc = await Service.open(config)
        try:
            sids = [f"s{i}" for i in range(sessions_n)]
            mine = [n for n in range(batches) if (n if shared else n % sessions_n) % workers == worker]
            payloads = [_params("session/push", sessionId=sids[n % sessions_n], messages=_batch(n, size))
                        for n in mine]
            ready.set()
            while not go.is_set():
                await asyncio.sleep(0.001)
            queue = list(payloads)
            started = time.time()

            async def client() -> None:
                while queue:
                    await ingest.push(svc, queue.pop(0))

            await asyncio.gather(*(client() for _ in range(clients)))
            out.put((started, time.time()))
        finally:
            await svc.close()

    asyncio.run(run())


def run_daemons(url: str, data_dir: Path, workers: int, batches: int, size: int, sessions_n: int,
                clients: int, shared: bool) -> float:
    """Messages per second (wall clock, first start to last end) through ``workers`` daemons."""
    import multiprocessing

    async def create() -> None:
        svc = await Service.open(Config(daemon=DaemonConfig(data_dir=str(data_dir / "c")),
                                        storage=StorageConfig(url=url)))
        try:
            for i in range(sessions_n):
                await sessions.create_session(svc, _params("session/create", sessionId=f"s{i}",
                                                           contextWindow=10_000_000))
        finally:
            await svc.close()

    asyncio.run(create())
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(workers)]
    procs = [ctx.Process(target=_daemon_worker, args=(url, str(data_dir / f"d{w}"), w, workers, batches, size,
                                                      sessions_n, clients // workers, shared, readies[w], go, out))
             for w in range(workers)]
    for proc in procs:
        proc.start()
    for ready in readies:
        ready.wait(120)
    go.set()
    spans = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    return batches * size / (max(e for _, e in spans) - min(s for s, _ in spans))


# --- search over many messages ---------------------------------------------------------------


async def run_search(url: str, data_dir: Path, messages: int, queries: int) -> dict[str, float]:
    """Search p50 (ms) by kind of query over ``messages`` messages in 10 sessions."""
    from ctxd.service import history

    config = Config(daemon=DaemonConfig(data_dir=str(data_dir)), storage=StorageConfig(url=url))
    svc = await Service.open(config)
    try:
        sids = [f"s{i}" for i in range(10)]
        for sid in sids:
            await sessions.create_session(svc, _params("session/create", sessionId=sid, contextWindow=10_000_000))
        started = time.perf_counter()
        for n in range(messages // 500):
            await ingest.push(svc, _params("session/push", sessionId=sids[n % 10], messages=_batch(n, 500)))
        await svc.indexer.catch_up()
        filled = time.perf_counter() - started
        kinds = {"rare word": lambda k: f"{(k * 7919) % messages}",  # "message <i>:": one message
                 "common word": lambda k: f"word{(k * 13) % 997}",  # in ~4% of the messages
                 "two words": lambda k: f"word{(k * 13) % 997} word{(k * 13 + 5) % 997}",  # near: together
                 "one session": lambda k: f"word{(k * 13) % 997}"}
        out: dict[str, float] = {"fill_seconds": filled}
        for kind, make in kinds.items():
            times = []
            for k in range(queries):
                extra = {"sessionId": sids[k % 10]} if kind == "one session" else {}
                t = time.perf_counter()
                result = await history.search(svc, _params("session/search", query=make(k), limit=20, **extra))
                times.append(time.perf_counter() - t)
                assert result.hits, (kind, make(k))
            out[f"{kind} p50_ms"] = statistics.median(times) * 1000
        return out
    finally:
        await svc.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server = start_server()
    results: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    out: dict[str, Any] = {"batches": args.batches, "size": args.size, "sessions": args.sessions,
                           "rounds": args.rounds}
    try:
        with tempfile.TemporaryDirectory(prefix="ctxd-bench-storage-") as tmp:
            if args.only in (None, "push"):
                for rnd in range(args.rounds):
                    order = ["sqlite", "postgresql"] if rnd % 2 == 0 else ["postgresql", "sqlite"]
                    for backend in order:
                        url = "" if backend == "sqlite" else server.create_database()
                        results[backend].append(await run_backend(url, Path(tmp) / f"{backend}{rnd}", args.batches,
                                                                  args.size, args.sessions))
                out["median"] = {b: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                                 for b, runs in results.items()}
                out["runs"] = results
            if args.only in (None, "daemons"):
                daemons: dict[str, list[float]] = {"one": [], "two, shared sessions": [], "two, own sessions": []}
                for rnd in range(args.rounds):
                    runs = [("one", 1, True), ("two, shared sessions", 2, True), ("two, own sessions", 2, False)]
                    for name, workers, shared in (runs if rnd % 2 == 0 else runs[::-1]):
                        rate = await asyncio.to_thread(run_daemons, server.create_database(),
                                                       Path(tmp) / f"daemons{rnd}-{len(daemons[name])}-{workers}",
                                                       workers, args.batches * 2, args.size, args.sessions,
                                                       args.clients, shared)
                        daemons[name].append(rate)
                out["daemons"] = {"clients": args.clients, "runs": daemons,
                                  "median": {k: statistics.median(v) for k, v in daemons.items()}}
            if args.only in (None, "search"):
                search = {}
                for backend in ("sqlite", "postgresql"):
                    url = "" if backend == "sqlite" else server.create_database()
                    search[backend] = await run_search(url, Path(tmp) / f"search-{backend}", args.search_messages,
                                                       args.queries)
                out["search"] = {"messages": args.search_messages, "queries": args.queries, **search}
    finally:
        stop_server(server)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="clients pushing at once (two daemons: half each)")
    parser.add_argument("--search-messages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=50, help="searches timed per kind of query")
    parser.add_argument("--only", choices=["push", "daemons", "search"])
    args = parser.parse_args()
    out = asyncio.run(main_async(args))
    if "median" in out:
        s, p = out["median"]["sqlite"], out["median"]["postgresql"]
        print(f"{'figure':32} {'SQLite':>12} {'PostgreSQL':>12} {'PG/SQLite':>10}")
        for key, label in (("push_msg_per_s", "batch push (msg/s)"),
                           ("concurrent_push_msg_per_s", "concurrent batch push (msg/s)"),
                           ("prompt_p50_ms", "context/prompt p50 (ms)")):
            print(f"{label:32} {s[key]:12,.1f} {p[key]:12,.1f} {p[key] / s[key]:10.2f}")
    if "daemons" in out:
        d = out["daemons"]["median"]
        print(f"PostgreSQL, {args.clients} clients pushing batches of {args.size} to {args.sessions} sessions:")
        for name, rate in d.items():
            print(f"  {name:24} {rate:10,.0f} msg/s  {rate / d['one']:5.2f}x")
    if "search" in out:
        found = out["search"]
        print(f"search over {found['messages']:,} messages, p50 ms: {'':14} {'SQLite':>10} {'PostgreSQL':>10}")
        for key in found["sqlite"]:
            print(f"  {key:38} {found['sqlite'][key]:10,.1f} {found['postgresql'][key]:10,.1f}")
    Path("bench-results").mkdir(exist_ok=True)
    Path("bench-results/storage.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
