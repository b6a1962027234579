"""Working on the active context: ``compress``, ``checkpoints``, ``expand``, ``pin`` and ``goal``."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import json_option, request, run, settings_of
from ctxd.cli.sessions import (
    CHECKPOINT_COLUMNS,
    checkpoint_rows,
    completion_request,
    goal_pairs,
    session_argument,
)
from ctxd.client import Client

PREVIEW = 400  # characters of a message a table row starts from (the table cuts it to the width)
STEP_STATUSES = {"pending": "pending", "in-progress": "in-progress", "in_progress": "in-progress",
                 "started": "in-progress", "completed": "completed", "done": "completed"}


# --- compress ----------------------------------------------------------------------


def progress_display(enabled: bool) -> tuple[ContextManager[Any], Callable[[dict[str, Any]], None]]:
    """A rich progress bar fed by ``$/progress`` values on a terminal; a no-op otherwise."""
    if not enabled:
        return nullcontext(), lambda value: None
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                   console=render.console(), transient=True)
    task = bar.add_task("compressing", total=100)

    def update(value: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = {}
        if value.get("kind") == "begin" and value.get("title"):
            kwargs["description"] = f"{value['title']} ({value.get('message') or ''})".replace(" ()", "")
        elif value.get("message"):
            kwargs["description"] = f"compressing: {value['message']}"
        if value.get("kind") == "end":
            kwargs["completed"] = 100
        elif isinstance(value.get("percentage"), (int, float)):
            kwargs["completed"] = value["percentage"]
        bar.update(task, **kwargs)

    return bar, update


def compress_lines(result: dict[str, Any]) -> list[Any]:
    before, after = result.get("beforeTokens", 0), result.get("afterTokens", 0)
    if not result.get("compressed"):
        return [render.Styled(f"nothing compressed in session {result['sessionId']}: "
                              f"{result.get('reason') or 'no reason given'};", "yellow"),
                f"context {render.num(before)} tokens"]
    parts = [f"{render.num(before)} -> {render.num(after)} tokens",
             f"freed {render.num(before - after)} ({render.percent(before - after, before)})",
             "+".join(result.get("layers") or [])]
    if result.get("checkpointIds"):
        parts.append("checkpoint " + ", ".join(result["checkpointIds"]))
    if result.get("summarizer"):
        parts.append(result["summarizer"])
    if result.get("durationMs") is not None:
        parts.append(f"{result['durationMs']:.0f} ms")
    return [render.Styled(f"compressed session {result['sessionId']}:", "green"), ", ".join(parts)]


@click.command("compress")
@session_argument
@click.option("--focus", metavar="TEXT", help="What the summary should keep (like /compact's instructions).")
@json_option
@click.pass_context
def compress(ctx: click.Context, session_id: str, focus: str | None) -> None:
    """Compress SESSION's context now, whatever the budget says (like /compact).

    Shows the stages as a progress bar on a terminal. The history keeps every message.
    """
    settings = settings_of(ctx)
    token = f"ctxd-cli-compress-{os.getpid()}"
    params: dict[str, Any] = {"sessionId": session_id, "workDoneToken": token}
    if focus:
        params["focus"] = focus
    display, update = progress_display(render.is_terminal() and not settings.json)

    async def work(client: Client) -> Any:
        def on_notification(method: str, p: Any) -> None:
            if method == "$/progress" and isinstance(p, dict) and p.get("token") == token:
                update(p.get("value") or {})

        client.on_notification(on_notification)
        with display:
            return await client.request("context/compress", params)

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    render.line(*compress_lines(result))


# --- checkpoints and expand ----------------------------------------------------------


def complete_checkpoint_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    session_id = ctx.params.get("session_id")
    if not session_id:
        return []
    result = completion_request(ctx, "context/checkpoints", {"sessionId": session_id})
    checkpoints = result["checkpoints"] if isinstance(result, dict) else []
    return [CompletionItem(c["id"], help=f"{c.get('kind')} seq {c.get('seqFrom')}-{c.get('seqTo')}")
            for c in checkpoints if c["id"].startswith(incomplete)]


@click.command("checkpoints")
@session_argument
@json_option
@click.pass_context
def checkpoints(ctx: click.Context, session_id: str) -> None:
    """The checkpoints in SESSION's active context, oldest first."""
    settings = settings_of(ctx)

    result = request(settings, "context/checkpoints", {"sessionId": session_id})
    if settings.json:
        render.print_json(result)
        return
    if not result["checkpoints"]:
        render.note(f"session {session_id} has no checkpoints (nothing has been compressed into one)")
        return
    render.table(CHECKPOINT_COLUMNS, checkpoint_rows(result["checkpoints"]))
    original = sum(c.get("originalTokens", 0) for c in result["checkpoints"])
    render.note(f"{render.count(len(result['checkpoints']), 'checkpoint')}: {render.num(result['tokens'])} tokens "
                f"in the prompt for {render.num(original)} tokens of conversation")


def checkpoint_pairs(c: dict[str, Any]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [
        ("checkpoint", c["id"]),
        ("kind", f"{c.get('kind')}, level {c.get('level')}"),
        ("stands for", f"seq {render.seq_range(c.get('seqFrom'), c.get('seqTo'))} "
                       f"({render.count(sum(b - a + 1 for a, b in c.get('messageRanges') or []), 'message')})"),
        ("tokens", f"{render.num(c.get('tokens'))} for {render.num(c.get('originalTokens'))} original "
                   f"({render.percent(c.get('tokens', 0), c.get('originalTokens', 0))})"),
        ("made", f"{c.get('createdAt')} by {c.get('summarizer')} (compression #{c.get('compressionNumber')})"),
    ]
    if c.get("mergedFrom"):
        pairs.append(("merged from", ", ".join(c["mergedFrom"])))
    for key, label in (("keyDecisions", "decisions"), ("filesModified", "files"), ("nextSteps", "next steps"),
                       ("errors", "errors")):
        for i, item in enumerate(c.get(key) or []):
            pairs.append((label if i == 0 else "", f"- {item}"))
    for i, tool in enumerate(c.get("toolsUsed") or []):
        pairs.append(("tools" if i == 0 else "", f"{tool.get('tool')} x{tool.get('count')}"))
    return pairs


@click.command("expand")
@session_argument
@click.argument("checkpoint_id", metavar="CHECKPOINT", shell_complete=complete_checkpoint_id)
@click.option("--full", is_flag=True, help="Print each message whole instead of one line each.")
@json_option
@click.pass_context
def expand(ctx: click.Context, session_id: str, checkpoint_id: str, full: bool) -> None:
    """The summary of CHECKPOINT and the original messages it stands for."""
    settings = settings_of(ctx)

    result = request(settings, "checkpoint/expand", {"sessionId": session_id, "checkpointId": checkpoint_id})
    if settings.json:
        render.print_json(result)
        return
    checkpoint = result["checkpoint"]
    render.fields(checkpoint_pairs(checkpoint))
    render.line("")
    render.line(render.Styled("Summary", "bold underline"))
    render.line(checkpoint.get("summary") or "-")
    render.line("")
    messages = result["messages"]
    if full:
        for m in messages:
            render.line(render.Styled(f"--- seq {m['seq']} {m['message'].get('role')} "
                                      f"({render.num(m.get('tokens'))} tokens, {m.get('createdAt')})", "bold"))
            render.line(render.message_text(m["message"]) or "-")
        return
    render.table([render.Column("SEQ", "right"), render.Column("ROLE"), render.Column("TOKENS", "right"),
                  render.Column("MESSAGE", flex=True)],
                 ([str(m["seq"]), str(m["message"].get("role")), render.num(m.get("tokens")),
                   render.message_preview(m["message"], PREVIEW)] for m in messages),
                 title=f"Original messages ({len(messages)}; --full prints them whole)")


# --- pin ---------------------------------------------------------------------------


@click.command("pin")
@session_argument
@click.argument("seq", type=click.IntRange(min=1), metavar="SEQ")
@click.option("--unpin", is_flag=True, help="Unpin it instead.")
@json_option
@click.pass_context
def pin(ctx: click.Context, session_id: str, seq: int, unpin: bool) -> None:
    """Pin message SEQ: it is always sent verbatim, never compressed (--unpin: undo)."""
    settings = settings_of(ctx)

    async def work(client: Client) -> Any:
        result = await client.request("message/pin", {"sessionId": session_id, "seq": seq, "pinned": not unpin})
        if settings.json:
            return result
        stats = await client.request("context/stats", {"sessionId": session_id})
        return {**result, "allPinned": stats.get("pinned", [])}

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    partners = [s for s in result.get("seqs") or [] if s != result["seq"]]
    what = f"seq {result['seq']}" + (f" (with its tool {'partner' if len(partners) == 1 else 'partners'} "
                                     f"{', '.join(map(str, partners))})" if partners else "")
    everything = result.get("allPinned") or []
    render.line(f"{'pinned' if result['pinned'] else 'unpinned'} {what} of session {result['sessionId']};",
                f"pinned now: {', '.join(map(str, everything)) or 'nothing'} "
                f"({render.num(result.get('pinnedTokens'))} tokens)")


# --- goal ----------------------------------------------------------------------------


@click.group("goal")
def goal() -> None:
    """Show, set and update a session's goal (sent in every prompt, never compressed)."""


def show_goal(result: dict[str, Any], settings: Any) -> None:
    if settings.json:
        render.print_json(result)
        return
    if result.get("goal") is None:
        render.note(f"session {result['sessionId']} has no goal (set one with: "
                    f"ctxd-cli goal set {result['sessionId']} \"what to achieve\")")
        return
    render.fields(goal_pairs(result["goal"], result.get("tokens")))


@goal.command("show")
@session_argument
@json_option
@click.pass_context
def goal_show(ctx: click.Context, session_id: str) -> None:
    """SESSION's goal: milestones, decisions, artifacts, next steps."""
    settings = settings_of(ctx)

    show_goal(request(settings, "goal/get", {"sessionId": session_id}), settings)


PRIORITY = click.Choice(["high", "medium", "low"])


@goal.command("set")
@session_argument
@click.argument("description", metavar="DESCRIPTION")
@click.option("--priority", type=PRIORITY, default="medium", show_default=True)
@click.option("--milestone", "milestones", multiple=True, metavar="TEXT", help="A milestone, pending (repeatable).")
@json_option
@click.pass_context
def goal_set(ctx: click.Context, session_id: str, description: str, priority: str, milestones: tuple[str, ...]) -> None:
    """Start a new goal for SESSION (replaces the current one, with its milestones and decisions)."""
    settings = settings_of(ctx)
    params: dict[str, Any] = {"sessionId": session_id, "description": description, "priority": priority}
    if milestones:
        params["checkpoints"] = [{"description": m, "status": "pending"} for m in milestones]

    show_goal(request(settings, "goal/set", params), settings)


def parse_milestone(text: str) -> dict[str, str]:
    description, sep, state = text.rpartition("=")
    status = STEP_STATUSES.get(state.strip().lower()) if sep else None
    if not sep or not description.strip() or status is None:
        raise click.BadParameter(f"{text!r}: expected TEXT=STATUS with STATUS one of pending, in-progress, "
                                 "completed", param_hint="--milestone")
    return {"description": description.strip(), "status": status}


def parse_artifact(text: str) -> dict[str, str]:
    path, sep, action = text.rpartition("=")
    if not sep:
        return {"path": text, "action": "modified"}
    if action not in ("created", "modified", "deleted") or not path:
        raise click.BadParameter(f"{text!r}: expected PATH or PATH=ACTION with ACTION one of created, modified, "
                                 "deleted", param_hint="--artifact")
    return {"path": path, "action": action}


@goal.command("update")
@session_argument
@click.option("--description", metavar="TEXT", help="Reword the goal.")
@click.option("--priority", type=PRIORITY)
@click.option("--status", type=click.Choice(["active", "paused", "completed"]))
@click.option("--decision", "decisions", multiple=True, metavar="TEXT",
              help="Record a decision (repeatable); an existing one with the same text is updated.")
@click.option("--locked", is_flag=True, help="The --decision(s) are locked: never dropped or compressed "
              "(without it, a --decision that was locked is unlocked).")
@click.option("--architecture", is_flag=True, help="The --decision(s) are architecture decisions.")
@click.option("--milestone", "milestones", multiple=True, metavar="TEXT=STATUS",
              help="Add or update a milestone: STATUS is pending, in-progress or completed (repeatable).")
@click.option("--artifact", "artifacts", multiple=True, metavar="PATH[=ACTION]",
              help="A file the work touched: ACTION created, modified (default) or deleted (repeatable).")
@click.option("--next", "next_steps", multiple=True, metavar="TEXT", help="Replace the next steps (repeatable).")
@click.option("--no-next", is_flag=True, help="Clear the next steps.")
@json_option
@click.pass_context
def goal_update(ctx: click.Context, session_id: str, description: str | None, priority: str | None,
                status: str | None, decisions: tuple[str, ...], locked: bool, architecture: bool,
                milestones: tuple[str, ...], artifacts: tuple[str, ...], next_steps: tuple[str, ...],
                no_next: bool) -> None:
    """Change SESSION's goal: status, milestones, decisions, artifacts, next steps.

    \b
      ctxd-cli goal update s1 --milestone "schema migrated=completed" --next "write the tests"
      ctxd-cli goal update s1 --decision "keep SQLite" --locked
      ctxd-cli goal update s1 --status completed
    """
    settings = settings_of(ctx)
    if (locked or architecture) and not decisions:
        raise click.UsageError("--locked and --architecture describe a --decision TEXT; give one")
    if next_steps and no_next:
        raise click.UsageError("--next and --no-next contradict each other")
    params: dict[str, Any] = {"sessionId": session_id}
    for key, value in (("description", description), ("priority", priority), ("status", status)):
        if value is not None:
            params[key] = value
    if decisions:
        params["decisions"] = [{"description": d, "locked": locked, "architecture": architecture} for d in decisions]
    if milestones:
        params["checkpoints"] = [parse_milestone(m) for m in milestones]
    if artifacts:
        params["artifacts"] = [parse_artifact(a) for a in artifacts]
    if next_steps or no_next:
        params["nextSteps"] = list(next_steps)
    if len(params) == 1:
        raise click.UsageError("nothing to change: give --status, --decision, --milestone, --artifact, --next, "
                               "--description or --priority")

    show_goal(request(settings, "goal/update", params), settings)
