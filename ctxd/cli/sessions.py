"""``ctxd-cli sessions list|show|delete``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import Settings, json_option, run, settings_of
from ctxd.client import Client


def complete_session_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of session ids from a running daemon (never starts one)."""
    import asyncio

    from click.shell_completion import CompletionItem

    from ctxd.cli.main import try_connect

    root = ctx.find_root().params
    settings = Settings(socket=root.get("socket"), data_dir=root.get("data_dir"),
                        config_file=root.get("config_file"), autostart=False)

    async def fetch() -> list[dict[str, Any]]:
        client = await try_connect(settings.socket_path)
        if client is None:
            return []
        try:
            await client.initialize(client_name="ctxd-cli-completion")
            result = await client.request("session/list", {"limit": 500}, timeout=2)
            return list(result["sessions"])
        finally:
            await client.close()

    try:
        sessions = asyncio.run(asyncio.wait_for(fetch(), 3))
    except Exception:  # completion must never print errors into the user's shell
        return []
    return [CompletionItem(s["sessionId"], help=render.session_label(s))
            for s in sessions if s["sessionId"].startswith(incomplete)]


def session_argument(fn: Any) -> Any:
    return click.argument("session_id", metavar="SESSION", shell_complete=complete_session_id)(fn)


@click.group("sessions")
def sessions() -> None:
    """List, inspect and delete sessions."""


@sessions.command("list")
@click.option("--limit", type=click.IntRange(min=0), help="Show at most N sessions (the most recently active).")
@click.option("--tag", metavar="T", help="Only sessions tagged T.")
@json_option
@click.pass_context
def list_sessions(ctx: click.Context, limit: int | None, tag: str | None) -> None:
    """Sessions, most recently active first."""
    settings = settings_of(ctx)
    params: dict[str, Any] = {}
    if limit is not None:
        params["limit"] = limit
    if tag is not None:
        params["tag"] = tag

    async def work(client: Client) -> Any:
        return await client.request("session/list", params)

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    rows = sorted(result["sessions"], key=lambda s: s.get("lastActivity") or "", reverse=True)
    if not rows:
        render.note("no sessions" + (f" tagged {tag!r}" if tag else ""))
        return
    render.table(
        [render.Column("ID", no_wrap=True), render.Column("TITLE / MODEL"),
         render.Column("MESSAGES", "right"), render.Column("TOKENS", "right"),
         render.Column("CONTEXT / WINDOW", "right"), render.Column("LAST ACTIVITY")],
        ([s["sessionId"], render.session_label(s), render.num(s["messageCount"]), render.num(s["tokenCount"]),
          render.window_use(s["contextTokens"], s["contextWindow"]), render.ago(s.get("lastActivity"))]
         for s in rows))


def session_pairs(info: dict[str, Any]) -> list[tuple[str, Any]]:
    encoding = info.get("encoding", "-") + (" (estimated)" if info.get("tokensEstimated") else "")
    pairs: list[tuple[str, Any]] = [
        ("id", info["sessionId"]),
        ("title", info.get("title") or "-"),
        ("model", info.get("model") or "-"),
        ("provider", info.get("provider") or "-"),
        ("tags", ", ".join(info.get("tags") or []) or "-"),
        ("created", f"{info.get('createdAt')} ({render.ago(info.get('createdAt'))})"),
        ("last activity", f"{info.get('lastActivity')} ({render.ago(info.get('lastActivity'))})"),
        ("messages", f"{render.num(info['messageCount'])} (last seq {info.get('lastSeq', 0)})"),
        ("history tokens", render.num(info["tokenCount"])),
        ("context", render.window_use(info["contextTokens"], info["contextWindow"])),
        ("system prompt", f"{render.num(info.get('systemPromptTokens', 0))} tokens"
                          + (f": {_first_line(info['systemPrompt'])}" if info.get("systemPrompt") else "")),
        ("encoding", encoding),
        ("compressions", (f"{render.num(info.get('compressionCount', 0))} "
                          f"({render.num(info.get('checkpointCount', 0))} checkpoints in the context)")),
    ]
    if info.get("settings"):
        pairs.append(("settings", _short_json(info["settings"])))
    if info.get("metadata"):
        pairs.append(("metadata", _short_json(info["metadata"])))
    return pairs


def _first_line(text: str, width: int = 70) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def _short_json(value: Any, width: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


@sessions.command("show")
@session_argument
@json_option
@click.pass_context
def show(ctx: click.Context, session_id: str) -> None:
    """A session's fields and totals."""
    settings = settings_of(ctx)

    async def work(client: Client) -> Any:
        return await client.request("session/get", {"sessionId": session_id})

    info = run(settings, work)
    if settings.json:
        render.print_json(info)
        return
    render.fields(session_pairs(info))


@sessions.command("delete")
@session_argument
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def delete(ctx: click.Context, session_id: str, yes: bool) -> None:
    """Delete a session and its whole history (asks first on a terminal unless --yes)."""
    settings = settings_of(ctx)
    if not yes and sys.stdin.isatty():
        async def get(client: Client) -> Any:
            return await client.request("session/get", {"sessionId": session_id})

        info = run(settings, get)
        question = (f"Delete session {session_id} ({render.session_label(info)}, "
                    f"{render.count(info['messageCount'], 'message')})?")
        try:
            confirmed = click.confirm(question, default=False, err=True)
        except click.Abort:
            raise click.exceptions.Exit(130) from None
        if not confirmed:
            render.note("not deleted")
            return

    async def work(client: Client) -> Any:
        return await client.request("session/delete", {"sessionId": session_id})

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    render.line(f"deleted session {result['sessionId']} ({render.count(result['deletedMessages'], 'message')})")
