"""SQLite against PostgreSQL, same run, same machine: batch push throughput and
``context/prompt`` p50 through the service (in process: the store is what differs).

    python -m tests.bench.storage                # 40 batches of 100 messages per backend
    python -m tests.bench.storage --batches 100

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


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server = start_server()
    results: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    try:
        with tempfile.TemporaryDirectory(prefix="ctxd-bench-storage-") as tmp:
            for rnd in range(args.rounds):
                order = ["sqlite", "postgresql"] if rnd % 2 == 0 else ["postgresql", "sqlite"]
                for backend in order:
                    url = "" if backend == "sqlite" else server.create_database()
                    results[backend].append(await run_backend(url, Path(tmp) / f"{backend}{rnd}", args.batches,
                                                              args.size, args.sessions))
    finally:
        stop_server(server)
    summary = {b: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for b, runs in results.items()}
    return {"batches": args.batches, "size": args.size, "sessions": args.sessions, "rounds": args.rounds,
            "median": summary, "runs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    out = asyncio.run(main_async(args))
    s, p = out["median"]["sqlite"], out["median"]["postgresql"]
    print(f"{'figure':32} {'SQLite':>12} {'PostgreSQL':>12} {'PG/SQLite':>10}")
    for key, label in (("push_msg_per_s", "batch push (msg/s)"),
                       ("concurrent_push_msg_per_s", "concurrent batch push (msg/s)"),
                       ("prompt_p50_ms", "context/prompt p50 (ms)")):
        print(f"{label:32} {s[key]:12,.1f} {p[key]:12,.1f} {p[key] / s[key]:10.2f}")
    Path("bench-results").mkdir(exist_ok=True)
    Path("bench-results/storage.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
