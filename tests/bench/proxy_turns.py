"""CPU time of a proxy turn with the daemon in process and no HTTP, for trees side by side.

    python -m tests.bench.proxy_turns TREE [TREE ...] [--turns 300] [--api openai|anthropic] [--rounds 3] [--on-loop]

Each TREE is a directory holding a ``ctxd`` package (``git archive REV ctxd | tar -x -C
DIR``). Per round, each tree runs in a process of its own, in turn: the proxy's
``Sessions`` on the daemon in that process (``PortLink``, the service port, a data directory of
its own), one conversation growing by a turn per request in a 200K window (no
compression due), as ``ctxd proxy`` handles a request: the body decoded and read
(``read``), the turn's push and prompt (``turn``), the upstream body built and encoded
(``body``), the reply pushed and settled (``reply``). Printed per tree: the median over
the turns (after 20 warm-up turns) of each phase's CPU time on the event loop's thread
(``time.thread_time``: the SQLite threads' work is not in it, their hops are), and the
wall time of the turn; then, over the rounds, the smallest and the median of those
medians (the smallest is the steadier on a shared machine). ``--on-loop``: every small push's
transaction on the event loop's thread (``Database.brief_gap`` below zero), as when requests
come seconds apart; by default a turn's push comes within the gap of the reply's push before
it, and both go to the writer's thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

PHASES = ("read", "turn", "body", "reply", "total", "turn_wall")

CHILD = r'''
import asyncio, json, shutil, sys, tempfile, time
from pathlib import Path
from ctxd.config import load_config
from ctxd.proxy.apis import split, upstream_body
from ctxd.proxy.convert import dumps, loads
from ctxd.proxy.sessions import Sessions

try:
    from ctxd.embed import open_here
    from ctxd.proxy.inproc import PortLink

    async def open_link(config):
        return PortLink(await open_here(config))
except ImportError:  # (a tree from before the service port)
    from ctxd.proxy.inproc import InProcessLink

    open_link = InProcessLink.open

API, TURNS, ON_LOOP = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

async def main():
    base = Path(tempfile.mkdtemp(prefix="ctxd-turns-", dir="/tmp"))
    config = load_config(None, overrides={"daemon": {"data_dir": str(base / "data"),
                                                     "socket": str(base / "run" / "ctxd.sock")}})
    link = await open_link(config)
    if ON_LOOP:
        link.here.daemon.service.db.brief_gap = -1.0
    sessions = Sessions(link)
    messages = [] if API == "anthropic" else [{"role": "system", "content": "You are a benchmark."}]
    out = {k: [] for k in ("read", "turn", "body", "reply", "total", "turn_wall")}
    try:
        for i in range(TURNS):
            messages.append({"role": "user", "content": f"Request {i}: report the build status of module {i}."})
            body = {"model": "gpt-4o-mini", "messages": messages}
            if API == "anthropic":
                body.update(system="You are a benchmark.", max_tokens=1000)
            raw = dumps(body)
            c0 = time.thread_time()
            decoded = loads(raw)
            parts = split(API, decoded)
            conv = sessions.read(API, decoded, parts, session="bench", window=200000)
            c1, w1 = time.thread_time(), time.perf_counter()
            tracked, chain, prompt = await sessions.turn(conv, API)
            c2, w2 = time.thread_time(), time.perf_counter()
            memo = getattr(conv, "align", None)  # (trees before the alignment memo)
            dumps(upstream_body(API, decoded, parts, prompt, memo) if memo is not None
                  else upstream_body(API, decoded, parts, prompt))
            if memo is not None:
                memo.previous = None
            c3 = time.thread_time()
            reply = {"role": "assistant", "content": f"Answer to: Request {i}."}
            await sessions.push_reply(tracked, chain, conv, [reply], {"inputTokens": 40 + 30 * i, "outputTokens": 12})
            await sessions._settle(tracked)
            c4 = time.thread_time()
            messages.append(reply)
            if i >= 20:
                for k, v in zip(out, (c1 - c0, c2 - c1, c3 - c2, c4 - c3, c4 - c0, w2 - w1)):
                    out[k].append(v * 1000)
    finally:
        await sessions.drain()
        await link.close()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({k: sorted(v)[len(v) // 2] for k, v in out.items()}))

asyncio.run(main())
'''


def run_tree(tree: str, api: str, turns: int, on_loop: bool = False) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    with tempfile.TemporaryDirectory() as cwd:  # (nothing of the caller's directory on the path)
        done = subprocess.run([sys.executable, "-c", CHILD, api, str(turns), "1" if on_loop else "0"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.proxy_turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--on-loop", action="store_true", help="every small push's transaction on the loop's thread")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for n in range(args.rounds):
        for tree in args.trees if n % 2 == 0 else reversed(args.trees):
            got = run_tree(tree, args.api, args.turns, args.on_loop)
            results[tree].append(got)
            print(f"round {n + 1} {tree}: " + ", ".join(f"{k} {got[k]:.3f}" for k in PHASES) + " ms", flush=True)
    print(f"\n{args.api}, {args.turns} turns, {args.rounds} rounds{', pushes on the loop' if args.on_loop else ''}: "
          f"smallest / median of the rounds' medians (ms)")
    for tree, runs in results.items():
        cells: list[Any] = [f"{k} {min(r[k] for r in runs):.3f} / {statistics.median(r[k] for r in runs):.3f}"
                            for k in PHASES]
        print(f"{tree}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
