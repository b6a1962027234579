"""``ctxd-cli watch``: a session's notifications as they arrive, until Ctrl-C.

On a terminal, watching one session is a live view: the context bar (prompt tokens
over what may be sent), the reliability level, the last events (compressions,
checkpoints, snapshots, thresholds, overflow) and a progress bar while a compression
runs. Off a terminal (or with --plain) it prints one line per notification; with
--json one JSON object per line.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from ctxd.cli import render
from ctxd.cli.main import initialize_client, json_option, resolve_session_callback, run, settings_of, try_connect
from ctxd.cli.sessions import complete_session_id
from ctxd.client import Client, DaemonUnavailable, RpcError

if TYPE_CHECKING:
    from rich.console import RenderableType

WILDCARD = "*"
LIVE_EVENTS = 10


MAX_OTHER = 160  # characters of JSON shown for a notification this version does not know


def _n(value: Any) -> str:
    return render.num(value) if isinstance(value, (int, float)) else str(value if value is not None else "-")


def _prompt_figure(prompt: Any, limits: tuple[int, int] | None) -> Any:
    if limits is None:
        return f"prompt {_n(prompt)}"
    return render.Styled(f"prompt {render.prompt_use(prompt, limits[0], limits[1])}",
                         "bold red" if isinstance(prompt, int) and prompt > limits[0] else "")


def _figures(method: str, p: dict[str, Any], limits: tuple[int, int] | None = None) -> list[Any]:
    """The key figures of the notifications ctxd sends, one short phrase each; ``limits``:
    the session's (max prompt, window), when known."""
    if method == "session/updated":
        reason = str(p.get("reason", "?")) + (f" +{p.get('pushed', 0)}" if p.get("reason") == "push" else "")
        return [render.Styled(reason, "cyan"), f"seq {_n(p.get('lastSeq'))}", f"messages {_n(p.get('messageCount'))}",
                f"history {_n(p.get('tokenCount'))} tokens", _prompt_figure(p.get("contextTokens"), limits)]
    if method == "session/deleted":
        why = p.get("reason")
        return [render.Styled("deleted", "red")] + ([f"by {why}: {p.get('detail') or ''}".rstrip(": ")]
                                                     if why and why != "request" else [])
    if method == "context/compressing":
        return [f"{p.get('stage')} {p.get('percentage', 0)}%", p.get("message") or ""]
    if method == "context/compressed":
        return [render.Styled(f"{_n(p.get('beforeTokens'))} -> {_n(p.get('afterTokens'))} tokens", "green"),
                f"freed {_n(p.get('freedTokens'))}", "+".join(p.get("layers") or []),
                f"pass {_n(p.get('compressionNumber'))}", f"{p.get('durationMs', 0):.0f} ms"]
    if method == "context/compressionFailed":
        return [render.Styled(f"failed: {p.get('reason')}", "red"), p.get("fallback") or ""]
    if method == "context/compressionSkipped":
        return [render.Styled(f"skipped: {p.get('reason')}", "yellow"),
                f"used {_n(p.get('used'))} / trigger {_n(p.get('triggerAt'))}"]
    if method == "context/threshold":
        return [render.Styled(str(p.get("level")), "yellow"),
                f"prompt {_n(p.get('promptTokens'))} / max {_n(p.get('maxPromptTokens'))}",
                f"used {_n(p.get('used'))} / trigger {_n(p.get('triggerAt'))}"]
    if method == "context/overflow":
        return [render.Styled(f"{p.get('policy')}: {p.get('action')}", "red"),
                f"prompt {_n(p.get('promptTokens'))} / max {_n(p.get('maxPromptTokens'))}"]
    if method == "context/reliability":
        rel = p.get("reliability") or {}
        change = f"{p['previousLevel']} -> " if p.get("previousLevel") else ""
        return [f"{change}{rel.get('level')}", f"score {rel.get('score')}"]
    if method == "checkpoint/created":
        c = p.get("checkpoint") or {}
        return [str(c.get("id")), f"{c.get('kind')}/{c.get('level')}", f"seq {c.get('seqFrom')}-{c.get('seqTo')}",
                f"{_n(c.get('originalTokens'))} -> {_n(c.get('tokens'))} tokens"]
    if method == "checkpoint/aged":
        return [str(p.get("checkpointId")), f"{p.get('fromLevel')} -> {p.get('toLevel')}",
                f"{_n(p.get('beforeTokens'))} -> {_n(p.get('afterTokens'))} tokens"]
    if method == "checkpoint/merged":
        return [f"{'+'.join(p.get('mergedIds') or [])} -> {p.get('intoId')}", f"{_n(p.get('tokens'))} tokens"]
    if method == "snapshot/created":
        s = p.get("snapshot") or {}
        return [str(s.get("snapshotId")), str(s.get("trigger")), s.get("label") or ""]
    if method == "snapshot/deleted":
        return [", ".join(p.get("snapshotIds") or []), str(p.get("reason"))]
    if method == "snapshot/error":
        return [render.Styled(f"{p.get('operation')} failed: {p.get('reason')}", "red")]
    rest = json.dumps({k: v for k, v in p.items() if k != "sessionId"}, ensure_ascii=False, separators=(",", ":"))
    return [rest if len(rest) <= MAX_OTHER else rest[: MAX_OTHER - 3] + "..."]


def describe(method: str, params: Any, maxima: dict[str, tuple[int, int]] | None = None) -> list[Any]:
    """The session and key figures of one notification, for a one-line display."""
    if not isinstance(params, dict):
        return [json.dumps(params)]
    limits = (maxima or {}).get(str(params.get("sessionId")))
    return [str(params.get("sessionId", "-")), *(f for f in _figures(method, params, limits) if f != "")]


# --- the live view -------------------------------------------------------------------


@dataclass
class LiveEvent:
    time: str
    label: str
    text: str
    style: str = ""


@dataclass
class LiveState:
    """What the live view shows, kept up to date from notifications (and ``context/stats``)."""

    session_id: str
    title: str | None = None
    model: str | None = None
    prompt_tokens: int = 0
    max_prompt_tokens: int = 0
    context_window: int = 0
    message_count: int = 0
    last_seq: int = 0
    compressions: int = 0
    reliability: dict[str, Any] | None = None
    compressing: tuple[str, int] | None = None
    last_update: str | None = None
    deleted: bool = False
    events: deque[LiveEvent] = field(default_factory=lambda: deque(maxlen=LIVE_EVENTS))

    def load(self, info: dict[str, Any] | None = None, stats: dict[str, Any] | None = None) -> None:
        """Figures from ``session/get`` and ``context/stats``."""
        if info:
            self.title = info.get("title")
            self.model = info.get("model")
            self.message_count = info.get("messageCount", self.message_count)
            self.last_seq = info.get("lastSeq", self.last_seq)
            self.prompt_tokens = info.get("contextTokens", self.prompt_tokens)
            self.context_window = info.get("contextWindow", self.context_window)
            self.compressions = info.get("compressionCount", self.compressions) or 0
        if stats:
            budget = stats.get("budget") or {}
            self.prompt_tokens = budget.get("promptTokens", stats.get("contextTokens", self.prompt_tokens))
            self.max_prompt_tokens = budget.get("maxPromptTokens", self.max_prompt_tokens)
            self.context_window = budget.get("contextWindow", self.context_window)
            self.compressions = stats.get("compressionCount", self.compressions)
            self.message_count = stats.get("messageCount", self.message_count)
            if stats.get("reliability"):
                self.reliability = stats["reliability"]

    def add(self, at: str, label: str, text: str, style: str = "") -> None:
        self.events.append(LiveEvent(at, label, text, style))

    def apply(self, method: str, p: Any, at: str) -> bool:
        """Take one notification in; True when the figures should be fetched again
        (the budget may have changed in ways notifications do not carry)."""
        if not isinstance(p, dict):
            return False
        if method == "session/updated":
            self.prompt_tokens = p.get("contextTokens", self.prompt_tokens)
            self.message_count = p.get("messageCount", self.message_count)
            self.last_seq = p.get("lastSeq", self.last_seq)
            reason = str(p.get("reason", "?"))
            self.last_update = f"{at} {reason}" + (f" +{p.get('pushed', 0)}" if reason == "push" else "")
            return reason in ("updated", "restored", "compressed", "pin", "goal", "watermark")
        if method == "context/compressing":
            self.compressing = (str(p.get("stage", "?")), int(p.get("percentage", 0) or 0))
            return False
        if method == "context/compressed":
            self.compressing = None
            self.compressions = p.get("compressionNumber", self.compressions + 1)
            self.prompt_tokens = p.get("afterTokens", self.prompt_tokens)
            layers = "+".join(p.get("layers") or []) or "-"
            trigger = f", {p['trigger']}" if p.get("trigger") else ""
            self.add(at, "compressed", f"{_n(p.get('beforeTokens'))} → {_n(p.get('afterTokens'))} tokens "
                     f"(freed {_n(p.get('freedTokens'))}) {layers}, #{_n(p.get('compressionNumber'))}{trigger}",
                     "green")
            return True
        if method == "context/compressionFailed":
            self.compressing = None
            self.add(at, "failed", f"{p.get('reason')}" + (f" (then: {p['fallback']})" if p.get("fallback") else ""),
                     "red")
            return True
        if method == "context/compressionSkipped":
            self.compressing = None
            self.add(at, "skipped", f"{p.get('reason')} (used {_n(p.get('used'))} / trigger {_n(p.get('triggerAt'))})",
                     "yellow")
            return False
        if method == "context/threshold":
            level = str(p.get("level"))
            self.add(at, f"threshold {level}", f"prompt {_n(p.get('promptTokens'))} / max "
                     f"{_n(p.get('maxPromptTokens'))}, used {_n(p.get('used'))} / trigger {_n(p.get('triggerAt'))}",
                     "bold red" if level == "critical" else "yellow")
            return False
        if method == "context/overflow":
            self.add(at, "overflow", f"{p.get('policy')}: {p.get('action')} (prompt {_n(p.get('promptTokens'))} / "
                     f"max {_n(p.get('maxPromptTokens'))})", "bold red")
            return True
        if method == "context/reliability":
            rel = p.get("reliability") or {}
            self.reliability = rel
            level = str(rel.get("level"))
            change = f"{p['previousLevel']} → {level}" if p.get("previousLevel") else level
            self.add(at, "reliability", f"{change} (score {rel.get('score')})",
                     render.RELIABILITY_STYLES.get(level, ""))
            return False
        if method == "checkpoint/created":
            c = p.get("checkpoint") or {}
            self.add(at, "checkpoint", f"{c.get('id')} {c.get('kind')}/{c.get('level')} seq "
                     f"{render.seq_range(c.get('seqFrom'), c.get('seqTo'))}: {_n(c.get('originalTokens'))} → "
                     f"{_n(c.get('tokens'))} tokens", "cyan")
            return False
        if method == "checkpoint/aged":
            self.add(at, "aged", f"{p.get('checkpointId')} {p.get('fromLevel')} → {p.get('toLevel')}: "
                     f"{_n(p.get('beforeTokens'))} → {_n(p.get('afterTokens'))} tokens", "cyan")
            return False
        if method == "checkpoint/merged":
            self.add(at, "merged", f"{'+'.join(p.get('mergedIds') or [])} → {p.get('intoId')} "
                     f"({_n(p.get('tokens'))} tokens)", "cyan")
            return False
        if method == "snapshot/created":
            s = p.get("snapshot") or {}
            self.add(at, "snapshot", f"{s.get('snapshotId')} ({s.get('trigger')})"
                     + (f" {s['label']}" if s.get("label") else ""), "blue")
            return False
        if method == "snapshot/restored":
            rolled = (f", seq {render.seq_range(p.get('rolledBackFrom'), p.get('rolledBackTo'))} rolled back"
                      if p.get("rolledBackFrom") is not None else "")
            self.add(at, "restored", f"to {p.get('snapshotId')}{rolled} (backup {p.get('backupSnapshotId')})",
                     "bold blue")
            return True
        if method == "snapshot/deleted":
            self.add(at, "snapshot deleted", f"{', '.join(p.get('snapshotIds') or [])} ({p.get('reason')})", "dim")
            return False
        if method == "snapshot/error":
            self.add(at, "snapshot error", f"{p.get('operation')}: {p.get('reason')}", "red")
            return False
        if method == "session/deleted":
            self.deleted = True
            why = p.get("detail") if p.get("reason") not in (None, "request") else None
            self.add(at, "deleted", f"the session was deleted ({why})" if why else "the session was deleted",
                     "bold red")
            return False
        return False


def usage_style(fraction: float) -> str:
    return "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"


def context_line(state: LiveState) -> str:
    """``Prompt: 5,234 / 6,800 (77%), window 8,192``: the prompt against the largest that
    may be sent, as every view shows it."""
    return f"Prompt: {render.prompt_use(state.prompt_tokens, state.max_prompt_tokens, state.context_window)}"


def render_live(state: LiveState) -> RenderableType:
    """The live view of one session, as a rich renderable (tests render it to text)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    fraction = state.prompt_tokens / state.max_prompt_tokens if state.max_prompt_tokens else 0.0
    top = Table.grid(padding=(0, 2))
    top.add_column(no_wrap=True)
    top.add_column(width=26)
    top.add_row(Text(context_line(state), style="bold"),
                ProgressBar(total=max(state.max_prompt_tokens, 1), completed=min(state.prompt_tokens,
                            max(state.max_prompt_tokens, 1)), width=24, complete_style=usage_style(fraction),
                            finished_style="bold red"))
    rel = state.reliability or {}
    level = str(rel.get("level", "-"))
    reliability = Text("Reliability: ")
    reliability.append(level, style=render.RELIABILITY_STYLES.get(level, "") + " bold")
    if isinstance(rel.get("score"), (int, float)):
        why = render.reliability_why(rel)
        reliability.append(f" (score {rel['score']:.2f}" + (f" = {why}" if why else "") + ")")
    reliability.append(f"  ·  {render.count(state.compressions, 'compression')}")
    top.add_row(reliability, Text(""))
    if state.compressing is not None:
        stage, percentage = state.compressing
        top.add_row(Text(f"Compressing: {stage} {percentage}%", style="magenta"),
                    ProgressBar(total=100, completed=percentage, width=24, complete_style="magenta"))
    events = Table.grid(padding=(0, 2))
    events.add_column(style="dim", no_wrap=True)
    events.add_column(no_wrap=True)
    events.add_column()
    for event in state.events:
        events.add_row(event.time, Text(event.label, style=event.style), Text(render.safe(event.text)))
    parts: list[Any] = [top, Text("")]
    if state.events:
        parts += [Text(f"Last {render.count(len(state.events), 'event')}", style="bold"), events]
    else:
        parts.append(Text("no compression, checkpoint or snapshot events yet", style="dim"))
    footer = f"messages {render.num(state.message_count)} (last seq {state.last_seq})"
    if state.last_update:
        footer += f" · last update {state.last_update}"
    parts += [Text(""), Text(footer, style="dim")]
    label = " · ".join(part for part in (state.session_id, state.title, state.model) if part)
    return Panel(Group(*parts), title=Text(render.safe(label), style="bold"), title_align="left",
                 subtitle="Ctrl-C to stop" if not state.deleted else "session deleted", subtitle_align="right")


class ConnectionLost(Exception):
    """The daemon closed the connection (stopped, restarted, crashed)."""


async def next_notification(stream: Any,
                            pending: asyncio.Future[Any]) -> tuple[tuple[str, Any], asyncio.Future[Any]]:
    """The next notification, and the future of the one after it."""
    try:
        item = await pending
    except StopAsyncIteration:
        raise ConnectionLost() from None
    return item, asyncio.ensure_future(anext(stream))


async def live_view(client: Client, state: LiveState, stream: Any, pending: asyncio.Future[Any]) -> None:
    """Run the live view until Ctrl-C, the session's deletion, or the connection's end
    (ConnectionLost; ``state`` is kept for the next connection)."""
    from rich.live import Live

    ref = {"sessionId": state.session_id}
    info, stats = await asyncio.gather(client.request("session/get", ref), client.request("context/stats", ref))
    state.load(info, stats)
    refresh: asyncio.Task[None] | None = None

    async def refetch() -> None:
        await asyncio.sleep(0.2)  # let a burst of notifications settle first
        try:
            state.load(stats=await client.request("context/stats", ref))
        except Exception:  # a deleted session, a closing connection: the notifications say so
            pass

    try:
        with Live(get_renderable=lambda: render_live(state), console=render.console(), refresh_per_second=4,
                  transient=False, redirect_stdout=False, redirect_stderr=False):
            while not state.deleted:
                (method, params), pending = await next_notification(stream, pending)
                now = datetime.now(UTC).astimezone().strftime("%H:%M:%S")
                try:
                    changed = state.apply(method, params, now)
                except Exception:  # a notification this version does not understand never ends the view
                    continue
                if changed and (refresh is None or refresh.done()):
                    refresh = asyncio.ensure_future(refetch())
    finally:
        pending.cancel()
        if refresh is not None:
            refresh.cancel()


RECONNECT_POLL_SECONDS = 0.25
BUDGET_CHANGES = ("updated", "restored", "compressed", "pin", "goal", "watermark")


# --- the command -----------------------------------------------------------------------


@click.command("watch")
@click.argument("session_id", required=False, metavar="SESSION", shell_complete=complete_session_id,
                callback=resolve_session_callback)
@click.option("--all", "all_sessions", is_flag=True, help="Watch every session (one line per notification).")
@click.option("--plain", is_flag=True, help="One line per notification even on a terminal (no live view).")
@json_option
@click.pass_context
def watch(ctx: click.Context, session_id: str | None, all_sessions: bool, plain: bool) -> None:
    """Watch SESSION (or every session, with --all) as notifications arrive.

    On a terminal: a live view of the prompt (against the largest prompt that may be
    sent, the window beside it), compressions, reliability, the last events and a
    progress bar while a compression runs. Otherwise (or with --plain) one line each:
    time, method, session and figures; with --json one JSON object per line: {"time",
    "method", "params"}. When the daemon stops or restarts, watch waits for it and
    carries on. Stops with Ctrl-C, or when the watched session is deleted.
    """
    settings = settings_of(ctx)
    if all_sessions == (session_id is not None):
        raise click.UsageError("give a SESSION or --all (not both)")
    target = WILDCARD if all_sessions else session_id
    assert target is not None
    live = render.is_terminal() and not settings.json and not plain and not all_sessions
    state = LiveState(session_id) if live and session_id is not None else None
    maxima: dict[str, tuple[int, int]] = {}  # session -> (max prompt, window), for the plain lines
    announced: list[bool] = []
    reconnecting: list[bool] = []

    async def budget_of(client: Client, sid: str) -> None:
        try:
            budget = (await client.request("context/stats", {"sessionId": sid}))["budget"]
        except RpcError:  # deleted meanwhile
            return
        maxima[sid] = (budget["maxPromptTokens"], budget["contextWindow"])

    async def follow(client: Client) -> bool:
        """Subscribe and show notifications until the watched session is deleted (True)
        or the connection ends (ConnectionLost)."""
        stream = client.notifications()
        # Start the iterator before subscribing: it registers its queue when it first
        # runs, and a notification may follow the subscribe answer in the same read.
        pending: asyncio.Future[Any] = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        try:
            await client.request("session/subscribe", {"sessionId": target})
            if reconnecting:
                reconnecting.clear()
                render.note(f"reconnected to the daemon on {settings.endpoint}; watching again")
                if state is not None:
                    state.add(datetime.now(UTC).astimezone().strftime("%H:%M:%S"), "daemon", "reconnected",
                              "green")
            elif state is None and not announced:
                announced.append(True)
                render.note(f"watching {'all sessions' if target == WILDCARD else 'session ' + target}; "
                            "Ctrl-C to stop")
            if state is not None:
                await live_view(client, state, stream, pending)
                return True
            if target != WILDCARD and not settings.json:
                await budget_of(client, target)
            while True:
                (method, params), pending = await next_notification(stream, pending)
                sid = params.get("sessionId") if isinstance(params, dict) else None
                if not settings.json and isinstance(sid, str) and method == "session/updated" and (
                        sid not in maxima or params.get("reason") in BUDGET_CHANGES):
                    await budget_of(client, sid)
                show(method, params)
                if method == "session/deleted" and target != WILDCARD and sid == target:
                    render.note(f"session {target} was deleted; nothing more to watch")
                    return True
        except DaemonUnavailable:  # the connection ended during a request
            raise ConnectionLost() from None
        finally:
            pending.cancel()

    async def reconnect() -> Client:
        render.note(f"the daemon on {settings.endpoint} closed the connection; waiting for it to come back "
                    "(Ctrl-C to stop)")
        if state is not None:
            state.add(datetime.now(UTC).astimezone().strftime("%H:%M:%S"), "daemon",
                      "connection lost; waiting for the daemon", "yellow")
        while True:
            await asyncio.sleep(RECONNECT_POLL_SECONDS)
            try:
                client = await try_connect(settings)
            except DaemonUnavailable:
                continue
            if client is None:
                continue
            try:
                client = await initialize_client(client, settings)
            except (DaemonUnavailable, RpcError):  # a daemon still starting, or stopping
                await client.close(shutdown=False)
                continue
            reconnecting.append(True)  # (said once subscribed again: notifications flow from then on)
            return client

    async def work(client: Client) -> None:
        while True:
            try:
                if await follow(client):
                    return
            except ConnectionLost:
                pass
            await client.close(shutdown=False)
            client = await reconnect()

    def show(method: str, params: Any) -> None:
        now = datetime.now(UTC).astimezone()
        if settings.json:
            render.print_json({"time": now.isoformat(timespec="milliseconds"), "method": method, "params": params},
                              compact=True)
        else:
            render.line(render.Styled(now.strftime("%H:%M:%S"), "dim"), render.Styled(method, "bold"),
                        *describe(method, params, maxima), sep="  ")

    run(settings, work, interrupt_code=0)
