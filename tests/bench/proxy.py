"""Benchmark of ``ctxd proxy``: what it adds to a request, against the same fake upstream
reached directly.

    python -m tests.bench.proxy [--requests 200] [--conversations 100] [--out bench-results/proxy.json]

* added latency of a non-streaming OpenAI request (p50, p99), one conversation growing
  by a turn per request, proxied and direct requests alternating;
* time to the first streamed byte, proxied and direct;
* 100 concurrent streaming conversations of 3 turns each through the proxy: wall time,
  per-request p50/p99, and that every session holds its 6 messages.

Real processes: a ctxd daemon and ``ctxd proxy`` in subprocesses, the fake upstream
(tests/proxy/upstream.py) in a thread of this process, httpx as the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from tests.bench.spine import Result, fmt, machine, percentile, table
from tests.e2e.helpers import Daemon, short_dir
from tests.proxy.conftest import ProxyProcess
from tests.proxy.upstream import MODEL, FakeUpstream


async def _whole(http: httpx.AsyncClient, url: str, messages: list[dict[str, Any]], headers: dict[str, str]) -> float:
    start = time.perf_counter()
    response = await http.post(url, json={"model": MODEL, "messages": messages}, headers=headers)
    response.raise_for_status()
    return (time.perf_counter() - start) * 1000


async def _first_byte(http: httpx.AsyncClient, url: str, messages: list[dict[str, Any]],
                      headers: dict[str, str]) -> tuple[float, float, str]:
    start = time.perf_counter()
    first = None
    text = ""
    async with http.stream("POST", url, json={"model": MODEL, "messages": messages, "stream": True},
                           headers=headers) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            if first is None:
                first = (time.perf_counter() - start) * 1000
            for line in chunk.decode().splitlines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    text += delta.get("content") or ""
    return first or 0.0, (time.perf_counter() - start) * 1000, text


async def run(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    base = short_dir("ctxd-bench-proxy-")
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    proxy: ProxyProcess | None = None
    try:
        daemon.start()
        with FakeUpstream() as upstream:
            assert daemon.socket_path is not None
            proxy = ProxyProcess(daemon.socket_path, upstream, base / "proxy.log", [])
            proxy.command.remove("-vv")
            proxy.start()
            direct_url = upstream.url + "/v1/chat/completions"
            proxied_url = proxy.url + "/v1/chat/completions"
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(timeout=60, limits=limits) as http:
                # 1. Non-streaming added latency.
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark."}]
                direct: list[float] = []
                proxied: list[float] = []
                headers = {"authorization": "Bearer bench", "x-ctxd-session": "bench-latency"}
                for i in range(args.requests):
                    messages.append({"role": "user", "content": f"Request {i}: report the build status of module {i}."})
                    direct.append(await _whole(http, direct_url, messages, headers))
                    proxied.append(await _whole(http, proxied_url, messages, headers))
                    messages.append({"role": "assistant", "content": f"Answer to: Request {i}: report the build "
                                                                       f"status of module {i}."})
                warm = slice(min(10, args.requests // 10), None)
                for q in (50, 99):
                    d, p = percentile(direct[warm], q), percentile(proxied[warm], q)
                    results.append(Result("proxy", f"non-streaming request p{q} (added {p - d:.2f} ms)", p, "ms",
                                          d, "direct", p / d if d else None))
                # 2. Time to first streamed byte.
                first_direct: list[float] = []
                first_proxied: list[float] = []
                for i in range(max(20, args.requests // 4)):
                    msgs = [{"role": "user", "content": f"Stream {i}, please."}]
                    h = {"authorization": "Bearer bench", "x-ctxd-session": f"bench-ttfb-{i}"}
                    first_direct.append((await _first_byte(http, direct_url, msgs, h))[0])
                    first_proxied.append((await _first_byte(http, proxied_url, msgs, h))[0])
                d, p = percentile(first_direct, 50), percentile(first_proxied, 50)
                results.append(Result("proxy", "time to first streamed byte p50", p, "ms", d, "direct",
                                      p / d if d else None))
                # 3. Concurrent streaming conversations.
                per_request: list[float] = []

                async def conversation(n: int) -> None:
                    h = {"authorization": "Bearer bench", "x-ctxd-session": f"bench-many-{n}"}
                    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"Conversation {n} starts."}]
                    for turn in range(3):
                        _, total, text = await _first_byte(http, proxied_url, msgs, h)
                        per_request.append(total)
                        msgs += [{"role": "assistant", "content": text},
                                 {"role": "user", "content": f"Conversation {n} turn {turn}."}]

                start = time.perf_counter()
                await asyncio.gather(*(conversation(n) for n in range(args.conversations)))
                wall = time.perf_counter() - start
                results.append(Result("proxy", f"{args.conversations} concurrent streaming conversations x 3 turns, "
                                      "wall", wall * 1000, "ms",
                                      details={"p50_ms": percentile(per_request, 50),
                                               "p99_ms": percentile(per_request, 99)}))
                results.append(Result("proxy", "  per streamed request p50", percentile(per_request, 50), "ms"))
                results.append(Result("proxy", "  per streamed request p99", percentile(per_request, 99), "ms"))
                from tests.proxy.conftest import history
                complete = 0
                for n in range(args.conversations):
                    if len(await history(daemon, f"bench-many-{n}")) == 6:
                        complete += 1
                results.append(Result("proxy", "conversations with all 6 messages stored", complete, "",
                                      target=f"{args.conversations}", passed=complete == args.conversations))
    finally:
        if proxy is not None:
            proxy.stop()
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--out", default="bench-results/proxy.json")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": machine(), "results": [asdict(r) for r in results]}, indent=2) + "\n")
    print(f"\nwritten to {out}")
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
