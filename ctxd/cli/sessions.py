"""``ctxd-cli sessions list|show|delete``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import (
    AliasGroup,
    Settings,
    confirm,
    json_option,
    request,
    require_terminal,
    resolve_session_callback,
    run,
    settings_of,
)
from ctxd.client import Client
from ctxd.ids import short_ids


def completion_request(ctx: click.Context, method: str, params: dict[str, Any]) -> Any:
    """One request to a running daemon for shell completion: never starts one, never
    prints an error into the user's shell (None on any failure)."""
    import asyncio

    from ctxd.cli.main import read_token, try_connect

    root = ctx.find_root().params
    settings = Settings(socket=root.get("socket"), data_dir=root.get("data_dir"), tcp=root.get("tcp"),
                        token_file=root.get("token_file"), config_file=root.get("config_file"), autostart=False)

    async def fetch() -> Any:
        client = await try_connect(settings)
        if client is None:
            return None
        try:
            token = read_token(settings) if settings.tcp is not None else None
            await client.initialize(client_name="ctxd-cli-completion", token=token)
            return await client.request(method, params, timeout=2)
        finally:
            await client.close()

    try:
        return asyncio.run(asyncio.wait_for(fetch(), 3))
    except Exception:  # completion must never print errors into the user's shell
        return None


def complete_session_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of session ids from a running daemon (never starts one)."""
    from click.shell_completion import CompletionItem

    result = completion_request(ctx, "session/list", {"limit": 500})
    sessions = result["sessions"] if isinstance(result, dict) else []
    return [CompletionItem(s["sessionId"], help=render.session_label(s))
            for s in sessions if s["sessionId"].startswith(incomplete)]


def session_argument(fn: Any = None, *, resolve: bool = True) -> Any:
    """The SESSION argument: an id, a unique prefix of one, or ``last`` (resolved before
    the command runs, unless ``resolve`` is false: the command resolves it itself)."""

    def decorate(f: Any) -> Any:
        return click.argument("session_id", metavar="SESSION", shell_complete=complete_session_id,
                              callback=resolve_session_callback if resolve else None)(f)

    return decorate(fn) if fn is not None else decorate


@click.group("sessions", cls=AliasGroup)
def sessions() -> None:
    """List, inspect, update, export, import and delete sessions."""


@sessions.command("list")
@click.option("--limit", type=click.IntRange(min=0), help="Show at most N sessions (the most recently active).")
@click.option("--tag", metavar="T", help="Only sessions tagged T.")
@json_option
@click.pass_context
def list_sessions(ctx: click.Context, limit: int | None, tag: str | None) -> None:
    """Sessions, most recently active first.

    IDs that ctxd made up are shown as their shortest unique prefix (8 characters or
    more), which every command accepts, as it accepts "last"; --json has them whole.
    PROMPT / MAX is the prompt to send next against the largest that may be sent.
    """
    settings = settings_of(ctx)
    params: dict[str, Any] = {}
    if limit is not None:
        params["limit"] = limit
    if tag is not None:
        params["tag"] = tag

    async def work(client: Client) -> tuple[Any, list[str], dict[str, Any]]:
        import asyncio

        result = await client.request("session/list", params)
        if settings.json:
            return result, [], {}
        every = (await client.request("session/list"))["sessions"] if params else result["sessions"]
        budgets = await asyncio.gather(*(client.request("context/stats", {"sessionId": s["sessionId"]})
                                         for s in result["sessions"]), return_exceptions=True)
        return result, [s["sessionId"] for s in every], {
            s["sessionId"]: b.get("budget") for s, b in zip(result["sessions"], budgets) if isinstance(b, dict)}

    result, every, budgets = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    rows = sorted(result["sessions"], key=lambda s: s.get("lastActivity") or "", reverse=True)
    footer = retention_footer(result.get("retention"))
    if not rows:
        if tag:
            render.line(f"no sessions tagged {tag!r}")
        else:
            render.line("no sessions yet (ctxd-cli push ID --create --content TEXT makes one; "
                        "ctxd-cli replay --example replays a real agent run)")
        if footer:
            render.line(footer)
        return
    shown = short_ids(every + [s["sessionId"] for s in rows])

    def prompt_cell(s: dict[str, Any]) -> Any:
        budget = budgets.get(s["sessionId"])
        if budget is None:  # (deleted meanwhile)
            return f"{render.num(s['contextTokens'])} / -"
        return render.prompt_use(budget["promptTokens"], budget["maxPromptTokens"])

    render.table(
        [render.Column("ID"), render.Column("TITLE (MODEL)", flex=True), render.Column("MSGS", "right"),
         render.Column("PROMPT / MAX", "right"), render.Column("WINDOW", "right"), render.Column("ACTIVE")],
        ([shown[s["sessionId"]], render.session_label(s), render.num(s["messageCount"]), prompt_cell(s),
          render.num(s["contextWindow"]), render.ago(s.get("lastActivity"))]
         for s in rows))
    if footer:
        render.line(footer)


RULES = {"max_sessions": "sessions.max_sessions", "max_age": "sessions.max_age_days"}


def retention_footer(retention: dict[str, Any] | None) -> str | None:
    """The line under ``sessions list`` saying what automatic retention removed and why
    (None when it never removed anything and is off)."""
    if not retention:
        return None
    removed = retention.get("removed", 0)
    max_sessions = retention.get("maxSessions", 0)
    max_age = retention.get("maxAgeDays", 0)
    rules = []
    if max_sessions:
        rules.append(f"sessions.max_sessions = {max_sessions} keeps the most recently active")
    if max_age:
        rules.append(f"sessions.max_age_days = {max_age:g} removes sessions inactive that long")
    if not removed:
        return f"retention: nothing removed so far ({'; '.join(rules)})" if rules else None
    by_reason = retention.get("byReason") or {}
    why = ", ".join(f"{n} by {RULES.get(reason, reason)}" for reason, n in sorted(by_reason.items()))
    line = (f"{render.count(removed, 'session')} removed by retention ({why})"
            f"{', the last ' + render.ago(retention['lastRemovedAt']) if retention.get('lastRemovedAt') else ''}")
    now = "; ".join(rules) if rules else "retention is now off (sessions.max_sessions = 0, sessions.max_age_days = 0)"
    return f"{line}; {now}"


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
        ("prompt / max", render.budget_use(info.get("budget"), info["contextTokens"]) if info.get("budget")
         else render.prompt_use(info["contextTokens"], None, info["contextWindow"])),
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


async def session_details(client: Client, session_id: str) -> dict[str, Any]:
    """``session/get`` plus what ``sessions show`` adds: reliability, budget, pins,
    checkpoints, snapshots and goal (one object, the session's fields at the top)."""
    import asyncio

    ref = {"sessionId": session_id}
    info = await client.request("session/get", ref)  # first: a missing session fails here, once
    stats, checkpoints, snapshots, goal = await asyncio.gather(
        client.request("context/stats", ref), client.request("context/checkpoints", ref),
        client.request("snapshot/list", ref), client.request("goal/get", ref))
    return {
        **info,
        "compressionCount": stats.get("compressionCount", info.get("compressionCount", 0)),
        "reliability": stats.get("reliability"),
        "budget": stats.get("budget"),
        "pinned": stats.get("pinned", []),
        "watermarkSeq": stats.get("watermarkSeq", 0),
        "prunedThroughSeq": stats.get("prunedThroughSeq", 0),
        "checkpoints": checkpoints["checkpoints"],
        "checkpointTokens": checkpoints["tokens"],
        "snapshots": snapshots["snapshots"],
        "goal": goal["goal"],
        "goalTokens": goal["tokens"],
    }


def checkpoint_rows(checkpoints: list[dict[str, Any]]) -> list[list[Any]]:
    return [[c["id"], f"{c.get('kind', '-')}/{c.get('level', '-')}", render.seq_range(c.get("seqFrom"), c.get("seqTo")),
             f"{render.num(c.get('tokens'))} / {render.num(c.get('originalTokens'))} "
             f"({render.percent(c.get('tokens', 0), c.get('originalTokens', 0))})",
             render.ago(c.get("createdAt"))]
            for c in checkpoints]


CHECKPOINT_COLUMNS = [render.Column("ID", no_wrap=True), render.Column("KIND/LEVEL"), render.Column("SEQS", "right"),
                      render.Column("TOKENS / ORIGINAL", "right"), render.Column("CREATED")]


def snapshot_rows(snapshots: list[dict[str, Any]]) -> list[list[Any]]:
    return [[s["snapshotId"], render.ago(s.get("createdAt")), s.get("trigger", "-"),
             render.num(s.get("lastSeq")), render.num(s.get("contextTokens")), s.get("label") or "-"]
            for s in snapshots]


SNAPSHOT_COLUMNS = [render.Column("ID", no_wrap=True), render.Column("CREATED"), render.Column("TRIGGER"),
                    render.Column("LAST SEQ", "right"), render.Column("PROMPT", "right"),
                    render.Column("LABEL", flex=True)]


def goal_pairs(goal: dict[str, Any], tokens: int | None = None) -> list[tuple[str, Any]]:
    status = goal.get("status", "active")
    pairs: list[tuple[str, Any]] = [
        ("goal", goal.get("description", "-")),
        ("priority", goal.get("priority", "medium")),
        ("status", render.Styled(status, {"completed": "green", "paused": "yellow"}.get(status, "cyan"))),
        ("since", f"{goal.get('createdAt')} ({render.ago(goal.get('createdAt'))})"),
    ]
    if goal.get("completedAt"):
        pairs.append(("completed", goal["completedAt"]))
    marks = {"completed": "[x]", "in-progress": "[~]", "pending": "[ ]"}
    for i, milestone in enumerate(goal.get("checkpoints") or []):
        state = milestone.get("status", "pending")
        pairs.append(("milestones" if i == 0 else "", f"{marks.get(state, '[ ]')} {milestone.get('description')}"
                      + ("" if state in marks else f" ({state})")))
    for i, decision in enumerate(goal.get("decisions") or []):
        flags = [f for f, on in (("locked", decision.get("locked")), ("architecture", decision.get("architecture")))
                 if on]
        pairs.append(("decisions" if i == 0 else "",
                      decision.get("description", "") + (f" ({', '.join(flags)})" if flags else "")))
    for i, artifact in enumerate(goal.get("artifacts") or []):
        pairs.append(("artifacts" if i == 0 else "", f"{artifact.get('path')} ({artifact.get('action', 'modified')})"))
    for i, step in enumerate(goal.get("nextSteps") or []):
        pairs.append(("next steps" if i == 0 else "", f"- {step}"))
    if tokens is not None:
        pairs.append(("tokens", f"{render.num(tokens)} (in every prompt)"))
    return pairs


@sessions.command("show")
@session_argument
@json_option
@click.pass_context
def show(ctx: click.Context, session_id: str) -> None:
    """A session's fields and totals, reliability, goal, checkpoints and snapshots."""
    settings = settings_of(ctx)

    async def work(client: Client) -> Any:
        return await session_details(client, session_id)

    info = run(settings, work)
    if settings.json:
        render.print_json(info)
        return
    pairs = session_pairs(info)
    pairs += render.reliability_pairs(info.get("reliability"))
    pinned = info.get("pinned") or []
    pairs.append(("pinned", ", ".join(f"seq {s}" for s in pinned) if pinned else "none"))
    render.fields(pairs)
    if info.get("goal"):
        render.line("")
        render.fields(goal_pairs(info["goal"], info.get("goalTokens")), title="Goal")
    checkpoints = info.get("checkpoints") or []
    if checkpoints:
        render.line("")
        render.table(CHECKPOINT_COLUMNS, checkpoint_rows(checkpoints),
                     title=f"Checkpoints in the context ({render.count(len(checkpoints), 'checkpoint')}, "
                           f"{render.num(info.get('checkpointTokens'))} tokens)")
    snapshots = info.get("snapshots") or []
    if snapshots:
        render.line("")
        render.table(SNAPSHOT_COLUMNS, snapshot_rows(snapshots),
                     title=f"Snapshots ({len(snapshots)}, newest first)")


sessions.alias("view", show)  # the name other chat CLIs give it


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

    result = request(settings, "session/delete", {"sessionId": session_id})
    if settings.json:
        render.print_json(result)
        return
    render.line(f"deleted session {result['sessionId']} ({render.count(result['deletedMessages'], 'message')})")


@sessions.command("update")
@session_argument
@click.option("--title", metavar="T", help="New title (an empty string clears it: the first user message's "
              "line is used again).")
@click.option("--tag", "tags", multiple=True, metavar="T", help="Replace the tags with these (repeatable).")
@click.option("--add-tag", "add_tags", multiple=True, metavar="T", help="Add a tag (repeatable).")
@click.option("--remove-tag", "remove_tags", multiple=True, metavar="T", help="Remove a tag (repeatable).")
@click.option("--no-tags", is_flag=True, help="Remove every tag.")
@click.option("--auto-compress/--no-auto-compress", default=None,
              help="Compress automatically when the conversation passes the trigger (default: the configuration).")
@click.option("--context-window", type=click.IntRange(min=1), metavar="N", help="Context window in tokens.")
@click.option("--system-prompt", metavar="TEXT", help="Replace the system prompt (an empty string removes it).")
@json_option
@click.pass_context
def update(ctx: click.Context, session_id: str, title: str | None, tags: tuple[str, ...], add_tags: tuple[str, ...],
           remove_tags: tuple[str, ...], no_tags: bool, auto_compress: bool | None, context_window: int | None,
           system_prompt: str | None) -> None:
    """Change a session's title, tags, automatic compression, context window or system prompt.

    \b
      ctxd-cli sessions update s1 --title "refactor auth" --tag work --tag auth
      ctxd-cli sessions update s1 --no-auto-compress --context-window 32768
    """
    settings = settings_of(ctx)
    if tags and (no_tags or add_tags or remove_tags):
        raise click.UsageError("--tag replaces the tags; it cannot be combined with --add-tag, --remove-tag "
                               "or --no-tags")
    if no_tags and add_tags:
        raise click.UsageError("--no-tags and --add-tag contradict each other")
    if all(v is None for v in (title, auto_compress, context_window, system_prompt)) and \
            not (tags or add_tags or remove_tags or no_tags):
        raise click.UsageError("nothing to change: give --title, --tag, --add-tag, --remove-tag, --no-tags, "
                               "--auto-compress/--no-auto-compress, --context-window or --system-prompt")

    async def work(client: Client) -> Any:
        params: dict[str, Any] = {"sessionId": session_id}
        current: dict[str, Any] | None = None
        if add_tags or remove_tags or auto_compress is not None:
            current = await client.request("session/get", {"sessionId": session_id})
        if title is not None:
            params["title"] = title or None
        if tags or no_tags:
            params["tags"] = list(dict.fromkeys(tags))
        elif add_tags or remove_tags:
            assert current is not None
            kept = [t for t in current.get("tags") or [] if t not in remove_tags]
            params["tags"] = list(dict.fromkeys(kept + list(add_tags)))
        if auto_compress is not None:
            assert current is not None
            # session/update replaces the settings object: keep the other overrides as they are.
            params["settings"] = {**(current.get("settings") or {}), "autoCompress": auto_compress}
        if context_window is not None:
            params["contextWindow"] = context_window
        if system_prompt is not None:
            params["systemPrompt"] = system_prompt
        info = await client.request("session/update", params)
        if context_window is not None or system_prompt is not None:
            stats = await client.request("context/stats", {"sessionId": session_id})
            return info, stats.get("budget")
        return info, None

    info, budget = run(settings, work)
    if settings.json:
        render.print_json(info)
        return
    render.line(render.Styled(f"updated session {info['sessionId']}", "green"))
    changed: list[tuple[str, Any]] = []
    if title is not None:
        changed.append(("title", info.get("title") or "-"))
    if tags or add_tags or remove_tags or no_tags:
        changed.append(("tags", ", ".join(info.get("tags") or []) or "-"))
    if auto_compress is not None:
        changed.append(("auto-compress", "on" if (info.get("settings") or {}).get("autoCompress") else "off"))
    if context_window is not None or system_prompt is not None:
        changed.append(("prompt / max", render.budget_use(budget, info["contextTokens"])))
    if system_prompt is not None:
        changed.append(("system prompt", f"{render.num(info.get('systemPromptTokens', 0))} tokens"))
    render.fields(changed)


def _session_names(sessions_: list[dict[str, Any]], shown: int = 5) -> str:
    names = [s["sessionId"] for s in sessions_[:shown]]
    more = len(sessions_) - shown
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _deleted_output(settings: Settings, result: dict[str, Any], what: str) -> None:
    if settings.json:
        render.print_json(result)
        return
    deleted = result.get("deleted") or []
    if not deleted:
        render.line(f"nothing to delete: {what}")
        return
    render.line(f"deleted {render.count(len(deleted), 'session')}: {', '.join(deleted)}")


@sessions.command("cleanup")
@click.option("--keep", type=click.IntRange(min=0), required=True, metavar="N",
              help="How many of the most recently active sessions to keep.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@json_option
@click.pass_context
def cleanup(ctx: click.Context, keep: int, yes: bool) -> None:
    """Keep the N most recently active sessions and delete the others.

    Asks first on a terminal; without one (a script, a pipe) it refuses unless --yes.
    """
    settings = settings_of(ctx)
    if not yes:
        require_terminal("deleting sessions")

        async def listing(client: Client) -> Any:
            return (await client.request("session/list"))["sessions"]

        everything = run(settings, listing)  # most recently active first, as session/cleanup counts
        doomed = everything[keep:]
        if not doomed:
            if settings.json:
                render.print_json({"deleted": []})
            else:
                render.line(f"nothing to delete: {render.count(len(everything), 'session')}, keeping up to {keep}")
            return
        question = (f"Delete {render.count(len(doomed), 'session')} ({_session_names(doomed)}) and keep the "
                    f"{render.num(keep)} most recently active?")
        if not confirm(question, yes=yes):
            render.note("nothing deleted")
            return

    _deleted_output(settings, request(settings, "session/cleanup", {"keep": keep}),
                    f"there are no more than {keep} sessions")


@sessions.command("clear")
@click.option("--all", "all_", is_flag=True, help="Required: yes, every session.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@json_option
@click.pass_context
def clear(ctx: click.Context, all_: bool, yes: bool) -> None:
    """Delete every session with its whole history (--all is required).

    Asks first on a terminal; without one (a script, a pipe) it refuses unless --yes.
    """
    settings = settings_of(ctx)
    if not all_:
        raise click.UsageError("sessions clear deletes every session; say so with --all")
    if not yes:
        require_terminal("deleting every session")

        async def listing(client: Client) -> Any:
            return (await client.request("session/list"))["sessions"]

        everything = run(settings, listing)
        if not everything:
            if settings.json:
                render.print_json({"deleted": []})
            else:
                render.line("nothing to delete: there are no sessions")
            return
        messages = sum(s.get("messageCount", 0) for s in everything)
        question = (f"Delete all {render.count(len(everything), 'session')} ({_session_names(everything)}) "
                    f"and their {render.count(messages, 'message')}?")
        if not confirm(question, yes=yes):
            render.note("nothing deleted")
            return

    _deleted_output(settings, request(settings, "session/clear", {"all": True}), "there are no sessions")
