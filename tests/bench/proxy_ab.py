"""Before/after of ``ctxd proxy`` in one run: a proxy from each of several trees (exports
of commits), one daemon and one fake upstream, requests rotating between direct and each
proxy so that machine load falls on all of them alike.

    python -m tests.bench.proxy_ab TREE [TREE ...] [--requests 300]

Each TREE is a directory holding a ``ctxd`` package (``git archive REV ctxd | tar -x -C
DIR``); ``+``-joined paths put more on its ``sys.path``; ``TREE#inproc``: that proxy runs
its own daemon in its process (``proxy.in_process``, a data directory and socket of its
own) instead of using the shared one; its CPU time then includes the daemon's (the shared
daemon's CPU time per request of the proxies using it is printed too). Prints, per tree: the added p50
and p99 of a non-streaming request (one conversation growing by a turn per request), the
added time to the first streamed byte, ``GET /v1/models`` through the proxy's
pass-through (the bare HTTP hop), and the proxy's CPU time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import time
from typing import Any

import httpx
import psutil

from tests.bench.spine import percentile
from tests.e2e.helpers import Daemon, short_dir
from tests.proxy.conftest import ProxyProcess
from tests.proxy.upstream import MODEL, FakeUpstream

WINDOW = "200000"
"""The window of the benchmark's sessions: no compression due in its 300 turns (the
issue's latency target is for requests with none due; at the default 8K window passes
ran from about turn 130 on, and their CPU fell on later requests)."""


def _rotated(n: int, i: int) -> list[int]:
    """The order of round ``i``: each round a permutation of its own (seeded), so that no
    tree always follows the same one. (A rotation did: each proxy's request always came
    right after the previous tree's, whose reply push the daemon was still storing, and
    the tree after the direct request was ~1-1.5 ms ahead of its place in another order.)"""
    order = list(range(n))
    random.Random(i).shuffle(order)
    return order


async def run(trees: list[str], requests: int) -> None:
    base = short_dir("ctxd-bench-ab-")
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    proxies: list[ProxyProcess] = []
    try:
        daemon.start()
        assert daemon.socket_path is not None
        with FakeUpstream() as upstream:
            # Latency is measured here, not the bill: no cached-prefix reports, whose
            # tokenizing of every request would compete for the cores being timed.
            upstream.caching = False
            for k, spec in enumerate(trees):
                tree, _, mode = spec.partition("#")
                if mode not in ("", "inproc"):
                    raise SystemExit(f"{spec}: unknown mode {mode!r} (TREE or TREE#inproc)")
                if mode:
                    own = base / f"own{k}"
                    proxy = ProxyProcess(own / "run" / "ctxd.sock", upstream, base / f"proxy{k}.log",
                                         ["--data-dir", str(own / "data")])
                    proxy.command.remove("--no-autostart")
                else:
                    proxy = ProxyProcess(daemon.socket_path, upstream, base / f"proxy{k}.log", [])
                proxy.command.remove("-vv")
                at = proxy.command.index("-m")
                proxy.command[at:at + 2] = ["-c", f"import sys; sys.path[0:0] = {tree.split('+')!r}; "
                                                  "from ctxd.__main__ import main; sys.exit(main())"]
                proxies.append(proxy.start())
            urls = [upstream.url] + [p.url for p in proxies]
            whole: list[list[float]] = [[] for _ in urls]
            first: list[list[float]] = [[] for _ in urls]
            hop: list[list[float]] = [[] for _ in urls]
            conversations: list[list[dict[str, Any]]] = [[{"role": "system", "content": "A benchmark."}] for _ in urls]
            cpu = [psutil.Process(p.proc.pid) for p in proxies if p.proc is not None]
            shared = psutil.Process(daemon.pid)
            on_shared = sum(1 for spec in trees if "#" not in spec)  # proxies using the shared daemon
            async with httpx.AsyncClient(timeout=60) as http:
                cpu_before = [sum(c.cpu_times()[:2]) for c in cpu]
                shared_before = sum(shared.cpu_times()[:2])
                for i in range(requests):
                    for k in _rotated(len(urls), i):
                        messages = conversations[k]
                        messages.append({"role": "user", "content": f"Request {i}: the build status of module {i}."})
                        start = time.perf_counter()
                        response = await http.post(urls[k] + "/v1/chat/completions", json={
                            "model": MODEL, "messages": messages}, headers={"x-ctxd-session": f"ab-{k}",
                                                                            "x-ctxd-context-window": WINDOW})
                        response.raise_for_status()
                        whole[k].append((time.perf_counter() - start) * 1000)
                        messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]
                                         ["content"]})
                cpu_used = [(sum(c.cpu_times()[:2]) - b) / requests * 1000 for c, b in zip(cpu, cpu_before)]
                shared_used = (sum(shared.cpu_times()[:2]) - shared_before) / max(1, on_shared * requests) * 1000
                for i in range(requests):
                    for k in _rotated(len(urls), i):
                        start = time.perf_counter()
                        (await http.get(urls[k] + "/v1/models")).raise_for_status()
                        hop[k].append((time.perf_counter() - start) * 1000)
                for i in range(max(20, requests // 4)):
                    for k in _rotated(len(urls), i):
                        body = {"model": MODEL, "stream": True,
                                "messages": [{"role": "user", "content": f"Stream {i}"}]}
                        start = time.perf_counter()
                        async with http.stream("POST", urls[k] + "/v1/chat/completions", json=body,
                                               headers={"x-ctxd-session": f"ab-stream-{k}-{i}"}) as response:
                            seen = None
                            async for _ in response.aiter_raw():  # read to the end: the connection is reused
                                seen = seen or (time.perf_counter() - start) * 1000
                            first[k].append(seen or 0.0)
        warm = slice(min(10, requests // 10), None)
        d50, d99 = percentile(whole[0][warm], 50), percentile(whole[0][warm], 99)
        f50, h50 = percentile(first[0], 50), percentile(hop[0], 50)
        print(f"direct: p50 {d50:.2f} ms, p99 {d99:.2f} ms, first byte {f50:.2f} ms, GET /v1/models {h50:.2f} ms; "
              f"the shared daemon's CPU {shared_used:.2f} ms per request of the {on_shared} proxies using it")
        for k, tree in enumerate(trees, 1):
            p50, p99 = percentile(whole[k][warm], 50), percentile(whole[k][warm], 99)
            print(f"{tree}: added p50 {p50 - d50:.2f} ms, p99 {p99 - d99:.2f} ms; first byte added "
                  f"{percentile(first[k], 50) - f50:.2f} ms; bare hop added {percentile(hop[k], 50) - h50:.2f} ms; "
                  f"proxy CPU {cpu_used[k - 1]:.2f} ms per request")
    finally:
        for proxy in proxies:
            proxy.stop()
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.proxy_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    asyncio.run(run(args.trees, args.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
