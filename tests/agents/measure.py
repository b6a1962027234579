"""The measures of a run (tests/agents/run.py), and of a proxied run against its direct twin.

- **ends the same**: the CLI exited 0 and the repository's diff is the fix
  (``fixture.BUGGY`` -> ``fixture.FIXED``, nothing else); proxied: the same diff as direct.
- **sessions**: the ctxd sessions of the task's conversation (those holding its task ref,
  its scripted tool call ids or answers; side conversations such as titles and summaries
  are counted apart), **forks** among them, and the messages they store against the
  messages of the conversation (the client's last request and its reply).
- **over the window**: upstream requests whose input, as the fake provider counts it
  (tests/agents/wire.py), is more than ctxd's window; the largest; and those whose input
  and reply limit (``max_tokens``...) are, which the providers refuse (**+ reply**).
- **newest intact**: upstream requests that end with the client's newest turn as sent
  (its last message or item; behind a trailing system reminder, from the last other
  message on; cache breakpoints aside), paired through the tap.
- **files intact**: the client's own files, those it sends itself as its context each
  request (aider's files in the chat, Claude Code's reminders: a repository file whole, as
  on disk when sent, in the system part or a user message's own text): of the client
  requests showing some, those whose upstream request shows every one whole. A request
  that cannot hold them whole (:func:`cannot_fit`: the client's fixed part, its files, its
  newest turn and the reply floor over the window) is counted apart as **cannot fit**,
  not as a miss. **Views**: the files an agent read through its tools (in tool results),
  counted once per request, those the upstream request shows whole.
- **newest intact** counts apart, the same way, the requests whose newest turn alone
  (beside the fixed part and the reply floor; a tool result with the calls it answers,
  which no provider takes without them) cannot fit.
- **tokens** and **bill**: the upstream requests' input tokens, and their price with
  prompt caching (tests/agents/pricing.py); **cached share**, and **prefix kept**: task
  requests that start with the previous task request up to its last message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxd.config import ProxyConfig
from ctxd.proxy import sessions
from tests.agents import fixture, pricing, script, wire
from tests.agents.upstream import escaped

REPLY_FLOOR = ProxyConfig().reply_floor_tokens
"""The least a reply keeps (``proxy.reply_floor_tokens``): what a request must leave free."""
TOOL_ITEMS = ("function_call_output", "custom_tool_call_output")


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


def _own_and_tools(api: str, body: dict[str, Any]) -> tuple[str, str]:
    """The client's own text (system part, user and system messages' own text) and its
    tool results, each as raw JSON text to look files up in."""
    own: list[Any] = [body.get("system"), body.get("instructions")]
    tools: list[Any] = []
    items = body.get("input") if api == "responses" else body.get("messages")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") in TOOL_ITEMS or item.get("role") == "tool":
            tools.append(item)
        elif item.get("role") in ("user", "system", "developer"):
            content = item.get("content")
            blocks = content if isinstance(content, list) else [content]
            for block in blocks:
                (tools if isinstance(block, dict) and block.get("type") == "tool_result" else own).append(block)
    return json.dumps(own), json.dumps(tools)


def _fixed_body(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request with its conversation left out: tools, system part, leading system items."""
    key = "input" if api == "responses" else "messages"
    items = body.get(key) if isinstance(body.get(key), list) else []
    leading = []
    for item in items:
        if not isinstance(item, dict) or item.get("role") not in ("system", "developer"):
            break
        leading.append(item)
    return dict(body, **{key: leading})


def reply_limit(api: str, body: dict[str, Any]) -> int:
    """The request's reply limit (0: none)."""
    key = {"responses": "max_output_tokens", "anthropic": "max_tokens"}.get(api)
    asked = body.get(key) if key else (body.get("max_completion_tokens") or body.get("max_tokens"))
    return asked if isinstance(asked, int) and asked > 0 else 0


def reply_floor(api: str, body: dict[str, Any], window: int | None = None) -> int:
    """The reply room a request must leave: the client's limit, down to ctxd's floor at
    ``window`` (``ctxd.proxy.sessions.reply_floor``)."""
    floor = sessions.reply_floor(REPLY_FLOOR, window)
    asked = reply_limit(api, body)
    return min(asked, floor) if asked else floor


def _with_its_calls(api: str, body: dict[str, Any]) -> list[Any]:
    """The newest turn and, when it holds tool results, the calls they answer (with the
    results of their sibling calls): a provider refuses a result whose call is not sent."""
    key = "input" if api == "responses" else "messages"
    items = body.get(key) if isinstance(body.get(key), list) else []
    start = len(items) - len(newest(api, body) or [])
    if not 0 <= start < len(items) or not isinstance(items[start], dict):
        return _strip(items[start:])
    first = items[start]
    if api == "responses":
        if first.get("type") in TOOL_ITEMS:
            while start > 0 and isinstance(items[start - 1], dict) and (
                    items[start - 1].get("type") in TOOL_ITEMS + ("reasoning",)
                    or str(items[start - 1].get("type", "")).endswith("_call")):
                start -= 1
    elif api == "anthropic":
        content = first.get("content")
        if start > 0 and isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            start -= 1
    elif first.get("role") == "tool":
        while start > 0 and isinstance(items[start - 1], dict) and items[start - 1].get("role") == "tool":
            start -= 1
        if start > 0 and isinstance(items[start - 1], dict) and items[start - 1].get("role") == "assistant":
            start -= 1
    return _strip(items[start:])


def cannot_fit(api: str, body: dict[str, Any], window: int, files: list[str]) -> bool:
    """The client's fixed part, ``files`` and its newest turn (with the calls its tool
    results answer), beside the reply floor, are over ``window`` as the provider counts: no
    prompt can show them whole."""
    fixed = _fixed_body(api, body)
    key = "input" if api == "responses" else "messages"
    newest_items = _with_its_calls(api, body)
    tokens = wire.count(api, dict(fixed, **{key: list(fixed[key]) + list(newest_items)}))
    tokens += sum(wire.count_text(text) for text in files)
    return tokens + reply_floor(api, body, window) > window


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
    over_with_reply: int  # of them or not: input + the reply limit sent over the window (providers refuse it)
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
    newest_unfit: int = 0  # requests whose newest turn cannot fit whole (not in newest_pairs)
    files_unfit: int = 0  # requests whose own files cannot fit whole (not in files_pairs)
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
    intact = newest_pairs = files = files_pairs = views = views_intact = newest_unfit = files_unfit = 0
    for e in ok:
        client = tapped.get(e["tap"]) if e["tap"] is not None else None
        if client is None or not isinstance(client.get("body"), dict):
            continue
        api, body = e["api"], client["body"]
        managed = body.get("model") in (None, run.get("model"))  # (side models pass through at their own window)
        if newest(api, e["body"]) == newest(api, body):
            intact += 1
            newest_pairs += 1
        elif managed and cannot_fit(api, body, window, []):
            newest_unfit += 1
        else:
            newest_pairs += 1
        if not client["shown"]:
            continue
        own_text, tool_text = _own_and_tools(api, body)
        sent = json.dumps(e["body"])
        own = [run["files"][h] for h in client["shown"] if escaped(run["files"][h]) in own_text]
        viewed = [run["files"][h] for h in client["shown"] if escaped(run["files"][h]) in tool_text]
        if own:
            if all(escaped(text) in sent for text in own):
                files += 1
                files_pairs += 1
            elif managed and cannot_fit(api, body, window, own):
                files_unfit += 1
            else:
                files_pairs += 1
        whole = [escaped(text) in sent for text in viewed]
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
        over_with_reply=sum(1 for e in ok if e["tokens"] + reply_limit(e["api"], e["body"]) > window
                            and e["body"].get("model") in (None, run.get("model"))),
        bill=round(bill, 1),
        cached_share=round(cached / tokens, 4) if tokens else 0.0, prefix_kept=prefix_kept, prefix_pairs=pairs,
        newest_intact=intact, newest_pairs=newest_pairs, files_intact=files, files_pairs=files_pairs,
        views_intact=views_intact, views=views, newest_unfit=newest_unfit, files_unfit=files_unfit,
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
