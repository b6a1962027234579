"""``ctxd-cli snapshot create|list|show|restore|delete``: the active context at a point in time."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import confirm, json_option, request, run, settings_of
from ctxd.cli.sessions import (
    CHECKPOINT_COLUMNS,
    SNAPSHOT_COLUMNS,
    checkpoint_rows,
    completion_request,
    goal_pairs,
    session_argument,
    snapshot_rows,
)
from ctxd.client import Client

USER_MESSAGES_SHOWN = 10


def complete_snapshot_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of the snapshot ids of the SESSION given before (from a running daemon)."""
    from click.shell_completion import CompletionItem

    session_id = ctx.params.get("session_id")
    if not session_id:
        return []
    result = completion_request(ctx, "snapshot/list", {"sessionId": session_id})
    snapshots = result["snapshots"] if isinstance(result, dict) else []
    return [CompletionItem(s["snapshotId"],
                           help=f"{s.get('trigger')} {s.get('createdAt')} {s.get('label') or ''}".strip())
            for s in snapshots if s["snapshotId"].startswith(incomplete)]


def snapshot_argument(fn: Any) -> Any:
    return click.argument("snapshot_id", metavar="SNAPSHOT", shell_complete=complete_snapshot_id)(fn)


@click.group("snapshot")
def snapshot() -> None:
    """Take, inspect, restore and delete snapshots of a session's active context.

    A snapshot holds what the model would be sent (every user message, the other
    messages of the context, checkpoints, goal, watermark); restoring one makes it the
    active context again, after snapshotting the current one. History keeps everything.
    """


def info_pairs(info: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("snapshot", info["snapshotId"]),
        ("session", info["sessionId"]),
        ("created", f"{info.get('createdAt')} ({render.ago(info.get('createdAt'))})"),
        ("trigger", info.get("trigger", "-")),
        ("label", info.get("label") or "-"),
        ("history", f"{render.count(info.get('messageCount'), 'message')} (last seq {info.get('lastSeq')}), "
                    f"{render.num(info.get('tokenCount'))} tokens"),
        ("prompt then", f"{render.num(info.get('contextTokens', 0))} tokens, window "
                        f"{render.num(info.get('contextWindow', 0))}"),
        ("compression", f"{render.count(info.get('compressionCount'), 'compression')}, "
                        f"{render.count(info.get('checkpointCount'), 'checkpoint')}, "
                        f"ratio {render.ratio(info.get('compressionRatio'))}"),
    ]


@snapshot.command("create")
@session_argument
@click.option("--label", metavar="L", help="A name to recognise it by.")
@json_option
@click.pass_context
def create(ctx: click.Context, session_id: str, label: str | None) -> None:
    """Snapshot SESSION's active context now (kept until deleted)."""
    settings = settings_of(ctx)
    params: dict[str, Any] = {"sessionId": session_id}
    if label is not None:
        params["label"] = label

    info = request(settings, "snapshot/create", params)
    if settings.json:
        render.print_json(info)
        return
    render.line(render.Styled(f"created snapshot {info['snapshotId']}", "green"),
                f"of session {info['sessionId']}: context {render.num(info.get('contextTokens'))} tokens, "
                f"last seq {info.get('lastSeq')}" + (f" ({info['label']})" if info.get("label") else ""))


@snapshot.command("list")
@session_argument
@json_option
@click.pass_context
def list_snapshots(ctx: click.Context, session_id: str) -> None:
    """SESSION's snapshots, newest first."""
    settings = settings_of(ctx)

    result = request(settings, "snapshot/list", {"sessionId": session_id})
    if settings.json:
        render.print_json(result)
        return
    if not result["snapshots"]:
        render.note(f"session {session_id} has no snapshots (take one with: ctxd-cli snapshot create {session_id})")
        return
    render.table(SNAPSHOT_COLUMNS, snapshot_rows(result["snapshots"]))


def content_summary(content: dict[str, Any]) -> list[tuple[str, Any]]:
    """What a snapshot holds, in figures."""
    users = content.get("userMessages") or []
    others = content.get("messages") or []
    # (A user-role message among the others carries tool results, not the user's words.)
    roles = Counter("tool" if role == "user" else role
                    for role in (str(m.get("message", {}).get("role", "?")) for m in others))
    in_context = sum(1 for m in [*users, *others] if m.get("inContext"))
    pinned = content.get("pinned") or []
    return [
        ("user messages", f"{render.num(len(users))} ({render.num(sum(m.get('tokens', 0) for m in users))} tokens, "
                          "every one in full)"),
        ("other messages", (f"{render.num(len(others))} ("
                            + (", ".join(f"{n} {r}" for r, n in roles.most_common()) or "none")
                            + f"; {render.num(sum(m.get('tokens', 0) for m in others))} tokens)")),
        ("in the context", f"{render.num(in_context)} of those messages"),
        ("checkpoints", render.num(len(content.get("checkpoints") or []))),
        ("goal", (content.get("goal") or {}).get("description") or "none"),
        ("watermark", f"seq {content.get('watermarkSeq', 0)}"),
        ("pinned", ", ".join(f"seq {s}" for s in pinned) if pinned else "none"),
        ("thinking", f"{render.num(content.get('thinkingTokens', 0))} tokens"),
    ]


@snapshot.command("show")
@session_argument
@snapshot_argument
@click.option("--messages", "all_messages", is_flag=True, help="List every message it holds, not only the user's.")
@json_option
@click.pass_context
def show(ctx: click.Context, session_id: str, snapshot_id: str, all_messages: bool) -> None:
    """What a snapshot holds: user messages, other messages, checkpoints, goal, watermark."""
    settings = settings_of(ctx)

    content = request(settings, "snapshot/get", {"sessionId": session_id, "snapshotId": snapshot_id})
    if settings.json:
        render.print_json(content)
        return
    render.fields(info_pairs(content["info"]) + content_summary(content))
    shown = sorted([*(content.get("userMessages") or []), *(content.get("messages") or [])] if all_messages
                   else (content.get("userMessages") or []), key=lambda m: m.get("seq", 0))
    if shown:
        render.line("")
        limit = None if all_messages else USER_MESSAGES_SHOWN
        rows = [[render.num(m.get("seq")), str(m.get("message", {}).get("role", "?")), render.num(m.get("tokens")),
                 "yes" if m.get("inContext") else "no", render.message_preview(m.get("message") or {}, 400)]
                for m in shown[-limit if limit else 0:]]
        title = "Messages" if all_messages else "User messages"
        if limit and len(shown) > limit:
            title += f" (the last {limit} of {len(shown)}; --json has them all)"
        render.table([render.Column("SEQ", "right"), render.Column("ROLE"), render.Column("TOKENS", "right"),
                      render.Column("IN CONTEXT"), render.Column("TEXT", flex=True)], rows, title=title)
    if content.get("checkpoints"):
        render.line("")
        render.table(CHECKPOINT_COLUMNS, checkpoint_rows(content["checkpoints"]), title="Checkpoints")
    if content.get("goal"):
        render.line("")
        render.fields(goal_pairs(content["goal"]), title="Goal")


@snapshot.command("restore")
@session_argument
@snapshot_argument
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def restore(ctx: click.Context, session_id: str, snapshot_id: str, yes: bool) -> None:
    """Make SNAPSHOT's context SESSION's active context again.

    The current context is snapshotted first (the backup's id is printed: restore it
    to undo), and the messages pushed after the snapshot are marked rolled back in
    the history (never deleted). Asks first on a terminal unless --yes.
    """
    settings = settings_of(ctx)
    ref = {"sessionId": session_id, "snapshotId": snapshot_id}
    if not yes:
        async def get(client: Client) -> Any:
            return await client.request("snapshot/get", ref)

        info = run(settings, get)["info"]
        question = (f"Restore session {session_id} to snapshot {snapshot_id} ({info.get('trigger')}, "
                    f"{render.ago(info.get('createdAt'))}, last seq {info.get('lastSeq')})? "
                    "The current context is snapshotted first")
        if not confirm(question, yes=yes):
            render.note("not restored")
            return

    result = request(settings, "snapshot/restore", ref)
    if settings.json:
        render.print_json(result)
        return
    render.line(render.Styled(f"restored session {result['sessionId']} to snapshot {result['snapshotId']}", "green"))
    start, end = result.get("rolledBackFrom"), result.get("rolledBackTo")
    pairs: list[tuple[str, Any]] = [
        ("backup", f"{result['backupSnapshotId']} (the context before; undo with: ctxd-cli snapshot restore "
                   f"{result['sessionId']} {result['backupSnapshotId']})"),
        ("rolled back", f"seq {render.seq_range(start, end)} (still in the history, marked rolled_back)"
         if start is not None else "nothing (no messages after the snapshot)"),
    ]
    if result.get("contextTokens") is not None:
        pairs.append(("context", f"{render.num(result['contextTokens'])} tokens"
                      + (" (the restored context did not fit the largest prompt: compressed right away)"
                         if result.get("compressed") else "")))
    if result.get("goalChanged"):
        before = (result.get("previousGoal") or {}).get("description")
        after = (result.get("goal") or {}).get("description")
        pairs.append(("goal", render.Styled(
            f"changed: {before or 'none'} -> {after or 'none'} (the snapshot's; the backup keeps the one before)",
            "yellow")))
    else:
        pairs.append(("goal", "unchanged"))
    render.fields(pairs)


@snapshot.command("delete")
@session_argument
@snapshot_argument
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def delete(ctx: click.Context, session_id: str, snapshot_id: str, yes: bool) -> None:
    """Delete one snapshot (asks first on a terminal unless --yes)."""
    settings = settings_of(ctx)
    ref = {"sessionId": session_id, "snapshotId": snapshot_id}
    if not yes and not confirm(f"Delete snapshot {snapshot_id} of session {session_id}?", yes=yes):
        render.note("not deleted")
        return

    result = request(settings, "snapshot/delete", ref)
    if settings.json:
        render.print_json(result)
        return
    render.line(f"deleted snapshot {', '.join(result['deleted']) or snapshot_id} of session {result['sessionId']}")
