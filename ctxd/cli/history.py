"""``ctxd-cli search`` and ``ctxd-cli history``: everything ever said, whatever compression did."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_REFUSED, CliError, json_option, run, session_option, settings_of
from ctxd.cli.sessions import complete_session_id, session_argument, sessions
from ctxd.client import Client, RpcError
from ctxd.protocol.errors import ErrorCode

ROLES = ("user", "assistant", "system", "tool")
PAGE = 50
MAX_PAGE = 1000


def show_hits(hits: list[dict[str, Any]]) -> None:
    """One block per hit: a line with the session id in full (to paste into other
    commands), seq, role, when and the session's title, then the matching text indented,
    wrapped to the width (80 columns through a pipe)."""
    import textwrap

    terminal = render.is_terminal()
    width = (render.console() if terminal else render.plain_console()).width
    for hit in hits:
        head = f"{hit['sessionId']}  seq {hit['seq']}  {hit['role']}  {render.ago(hit.get('createdAt'))}"
        title = hit.get("title")
        if title:
            room = width - len(render.safe(head)) - 2
            if room >= 12:
                head += f"  ({render.shorten(title, room - 2)})"
        snippet = " ".join(hit["snippet"].split())
        if terminal:
            from rich.padding import Padding

            render.console().print(render.rich_cell(render.Styled(head, "bold")))
            render.console().print(Padding(render.rich_cell(render.Marked(snippet)), (0, 0, 0, 2)))
        else:
            click.echo(render.safe(head))
            click.echo(textwrap.fill(render.safe(snippet), width=max(width, 20), initial_indent="  ",
                                     subsequent_indent="  ", break_on_hyphens=False))


@click.command("search")
@click.argument("query", metavar="QUERY")
@session_option("--session", "session_id", metavar="ID", shell_complete=complete_session_id,
                help="Search only this session (an id, a unique prefix of one, or last).")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True, metavar="N",
              help="At most N hits, best first.")
@click.option("--role", type=click.Choice(ROLES), help="Only messages of this role.")
@click.option("--fts", is_flag=True, help="Pass QUERY to SQLite FTS5 as is: \"phrases\", OR, NOT, NEAR(), prefix*. "
              "Without it every word must appear.")
@json_option
@click.pass_context
def search(ctx: click.Context, query: str, session_id: str | None, limit: int, role: str | None, fts: bool) -> None:
    """Full-text search over every session's whole history (or one session's).

    \b
      ctxd-cli search "database migration"
      ctxd-cli search 'auth* NOT oauth' --fts --session s1 --role user
    """
    settings = settings_of(ctx)
    params: dict[str, Any] = {"query": query, "limit": limit, "syntax": "fts" if fts else "words"}
    if session_id is not None:
        params["sessionId"] = session_id
    if role is not None:
        params["role"] = role
    started = time.monotonic()

    async def work(client: Client) -> Any:
        try:
            return await client.request("session/search", params)
        except RpcError as exc:
            if fts and exc.code in (ErrorCode.InvalidParams, ErrorCode.StorageError):
                raise CliError(f"{exc.message} ({exc.code}); with --fts the query is FTS5 syntax: close quotes and "
                               "parentheses, or drop --fts to search for the words", EXIT_REFUSED) from None
            raise

    result = run(settings, work)
    elapsed_ms = (time.monotonic() - started) * 1000
    if settings.json:
        render.print_json(result)
        return
    hits = result["hits"]
    show_hits(hits)
    where = f" in session {session_id}" if session_id else ""
    more = " (the limit; --limit N for more)" if len(hits) == limit else ""
    render.note(f"{render.count(len(hits), 'hit')}{where}{more}: searched in {result.get('tookMs', 0):.1f} ms "
                f"({elapsed_ms:.0f} ms with the round trip)")


sessions.alias("search", search)  # the name other chat CLIs give it


def _marker(record: dict[str, Any]) -> render.Rule:
    layers = "+".join(record.get("layers") or [])
    checkpoints = record.get("checkpointIds") or []
    text = (f"-- compression #{record.get('number')} ({record.get('trigger')}): "
            f"{render.num(record.get('beforeTokens'))} -> {render.num(record.get('afterTokens'))} tokens, {layers}"
            + (f", checkpoint {', '.join(checkpoints)}" if checkpoints else "")
            + (f", {record['summarizer']}" if record.get("summarizer") else "") + " --")  # (then when)
    return render.Rule(f"{text} {render.ago(record.get('at'))}", "bold yellow")


def _event_marker(event: dict[str, Any]) -> render.Rule:
    detail = event.get("detail") or {}
    kind = str(event.get("kind"))
    if kind == "restore":
        text = f"-- restored snapshot {detail.get('snapshotId')}"
        rolled = detail.get("rolledBack")
        if isinstance(rolled, list) and len(rolled) == 2:
            text += f", seq {render.seq_range(rolled[0], rolled[1])} rolled back"
        if detail.get("backupSnapshotId"):
            text += f" (backup {detail['backupSnapshotId']})"
    else:
        flat: list[str] = []
        for key, value in detail.items():  # {"settings": {"autoCompress": false}} -> autoCompress=false
            items = value.items() if isinstance(value, dict) else [(key, value)]
            flat += [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in items]
        text = f"-- {kind}" + (" changed" if kind == "settings" else "") + \
            (": " + render.shorten(", ".join(flat), 100) if flat else "")
    return render.Rule(f"{text} -- {render.ago(event.get('at'))}", "bold cyan")


def history_rows(messages: list[dict[str, Any]], compressions: list[dict[str, Any]],
                 events: list[dict[str, Any]], width: int) -> list[Any]:
    """Messages in order, with a marker line after the message each compression and each
    event (restores, settings changes) happened at."""
    pending = sorted(compressions, key=lambda c: (int(c.get("lastSeq", 0)), c.get("number", 0)))
    first_seq = messages[0]["seq"] if messages else 0
    by_seq: dict[int, list[dict[str, Any]]] = {}
    rows: list[Any] = []
    for event in events:
        seq = int(event.get("lastSeq", 0))
        if seq < first_seq:
            rows.append(_event_marker(event))
        else:
            by_seq.setdefault(seq, []).append(event)
    for m in messages:
        while pending and int(pending[0].get("lastSeq", 0)) < m["seq"]:
            rows.append(_marker(pending.pop(0)))
        flags = [f for f in ("pruned", "filtered") if m.get(f)]
        state = str(m.get("status", "?"))
        rows.append([str(m["seq"]), render.ago(m.get("createdAt")), str(m["message"].get("role", "?")),
                     render.num(m.get("tokens")),
                     render.Styled(state + (f" ({', '.join(flags)})" if flags else ""),
                                   render.STATUS_STYLES.get(state, "")),
                     render.message_preview(m["message"], width)])
        for event in by_seq.pop(m["seq"], []):
            rows.append(_event_marker(event))
    rows += [_marker(record) for record in pending]
    for seq in sorted(by_seq):
        rows += [_event_marker(event) for event in by_seq[seq]]
    return rows


@click.command("history")
@session_argument
@click.option("--from", "from_seq", type=click.IntRange(min=1), default=1, show_default=True, metavar="SEQ",
              help="Start at this sequence number.")
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=PAGE, show_default=True, metavar="N",
              help="Messages per page.")
@click.option("--all", "all_pages", is_flag=True, help="Every page to the end, not just one.")
@json_option
@click.pass_context
def history(ctx: click.Context, session_id: str, from_seq: int, limit: int, all_pages: bool) -> None:
    """SESSION's whole history: every message as pushed, with where it stands now.

    Status: context (sent to the model), kept (behind the compression boundary but
    sent verbatim: user messages, pins), compressed (stands in a checkpoint; see
    `ctxd-cli expand`), rolled_back (after a restored snapshot). Compression points
    and restores are shown where they happened.
    """
    settings = settings_of(ctx)

    async def work(client: Client) -> dict[str, Any]:
        params = {"sessionId": session_id, "from": from_seq, "limit": limit}
        page = await client.request("session/history", params)
        merged = dict(page)
        if from_seq > 1:  # compressions and events come with the first page only
            first = await client.request("session/history", {"sessionId": session_id, "from": 1, "limit": 1})
            merged["compressions"] = first.get("compressions", [])
            merged["events"] = first.get("events", [])
        messages = list(page["messages"])
        while all_pages and page.get("nextSeq") is not None:
            page = await client.request("session/history", {**params, "from": page["nextSeq"],
                                                             "limit": MAX_PAGE})
            messages += page["messages"]
        merged["messages"] = messages
        merged["nextSeq"] = page.get("nextSeq")
        return merged

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    messages = result["messages"]
    compressions = result.get("compressions") or []
    events = result.get("events") or []
    if messages and (from_seq > 1 or result.get("nextSeq") is not None):
        # Only the compressions and events of this page: each shows after the message it
        # happened at.
        hi = messages[-1]["seq"]
        last_page = result.get("nextSeq") is None

        def here(seq: int) -> bool:
            return (from_seq == 1 or seq >= from_seq) and (last_page or seq <= hi)

        compressions = [c for c in compressions if here(int(c.get("lastSeq", 0)))]
        events = [e for e in events if here(int(e.get("lastSeq", 0)))]
    rows = history_rows(messages, compressions, events, 400)
    if not rows:
        render.note(f"session {session_id} has no messages" + (f" from seq {from_seq}" if from_seq > 1 else ""))
        return
    render.table([render.Column("SEQ", "right"), render.Column("WHEN"), render.Column("ROLE"),
                  render.Column("TOKENS", "right"), render.Column("STATUS"), render.Column("MESSAGE", flex=True)],
                 rows)
    counts: dict[str, int] = {}
    for m in messages:
        counts[m.get("status", "?")] = counts.get(m.get("status", "?"), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    tail = (f"; next page: ctxd-cli history {session_id} --from {result['nextSeq']}"
            if result.get("nextSeq") is not None else "")
    render.note(f"{render.count(len(messages), 'message')} of {render.num(result.get('messageCount'))} "
                f"({summary}){tail}")
