"""The measures of a run (tests/agents/run.py), and of a proxied run against its direct twin.

- **ends the same**: the CLI exited 0 and the repository's diff is the fix
  (``fixture.BUGGY`` -> ``fixture.FIXED``, nothing else); proxied: the same diff as direct.
- **sessions**: the ctxd sessions of the task's conversation (those holding its task ref,
  its scripted tool call ids or answers; side conversations such as titles and summaries
  are counted apart), **forks** among them, and the messages they store against the
  messages of the conversation (the client's last request and its reply).
- **over the window**: upstream requests whose input, as the fake provider counts it
  (tests/agents/wire.py), is more than ctxd's window; the largest.
- **newest intact**: upstream requests that end with the client's newest turn as sent
  (its last message or item; behind a trailing system reminder, from the last other
  message on; cache breakpoints aside), paired through the tap.
- **files intact**: of the client requests showing a repository file whole (as it was on
  disk when sent: aider's files in the chat, a ``cat``), those whose upstream request
  shows it whole too (every one of them); and of the files such requests show, counted
  once per request (**file views**), those the upstream request shows whole.
- **tokens** and **bill**: the upstream requests' input tokens, and their price with
  prompt caching (tests/agents/pricing.py); **cached share**, and **prefix kept**: task
  requests that start with the previous task request up to its last message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.agents import fixture, pricing, script, wire
from tests.agents.upstream import escaped


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def is_side_session(messages: list[dict[str, Any]]) -> bool:
    """A session of a side conversation (a title, a summary): every reply stored in it is
    one the script gives outside the task."""
    replies = [_text(m).strip() for m in messages if m.get("role") == "assistant"]
    side = set(script.SIDE_REPLIES) | {script.AIDER_SUMMARY}
    return bool(replies) and all(r in side for r in replies)


def _strip(value: Any) -> Any:
    if isinstance(value, list):
        return [_strip(v) for v in value]
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    return value


def newest(api: str, body: Any) -> Any:
    """The request's newest turn as sent: its last message (Responses: input item) and,
    when that is a trailing system reminder (aider's), back to the last other message
    (the user's newest words); cache breakpoints left out."""
    if not isinstance(body, dict):
        return None
    items = body.get("input") if api == "responses" else body.get("messages")
    if not isinstance(items, list) or not items:
        return items
    start = len(items) - 1
    while start > 0 and isinstance(items[start], dict) and items[start].get("role") in ("system", "developer"):
        start -= 1
    return _strip(items[start:])


def expected_diff_ok(diff: str) -> bool:
    """The diff is the fix and only the fix."""
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return removed == ["-" + fixture.BUGGY.rstrip("\n")] and added == ["+" + fixture.FIXED.rstrip("\n")] \
        and diff.count("diff --git") == 1


@dataclass
class RunMeasures:
    cli: str
    via: str
    window: int
    returncode: int | None
    seconds: float
    fixed: bool
    requests: int
    task_requests: int
    refused: int  # upstream 400s (validation, window)
    refusals: list[str]
    tokens: int
    max_tokens: int
    over_window: int
    bill: float
    cached_share: float
    prefix_kept: int
    prefix_pairs: int
    newest_intact: int
    newest_pairs: int
    files_intact: int
    files_pairs: int
    views_intact: int = 0
    views: int = 0
    sessions: int = 0
    task_sessions: int = 0
    task_forks: int = 0
    stored: int = 0
    conversation: int = 0
    side_sessions: int = 0
    diff: str = ""
    final_output: str = ""
    per_request: list[dict[str, Any]] = field(default_factory=list)  # each upstream request, in order


def measure(run: dict[str, Any]) -> RunMeasures:
    exchanges = run["exchanges"]
    tapped = {t["n"]: t for t in run["tapped"]}
    window = run["window"]
    ok = [e for e in exchanges if e["status"] == 200]
    task = [e for e in ok if e["kind"] == "task"]
    pricers: dict[str, pricing.Pricer] = {}
    bill = 0.0
    cached = 0
    prefix_kept = pairs = 0
    previous: tuple[list[int], int] | None = None
    per_request: list[dict[str, Any]] = []
    for e in exchanges:
        row = {"n": e["n"], "kind": e["kind"], "step": e["step"], "status": e["status"], "tokens": e["tokens"]}
        per_request.append(row)
        if e["status"] != 200:
            row["error"] = e["error"][:200]
            continue
        ids = wire.token_ids(e["api"], e["body"])
        pricer = pricers.setdefault(e["api"], pricing.Pricer(pricing.prices_for(e["api"])))
        billed = pricer.add(ids)
        bill += billed.cost
        cached += billed.cached
        row.update(cached=billed.cached, cost=round(billed.cost, 1))
        if e["kind"] == "task":
            pieces = wire.segments(e["api"], e["body"])
            head = len(ids) - (wire.count_text(pieces[-1]) + wire.MESSAGE_FRAMING if pieces else 0)
            if previous is not None:
                pairs += 1
                before, before_head = previous
                if pricing.common_prefix(ids, before) >= before_head:
                    prefix_kept += 1
            previous = (ids, head)
    intact = newest_pairs = files = files_pairs = views = views_intact = 0
    for e in ok:
        client = tapped.get(e["tap"]) if e["tap"] is not None else None
        if client is None or not isinstance(client.get("body"), dict):
            continue
        newest_pairs += 1
        if newest(e["api"], e["body"]) == newest(e["api"], client["body"]):
            intact += 1
        if client["shown"]:
            files_pairs += 1
            sent = json.dumps(e["body"])
            whole = [escaped(run["files"][h]) in sent for h in client["shown"]]
            files += all(whole)
            views += len(whole)
            views_intact += sum(whole)
    tokens = sum(e["tokens"] for e in ok)
    out = RunMeasures(
        cli=run["cli"], via=run["via"], window=window, returncode=run.get("returncode"),
        seconds=run.get("seconds", 0.0), fixed=run.get("returncode") == 0 and expected_diff_ok(run.get("diff", "")),
        requests=len(exchanges), task_requests=len(task), refused=len(exchanges) - len(ok),
        refusals=sorted({e["error"][:160] for e in exchanges if e["status"] != 200}),
        tokens=tokens, max_tokens=max((e["tokens"] for e in ok), default=0),
        # (the window is the main model's: its side models pass through at their own)
        over_window=sum(1 for e in ok if e["tokens"] > window and e["body"].get("model") in (None, run.get("model"))),
        bill=round(bill, 1),
        cached_share=round(cached / tokens, 4) if tokens else 0.0, prefix_kept=prefix_kept, prefix_pairs=pairs,
        newest_intact=intact, newest_pairs=newest_pairs, files_intact=files, files_pairs=files_pairs,
        views_intact=views_intact, views=views,
        diff=run.get("diff", ""), final_output=(run.get("stdout") or "").strip()[-300:], per_request=per_request)
    sessions = run.get("sessions")
    if sessions is not None:
        task_sessions = [s for s in sessions if not is_side_session(s["messages"])]
        out.sessions = len(sessions)
        out.task_sessions = len(task_sessions)
        out.side_sessions = len(sessions) - len(task_sessions)
        out.task_forks = sum(1 for s in task_sessions if "~" in s["info"]["sessionId"])
        out.stored = sum(len(s["messages"]) for s in task_sessions)
    last_task = [t for t in run["tapped"] if isinstance(t.get("body"), dict)
                 and t["n"] in {e["tap"] for e in task}]
    if last_task:
        body = last_task[-1]["body"]
        items = body.get("input") if isinstance(body.get("input"), list) else body.get("messages") or []
        out.conversation = len(items) + 1
    return out


@dataclass
class Comparison:
    """A proxied run against its direct twin: what the benchmark's table shows."""

    cli: str
    window: int
    direct: RunMeasures
    proxy: RunMeasures
    same_diff: bool = False
    tokens_ratio: float = 0.0
    bill_ratio: float = 0.0
    notes: list[str] = field(default_factory=list)


def compare(direct: RunMeasures, proxy: RunMeasures) -> Comparison:
    c = Comparison(proxy.cli, proxy.window, direct, proxy)
    c.same_diff = direct.diff == proxy.diff
    c.tokens_ratio = round(proxy.tokens / direct.tokens, 3) if direct.tokens else 0.0
    c.bill_ratio = round(proxy.bill / direct.bill, 3) if direct.bill else 0.0
    if not direct.fixed:
        c.notes.append("direct run did not end with the fix")
    if direct.refused:
        c.notes.append(f"direct: upstream refused {direct.refused}: {direct.refusals[:2]}")
    if proxy.refused:
        c.notes.append(f"proxy: upstream refused {proxy.refused}: {proxy.refusals[:2]}")
    return c


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}% ({n}/{d})" if d else "-"


def as_json(c: Comparison) -> dict[str, Any]:
    return asdict(c)
