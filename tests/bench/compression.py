"""The compression benchmarks: what the engine costs, what prompts cost on long
sessions, and what survives compression of real transcripts.

    python -m tests.bench.compression                    # 1 and 2 (3 needs --corpus)
    python -m tests.bench.compression --corpus DIR       # all three
    python -m tests.bench.compression --quick --corpus DIR
    python -m tests.bench.compression --only 3 --corpus /work/shared/corpus

1. Engine time without the summarizer, in process, on a ~200k-token active context
   of ~1,000 agent messages: prune (plan + apply + refresh) and a whole pass minus
   the summarizer call (identify, prepare, checkpoint, apply, refresh, ageing and
   merge planning, render). Baseline: ``msgspec.json.encode`` of the same messages.
2. ``context/prompt`` p50/p99 on sessions of 1,000, 10,000 and 100,000 messages with a
   32k window, automatic compression on (extractive summarizer), built over the
   protocol. Target: the largest session's p50 within 1.5x the smallest's.
3. Retention on real transcripts (``--corpus DIR``, e.g. /work/shared/corpus; nothing
   is read from it otherwise): each transcript replayed through ``ctxd-cli replay`` at
   8k and 32k windows; what the final prompt still holds of the user's messages, the
   files modified, the key decisions and (LoCoMo) the answer-bearing turns, against a
   sliding window and one rolling summary + the newest 30%, computed in the same run.

See docs/performance.md. A measurement, not a test: exit code 0 unless ``--strict``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tests.bench.framed import frame, result_of
from tests.bench.harness import NotifyingProcess, SocketDaemon, common_args, percentile, run_suite, spawn_notifying
from tests.bench.spine import Lab, Quiet, Result, check_bodies, cpu_seconds, median
from tests.bench.workloads import AgentWorkload, renumber

Log = Callable[[str], None]
MODEL = "gpt-4"


@dataclass
class Plan:
    rounds: int = 21                 # bench 1: alternated rounds
    engine_messages: int = 1000      # bench 1
    sizes: tuple[int, ...] = (1_000, 10_000, 100_000)   # bench 2: session lengths
    window: int = 32_768             # bench 2
    push_batch: int = 20             # bench 2: messages per push while building
    prompt_rounds: int = 11          # bench 2: alternated rounds over the sessions
    prompt_per_round: int = 30       # bench 2: prompts per session per round
    windows: tuple[int, ...] = (8_192, 32_768)   # bench 3
    replay_batch: int = 1            # bench 3: messages per push in ctxd-cli replay (an agent's turn)


QUICK = Plan(rounds=7, sizes=(1_000, 3_000, 10_000), prompt_rounds=5, prompt_per_round=20)
FULL = Plan()


# --- 1. engine time, in process ---------------------------------------------------------

ENGINE_WINDOW = 262_144   # a 256k window: 200k tokens are past the trigger and still fit
FIXED_SUMMARY = """Task:
- Fix the empty-input crash in the parser and keep the public API unchanged.
Decisions:
- Guard the call in parse_header instead of restructuring the retry loop.
Progress:
- Added an early return for empty lists and a regression test; CI failure traced to the temp dir cleanup.
Files:
- src/parser/lexer.py
- tests/test_lexer.py
Next:
- Run the full suite on Linux and update docs/setup.md."""


class EngineFixture:
    """A session's active context as the service holds it, before a compression pass:
    four older summary checkpoints (seqs 1-5000, two of them still ``detailed``), 40
    user messages kept verbatim behind the boundary, and ~1,000 newer messages
    (~200k tokens) after it, counted with the daemon's counter."""

    def __init__(self, n: int) -> None:
        from ctxd.engine.budget import BudgetPolicy, budget_for
        from ctxd.engine.checkpoints import render_checkpoint
        from ctxd.engine.context import CompressionState, Entry
        from ctxd.engine.policy import CompressionPolicy
        from ctxd.protocol.compression import Checkpoint
        from ctxd.protocol.message import Message
        from ctxd.tokens import TokenCounter

        self.counter = TokenCounter.for_model(MODEL)
        self.count = self.counter.count
        work = AgentWorkload(seed=11)
        wire = work.messages(n)
        self.messages = [msgspec.convert(m, Message) for m in wire]
        base = 5000
        self.recent = [Entry.of(base + 1 + i, m, self.counter.count_message(m)) for i, m in enumerate(self.messages)]
        older_users = [msgspec.convert(work.corpus.user(40, 120), Message) for _ in range(40)]
        self.kept = [Entry.of(100 + i * 120, m, self.counter.count_message(m)) for i, m in enumerate(older_users)]
        self.checkpoints = []
        for i, level in enumerate(("compact", "moderate", "detailed", "detailed")):
            summary = "\n".join([FIXED_SUMMARY] * (1 + i))
            cp = Checkpoint(id=f"ckpt_old{i}", kind="summary", level=level, seq_from=1 + i * 1250,  # type: ignore[arg-type]
                            seq_to=(i + 1) * 1250, message_ranges=[(1 + i * 1250, (i + 1) * 1250)],
                            summary=summary, tokens=0, original_tokens=60_000, created_at="2026-01-01T00:00:00Z",
                            compression_number=i + 1, summarizer="extractive",
                            files_modified=["src/parser/lexer.py", "tests/test_lexer.py"])
            cp.tokens = self.count(render_checkpoint(cp)) + 2
            self.checkpoints.append(cp)
        self.state_type = CompressionState
        self.policy = CompressionPolicy()
        self.budget_policy = BudgetPolicy(usable_fraction=1.0)   # a hosted model (gpt-4): exact window
        self.budget_for = budget_for
        self.tokens = sum(e.tokens.context for e in self.recent)
        self.wire = wire

    def context(self) -> Any:
        """A fresh active context (untimed), refreshed as the service leaves it."""
        from ctxd.engine.context import ActiveContext

        state = self.state_type(boundary=5000, kept_seqs=[e.seq for e in self.kept], compression_count=4,
                                last_after_used=100_000)
        ctx = ActiveContext(system_prompt="You are a careful coding agent. Use the tools to inspect and edit files.",
                            state=state, checkpoints=list(self.checkpoints), kept=list(self.kept),
                            recent=list(self.recent))
        ctx.refresh_system(self.count)
        ctx.refresh(self.count, self.policy.protected_tools)
        return ctx

    def budget(self, ctx: Any) -> Any:
        return self.budget_for(self.budget_policy, context_window=ENGINE_WINDOW, output_limit=None,
                               system_tokens=ctx.system_tokens, pinned_tokens=ctx.pinned_tokens,
                               checkpoint_tokens=ctx.checkpoint_tokens, used=ctx.used)


def engine_prune(fx: EngineFixture, ctx: Any) -> tuple[float, dict[str, Any]]:
    """Layer 1 as the service runs it: plan, apply, refresh the views."""
    from ctxd.engine.prune import apply_prune, plan_prune

    budget = fx.budget(ctx)
    minimum, protect = fx.policy.prune_thresholds(budget.available)
    clock = time.perf_counter
    t0 = clock()
    plan = plan_prune(ctx, minimum, protect, fx.policy.protected_tools)
    t1 = clock()
    assert plan is not None, "the fixture must be prunable"
    apply_prune(ctx, plan, "2026-01-27T10:00:00Z")
    ctx.refresh(fx.count, fx.policy.protected_tools)
    t2 = clock()
    return t2 - t0, {"plan": t1 - t0, "apply+refresh": t2 - t1, "results": plan.results, "tokens": plan.tokens}


def engine_pass(fx: EngineFixture, ctx: Any) -> tuple[float, dict[str, Any]]:
    """Layer 3 minus the summarizer call, as ``service/compression.py`` runs it: identify,
    prepare, checkpoint (fixed summary), apply, refresh with the system part, plan the
    ageing of older checkpoints and the merge of the oldest, render the prompt."""
    from ctxd.engine import checkpoints as ckpts
    from ctxd.engine.pipeline import apply_selection, identify, make_checkpoint, prepare
    from ctxd.engine.render import PromptPlan, render_openai

    count = fx.count
    policy = fx.policy
    min_freed = 48 + 16
    clock = time.perf_counter
    stages: dict[str, float] = {}
    t = t0 = clock()

    def lap(name: str) -> None:
        nonlocal t
        now = clock()
        stages[name] = now - t
        t = now

    budget = fx.budget(ctx)
    selection = identify(ctx, budget, policy, min_freed=min_freed)
    assert selection is not None
    lap("identify")
    prepare(selection, budget)
    lap("prepare")
    cp = make_checkpoint(selection, FIXED_SUMMARY, "extractive", now="2026-01-27T10:00:00Z", number=5, count=count)
    lap("make_checkpoint")
    apply_selection(ctx, selection, cp)
    lap("apply_selection")
    ctx.refresh_system(count)
    ctx.refresh(count, policy.protected_tools)
    lap("refresh")
    budget = fx.budget(ctx)
    older = [c for c in ctx.checkpoints if c.id != cp.id]
    aging = ckpts.plan_aging(older, budget.max_prompt_tokens)
    merged = ckpts.merge_truncated(ctx.checkpoints, policy.max_checkpoints, count, "2026-01-27T10:00:00Z")
    merge = ckpts.plan_merge(merged, policy.max_checkpoints, budget.max_prompt_tokens)
    lap("aging+merge planning")
    rendered = render_openai(PromptPlan(system_parts=[ctx.system_text] if ctx.system_text else [],
                                        messages=ctx.conversation()), count)
    lap("render")
    return clock() - t0, {**stages, "removed": len(selection.removed), "freed_tokens": selection.freed_tokens,
                          "aging_steps": len(aging), "merge": merge is not None,
                          "prompt_messages": len(rendered.messages), "prompt_tokens": ctx.prompt_tokens}


def bench_engine(lab: Lab, plan: Plan, log: Log) -> list[Result]:
    fx = EngineFixture(plan.engine_messages)
    log(f"  fixture: {len(fx.recent)} messages, {fx.tokens:,} tokens after the boundary, "
        f"{len(fx.kept)} kept, {len(fx.checkpoints)} checkpoints")
    encode = msgspec.json.encode
    messages = fx.messages

    def timed_encode() -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        body = encode(messages)
        return time.perf_counter() - t, {"bytes": len(body)}

    def prune_once() -> tuple[float, dict[str, Any]]:
        ctx = fx.context()
        with Quiet():
            return engine_prune(fx, ctx)

    def pass_once() -> tuple[float, dict[str, Any]]:
        # The service prunes first; the pass starts from the pruned context.
        ctx = fx.context()
        engine_prune(fx, ctx)
        with Quiet():
            return engine_pass(fx, ctx)

    def encode_once() -> tuple[float, dict[str, Any]]:
        with Quiet():
            return timed_encode()

    kinds: dict[str, Callable[[], tuple[float, dict[str, Any]]]] = {
        "prune": prune_once, "pass": pass_once, "encode": encode_once}
    for fn in kinds.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    details: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    cpu0 = time.process_time()
    order = list(kinds)
    for r in range(plan.rounds):
        for k in order[r % 3:] + order[:r % 3]:
            elapsed, info = kinds[k]()
            times[k].append(elapsed)
            details[k].append(info)
    stage_names = [s for s in details["pass"][0] if isinstance(details["pass"][0][s], float)]
    stages_ms = {s: median([d[s] for d in details["pass"]]) * 1e3 for s in stage_names}
    prune_stages = {s: median([d[s] for d in details["prune"]]) * 1e3 for s in ("plan", "apply+refresh")}

    # For reference: rendering the whole 200k-token context (what context/prompt does
    # before any compression), same messages.
    from ctxd.engine.render import PromptPlan, render_openai

    ctx = fx.context()
    render_full = []
    with Quiet():
        for _ in range(max(3, plan.rounds // 3)):
            t = time.perf_counter()
            render_openai(PromptPlan(system_parts=[ctx.system_text], messages=ctx.conversation()), fx.count)
            render_full.append(time.perf_counter() - t)

    p, c, e = (median(times[k]) * 1e3 for k in ("prune", "pass", "encode"))
    common = {"messages": len(fx.recent), "active_tokens": fx.tokens, "window": ENGINE_WINDOW,
              "encoded_bytes": details["encode"][0]["bytes"], "rounds": plan.rounds,
              "benchmark_cpu_s": time.process_time() - cpu0}
    last = details["pass"][-1]
    return [
        Result("1", f"engine prune: plan+apply+refresh ({fx.tokens // 1000}k tok, {len(fx.recent)} msgs)", p, "ms",
               e, "msgspec.json.encode of the messages", p / e, "< 20 ms", p < 20,
               {**common, "rounds_ms": [x * 1e3 for x in times["prune"]], "stages_ms_median": prune_stages,
                "pruned_results": details["prune"][0]["results"], "pruned_tokens": details["prune"][0]["tokens"]}),
        Result("1", "engine pass minus summarizer (identify..render)", c, "ms", e,
               "msgspec.json.encode of the messages", c / e, "< 50 ms", c < 50,
               {**common, "rounds_ms": [x * 1e3 for x in times["pass"]], "stages_ms_median": stages_ms,
                "removed_messages": last["removed"], "freed_tokens": last["freed_tokens"],
                "aging_steps": last["aging_steps"], "merge_planned": last["merge"],
                "prompt_after": {"messages": last["prompt_messages"], "tokens": last["prompt_tokens"]},
                "encode_rounds_ms": [x * 1e3 for x in times["encode"]],
                "render_whole_context_ms_median": median(render_full) * 1e3}),
    ]


# --- 2. context/prompt on long sessions --------------------------------------------------

PASS_END = ("context/compressed", "context/compressionSkipped", "context/compressionFailed")


def _pass_ended(session_id: str) -> Callable[[str, dict[str, Any]], bool]:
    def accept(method: str, params: dict[str, Any]) -> bool:
        if params.get("sessionId") != session_id or method not in PASS_END:
            return False
        if method == "context/compressed":
            return params.get("layers") != ["watermark"]
        if method == "context/compressionFailed":
            return params.get("fallback") == "the active context is unchanged"  # the whole pass failed
        return True
    return accept


def will_compress(budget: dict[str, Any], last_after_used: int | None, growth: float) -> bool:
    """The daemon's ``engine.pipeline.decide`` with automatic compression on, from the
    budget a push returns: whether that push started a background pass."""
    fits = budget["promptTokens"] <= budget["maxPromptTokens"]
    if budget["used"] <= budget["triggerAt"] and fits:
        return False
    if fits and last_after_used is not None:
        return budget["used"] >= last_after_used + math.ceil(growth * budget["available"])
    return True


class AgentSession:
    """One session driven as an agent drives it: push a batch of messages; when that
    push starts a compression pass (the daemon's own rule, :func:`will_compress`), wait
    for the pass to end, so compression keeps up as it would between model calls."""

    def __init__(self, proc: NotifyingProcess, sid: str, plan: Plan, pool: list[dict[str, Any]]) -> None:
        from ctxd.config import Config

        self.proc, self.sid, self.plan, self.pool = proc, sid, plan, pool
        self.growth = Config().compression.min_growth_fraction
        self.pushed = 0
        self.cycle = 0
        self.last_after: int | None = None
        self.waits: list[float] = []
        self.timeouts = 0
        self.ended = _pass_ended(sid)
        proc.request("session/create", {"sessionId": sid, "model": MODEL, "contextWindow": plan.window})
        proc.request("session/subscribe", {"sessionId": sid})

    def push(self, k: int) -> None:
        offset = self.pushed % len(self.pool)
        k = min(k, len(self.pool) - offset)
        if offset == 0:
            self.cycle += 1
        batch = renumber(self.pool[offset:offset + k], f"{self.sid}-{self.cycle}-")
        proc = self.proc
        mark = len(proc.notes)
        answer = proc.request("session/push", {"sessionId": self.sid, "messages": batch})
        self.pushed += k
        if will_compress(answer["budget"], self.last_after, self.growth):
            t = time.perf_counter()
            if proc.wait_note(mark, self.ended, 120) is None:
                self.timeouts += 1
            self.waits.append(time.perf_counter() - t)
            self.last_after = proc.request("context/stats", {"sessionId": self.sid})["budget"]["used"]

    def settle(self) -> None:
        """Wait out a pass that is still running (one not predicted, or late notes)."""
        proc = self.proc
        proc.pump(0.2)
        for _ in range(600):
            marks = [m for _, m, p in proc.notes
                     if p.get("sessionId") == self.sid and (m == "context/compressing" or self.ended(m, p))]
            if not marks or marks[-1] != "context/compressing":
                return
            proc.pump(0.2)

    def summary(self, since_note: int = 0) -> dict[str, Any]:
        stats = self.proc.request("context/stats", {"sessionId": self.sid})
        notes = [(m, p) for _, m, p in self.proc.notes[since_note:] if p.get("sessionId") == self.sid]
        passes = [p for m, p in notes if m == "context/compressed" and p.get("layers") != ["watermark"]]
        durations = [p["durationMs"] for p in passes]
        tenth = max(1, len(durations) // 10)
        return {
            "messages": self.pushed, "token_count": stats["tokenCount"], "context_tokens": stats["contextTokens"],
            "compression_count": stats["compressionCount"], "checkpoint_count": stats["checkpointCount"],
            "passes_notified": len(passes), "waited_passes": len(self.waits), "settle_timeouts": self.timeouts,
            "wait_ms_p50": percentile(self.waits, 50) * 1e3 if self.waits else None,
            "pass_duration_ms": {"p50": percentile(durations, 50), "p99": percentile(durations, 99),
                                 "first_tenth_p50": percentile(durations[:tenth], 50),
                                 "last_tenth_p50": percentile(durations[-tenth:], 50)} if durations else None,
            "layers": dict(Counter(la for p in passes for la in p.get("layers", []))),
            "notifications": dict(Counter(m for m, _ in notes)), "budget": stats["budget"],
        }


def _is_response(body: bytes) -> bool:
    return b'"id":' in body[:48]


def time_prompts(proc: NotifyingProcess, sid: str, n: int) -> tuple[list[float], bytes]:
    """``n`` sequential context/prompt calls, pre-encoded; a notification arriving
    meanwhile is kept aside (it would only come from a pass not waited for)."""
    frames = [frame(proc.next_id(), "context/prompt", {"sessionId": sid}) for _ in range(n)]
    lat: list[float] = []
    body = b""
    clock = time.perf_counter
    strays: list[bytes] = []
    with Quiet():
        for f in frames:
            t = clock()
            body = proc.call(f)
            while not _is_response(body):
                strays.append(body)
                body = proc.read_frame()
            lat.append(clock() - t)
            check_bodies([body], "context/prompt")
    for s in strays:
        proc._keep(s)
    return lat, body


def bench_prompt(lab: Lab, plan: Plan, log: Log) -> list[Result]:
    pool = AgentWorkload(seed=21).messages(3000)
    proc = spawn_notifying(lab, "b2-ctxd")
    sessions: dict[int, AgentSession] = {}
    builds: dict[int, dict[str, Any]] = {}
    for n in plan.sizes:
        s = sessions[n] = AgentSession(proc, f"s{n}", plan, pool)
        start = time.perf_counter()
        cpu0 = cpu_seconds(proc.pid)
        next_log = time.monotonic() + 30
        while s.pushed < n:
            s.push(min(plan.push_batch, n - s.pushed))
            if time.monotonic() > next_log:
                log(f"  s{n}: {s.pushed:,}/{n:,} messages, {len(s.waits)} passes")
                next_log = time.monotonic() + 30
        s.settle()
        elapsed = time.perf_counter() - start
        builds[n] = {**s.summary(), "build_seconds": elapsed, "build_msg_s": n / elapsed,
                     "daemon_cpu_s": cpu_seconds(proc.pid) - cpu0}
        b = builds[n]
        pd = b["pass_duration_ms"] or {}
        log(f"  s{n}: {n:,} messages, {b['token_count']:,} tokens in {elapsed:.0f} s ({n / elapsed:,.0f} msg/s), "
            f"{b['compression_count']} compressions, context {b['context_tokens']:,} tokens; pass p50 "
            f"{pd.get('p50', float('nan')):.1f} ms (first tenth {pd.get('first_tenth_p50', float('nan')):.1f}, "
            f"last tenth {pd.get('last_tenth_p50', float('nan')):.1f})")
    rss = _rss_mb(proc.pid)
    mark = len(proc.notes)
    for s in sessions.values():  # warm-up
        time_prompts(proc, s.sid, 5)
    # Alternated rounds; each round first pushes one more batch into the session (and
    # waits for the pass it may start), so every session is measured across its whole
    # compression cycle (its prompt swings between the low-water mark and the trigger),
    # not wherever its build happened to stop.
    lat: dict[int, list[float]] = {n: [] for n in sessions}
    cpu: dict[int, float] = dict.fromkeys(sessions, 0.0)
    tokens: dict[int, list[int]] = {n: [] for n in sessions}
    last_body: dict[int, bytes] = {}
    order = list(sessions)
    for r in range(plan.prompt_rounds):
        for n in order[r % len(order):] + order[:r % len(order)]:
            s = sessions[n]
            s.push(plan.push_batch)
            s.settle()
            before = cpu_seconds(proc.pid)
            took, body = time_prompts(proc, s.sid, plan.prompt_per_round)
            cpu[n] += cpu_seconds(proc.pid) - before
            lat[n] += took
            last_body[n] = body
            tokens[n].append(result_of(body)["tokens"])
    after = {n: s.summary(mark) for n, s in sessions.items()}
    lab.close(proc)
    enc: dict[int, float] = {}
    with Quiet():
        for n, body in last_body.items():
            result = result_of(body)
            samples = []
            for _ in range(30):
                t = time.perf_counter()
                msgspec.json.encode(result)
                samples.append(time.perf_counter() - t)
            enc[n] = percentile(samples, 50) * 1e3
    small, big = min(sessions), max(sessions)
    per_session: dict[str, Any] = {}
    for n in sessions:
        p50 = percentile(lat[n], 50) * 1e3
        mean_tokens = statistics.mean(tokens[n])
        per_session[str(n)] = {
            "p50_ms": p50, "p99_ms": percentile(lat[n], 99) * 1e3, "samples": len(lat[n]),
            "daemon_cpu_ms_per_prompt": cpu[n] / len(lat[n]) * 1e3,
            "prompt_tokens": {"min": min(tokens[n]), "mean": mean_tokens, "max": max(tokens[n])},
            "p50_us_per_1k_prompt_tokens": p50 * 1e3 / (mean_tokens / 1000),
            "last_prompt_messages": len(result_of(last_body[n])["messages"]),
            "last_response_bytes": len(last_body[n]), "encode_last_result_p50_ms": enc[n],
            "messages_at_end": sessions[n].pushed,
            "compressions_while_measuring": after[n]["passes_notified"],
            "settle_timeouts_while_measuring": sessions[n].timeouts - builds[n]["settle_timeouts"],
            "build": builds[n]}
    results = []
    p_small = per_session[str(small)]["p50_ms"]
    for n in sessions:
        d = per_session[str(n)]
        if n == small:
            base, base_name = enc[n], "msgspec.json.encode of the result"
        else:
            base, base_name = p_small, f"same @ {small:,} msgs"
        results.append(Result(
            "2", f"context/prompt p50 @ {n:,} msgs, 32k window", d["p50_ms"], "ms", base, base_name, d["p50_ms"] / base,
            f"<= 1.5x the {small:,} figure" if n == big else "(figure only)",
            (d["p50_ms"] / p_small <= 1.5) if n == big else None,
            {**d, **({"daemon_rss_mb": rss, "all_sessions": per_session} if n == big else {})}))
    return results


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# --- 3. retention on real transcripts ----------------------------------------------------

FORMATS_MEASURED = ("mini_swe_agent", "swe_agent", "openhands", "claude_code", "locomo")
AGENT_FORMATS = ("mini_swe_agent", "swe_agent", "openhands", "claude_code")
RECENT_SHARE = 0.30          # baseline (b): the newest 30% of the budget stays verbatim
DECISION_WORDS = 0.70        # a decision is present when this share of its words is in the prompt
_WORDS = re.compile(r"\w+")


@dataclass
class Transcript:
    path: Path
    index: int
    name: str
    fmt: str
    model: str | None
    system_prompt: str | None
    messages: list[Any]
    metadata: dict[str, Any]


def find_transcripts(corpus: Path, log: Log) -> tuple[list[Transcript], dict[str, str]]:
    """Every transcript under ``corpus`` in one of the measured formats (decided from
    the content, as ``ctxd-cli replay`` decides it)."""
    from ctxd.importers import TranscriptError, load_transcripts

    found: list[Transcript] = []
    skipped: dict[str, str] = {}
    for path in sorted(corpus.rglob("*")):
        if not path.is_file() or path.suffix not in (".json", ".jsonl", ".traj") or path.name == "metadata.json":
            continue
        try:
            transcripts = load_transcripts(path)
        except (TranscriptError, ValueError) as exc:
            skipped[str(path.relative_to(corpus))] = f"not a transcript: {str(exc)[:120]}"
            continue
        for i, t in enumerate(transcripts):
            if t.source_format not in FORMATS_MEASURED:
                skipped[f"{path.relative_to(corpus)}#{i}"] = f"format {t.source_format} is not measured"
                continue
            found.append(Transcript(path, i, t.title or path.stem, t.source_format, t.model, t.system_prompt,
                                    list(t.messages), dict(t.metadata or {})))
    log(f"  {len(found)} transcripts in {len({t.path for t in found})} files "
        f"({', '.join(f'{k} {v}' for k, v in sorted(Counter(t.fmt for t in found).items()))})")
    return found, skipped


def sent_strings(message: Any) -> list[str]:
    """What of a stored message reaches a prompt: text, tool calls' arguments, tool
    results (thinking never does)."""
    from ctxd.protocol import message as wire
    from ctxd.protocol.message import TextBlock, ToolResultBlock, ToolUseBlock, tool_result_text

    image = getattr(wire, "ImageBlock", None)  # (None in a tree before typed images: --ctxd-path)
    out: list[str] = []
    content = message.content
    if isinstance(content, str):
        out.append(content)
    elif content:
        for block in content:
            if isinstance(block, TextBlock):
                out.append(block.text)
            elif image is not None and isinstance(block, image):
                out.append(wire.image_text(block))
            elif isinstance(block, ToolUseBlock):
                out.append(msgspec.json.encode(block.input).decode())
            elif isinstance(block, ToolResultBlock):
                out.append(tool_result_text(block))
    for call in message.tool_calls or ():
        out.append(call.function.arguments)
    return out


def prompt_text(prompt: dict[str, Any]) -> str:
    """The text of an OpenAI-format ``context/prompt`` result."""
    parts: list[str] = []
    for m in prompt["messages"]:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [b.get("text", "") for b in content if isinstance(b, dict)]
        for call in m.get("tool_calls") or ():
            parts.append(call["function"]["arguments"])
    return "\n".join(parts)


def user_texts(message: Any) -> list[str]:
    """The user's own words in a message (what ctxd keeps verbatim), block by block. A
    user-role message marked ``metadata.observation: true`` is tool output an agent sent
    back as a user message (the SWE-agent importer marks them), not the user's words; nor
    is ``metadata.demonstration: true``, a worked example of another task (SWE-agent)."""
    from ctxd.protocol.message import TextBlock

    if message.role != "user" or (message.metadata or {}).get("observation") is True \
            or (message.metadata or {}).get("demonstration") is True:
        return []
    content = message.content
    if isinstance(content, str):
        return [content.strip()] if content.strip() else []
    return [b.text.strip() for b in content or () if isinstance(b, TextBlock) and b.text.strip()]


def locomo_roles(t: Transcript) -> dict[str, str]:
    """dia_id -> the role the turn was imported with (speaker A: user, B: assistant)."""
    return {str(m.metadata["dia_id"]): m.role for m in t.messages if (m.metadata or {}).get("dia_id")}


def locomo_turns(t: Transcript) -> dict[str, str]:
    """dia_id -> the turn's original ``text`` (its text blocks: a shared photo is an image block)."""
    from ctxd.protocol.message import TextBlock

    turns = {}
    for m in t.messages:
        meta = m.metadata or {}
        dia = meta.get("dia_id")
        content = m.content
        text = content if isinstance(content, str) else "\n".join(
            b.text for b in content or () if isinstance(b, TextBlock))
        caption = meta.get("blip_caption")  # (a tree whose importer appended the caption: --ctxd-path)
        if isinstance(content, str) and isinstance(caption, str) and text.endswith(f"[shares a photo: {caption}]"):
            text = text[: -len(f"[shares a photo: {caption}]")]
        if dia:
            turns[str(dia)] = text.strip()
    return turns


def evidence_ids(qa: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    for item in qa.get("evidence") or ():
        ids += [x for x in re.split(r"[;,\s]+", str(item)) if x]
    return ids


class Targets:
    """What is to be found in a final prompt, from the whole transcript."""

    def __init__(self, t: Transcript) -> None:
        from ctxd.engine.extract import extract

        self.users = [texts for m in t.messages if (texts := user_texts(m))]
        facts = extract(t.messages)
        self.files = list(facts.files_modified)
        self.decisions = [d for d in facts.key_decisions if _WORDS.findall(d)]
        self.qa: list[dict[str, Any]] = []
        self.turns: dict[str, str] = {}
        self.roles: dict[str, str] = {}
        if t.fmt == "locomo":
            self.turns = locomo_turns(t)
            self.roles = locomo_roles(t)
            self.qa = [q for q in t.metadata.get("qa") or () if isinstance(q, dict)]

    def score(self, text: str) -> dict[str, Any]:
        words = set(_WORDS.findall(text.lower()))
        squashed = " ".join(text.split())
        low = text.lower()
        out: dict[str, Any] = {
            "users": [len(self.users), sum(all(x in text for x in texts) for texts in self.users)],
            "users_whitespace_insensitive": [len(self.users), sum(
                all(" ".join(x.split()) in squashed for x in texts) for texts in self.users)],
            "files": [len(self.files), sum(f in text for f in self.files)],
            "decisions": [len(self.decisions), sum(
                len(ws & words) / len(ws) >= DECISION_WORDS for d in self.decisions
                if (ws := set(_WORDS.findall(d.lower()))))],
        }
        if self.qa:
            evidence = sorted({e for q in self.qa for e in evidence_ids(q)})
            known = [e for e in evidence if self.turns.get(e)]
            present = {e for e in known if self.turns[e] in text}
            with_evidence = [ids for q in self.qa if (ids := [e for e in evidence_ids(q) if self.turns.get(e)])]
            answered = [q for q in self.qa if "answer" in q and str(q["answer"]).strip()]
            out.update({
                "evidence_turns": [len(known), len(present)],
                "evidence_turns_speaker_a": [sum(self.roles.get(e) == "user" for e in known),
                                             sum(self.roles.get(e) == "user" for e in present)],
                "evidence_turns_speaker_b": [sum(self.roles.get(e) == "assistant" for e in known),
                                             sum(self.roles.get(e) == "assistant" for e in present)],
                "evidence_unresolved": len(evidence) - len(known),
                "qa_all_evidence": [len(with_evidence), sum(all(e in present for e in ids) for ids in with_evidence)],
                "answers": [len(answered), sum(str(q["answer"]).strip().lower() in low for q in answered)],
            })
        return out


def sliding_window(t: Transcript, tokens: list[int], system: tuple[str, int], max_prompt: int) -> tuple[str, int, int]:
    """Baseline (a): the newest messages that fit the same max prompt. (text, tokens, kept)"""
    from ctxd.tokens import PROMPT_PRIMING

    budget = max_prompt - PROMPT_PRIMING - system[1]
    used, start = 0, len(tokens)
    while start > 0 and used + tokens[start - 1] <= budget:
        start -= 1
        used += tokens[start]
    parts = [system[0]] if system[0] else []
    for m in t.messages[start:]:
        parts += sent_strings(m)
    return "\n".join(parts), PROMPT_PRIMING + system[1] + used, len(tokens) - start


def rolling_summary(t: Transcript, tokens: list[int], system: tuple[str, int], max_prompt: int,
                    counter: Any) -> tuple[str, int, dict[str, Any]]:
    """Baseline (b), gemini-cli/Letta style: the newest 30% of the budget verbatim,
    everything older replaced by one summary (ctxd's extractive summarizer, at its most
    detailed level) sized to fit what is left of the budget."""
    from ctxd.summarize import ExtractiveSummarizer, SummaryRequest
    from ctxd.tokens import MESSAGE_OVERHEAD, PROMPT_PRIMING

    budget = max_prompt - PROMPT_PRIMING - system[1]
    if sum(tokens) <= budget:
        text = "\n".join(([system[0]] if system[0] else []) + [s for m in t.messages for s in sent_strings(m)])
        return text, PROMPT_PRIMING + system[1] + sum(tokens), {"summarized": 0}
    keep_budget = math.floor(RECENT_SHARE * budget)
    used, start = 0, len(tokens)
    while start > 0 and used + tokens[start - 1] <= keep_budget:
        start -= 1
        used += tokens[start]
    older = t.messages[:start]
    target = budget - used - MESSAGE_OVERHEAD - 8
    started = time.perf_counter()
    summary = ExtractiveSummarizer(counter.count).summarize_now(
        SummaryRequest(messages=older, level="detailed", target_tokens=max(48, target))).text
    took = time.perf_counter() - started
    cost = counter.count(summary) + MESSAGE_OVERHEAD if summary else 0
    parts = ([system[0]] if system[0] else []) + [summary]
    for m in t.messages[start:]:
        parts += sent_strings(m)
    return "\n".join(parts), PROMPT_PRIMING + system[1] + cost + used, {
        "summarized": len(older), "kept": len(t.messages) - start, "summary_tokens": cost, "summary_target": target,
        "summarize_ms": took * 1e3}


def sent_per_turn(tokens: list[int], fixed: int, max_prompt: int) -> tuple[int, int]:
    """(sliding window, whole history): tokens sent over the transcript if the prompt
    were asked for after every message."""
    window = whole = 0
    lo = 0
    inside = 0
    running = 0
    for k, n in enumerate(tokens):
        inside += n
        running += n
        while inside + fixed > max_prompt and lo <= k:
            inside -= tokens[lo]
            lo += 1
        window += inside + fixed
        whole += running + fixed
    return window, whole


async def _replay_all(daemon: SocketDaemon, transcripts: list[Transcript], plan: Plan,
                      log: Log) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Replay every file at every window through ``ctxd-cli replay`` (a subprocess), a
    monitoring connection subscribed to all sessions; then the final prompt, stats and
    compression records of each session."""
    from ctxd.client import Client

    client = await Client.connect_unix(daemon.socket)
    await client.initialize(client_name="ctxd-bench-monitor")
    notes: list[tuple[str, dict[str, Any]]] = []
    client.on_notification(lambda method, params: notes.append((method, params)))
    await client.request("session/subscribe", {"sessionId": "*"})
    files: dict[Path, list[Transcript]] = defaultdict(list)
    for t in transcripts:
        files[t.path].append(t)
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for window in plan.windows:
        for path, ts in files.items():
            base = f"w{window}-{len(out)}"
            argv = [sys.executable, "-m", "ctxd.cli.main", "--socket", str(daemon.socket), "--data-dir",
                    str(daemon.data_dir), "--no-autostart", "--json", "replay", str(path), "--context-window",
                    str(window), "--batch", str(plan.replay_batch), "--session", base]
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, env=daemon.lab.ctxd_env,
                                                        cwd=str(daemon.lab.root))
            stdout, stderr = await proc.communicate()
            took = time.perf_counter() - started
            if proc.returncode != 0:
                raise RuntimeError(f"ctxd-cli replay {path.name} exited {proc.returncode}: {stderr.decode()[-500:]}")
            replayed = json.loads(stdout)["sessions"]
            await asyncio.sleep(0.2)  # the last notifications
            for t, session in zip(ts, replayed):
                sid = session["sessionId"]
                prompt = await client.request("context/prompt", {"sessionId": sid, "format": "openai"})
                stats = await client.request("context/stats", {"sessionId": sid})
                history = await client.request("session/history", {"sessionId": sid, "limit": 1})
                mine = [(m, p) for m, p in notes if p.get("sessionId") == sid]
                out[(window, str(t.path), t.index)] = {
                    "session_id": sid, "replay": session, "prompt": prompt, "stats": stats,
                    "compressions": history.get("compressions", []), "notes": mine,
                    "replay_seconds_file": took}
            log(f"  {window // 1024}k {path.name}: {len(ts)} conversation(s), {took:.1f} s")
    await client.close()
    return out


def _share(pair: list[int]) -> float | None:
    return 100.0 * pair[1] / pair[0] if pair[0] else None


def _add(acc: dict[str, list[int]], scores: dict[str, Any]) -> None:
    for k, v in scores.items():
        if isinstance(v, list):
            a = acc.setdefault(k, [0, 0])
            a[0] += v[0]
            a[1] += v[1]


def bench_retention(lab: Lab, plan: Plan, log: Log, corpus: Path | None = None) -> list[Result]:
    from ctxd.protocol.message import Message  # noqa: F401 - ctxd importable here
    from ctxd.tokens import TokenCounter

    assert corpus is not None
    transcripts, skipped = find_transcripts(corpus, log)
    if not transcripts:
        raise RuntimeError(f"no transcript of {', '.join(FORMATS_MEASURED)} under {corpus}")
    daemon = SocketDaemon(lab, "b3-ctxd")
    try:
        cpu0 = cpu_seconds(daemon.pid)
        replays = asyncio.run(_replay_all(daemon, transcripts, plan, log))
        daemon_cpu = cpu_seconds(daemon.pid) - cpu0
    finally:
        daemon.stop()

    rows: list[dict[str, Any]] = []
    for (window, path, index), got in replays.items():
        t = next(x for x in transcripts if str(x.path) == path and x.index == index)
        stats = got["stats"]
        budget = stats["budget"]
        max_prompt = budget["maxPromptTokens"]
        counter = TokenCounter.for_encoding(stats["encoding"], stats["tokensEstimated"])
        tokens = [counter.count_message(m).context for m in t.messages]
        sys_text = t.system_prompt or ""
        system = (sys_text, budget["systemTokens"])
        targets = Targets(t)
        ctxd_text = prompt_text(got["prompt"])
        slide_text, slide_tokens, slide_kept = sliding_window(t, tokens, system, max_prompt)
        roll_text, roll_tokens, roll_info = rolling_summary(t, tokens, system, max_prompt, counter)
        notes = got["notes"]
        pushes = [p for m, p in notes if m == "session/updated" and p.get("reason") == "push"]
        sent = sum(min(p["contextTokens"], max_prompt) for p in pushes)
        created = [p["checkpoint"] for m, p in notes if m == "checkpoint/created"]
        summarizer_calls = (sum(1 for c in created if c.get("kind") == "summary")
                            + sum(1 for m, _ in notes if m in ("checkpoint/aged", "checkpoint/merged")))
        from ctxd.tokens import PROMPT_PRIMING

        window_sent, whole_sent = sent_per_turn(tokens, PROMPT_PRIMING + system[1], max_prompt)
        turns = len(t.messages)
        rows.append({
            "window": window, "format": t.fmt, "file": str(Path(path).relative_to(corpus)), "conversation": index,
            "name": t.name, "messages": turns, "history_tokens": sum(tokens), "max_prompt_tokens": max_prompt,
            "session_id": got["session_id"], "tokens_estimated": stats["tokensEstimated"],
            "fits_uncompressed": PROMPT_PRIMING + system[1] + sum(tokens) <= max_prompt,
            "scores": {"ctxd": targets.score(ctxd_text), "sliding": targets.score(slide_text),
                       "rolling": targets.score(roll_text)},
            "prompt_tokens": {"ctxd": got["prompt"]["tokens"], "sliding": slide_tokens, "rolling": roll_tokens},
            "sliding_kept_messages": slide_kept, "rolling": roll_info,
            "ctxd": {"compressions": stats["compressionCount"], "checkpoints": stats["checkpointCount"],
                     "passes_notified": sum(1 for m, p in notes if m == "context/compressed"
                                            and p.get("layers") != ["watermark"]),
                     "summarizer_calls": summarizer_calls, "pushes_seen": len(pushes), "tokens_sent": sent,
                     "layers": dict(Counter(la for c in got["compressions"] for la in c.get("layers", []))),
                     "overflow": sum(1 for m, _ in notes if m == "context/overflow"),
                     "prompt_messages": len(got["prompt"]["messages"])},
            "tokens_sent": {"ctxd": sent, "sliding": window_sent, "whole_history": whole_sent},
        })

    # Micro-averaged shares per (window, group, method).
    groups: dict[str, tuple[str, ...]] = {"agents": AGENT_FORMATS, "locomo": ("locomo",)}
    groups.update({f"format:{f}": (f,) for f in AGENT_FORMATS})
    summary: dict[str, Any] = {}
    for window in plan.windows:
        for group, fmts in groups.items():
            mine = [r for r in rows if r["window"] == window and r["format"] in fmts]
            if not mine:
                continue
            entry: dict[str, Any] = {"transcripts": len(mine),
                                     "compressed_by_ctxd": sum(r["ctxd"]["compressions"] > 0 for r in mine),
                                     "fit_uncompressed": sum(r["fits_uncompressed"] for r in mine)}
            for method in ("ctxd", "sliding", "rolling"):
                acc: dict[str, list[int]] = {}
                for r in mine:
                    _add(acc, r["scores"][method])
                entry[method] = {k: {"of": v[0], "present": v[1], "share": _share(v)} for k, v in acc.items()}
                entry[method]["prompt_tokens_mean"] = statistics.mean(r["prompt_tokens"][method] for r in mine)
            turns = sum(r["messages"] for r in mine)
            entry["per_100_turns"] = {
                "ctxd_tokens_sent": 100 * sum(r["tokens_sent"]["ctxd"] for r in mine) / turns,
                "sliding_tokens_sent": 100 * sum(r["tokens_sent"]["sliding"] for r in mine) / turns,
                "whole_history_tokens_sent": 100 * sum(r["tokens_sent"]["whole_history"] for r in mine) / turns,
                "ctxd_compressions": 100 * sum(r["ctxd"]["compressions"] for r in mine) / turns,
                "ctxd_summarizer_calls": 100 * sum(r["ctxd"]["summarizer_calls"] for r in mine) / turns,
            }
            entry["turns"] = turns
            summary[f"{window}/{group}"] = entry

    results: list[Result] = []

    def share(key: str, method: str, metric: str) -> float | None:
        return summary.get(key, {}).get(method, {}).get(metric, {}).get("share")

    details = {"summary": summary, "transcripts": rows, "skipped_files": skipped,
               "replay_batch": plan.replay_batch, "daemon_cpu_s": daemon_cpu,
               "decision_word_share": DECISION_WORDS, "recent_share_rolling": RECENT_SHARE}
    first = True
    for window in plan.windows:
        k = f"{window // 1024}k"
        for key, metric, label in ((f"{window}/agents", "users", f"agents @ {k}: user messages verbatim"),
                                   (f"{window}/agents", "files", f"agents @ {k}: files modified present"),
                                   (f"{window}/agents", "decisions", f"agents @ {k}: key decisions present"),
                                   (f"{window}/locomo", "users", f"LoCoMo @ {k}: speaker-A turns verbatim"),
                                   (f"{window}/locomo", "evidence_turns", f"LoCoMo @ {k}: evidence turns verbatim"),
                                   (f"{window}/locomo", "answers", f"LoCoMo @ {k}: QA answer strings present")):
            c, s, r_ = share(key, "ctxd", metric), share(key, "sliding", metric), share(key, "rolling", metric)
            if c is None:
                continue
            of = summary[key]["ctxd"][metric]["of"]
            results.append(Result("3", f"{label} (n={of})", c, "%", s, f"sliding window; rolling summary {_pct(r_)}",
                                  (c / s) if s else None, "(figure only)", None,
                                  {**({"retention": details} if first else {}),
                                   "rolling_share": r_, "key": key, "metric": metric}))
            first = False
        for group in ("agents", "locomo"):
            key = f"{window}/{group}"
            if key not in summary:
                continue
            per = summary[key]["per_100_turns"]
            results.append(Result(
                "3", f"{'agents' if group == 'agents' else 'LoCoMo'} @ {k}: prompt tokens sent per 100 turns",
                per["ctxd_tokens_sent"], "tok", per["sliding_tokens_sent"], "sliding window (whole history: "
                f"{per['whole_history_tokens_sent']:,.0f})", per["ctxd_tokens_sent"] / per["sliding_tokens_sent"],
                "(figure only)", None,
                {"key": key, "compressions_per_100_turns": per["ctxd_compressions"],
                 "summarizer_calls_per_100_turns": per["ctxd_summarizer_calls"]}))
    return results


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def retention_table(results: list[Result]) -> str:
    """All three methods side by side, per window and corpus group."""
    ret = next((r.details["retention"] for r in results if "retention" in r.details), None)
    if ret is None:
        return ""
    metrics = [("users", "user msgs"), ("files", "files"), ("decisions", "decisions"),
               ("evidence_turns", "evidence turns"), ("evidence_turns_speaker_a", "of which A"),
               ("evidence_turns_speaker_b", "of which B"), ("qa_all_evidence", "QAs w/ all evidence"),
               ("answers", "answers")]
    head = ["window", "corpus", "method"] + [m[1] for m in metrics] + ["final prompt tok", "sent/100 turns",
                                                                       "compr./100", "summ. calls/100"]
    rows = [head]
    names = {"ctxd": "ctxd", "sliding": "sliding window", "rolling": "summary + newest 30%"}
    for key, entry in ret["summary"].items():
        window, group = key.split("/")
        if group.startswith("format:"):
            continue
        for method in ("ctxd", "sliding", "rolling"):
            m = entry[method]
            cells = []
            for metric, _ in metrics:
                if metric in m:
                    cells.append(f"{_pct(m[metric]['share'])} of {m[metric]['of']}")
                else:
                    cells.append("-")
            per = entry["per_100_turns"]
            sent = {"ctxd": per["ctxd_tokens_sent"], "sliding": per["sliding_tokens_sent"]}.get(method)
            rows.append([f"{int(window) // 1024}k",
                         f"{group} ({entry['transcripts']}, {entry['compressed_by_ctxd']} compr.)",
                         names[method]] + cells + [
                f"{m['prompt_tokens_mean']:,.0f}", "-" if sent is None else f"{sent:,.0f}",
                f"{per['ctxd_compressions']:.2f}" if method == "ctxd" else "-",
                f"{per['ctxd_summarizer_calls']:.2f}" if method == "ctxd" else "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    text = "Retention (benchmark 3), micro-averaged over the transcripts:\n" + "\n".join(lines)
    # Per agent format: user messages and files, ctxd / sliding window / summary + newest 30%.
    head = ["window", "format", "transcripts", "compressed", "user msgs c/s/r", "files c/s/r",
            "final prompt tok c/s/r", "compr./100 turns"]
    rows = [head]
    for key, entry in ret["summary"].items():
        window, group = key.split("/")
        if not group.startswith("format:"):
            continue
        def trio(metric: str, entry: dict[str, Any] = entry) -> str:
            of = entry["ctxd"].get(metric, {}).get("of", 0)
            if not of:
                return "-"
            return " / ".join(_pct(entry[m][metric]["share"]) for m in ("ctxd", "sliding", "rolling")) + f" of {of}"
        rows.append([f"{int(window) // 1024}k", group.split(":", 1)[1], str(entry["transcripts"]),
                     str(entry["compressed_by_ctxd"]), trio("users"), trio("files"),
                     " / ".join(f"{entry[m]['prompt_tokens_mean']:,.0f}" for m in ("ctxd", "sliding", "rolling")),
                     f"{entry['per_100_turns']['ctxd_compressions']:.1f}"])
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        text += "\n\nBy agent format (c = ctxd, s = sliding window, r = summary + newest 30%):\n" + "\n".join(lines)
    return text


# --- main ---------------------------------------------------------------------------------

BENCHES: dict[str, Callable[[Lab, Plan, Log], list[Result]]] = {"1": bench_engine, "2": bench_prompt}
TITLES = {"1": "engine time without the summarizer", "2": "context/prompt on long sessions, 32k window",
          "3": "retention on real transcripts"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.compression", description=__doc__.split("\n\n")[0])
    common_args(p, "bench-results/compression.json")
    p.add_argument("--corpus", metavar="DIR", help="transcripts for benchmark 3 (e.g. /work/shared/corpus); "
                   "without it benchmark 3 is skipped")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    benches = dict(BENCHES)
    skip = {}
    if args.corpus:
        corpus = Path(args.corpus).expanduser().resolve()
        if not corpus.is_dir():
            p.error(f"--corpus {args.corpus}: not a directory")
        benches["3"] = lambda lab, plan, log: bench_retention(lab, plan, log, corpus)
    else:
        benches["3"] = lambda lab, plan, log: []
        skip["3"] = "needs --corpus DIR (real transcripts; nothing is read from a default location)"
    return run_suite("compression", args, benches, TITLES, plan, extra_tables=retention_table, skip=skip)


if __name__ == "__main__":
    sys.exit(main())
