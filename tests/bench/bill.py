"""What agents pay through ``ctxd proxy`` against going direct, where providers cache prompts.

    python -m tests.bench.bill [--quick] [--only 1,2] [--set compression.cached_low_water_fraction=0.5]
                               [--out bench-results/bill.json]

A scripted coding agent (each turn: a task, a tool call, its output, an answer; the
client's tool definitions and system prompt resent on every request, cache breakpoints
on its system part and last message as Claude Code puts them) talks to a fake upstream
(tests/proxy/upstream.py's, answering whole with the usage a caching provider would
report) twice per request: through ``ctxd proxy`` at a window below the conversation, and
direct (the client's own request, whatever its size). Every request the upstream
receives is priced as the agent CLIs benchmark prices them (``tests/agents/pricing.py``,
each request read by ``tests/agents/wire.py``): the longest prefix it shares with an
earlier request counts as cached, in 128-token blocks from 1,024; the rest is written
(Anthropic, 1.25x) or uncached (OpenAI); reads bill 0.1x.

Each task: the user asks, the model calls a tool 2-8 times (each call's output goes
back), then answers.

1. Four agents shaped like the issue's CLIs (Anthropic at 48k with a 20k fixed prefix,
   OpenAI Chat at 24k and 16k, the Responses API at 24k), each on a run that ends once
   its own request passes 1.4x the window and one that ends past 3.2x: billed through
   ctxd / direct (target: <= 1.0 on every run, <= 0.8 on runs over twice the window),
   tokens sent, the share of requests that start with the
   whole previous request, passes, and ctxd's own bill (``context/stats``) against the
   benchmark's pricing.
2. The proxy benchmark's long conversation in shape (each task: a short request, one
   tool call, its ~350-token output, the answer), 500 tasks (1,000 requests) at 8k,
   Anthropic: passes per request (the issue's turns; target: <= 10%) and the share of
   tasks during which one ran, the share of requests that start with the whole previous
   one (target: >= 90%), billed against direct; each pass's prompt composition (before
   and after it, and why it ran) is in the JSON (``compressions``).

Real processes: ``ctxd proxy`` with the daemon in its process, the upstream in a thread
of this one, httpx as the client. Figures do not depend on timing (nothing waits for a
cache to expire).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import re
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.agents import wire
from tests.agents.pricing import Pricer, prices_for
from tests.agents.wire import count_text
from tests.bench.spine import Result, machine, table
from tests.bench.workloads import AgentWorkload
from tests.e2e.helpers import Daemon, short_dir
from tests.proxy.conftest import ProxyProcess
from tests.proxy.upstream import MODEL, FakeUpstream

K = 1024
WIRE = {"anthropic": "anthropic", "openai": "chat", "responses": "responses"}
"""The agents harness's names of the APIs (``tests/agents/wire.py``)."""

_SEGMENTS: dict[str, list[int]] = {}


def token_ids(api: str, body: dict[str, Any]) -> list[int]:
    """``tests.agents.wire.token_ids``, each segment encoded once: a direct request of a
    long run resends hundreds of thousands of tokens of history every time."""
    out: list[int] = []
    for piece in wire.segments(api, body):
        ids = _SEGMENTS.get(piece)
        if ids is None:
            ids = _SEGMENTS[piece] = [*wire._ENCODING.encode_ordinary(piece), *(0,) * wire.MESSAGE_FRAMING]
        out.extend(ids)
    return out


class RecentPricer(Pricer):
    """The harness's pricer, comparing a request with the newest earlier ones only: the
    longest shared prefix is the previous request's, or one of the few before a pass (a
    long run's direct requests are each compared with all earlier ones otherwise)."""

    NEWEST = 16

    def longest_prefix(self, tokens: Any) -> int:
        saved, self.seen = self.seen, self.seen[-self.NEWEST:]
        try:
            return super().longest_prefix(tokens)
        finally:
            self.seen = saved


@dataclass
class Priced:
    """One upstream request: its tokens, of them cached (tests/agents/pricing.py), its
    price in uncached input tokens, and whether the whole previous request is its prefix."""

    tokens: int
    cached: int
    cost: float
    follows: bool


def billed(priced: list[Priced]) -> float:
    return sum(p.cost for p in priced)


# --- the upstream: answers whole, with the usage a caching provider reports ----------------


class PricedUpstream(FakeUpstream):
    """The proxy tests' fake upstream, whose chat answers are whole and carry realistic usage:
    every request is priced as it arrives (per run and route), and the reply reports what
    the provider would have billed (Anthropic: input, cache writes and reads; OpenAI:
    prompt tokens with their cached part)."""

    def __init__(self) -> None:
        super().__init__()
        self.pricers: dict[tuple[str, str], Pricer] = {}
        self.priced: dict[tuple[str, str], list[Priced]] = {}
        self._price_lock = threading.Lock()
        self.calls = 0

    def app(self) -> Starlette:
        app = super().app()
        chat = [Route("/v1/chat/completions", self._priced_chat, methods=["POST"]),
                Route("/v1/messages", self._priced_chat, methods=["POST"]),
                Route("/v1/responses", self._priced_chat, methods=["POST"])]
        app.router.routes[:0] = chat
        return app

    async def _priced_chat(self, request: Request) -> Response:
        body = await self._record(request)
        api = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic",
               "/v1/responses": "responses"}[request.url.path]
        key = (request.headers.get("x-bench-run", ""), request.headers.get("x-bench", ""))
        ids = token_ids(WIRE[api], body)
        with self._price_lock:
            pricer = self.pricers.get(key)
            if pricer is None:
                pricer = self.pricers[key] = RecentPricer(prices_for(WIRE[api]))
            previous = pricer.seen[-1] if pricer.seen else None
            bill = pricer.add(ids)
            follows = previous is not None and ids[:len(previous)] == list(previous)
            self.priced.setdefault(key, []).append(Priced(bill.tokens, bill.cached, bill.cost, follows))
        messages = body.get("messages") if api != "responses" else _items_as_messages(body.get("input") or [])
        text, steps = _task(messages)
        wanted = re.search(r"use the tool (\d+) times", text)
        tool = wanted is not None and steps < int(wanted.group(1))
        answer = f"Step {steps}: " + " ".join(text.split())[:60]
        self.calls += 1
        written = bill.tokens - bill.cached if bill.tokens >= 1024 else 0
        if api == "anthropic":
            content: list[Any] = [{"type": "text", "text": answer}]
            if tool:
                content = [{"type": "text", "text": "Let me check."},
                           {"type": "tool_use", "id": f"toolu_{self.calls:08d}", "name": "inspect",
                            "input": {"target": text[-40:]}}]
            return JSONResponse({
                "id": f"msg_{self.calls}", "type": "message", "role": "assistant", "model": MODEL,
                "content": content, "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": bill.tokens - bill.cached - written, "output_tokens": 20,
                          "cache_creation_input_tokens": written, "cache_read_input_tokens": bill.cached}})
        usage_in = bill.tokens
        if api == "responses":
            if tool:
                output = [{"type": "function_call", "id": f"fc_{self.calls}", "call_id": f"call_{self.calls:08d}",
                           "name": "inspect", "arguments": json.dumps({"target": text[-40:]}), "status": "completed"}]
            else:
                output = [{"type": "message", "id": f"msg_{self.calls}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": answer, "annotations": []}]}]
            return JSONResponse({
                "id": f"resp_{self.calls}", "object": "response", "created_at": 1, "status": "completed",
                "model": MODEL, "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": usage_in, "input_tokens_details": {"cached_tokens": bill.cached},
                          "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": usage_in + 20}})
        message: dict[str, Any] = {"role": "assistant", "content": None if tool else answer}
        if tool:
            message["tool_calls"] = [{"id": f"call_{self.calls:08d}", "type": "function", "function": {
                "name": "inspect", "arguments": json.dumps({"target": text[-40:]})}}]
        return JSONResponse({
            "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
            "usage": {"prompt_tokens": usage_in, "completion_tokens": 20, "total_tokens": usage_in + 20,
                      "prompt_tokens_details": {"cached_tokens": bill.cached}}})


def _task(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The newest user text (the task) and how many tool results came after it."""
    results = 0
    for message in reversed(messages):
        role, content = message.get("role"), message.get("content")
        if role == "tool":
            results += 1
            continue
        if role != "user":
            continue
        if isinstance(content, list):
            if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
                results += 1
                continue
            content = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
        return str(content or ""), results
    return "", results


def _items_as_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out = []
    for item in items:
        if item.get("type", "message") == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append({"role": item.get("role"), "content": content})
        elif item.get("type") == "function_call":
            out.append({"role": "assistant", "content": None})
        elif item.get("type") == "function_call_output":
            out.append({"role": "tool", "content": item.get("output")})
    return out


# --- the agent ----------------------------------------------------------------------------------


@dataclass
class Agent:
    """One scripted client: its API, the window ctxd is given, what it resends every
    request (tools and system prompt), how big its tool outputs are, how many turns."""

    name: str
    api: str
    window: int
    fixed: int
    """Tokens of tool definitions and system prompt, sent with every request."""
    output_median: int
    turns: int
    max_tokens: int = 4096
    seed: int = 1
    steps: tuple[int, int] = (2, 8)
    """Tool calls per task, at least and at most."""
    max_requests: int = 0
    """Stop after the task during which this many requests were made (0: all ``turns`` tasks)."""
    until: float = 0.0
    """Stop after the task during which the client's own request passed this many times the
    window (0: all ``turns`` tasks)."""

    def tools(self) -> list[dict[str, Any]]:
        rng = random.Random(self.seed)
        work = AgentWorkload(seed=self.seed)
        tools: list[dict[str, Any]] = []
        total = 0
        i = 0
        while total < self.fixed * 0.8:
            i += 1
            description = work.corpus.text(_DOC, 120, 400)
            params = {"type": "object", "properties": {f"arg{j}": {"type": "string", "description": work.corpus.text(
                _DOC, 10, 40)} for j in range(rng.randint(1, 4))}}
            if self.api == "anthropic":
                tool = {"name": f"tool_{i}", "description": description, "input_schema": params}
            elif self.api == "responses":
                tool = {"type": "function", "name": f"tool_{i}", "description": description, "parameters": params}
            else:
                tool = {"type": "function", "function": {"name": f"tool_{i}", "description": description,
                                                         "parameters": params}}
            tools.append(tool)
            total += count_text(json.dumps(tool))
        return tools

    def system(self) -> str:
        work = AgentWorkload(seed=self.seed + 1)
        return "You are a coding agent. " + work.corpus.text(_DOC, int(self.fixed * 0.2), int(self.fixed * 0.2) + 1)


_DOC = ["Use this tool to {thing} the {file} before you {thing} it.",
        "It returns the {thing} of {func}, or an error when {file} is missing.",
        "Never call it twice for the same {thing}; prefer {func} for large inputs.",
        "Arguments are validated; paths are relative to the repository root ({file})."]


class Conversation:
    """The client's history and how each request is built from it, per API."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.tools = agent.tools()
        self.system = agent.system()
        self.history: list[dict[str, Any]] = []
        self.work = AgentWorkload(seed=agent.seed + 2)

    def body(self) -> dict[str, Any]:
        a = self.agent
        if a.api == "anthropic":
            messages = [dict(m) for m in self.history]
            last = messages[-1]
            content = last["content"] if isinstance(last["content"], list) else [
                {"type": "text", "text": last["content"]}]
            last["content"] = [*content[:-1], dict(content[-1], cache_control={"type": "ephemeral"})]
            return {"model": MODEL, "max_tokens": a.max_tokens, "tools": self.tools, "messages": messages,
                    "system": [{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}]}
        if a.api == "responses":
            return {"model": MODEL, "max_output_tokens": a.max_tokens, "tools": self.tools, "store": False,
                    "instructions": self.system, "input": list(self.history)}
        return {"model": MODEL, "max_tokens": a.max_tokens, "tools": self.tools,
                "messages": [{"role": "system", "content": self.system}, *self.history]}

    def ask(self, turn: int) -> None:
        steps = random.Random(turn * 7 + self.agent.seed).randint(self.agent.steps[0], self.agent.steps[1])
        text = (f"Task {turn}: please use the tool {steps} times to inspect module {turn % 37} and tell me what "
                f"{self.work.corpus.text(_DOC, 10, 30)}")
        if self.agent.api == "responses":
            self.history.append({"role": "user", "content": [{"type": "input_text", "text": text}]})
        elif self.agent.api == "anthropic":
            self.history.append({"role": "user", "content": [{"type": "text", "text": text}]})
        else:
            self.history.append({"role": "user", "content": text})

    def output(self) -> str:
        tokens = int(min(8 * self.agent.output_median, max(40, random.Random(len(self.history)).lognormvariate(
            math.log(self.agent.output_median), 0.8))))
        return self.work.tool_output("read_file", tokens)

    def answer(self, reply: dict[str, Any]) -> bool:
        """Add the upstream's reply (and a tool's output when it called one); whether it did."""
        a = self.agent
        if a.api == "anthropic":
            self.history.append({"role": "assistant", "content": reply["content"]})
            call = next((b for b in reply["content"] if b["type"] == "tool_use"), None)
            if call is None:
                return False
            self.history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": self.output()}]})
            return True
        if a.api == "responses":
            self.history += reply["output"]
            call = next((i for i in reply["output"] if i["type"] == "function_call"), None)
            if call is None:
                return False
            self.history.append({"type": "function_call_output", "call_id": call["call_id"],
                                 "output": self.output()})
            return True
        message = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
        self.history.append(message)
        calls = message.get("tool_calls")
        if not calls:
            return False
        self.history.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": self.output()})
        return True


PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions", "responses": "/v1/responses"}


@dataclass
class Run:
    agent: Agent
    requests: int = 0
    tasks: int = 0
    turns_with_pass: int = 0
    requests_after_pass: int = 0
    passes: int = 0
    history_tokens: int = 0
    bill: dict[str, Any] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)
    compressions: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


async def drive(http: httpx.AsyncClient, proxy_url: str, upstream: PricedUpstream, agent: Agent,
                daemon: Daemon, label: str) -> Run:
    conv = Conversation(agent)
    run = Run(agent)
    session = f"bill-{label}"
    headers = {"x-ctxd-session": session, "x-ctxd-context-window": str(agent.window), "x-bench-run": label}
    if agent.api == "anthropic":
        headers |= {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
    else:
        headers |= {"authorization": "Bearer bench"}
    path = PATHS[agent.api]
    started = time.perf_counter()
    passes_before = 0

    async def send(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal passes_before
        (await http.post(upstream.url + path, json=body, headers={**headers, "x-bench": "direct"})).raise_for_status()
        response = await http.post(proxy_url + path, json=body, headers={**headers, "x-bench": "proxy"})
        response.raise_for_status()
        run.requests += 1
        return response.json()

    for turn in range(agent.turns):
        conv.ask(turn)
        before = await _passes(daemon, session)
        while conv.answer(await send(conv.body())):
            pass
        after = await _passes(daemon, session)
        run.turns_with_pass += after > before
        if agent.max_requests and run.requests >= agent.max_requests:
            break
        if agent.until and upstream.priced[(label, "direct")][-1].tokens >= agent.until * agent.window:
            break
    run.tasks = turn + 1
    run.seconds = time.perf_counter() - started
    infos = [i for i in await _sessions(daemon)
             if i["sessionId"] == session or i["sessionId"].startswith(session + "~")]
    run.sessions = [i["sessionId"] for i in infos]
    run.passes = await _passes(daemon, session)
    stats = await _stats(daemon, session)
    run.bill = stats.get("bill") or {}
    run.history_tokens = upstream.priced[(label, "direct")][-1].tokens
    run.compressions = compressions(daemon, run.sessions)
    return run


async def _request(daemon: Daemon, method: str, params: dict[str, Any]) -> Any:
    from tests.proxy.conftest import ctxd_client

    client = await ctxd_client(daemon)
    try:
        return await client.request(method, params)
    finally:
        await client.close()


async def _sessions(daemon: Daemon) -> list[dict[str, Any]]:
    return (await _request(daemon, "session/list", {}))["sessions"]


async def _stats(daemon: Daemon, session: str) -> dict[str, Any]:
    return await _request(daemon, "context/stats", {"sessionId": session})


def compressions(daemon: Daemon, sessions: list[str]) -> list[dict[str, Any]]:
    """The passes ctxd recorded for ``sessions`` (read from its SQLite file, as it runs)."""
    import sqlite3

    db = sqlite3.connect(f"file:{daemon.data_dir / 'ctxd.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT session_id, number, trigger_kind, last_seq, layers, before_tokens, after_tokens, "
                          "detail FROM compressions ORDER BY at").fetchall()
    finally:
        db.close()
    return [{"session": r[0], "number": r[1], "trigger": r[2], "last_seq": r[3], "layers": json.loads(r[4]),
             "before": r[5], "after": r[6], "detail": json.loads(r[7]) if r[7] else {}}
            for r in rows if r[0] in sessions]


async def _passes(daemon: Daemon, session: str) -> int:
    """Passes recorded so far for the session and its forks (prune-only passes included,
    which ``compressionCount`` leaves out)."""
    import sqlite3

    db = sqlite3.connect(f"file:{daemon.data_dir / 'ctxd.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*) FROM compressions WHERE session_id = ? OR session_id LIKE ?",
                          (session, session + "~%")).fetchone()[0]
    finally:
        db.close()


# --- the benchmarks -------------------------------------------------------------------------------


def agents(quick: bool) -> list[tuple[Agent, str]]:
    """The issue's four CLIs in shape: (agent, its run's length). A run ends after the task
    in which the client's own request passes 1.4x the window (``short``: one or two passes)
    or 3.2x (``long``)."""
    shapes = [Agent("anthropic-48k", "anthropic", 48_000, 20_000, 900, 10_000, max_tokens=8192, seed=11),
              Agent("openai-24k", "openai", 24_000, 6_000, 500, 10_000, seed=12),
              Agent("responses-24k", "responses", 24_000, 8_000, 500, 10_000, seed=13),
              Agent("openai-16k", "openai", 16_000, 3_000, 600, 10_000, max_tokens=2048, seed=14)]
    out = []
    for shape in shapes:
        for label, times in (("short", 1.4), ("long", 3.2)):
            if quick and label == "long" and shape.name != "anthropic-48k":
                continue
            out.append((dataclasses.replace(shape, until=times), label))
    return out


def run_results(run: Run, upstream: PricedUpstream, label: str) -> list[Result]:
    a = run.agent
    proxied, direct = upstream.priced[(label, "proxy")], upstream.priced[(label, "direct")]
    b_proxy, b_direct = billed(proxied), billed(direct)
    ratio = b_proxy / b_direct
    over = run.history_tokens / a.window
    target = 0.8 if over > 2 else 1.0
    follows = sum(p.follows for p in proxied[1:]) / max(1, len(proxied) - 1)
    follows_direct = sum(p.follows for p in direct[1:]) / max(1, len(direct) - 1)
    tokens = sum(p.tokens for p in proxied) / sum(p.tokens for p in direct)
    own = run.bill.get("ratio")
    details = {"agent": asdict(a), "requests": run.requests, "history_over_window": round(over, 2),
               "passes": run.passes, "turns_with_pass": run.turns_with_pass, "sessions": run.sessions,
               "billed_proxy": round(b_proxy), "billed_direct": round(b_direct), "tokens_ratio": round(tokens, 4),
               "prefix_follows_proxy": round(follows, 4), "prefix_follows_direct": round(follows_direct, 4),
               "ctxd_bill": run.bill, "seconds": round(run.seconds, 1), "compressions": run.compressions,
               "per_request_proxy": [asdict(p) for p in proxied], "per_request_direct": [asdict(p) for p in direct]}
    name = f"{a.name} {label} ({run.requests} requests, history {over:.1f}x the window, {run.passes} passes)"
    return [
        Result("1", f"{name}: billed, proxy / direct", ratio, "x", 1.0, "direct", ratio, f"<= {target}",
               ratio <= target, details),
        Result("1", "  tokens sent, proxy / direct", tokens, "x"),
        Result("1", "  requests starting with the whole previous one, proxy", 100 * follows, "%",
               100 * follows_direct, "direct"),
        Result("1", "  ctxd's own bill (context/stats), ctxd / direct", own if own is not None else float("nan"),
               "x", ratio, "the benchmark's pricing"),
    ]


async def bench_agents(http: httpx.AsyncClient, proxy: ProxyProcess, upstream: PricedUpstream, daemon: Daemon,
                       quick: bool, log: Any, runs: set[str]) -> list[Result]:
    results = []
    for agent, label in agents(quick):
        tag = f"{agent.name}-{label}"
        if runs and label not in runs and agent.name not in runs:
            continue
        run = await drive(http, proxy.url, upstream, agent, daemon, tag)
        log(f"  {tag}: {run.requests} requests, {run.passes} passes, {run.seconds:.0f} s")
        results += run_results(run, upstream, tag)
    return results


async def bench_long(http: httpx.AsyncClient, proxy: ProxyProcess, upstream: PricedUpstream, daemon: Daemon,
                     quick: bool, log: Any) -> list[Result]:
    requests = 300 if quick else 1000
    # The proxy benchmark's long conversation in shape (tests/bench/proxy.py): each turn a
    # short request, one tool call, its ~350-token output, the answer.
    agent = Agent("anthropic-8k", "anthropic", 8192, 300, 350, requests, max_tokens=1024, seed=21,
                  steps=(1, 1), max_requests=requests)
    run = await drive(http, proxy.url, upstream, agent, daemon, "long-8k")
    log(f"  long-8k: {run.requests} requests, {run.passes} passes, {run.seconds:.0f} s")
    proxied, direct = upstream.priced[("long-8k", "proxy")], upstream.priced[("long-8k", "direct")]
    follows = sum(p.follows for p in proxied[1:]) / max(1, len(proxied) - 1)
    follows_direct = sum(p.follows for p in direct[1:]) / max(1, len(direct) - 1)
    share = run.passes / run.requests
    ratio = billed(proxied) / billed(direct)
    details = {"tasks": run.tasks, "requests": run.requests, "passes": run.passes,
               "turns_with_pass": run.turns_with_pass, "ctxd_bill": run.bill, "compressions": run.compressions,
               "per_request_proxy": [asdict(p) for p in proxied]}
    # The turns are requests (each one a prompt that keeps the prefix or not): the
    # target is on passes per request; tasks (a request and its tool call's) beside it.
    return [
        Result("2", f"a {run.tasks}-task agent at 8k ({run.requests} requests): passes per request",
               100 * share, "%", target="<= 10%", passed=share <= 0.10, details=details),
        Result("2", "  tasks (2 requests each) during which a pass ran", 100 * run.turns_with_pass / run.tasks, "%"),
        Result("2", "  requests starting with the whole previous one", 100 * follows, "%", 100 * follows_direct,
               "direct", target=">= 90%", passed=follows >= 0.9),
        Result("2", "  billed, proxy / direct", ratio, "x", 1.0, "direct", ratio),
    ]


async def main_async(args: argparse.Namespace) -> list[Result]:
    base = short_dir("ctxd-bench-bill-")
    daemon = Daemon(base / "data", socket_path=base / "run" / "ctxd.sock")
    proxy: ProxyProcess | None = None
    only = {x.strip() for x in args.only.split(",") if x.strip()} or {"1", "2"}

    def log(message: str) -> None:
        print(f"[bill {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    results: list[Result] = []
    try:
        with PricedUpstream() as upstream:
            assert daemon.socket_path is not None
            sets = [x for s in args.set for x in ("--set", s)]
            proxy = ProxyProcess(daemon.socket_path, upstream, base / "proxy.log",
                                 ["--data-dir", str(daemon.data_dir), *sets])
            proxy.command.remove("-vv")
            proxy.command.remove("--no-autostart")
            proxy.start()
            async with httpx.AsyncClient(timeout=600) as http:
                if "1" in only:
                    log("benchmark 1: agents through the proxy against direct")
                    runs = {x.strip() for x in args.runs.split(",") if x.strip()}
                    results += await bench_agents(http, proxy, upstream, daemon, args.quick, log, runs)
                if "2" in only:
                    log("benchmark 2: a long agent session at 8k")
                    results += await bench_long(http, proxy, upstream, daemon, args.quick, log)
    finally:
        if proxy is not None:
            proxy.stop()
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter runs")
    parser.add_argument("--only", default="", help="comma-separated benchmark numbers")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="configuration for the proxy's daemon (repeatable)")
    parser.add_argument("--runs", default="", help="benchmark 1's runs: short, long and/or agent names")
    parser.add_argument("--out", default="bench-results/bill.json")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    results = asyncio.run(main_async(args))
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = machine()
    meta["settings"] = args.set
    out.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1) + "\n")
    print(f"\nwritten to {out}")
    return 1 if args.strict and any(r.passed is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
