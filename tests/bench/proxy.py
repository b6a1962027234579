"""Benchmark of ``ctxd proxy``: what it adds to a request, against the same fake upstream
reached directly.

    python -m tests.bench.proxy [--requests 200] [--conversations 100] [--out bench-results/proxy.json]
                                [--daemon in-process|socket] [--litellm PYTHON|auto] [--cores shared|split]

* added latency of a non-streaming OpenAI request (p50, p99), one conversation growing
  by a turn per request in a 200K window (no compression due), direct, proxied and
  through a bare pass-through on the same stack (``tests.bench.passthrough``: uvicorn,
  httpx over httpcore, the proxy's socket and one-send writes, none of ctxd's work: what
  any proxy of this design adds) in a new order each round; the JSON's ``ctxd_share_ms``
  is the proxy's added time less the pass-through's; the ratio that counts is ctxd's added
  p50 over the pass-through's (target at most 2x); with ``--litellm``, LiteLLM's proxy on
  the same upstream joins the rounds (``tests.bench.litellm_proxy``), a figure beside it;
* time to the first streamed byte, the same three;
* 100 concurrent streaming conversations of 3 turns each through the proxy: wall time,
  per-request p50/p99, that every session holds its 6 messages, and the proxy's RSS;
* a 300-turn Anthropic conversation (a tool call and its output each turn, the client's
  cache breakpoints on its system prompt and last message) at an 8K window: the share of
  upstream requests that start with the previous request's content up to its last cache
  breakpoint, and the input tokens sent in all, through the proxy and direct (the
  client's own requests, sent to the fake upstream until one no longer fits).

``--cores split``: during the latency rounds, this process (the client and the fake
upstream) on one core and the proxies on the others. Sharing the cores (the default), the
kernel runs the fake upstream, woken by the proxy's write, on the proxy's own core in about
half the requests (a synchronous wake-up goes to the waker's core): the proxy is held for
the upstream's work, ~0.7 ms, while the other core idles, so ctxd's turn, which runs while
a remote upstream answers, runs after it instead. Split, the upstream is elsewhere, as a
real one is; both figures are in docs/performance.md.

``--daemon``: where the daemon runs: ``in-process`` (the default, as ``ctxd proxy`` runs
it when none is running: in the proxy's process, so the RSS is both's) or ``socket`` (a
daemon process of its own, which the proxy connects to).

Real processes: a ctxd daemon and ``ctxd proxy`` in subprocesses, the fake upstream
(tests/proxy/upstream.py) in a thread of this process, httpx as the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import psutil

from ctxd.tokens import TokenCounter
from tests.bench.spine import Result, machine, percentile, table
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


def _place(pids: list[int], cpus: set[int]) -> None:
    """Every thread of each process (and of its children) onto ``cpus``; threads made
    later inherit it from the one that makes them."""
    for pid in pids:
        try:
            family = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:
            continue
        for member in family:
            try:
                threads = os.listdir(f"/proc/{member}/task")
            except OSError:
                continue
            for tid in threads:
                try:
                    os.sched_setaffinity(int(tid), cpus)
                except OSError:  # (a thread that ended meanwhile)
                    pass


def _order(urls: dict[str, str], i: int) -> list[str]:
    """The order of round ``i``'s requests, a permutation of its own (seeded): no target
    always follows the same one (the request after a proxied one finds the daemon storing
    its reply)."""
    order = list(urls)
    random.Random(i).shuffle(order)
    return order


LONG_WINDOW = 8192
LONG_MAX_TOKENS = 1024
LONG_SYSTEM = "You are a build agent. Check each module with the tool, then report."
LONG_TOOLS = [{"name": "check_build", "description": "Check a module's build.",
               "input_schema": {"type": "object", "properties": {"module": {"type": "string"}}}}]
LONG_OUTPUT = " ".join(f"line {i}: build step finished, file src/module_{i}.py compiled" for i in range(25))


def _blocks(body: dict[str, Any]) -> tuple[list[str], int]:
    """A Messages API request as the sequence its prompt cache sees (tools, system blocks,
    then each message's blocks, breakpoints left out), and the index of its last block
    with a cache breakpoint (-1: none)."""
    out = [json.dumps(body.get("tools"), sort_keys=True)]
    last = -1
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        last = len(out) if "cache_control" in block else last
        out.append(json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True))
    for message in body["messages"]:
        content = message["content"]
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            last = len(out) if "cache_control" in block else last
            out.append(message["role"] + json.dumps({k: v for k, v in block.items() if k != "cache_control"},
                                                    sort_keys=True))
    return out, last


def prefix_kept(bodies: list[dict[str, Any]]) -> tuple[int, int, int]:
    """How many requests start with the previous request's content up to its last cache
    breakpoint (what Anthropic's prompt cache can reuse), of how many had a previous one,
    and how many of the others differ first where ctxd cleared an old tool output."""
    kept = pruned = 0
    previous: tuple[list[str], int] | None = None
    for body in bodies:
        blocks = _blocks(body)
        if previous is not None and previous[1] >= 0:
            end = previous[1] + 1
            if blocks[0][:end] == previous[0][:end]:
                kept += 1
            else:
                at = next(i for i in range(end) if i >= len(blocks[0]) or blocks[0][i] != previous[0][i])
                pruned += at < len(blocks[0]) and "[Old tool result cleared by ctxd" in blocks[0][at]
        previous = blocks
    return kept, max(0, len(bodies) - 1), pruned


def input_tokens(counter: TokenCounter, body: dict[str, Any]) -> int:
    """The request's prompt in ctxd's count: the text of the system prompt, the tool
    schemas, and each block (a tool call's name and input, a tool result's text)."""
    texts = [json.dumps(body.get("tools"))]
    system = body.get("system")
    texts += [system] if isinstance(system, str) else [b.get("text", "") for b in system or []]
    for message in body["messages"]:
        content = message["content"]
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if block.get("type") == "tool_use":
                texts.append(block["name"] + json.dumps(block.get("input")))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                texts.append(inner if isinstance(inner, str) else " ".join(b.get("text", "") for b in inner or []))
            else:
                texts.append(block.get("text", ""))
    return sum(_counted(counter, t) for t in texts)


_COUNTS: dict[str, int] = {}


def _counted(counter: TokenCounter, text: str) -> int:
    """Each block is counted once (the client resends its whole history every turn)."""
    if text not in _COUNTS:
        _COUNTS[text] = counter.count(text)
    return _COUNTS[text]


async def long_conversation(http: httpx.AsyncClient, upstream: FakeUpstream, proxy_url: str, turns: int,
                            daemon: Daemon) -> list[Result]:
    """``turns`` turns of an agent through the proxy, each client request also sent direct
    while it fits the window."""
    counter = TokenCounter.for_model("claude-sonnet-4")
    headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "x-ctxd-session": "bench-long",
               "x-ctxd-context-window": str(LONG_WINDOW)}
    messages: list[dict[str, Any]] = []
    client_bodies: list[dict[str, Any]] = []
    fits = True
    direct_sent = 0

    async def send(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal fits, direct_sent
        client_bodies.append(body)
        if fits and input_tokens(counter, body) + LONG_MAX_TOKENS <= LONG_WINDOW:
            (await http.post(upstream.url + "/v1/messages", json=body, headers={**headers, "x-bench": "direct"})) \
                .raise_for_status()
            direct_sent += 1
        else:
            fits = False
        response = await http.post(proxy_url + "/v1/messages", json=body, headers={**headers, "x-bench": "proxy"})
        response.raise_for_status()
        return response.json()

    def marked(history: list[dict[str, Any]]) -> dict[str, Any]:
        """The client's body: breakpoints on its system prompt and its last message, as Claude Code puts them."""
        out = [dict(m) for m in history]
        last = out[-1]
        content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
        last["content"] = [*content[:-1], dict(content[-1], cache_control={"type": "ephemeral"})]
        return {"model": MODEL, "max_tokens": LONG_MAX_TOKENS, "tools": LONG_TOOLS, "messages": out,
                "system": [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]}

    start = time.perf_counter()
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Request {turn}: please use the tool to check the build of "
                                                    f"module {turn}."})
        reply = await send(marked(messages))
        messages.append({"role": "assistant", "content": reply["content"]})
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                      "content": f"{LONG_OUTPUT} (turn {turn})"}]})
        reply = await send(marked(messages))
        messages.append({"role": "assistant", "content": reply["content"]})
    wall = time.perf_counter() - start
    proxied = [r.json for r in upstream.chats("/v1/messages") if r.headers.get("x-bench") == "proxy"]
    direct = [r.json for r in upstream.chats("/v1/messages") if r.headers.get("x-bench") == "direct"]
    assert len(proxied) == len(client_bodies)
    kept, followed, pruned = prefix_kept(proxied)
    kept_direct, followed_direct, _ = prefix_kept(direct)
    tokens_proxied = [input_tokens(counter, b) for b in proxied]
    tokens_client = [input_tokens(counter, b) for b in client_bodies]
    n = len(direct)
    from tests.proxy.conftest import sessions
    info = next(i for i in await sessions(daemon) if i["sessionId"] == "bench-long")
    results = [
        Result("proxy", f"{turns}-turn conversation at {LONG_WINDOW // 1024}K: requests", len(proxied), "",
               details={"wall_s": wall, "direct_requests_that_fit": n}),
        Result("proxy", "  prefix up to the last breakpoint kept, through the proxy",
               100 * kept / followed if followed else 0, "%", 100 * kept_direct / followed_direct
               if followed_direct else None, f"direct, first {n} requests",
               details={"kept": kept, "followed": followed, "compressions": info.get("compressionCount", 0),
                        "pruned": pruned}),
        Result("proxy", "  requests that did not keep it: an old tool output cleared", pruned, "",
               details={"other": followed - kept - pruned}),
        Result("proxy", "  compression passes (each starts a new prefix)", info.get("compressionCount", 0), ""),
        Result("proxy", "  input tokens sent, all requests, through the proxy", sum(tokens_proxied), "tokens",
               sum(tokens_client), "the client's bodies (direct would not fit)",
               details={"largest_request": max(tokens_proxied)}),
        Result("proxy", f"  input tokens sent, the first {n} requests (direct fits)", sum(tokens_proxied[:n]),
               "tokens", sum(tokens_client[:n]), "direct",
               sum(tokens_proxied[:n]) / sum(tokens_client[:n]) if n else None),
        Result("proxy", "  largest request through the proxy", max(tokens_proxied), "tokens",
               LONG_WINDOW, "the window"),
    ]
    return results


async def run(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    base = short_dir("ctxd-bench-proxy-")
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    proxy: ProxyProcess | None = None
    floor: ProxyProcess | None = None
    litellm = None
    try:
        if args.daemon == "socket":
            daemon.start()
        with FakeUpstream() as upstream:
            # Latency is measured here, not the bill: no cached-prefix reports, whose
            # tokenizing of every request would compete for the cores being timed.
            upstream.caching = False
            assert daemon.socket_path is not None
            own = ["--data-dir", str(daemon.data_dir)] if args.daemon == "in-process" else []
            proxy = ProxyProcess(daemon.socket_path, upstream, base / "proxy.log", own)
            proxy.command.remove("-vv")
            if args.daemon == "in-process":
                proxy.command.remove("--no-autostart")  # no daemon runs: the proxy runs one itself
            proxy.start()
            floor = ProxyProcess(daemon.socket_path, upstream, base / "floor.log", [])
            floor.command = [sys.executable, "-m", "tests.bench.passthrough", upstream.url]
            floor.start()
            if args.litellm:
                from tests.bench.litellm_proxy import LiteLLMProcess, interpreter
                litellm = LiteLLMProcess(interpreter(args.litellm), upstream.url, base).start()
            cpus = sorted(os.sched_getaffinity(0))
            split = args.cores == "split" and len(cpus) >= 2
            if args.cores == "split" and not split:
                print("--cores split: one core only here; the cores are shared", file=sys.stderr)
            servers = [p.proc.pid for p in (proxy, floor, litellm, daemon) if p is not None and p.proc is not None]
            if split:
                _place([os.getpid()], {cpus[0]})
                _place(servers, set(cpus[1:]))
            placement = " (cores split)" if split else ""
            direct_url = upstream.url + "/v1/chat/completions"
            proxied_url = proxy.url + "/v1/chat/completions"
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(timeout=60, limits=limits) as http:
                # 1. Non-streaming added latency: direct, through the bare pass-through (the
                # stack's floor) and through ctxd, in a new order each round.
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark."}]
                urls = {"direct": direct_url, "floor": floor.url + "/v1/chat/completions", "proxy": proxied_url}
                if litellm is not None:
                    urls["litellm"] = litellm.url + "/v1/chat/completions"
                times: dict[str, list[float]] = {k: [] for k in urls}
                # No compression due (what the target is for): at the default 8K window
                # passes ran from about request 130 on.
                headers = {"authorization": "Bearer bench", "x-ctxd-session": "bench-latency",
                           "x-ctxd-context-window": "200000"}
                # LiteLLM checks its master key (it refuses to start without one).
                keyed = {"litellm": {**headers, **litellm.headers}} if litellm is not None else {}
                for i in range(args.requests):
                    messages.append({"role": "user", "content": f"Request {i}: report the build status of module {i}."})
                    for k in _order(urls, i):
                        times[k].append(await _whole(http, urls[k], messages, keyed.get(k, headers)))
                    messages.append({"role": "assistant", "content": f"Answer to: Request {i}: report the build "
                                                                       f"status of module {i}."})
                warm = slice(min(10, args.requests // 10), None)
                for q in (50, 99):
                    d, f, p = (percentile(times[k][warm], q) for k in ("direct", "floor", "proxy"))
                    results.append(Result("proxy", f"non-streaming request p{q} (added {p - d:.2f} ms)", p, "ms",
                                          d, "direct", p / d if d else None,
                                          details={"added_ms": p - d, "floor_added_ms": f - d,
                                                   "ctxd_share_ms": p - f}))
                    results.append(Result("proxy", f"  through a bare pass-through on the same stack, p{q} "
                                          f"(added {f - d:.2f} ms)", f, "ms", d, "direct", f / d if d else None))
                    if litellm is not None:
                        x = percentile(times["litellm"][warm], q)
                        results.append(Result("proxy", f"  through LiteLLM's proxy, p{q} (added {x - d:.2f} ms)", x,
                                              "ms", d, "direct", x / d if d else None,
                                              details={"added_ms": x - d}))
                    if q == 50:
                        results.append(Result("proxy", f"  added p50, ctxd over the bare pass-through{placement}",
                                              p - d, "ms",
                                              f - d, "pass-through added", (p - d) / (f - d) if f > d else None,
                                              "<= 2x", (p - d) <= 2 * (f - d)))
                        if litellm is not None:
                            x = percentile(times["litellm"][warm], 50)
                            results.append(Result("proxy", "  added p50, LiteLLM over the bare pass-through", x - d,
                                                  "ms", f - d, "pass-through added",
                                                  (x - d) / (f - d) if f > d else None))
                            results.append(Result("proxy", "  added p50, ctxd over LiteLLM", p - d, "ms", x - d,
                                                  "LiteLLM added", (p - d) / (x - d) if x > d else None))
                # 2. Time to first streamed byte.
                firsts: dict[str, list[float]] = {k: [] for k in urls}
                for i in range(max(20, args.requests // 4)):
                    msgs = [{"role": "user", "content": f"Stream {i}, please."}]
                    h = {"authorization": "Bearer bench", "x-ctxd-session": f"bench-ttfb-{i}"}
                    for k in _order(urls, i):
                        firsts[k].append((await _first_byte(http, urls[k], msgs,
                                                            {**h, **litellm.headers} if k == "litellm" and litellm
                                                            else h))[0])
                d, f, p = (percentile(firsts[k], 50) for k in ("direct", "floor", "proxy"))
                results.append(Result("proxy", "time to first streamed byte p50", p, "ms", d, "direct",
                                      p / d if d else None, details={"floor_ms": f}))
                results.append(Result("proxy", "  through the bare pass-through", f, "ms", d, "direct",
                                      f / d if d else None))
                if litellm is not None:
                    x = percentile(firsts["litellm"], 50)
                    results.append(Result("proxy", "  through LiteLLM's proxy", x, "ms", d, "direct",
                                          x / d if d else None))
                if split:  # (the load below is the proxy's alone: every core)
                    _place([os.getpid(), *servers], set(cpus))
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

                assert proxy.proc is not None
                process = psutil.Process(proxy.proc.pid)
                rss_idle = process.memory_info().rss
                rss_peak = rss_idle
                done = asyncio.Event()

                async def sample_rss() -> None:
                    nonlocal rss_peak
                    while not done.is_set():
                        rss_peak = max(rss_peak, process.memory_info().rss)
                        await asyncio.sleep(0.02)

                sampler = asyncio.create_task(sample_rss())
                start = time.perf_counter()
                await asyncio.gather(*(conversation(n) for n in range(args.conversations)))
                wall = time.perf_counter() - start
                done.set()
                await sampler
                results.append(Result("proxy", f"{args.conversations} concurrent streaming conversations x 3 turns, "
                                      "wall", wall * 1000, "ms",
                                      details={"p50_ms": percentile(per_request, 50),
                                               "p99_ms": percentile(per_request, 99)}))
                results.append(Result("proxy", "  per streamed request p50", percentile(per_request, 50), "ms"))
                results.append(Result("proxy", "  per streamed request p99", percentile(per_request, 99), "ms"))
                results.append(Result("proxy", "  proxy RSS, peak under that load", rss_peak / 2**20, "MiB",
                                      rss_idle / 2**20, "before it"))
                from tests.proxy.conftest import history
                complete = 0
                for n in range(args.conversations):
                    if len(await history(daemon, f"bench-many-{n}")) == 6:
                        complete += 1
                results.append(Result("proxy", "conversations with all 6 messages stored", complete, "",
                                      target=f"{args.conversations}", passed=complete == args.conversations))
                # 4. A long conversation: prompt caching and tokens sent.
                if args.turns:
                    results += await long_conversation(http, upstream, proxy.url, args.turns, daemon)
    finally:
        for process in (proxy, floor, litellm):
            if process is not None:
                process.stop()
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--turns", type=int, default=300, help="turns of the long conversation (0: none)")
    parser.add_argument("--out", default="bench-results/proxy.json")
    parser.add_argument("--cores", choices=["shared", "split"], default="shared",
                        help="split: in the latency rounds, the client and the fake upstream on one core, the "
                             "proxies on the others (a remote upstream never runs on the proxy's core)")
    parser.add_argument("--daemon", choices=["in-process", "socket"], default="in-process",
                        help="the daemon in the proxy's process (proxy.in_process) or in its own")
    parser.add_argument("--litellm", metavar="PYTHON|auto", default="",
                        help="also measure LiteLLM's proxy, run by PYTHON (an interpreter with litellm[proxy]); "
                             "auto: a virtualenv made under bench-results/ with pip")
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
