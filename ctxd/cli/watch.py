"""``ctxd-cli watch``: print a session's notifications as they arrive, until Ctrl-C."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_UNAVAILABLE, CliError, json_option, run, settings_of
from ctxd.cli.sessions import complete_session_id
from ctxd.client import Client

WILDCARD = "*"


MAX_OTHER = 160  # characters of JSON shown for a notification this version does not know


def _n(value: Any) -> str:
    return render.num(value) if isinstance(value, (int, float)) else str(value if value is not None else "-")


def _figures(method: str, p: dict[str, Any]) -> list[Any]:
    """The key figures of the notifications ctxd sends, one short phrase each."""
    if method == "session/updated":
        reason = str(p.get("reason", "?")) + (f" +{p.get('pushed', 0)}" if p.get("reason") == "push" else "")
        return [render.Styled(reason, "cyan"), f"seq {_n(p.get('lastSeq'))}", f"messages {_n(p.get('messageCount'))}",
                f"tokens {_n(p.get('tokenCount'))}", f"context {_n(p.get('contextTokens'))}"]
    if method == "session/deleted":
        return [render.Styled("deleted", "red")]
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


def describe(method: str, params: Any) -> list[Any]:
    """The session and key figures of one notification, for a one-line display."""
    if not isinstance(params, dict):
        return [json.dumps(params)]
    return [str(params.get("sessionId", "-")), *(f for f in _figures(method, params) if f != "")]


@click.command("watch")
@click.argument("session_id", required=False, metavar="SESSION", shell_complete=complete_session_id)
@click.option("--all", "all_sessions", is_flag=True, help="Watch every session.")
@json_option
@click.pass_context
def watch(ctx: click.Context, session_id: str | None, all_sessions: bool) -> None:
    """Print SESSION's notifications (or every session's, with --all) as they arrive.

    One line each: time, method, session, reason and figures. With --json, one JSON
    object per line: {"time", "method", "params"}. Stops with Ctrl-C, or when the
    watched session is deleted.
    """
    settings = settings_of(ctx)
    if all_sessions == (session_id is not None):
        raise click.UsageError("give a SESSION or --all (not both)")
    target = WILDCARD if all_sessions else session_id
    assert target is not None

    async def work(client: Client) -> None:
        stream = client.notifications()
        # Start the iterator before subscribing: it registers its queue when it first
        # runs, and a notification may follow the subscribe answer in the same read.
        pending = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        try:
            await client.request("session/subscribe", {"sessionId": target})
            render.note(f"watching {'all sessions' if target == WILDCARD else 'session ' + target}; Ctrl-C to stop")
            while True:
                try:
                    method, params = await pending
                except StopAsyncIteration:
                    raise CliError(f"the daemon on {settings.socket_path} closed the connection",
                                   EXIT_UNAVAILABLE) from None
                pending = asyncio.ensure_future(anext(stream))
                show(method, params)
                if (method == "session/deleted" and target != WILDCARD and isinstance(params, dict)
                        and params.get("sessionId") == target):
                    render.note(f"session {target} was deleted; nothing more to watch")
                    return
        finally:
            pending.cancel()

    def show(method: str, params: Any) -> None:
        now = datetime.now(timezone.utc).astimezone()
        if settings.json:
            render.print_json({"time": now.isoformat(timespec="milliseconds"), "method": method, "params": params},
                              compact=True)
        else:
            render.line(render.Styled(now.strftime("%H:%M:%S"), "dim"), render.Styled(method, "bold"),
                        *describe(method, params), sep="  ")

    run(settings, work, interrupt_code=0)

