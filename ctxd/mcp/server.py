"""``ctxd mcp``: ctxd's history, checkpoints, goal and snapshots as MCP tools and resources.

An agent whose prompt ctxd compressed calls these tools to get back what its prompt
no longer holds. The server speaks MCP over stdio (the official ``mcp`` SDK); stdout
carries nothing but MCP frames, logs go to stderr. See docs/mcp.md.
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from pydantic import Field, ValidationError

from ctxd import __version__
from ctxd.mcp import render
from ctxd.mcp.link import SESSION_ENV, DaemonLink, NotFound, Resolved
from ctxd.mcp.render import Item
from ctxd.protocol.common import MAX_GOAL_CHARS, MAX_GOAL_ITEM_CHARS, MAX_LABEL_CHARS

DEFAULT_MAX_TOKENS = 4000
"""A tool result's cap when neither the call nor ``--max-tokens`` says (cl100k tokens)."""
MIN_MAX_TOKENS = 200
HARD_MAX_TOKENS = 20000
MAX_TOKENS_ENV = "CTXD_MCP_MAX_TOKENS"
SEARCH_WINDOW = 200
"""Search hits a page can reach (offset + limit): the daemon's own limit (service/history.py MAX_HITS)."""

INSTRUCTIONS = f"""\
ctxd keeps this conversation's complete history and compresses what is sent to you:
older turns become checkpoints (summaries). These tools give back what your prompt no
longer holds: search_history finds earlier messages (in this session or all sessions),
read_message reads one whole by its sequence number, expand_checkpoint shows the
messages a checkpoint stands for. Also: session_stats (tokens and budget), set_goal,
lock_decision, pin_message (always sent verbatim), snapshots (create, list, restore).
Every tool takes an optional session_id; without it the session is ${SESSION_ENV} when
set, else the most recently active session. Results are paged and capped in tokens
(max_tokens); a result ends with how to get the next page."""

SessionId = Annotated[str | None, Field(
    description=f"Session id. Default: ${SESSION_ENV} when set, else the most recently active session.")]
MaxTokens = Annotated[int | None, Field(
    ge=MIN_MAX_TOKENS, le=HARD_MAX_TOKENS,
    description="Cap on this result's size in tokens (default set by the server, usually 4000).")]
Offset = Annotated[int, Field(ge=0, description="Items to skip: the offset a previous page's footer gave.")]
Seq = Annotated[int, Field(ge=1, description="A message's sequence number in its session (1 = first message).")]
PromptFormat = Annotated[Literal["openai", "anthropic", "ollama"] | None, Field(
    description="Count the prompt as that provider's shape sends it: 'openai' and 'ollama' send no thinking, "
                "'anthropic' sends the signed thinking blocks. Default: the context's own count, signed thinking "
                "included (so the prompt fits any shape).")]

log = logging.getLogger("ctxd.mcp")


class _Server(MCPServer):
    """The SDK's server, with arguments that fail validation reported in a line the agent
    reads at once (``seq should be greater than or equal to 1 (given 0)``) instead of
    pydantic's report (``1 validation error for read_messageArguments ... For further
    information visit https://errors.pydantic.dev/...``)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if type(exc) is ToolError and isinstance(exc.__cause__, ValidationError):
                raise ToolError(f"Error executing tool {name}: {argument_errors(exc.__cause__)}") from exc.__cause__
            raise


def argument_errors(error: ValidationError) -> str:
    """Each failed argument: its name, what it should be, and what was given."""
    parts = []
    for e in error.errors(include_url=False):
        name = ".".join(str(p) for p in e.get("loc", ())) or "arguments"
        if e.get("type") == "missing":
            parts.append(f"{name} is required")
            continue
        message = str(e.get("msg", "is invalid"))
        message = message[len("Input "):] if message.startswith("Input ") else message
        parts.append(f"{name} {message[:1].lower()}{message[1:]} (given {_shown(e.get('input'))})")
    return "bad arguments: " + "; ".join(parts)


def _shown(value: Any) -> str:
    """A given value as the error repeats it: a long text by its start and its length
    (a 20 MB goal must not come back whole in the error)."""
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:40]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def build_server(link: DaemonLink, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> MCPServer:
    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await link.close()

    server: MCPServer = _Server("ctxd", version=__version__, instructions=INSTRUCTIONS,
                                  website_url=None, lifespan=lifespan,
                                  log_level="DEBUG" if log.isEnabledFor(logging.DEBUG) else "WARNING")

    def cap(value: int | None) -> int:
        return max_tokens if value is None else value

    async def session(session_id: str | None) -> Resolved:
        return await link.session(session_id)

    # --- sessions ---------------------------------------------------------------------

    @server.tool()
    async def list_sessions(limit: Annotated[int, Field(ge=1, le=100)] = 20, offset: Offset = 0,
                            tag: str | None = None, max_tokens: MaxTokens = None) -> str:
        """List the sessions ctxd holds, most recently active first (id, title, model, size)."""
        params: dict[str, Any] = {"limit": offset + limit + 1}
        if tag:
            params["tag"] = tag
        result = await link.request("session/list", params)
        sessions = result.get("sessions") or []
        items = [Item(_session_line(s)) for s in sessions[offset:offset + limit]]
        default = link.default_session
        header = "Sessions, most recently active first." + (
            f" Tools default to {default} (${SESSION_ENV})." if default else
            " Tools default to the first (most recently active).")
        return render.page(header, items, offset=offset, total=None, max_tokens=cap(max_tokens),
                           more=len(sessions) > offset + limit, noun="sessions",
                           next_hint=lambda nxt: f"list_sessions(offset={nxt}, limit={limit})")

    @server.tool()
    async def session_stats(session_id: SessionId = None, format: PromptFormat = None,
                            max_tokens: MaxTokens = None) -> str:
        """The session's size and budget: messages and tokens in history, tokens in the
        prompt now, the window, reserved output, what is available, when compression
        triggers, checkpoints, pins, reliability, and the goal with its locked decisions.
        With format: the prompt's tokens and the budget's free room as that provider's
        prompt counts them (OpenAI and Ollama send no thinking, Anthropic the signed blocks)."""
        s = await session(session_id)
        info = await link.session_request(s, "session/get", {})
        stats = await link.session_request(s, "context/stats", {} if format is None else {"format": format})
        goal = await link.session_request(s, "goal/get", {})
        return render.fit(_stats_text(s, info, stats, goal, format), cap(max_tokens))

    # --- history ----------------------------------------------------------------------

    @server.tool()
    async def search_history(query: Annotated[str, Field(min_length=1, description="Words to find (all must appear).")],
                             session_id: SessionId = None,
                             all_sessions: Annotated[bool, Field(description="Search every session.")] = False,
                             role: Literal["user", "assistant", "tool", "system"] | None = None,
                             syntax: Annotated[Literal["words", "fts"], Field(
                                 description="'fts': SQLite FTS5 syntax (phrases, OR, NEAR, prefix*).")] = "words",
                             limit: Annotated[int, Field(ge=1, le=50)] = 10, offset: Offset = 0,
                             max_tokens: MaxTokens = None) -> str:
        """Search the full history (everything ever said, also what was compressed away)
        of this session, or of all sessions; ranked hits with snippets. Read a hit whole
        with read_message(seq=...)."""
        if not query.strip():
            raise ToolError("query is empty: give the words to search for")
        if all_sessions and session_id:
            raise ToolError("give session_id or all_sessions=true, not both")
        if offset + limit > SEARCH_WINDOW:
            raise ToolError(f"offset + limit may reach {SEARCH_WINDOW} hits at most; narrow the query instead")
        params: dict[str, Any] = {"query": query, "limit": min(offset + limit + 1, SEARCH_WINDOW), "syntax": syntax}
        if role:
            params["role"] = role
        if all_sessions:
            where = "all sessions"
            result = await link.request("session/search", params)
        else:
            s = await session(session_id)
            await link.session_request(s, "session/get", {})  # a missing session is an error, not "no hits"
            where = s.label()
            result = await link.session_request(s, "session/search", params)
        hits = result.get("hits") or []
        items = []
        for hit in hits[offset:offset + limit]:
            head = render.message_head(hit["seq"], {"role": hit.get("role")}, status=hit.get("status"),
                                       created_at=hit.get("createdAt"),
                                       session_id=hit.get("sessionId") if all_sessions else None)
            items.append(Item(f"{head}\n{hit.get('snippet', '')}"))
        header = f"Search {query!r} in {where}, best first. Whole message: read_message(seq=..., session_id=" + (
            "...)." if all_sessions else f"{s.session_id!r}).")
        args = f"query={query!r}" + (", all_sessions=true" if all_sessions else f", session_id={s.session_id!r}")
        return render.page(header, items, offset=offset, total=None, max_tokens=cap(max_tokens),
                           more=len(hits) > offset + limit, noun="hits",
                           next_hint=lambda nxt: f"search_history({args}, offset={nxt}, limit={limit})")

    @server.tool()
    async def read_message(seq: Seq, session_id: SessionId = None,
                           count: Annotated[int, Field(ge=1, le=50, description="Messages to read from seq on.")] = 1,
                           char_offset: Annotated[int, Field(
                               ge=0, description="Start the first message's text here (to read on after a cut).")] = 0,
                           max_tokens: MaxTokens = None) -> str:
        """Read a message whole (or `count` messages from it) by sequence number, as it was
        pushed, whether or not it is still in the prompt."""
        s = await session(session_id)
        result = await link.session_request(s, "session/history", {"from": seq, "limit": count},
                                            what=f"message #{seq} in {s.label()}")
        sid = s.session_id  # (after the request: a short form given is the whole id now)
        entries = result.get("messages") or []
        if not entries or entries[0]["seq"] != seq:
            total = result.get("messageCount", 0)
            raise NotFound(f"no message #{seq} in {s.label()}: it has {total} message"
                           f"{'' if total == 1 else 's'}" + (f" (#1-#{total})" if total else "") + ".")
        items = []
        for index, entry in enumerate(entries):
            head = render.message_head(entry["seq"], entry["message"], tokens=entry.get("tokens"),
                                       status=entry.get("status"), created_at=entry.get("createdAt"))
            body = render.message_body(entry["message"])
            base = 0
            if index == 0 and char_offset:
                if char_offset >= len(body):
                    raise ToolError(f"char_offset {char_offset} is past the end of message #{seq} "
                                    f"({len(body)} characters)")
                body = body[char_offset:]
                base = char_offset
                head += f" · from character {char_offset:,}"
            start = len(head) + 1

            def hint(chars: int, seq_: int = entry["seq"], base_: int = base, start_: int = start) -> str:
                return f"read_message(seq={seq_}, char_offset={base_ + max(0, chars - start_)}, session_id={sid!r})"

            items.append(Item(f"{head}\n{body}", continue_hint=hint, start=start, base=base))
        next_seq = result.get("nextSeq")

        def next_hint(nxt: int) -> str:
            target = entries[nxt]["seq"] if nxt < len(entries) else next_seq
            return f"read_message(seq={target}, count={count}, session_id={sid!r})"

        header = f"{s.label()}; status: context = in the prompt, kept = sent verbatim, " \
                 "compressed = stands in a checkpoint, rolled_back = undone by a restore."
        return render.page(header, items, offset=0, total=None, max_tokens=cap(max_tokens), noun="messages",
                           more=False, next_hint=next_hint,
                           span=lambda a, b: f"[messages #{entries[a - 1]['seq']}-#{entries[b - 1]['seq']}]")

    # --- checkpoints ------------------------------------------------------------------

    @server.tool()
    async def list_checkpoints(session_id: SessionId = None, offset: Offset = 0,
                               max_tokens: MaxTokens = None) -> str:
        """The checkpoints (summaries of older turns) in the session's prompt, oldest first,
        with the message ranges they stand for. expand_checkpoint shows those messages."""
        s = await session(session_id)
        result = await link.session_request(s, "context/checkpoints", {})
        checkpoints = result.get("checkpoints") or []
        items = [Item(_checkpoint_text(c)) for c in checkpoints[offset:]]
        header = f"Checkpoints of {s.label()}, oldest first ({len(checkpoints)}, " \
                 f"{result.get('tokens', 0):,} tokens in the prompt)."
        return render.page(header, items, offset=offset, total=len(checkpoints), max_tokens=cap(max_tokens),
                           noun="checkpoints",
                           next_hint=lambda nxt: f"list_checkpoints(offset={nxt}, session_id={s.session_id!r})")

    @server.tool()
    async def expand_checkpoint(checkpoint_id: Annotated[str, Field(min_length=1)], session_id: SessionId = None,
                                offset: Offset = 0, max_tokens: MaxTokens = None) -> str:
        """The original messages a checkpoint stands for, from history (paged)."""
        s = await session(session_id)
        result = await link.session_request(s, "checkpoint/expand", {"checkpointId": checkpoint_id},
                                            what=f"checkpoint {checkpoint_id!r} in {s.label()} "
                                                 "(list_checkpoints lists them)")
        sid = s.session_id
        checkpoint = result.get("checkpoint") or {}
        messages = result.get("messages") or []
        if offset and offset >= len(messages):
            raise ToolError(f"offset {offset} is past the checkpoint's {len(messages)} messages")
        items = []
        for m in messages[offset:]:
            head = render.message_head(m["seq"], m["message"], tokens=m.get("tokens"), created_at=m.get("createdAt"))
            start = len(head) + 1

            def hint(chars: int, seq_: int = m["seq"], start_: int = start) -> str:
                return f"read_message(seq={seq_}, char_offset={max(0, chars - start_)}, session_id={sid!r})"

            items.append(Item(f"{head}\n{render.message_body(m['message'])}", continue_hint=hint, start=start))
        ranges = ", ".join(f"#{a}-#{b}" if a != b else f"#{a}" for a, b in checkpoint.get("messageRanges", []))
        header = (f"Checkpoint {checkpoint.get('id', checkpoint_id)} of {s.label()}: a {checkpoint.get('kind', '')} "
                  f"(level {checkpoint.get('level', '?')}) of messages {ranges or 'none'}, "
                  f"{checkpoint.get('originalTokens', 0):,} tokens summarized in {checkpoint.get('tokens', 0):,}. "
                  "The original messages:")
        return render.page(header, items, offset=offset, total=len(messages), max_tokens=cap(max_tokens),
                           noun="messages",
                           next_hint=lambda nxt: f"expand_checkpoint(checkpoint_id={checkpoint_id!r}, offset={nxt}, "
                                                 f"session_id={sid!r})")

    # --- goal, decisions, pins --------------------------------------------------------

    @server.tool()
    async def set_goal(description: Annotated[str, Field(min_length=1, max_length=MAX_GOAL_CHARS,
                                                         description="What the session is for.")],
                       priority: Literal["high", "medium", "low"] = "medium",
                       session_id: SessionId = None) -> str:
        """Set the session's goal (replacing the previous one; its locked decisions stay).
        The goal is always sent in the prompt, never compressed."""
        if not description.strip():
            raise ToolError("description is empty: say what the goal is")
        s = await session(session_id)
        result = await link.session_request(s, "goal/set", {"description": description, "priority": priority})
        return f"Goal set for {s.label()}.\n" + _goal_text(result)

    @server.tool()
    async def lock_decision(decision: Annotated[str, Field(min_length=1, max_length=MAX_GOAL_ITEM_CHARS,
                                                           description="The decision, in one sentence.")],
                            unlock: bool = False, architecture: bool = False,
                            session_id: SessionId = None) -> str:
        """Lock a decision into the session's goal: locked decisions are always sent and
        survive a new goal. `unlock=true` unlocks one (matched by its text). Needs a goal
        (set_goal)."""
        if not decision.strip():
            raise ToolError("decision is empty: state the decision")
        s = await session(session_id)
        entry = {"description": decision.strip(), "locked": not unlock, "architecture": architecture}
        result = await link.session_request(s, "goal/update", {"decisions": [entry]})
        return f"Decision {'unlocked' if unlock else 'locked'} in {s.label()}.\n" + _goal_text(result)

    @server.tool()
    async def pin_message(seq: Seq, pinned: bool = True, session_id: SessionId = None) -> str:
        """Pin a message so it is always sent verbatim, never compressed (`pinned=false` unpins)."""
        s = await session(session_id)
        result = await link.session_request(s, "message/pin", {"seq": seq, "pinned": pinned},
                                            what=f"message #{seq} in {s.label()}")
        seqs = result.get("seqs")
        return (f"Message #{seq} of {s.label()} is {'pinned' if result.get('pinned') else 'not pinned'}. "
                f"Pinned messages cost {result.get('pinnedTokens', 0):,} tokens"
                + (f" (pinned: {', '.join(f'#{n}' for n in seqs)})." if seqs else "."))

    # --- snapshots ----------------------------------------------------------------------

    @server.tool()
    async def create_snapshot(label: Annotated[str | None, Field(max_length=MAX_LABEL_CHARS)] = None,
                              session_id: SessionId = None) -> str:
        """Snapshot the session's prompt (context, checkpoints, goal) now, to restore later."""
        s = await session(session_id)
        params: dict[str, Any] = {"label": label} if label else {}
        info = await link.session_request(s, "snapshot/create", params)
        return f"Snapshot taken of {s.label()}:\n{_snapshot_line(info)}\nRestore it with " \
               f"restore_snapshot(snapshot_id={info['snapshotId']!r}, session_id={s.session_id!r})."

    @server.tool()
    async def list_snapshots(session_id: SessionId = None, offset: Offset = 0, max_tokens: MaxTokens = None) -> str:
        """The session's snapshots, newest first."""
        s = await session(session_id)
        result = await link.session_request(s, "snapshot/list", {})
        snapshots = result.get("snapshots") or []
        items = [Item(_snapshot_line(x)) for x in snapshots[offset:]]
        return render.page(f"Snapshots of {s.label()}, newest first.", items, offset=offset, total=len(snapshots),
                           max_tokens=cap(max_tokens), noun="snapshots",
                           next_hint=lambda nxt: f"list_snapshots(offset={nxt}, session_id={s.session_id!r})")

    @server.tool()
    async def restore_snapshot(snapshot_id: Annotated[str, Field(min_length=1)], session_id: SessionId = None) -> str:
        """Make a snapshot's context the session's prompt again (the current one is
        snapshotted first; history keeps every message, later ones marked rolled back)."""
        s = await session(session_id)
        result = await link.session_request(s, "snapshot/restore", {"snapshotId": snapshot_id},
                                            what=f"snapshot {snapshot_id!r} in {s.label()} (list_snapshots lists them)")
        rolled = ""
        if result.get("rolledBackFrom") is not None:
            rolled = f" Messages #{result['rolledBackFrom']}-#{result.get('rolledBackTo')} are rolled back."
        return (f"Restored snapshot {snapshot_id} in {s.label()}; the context before it is snapshot "
                f"{result.get('backupSnapshotId')}.{rolled} Prompt now {result.get('contextTokens', 0):,} tokens.")

    # --- resources ----------------------------------------------------------------------

    @server.resource("ctxd://sessions", name="sessions", mime_type="application/json",
                     description="The sessions ctxd holds, most recently active first (up to 100).")
    async def sessions_resource() -> str:
        result = await _resource(link.request("session/list", {"limit": 100}))
        return _json({"defaultSession": link.default_session,
                      "sessions": [_session_summary(s) for s in result.get("sessions") or []]})

    @server.resource("ctxd://sessions/{session_id}/goal", name="goal", mime_type="application/json",
                     description="A session's goal: description, status, milestones, decisions (locked ones are "
                                 "always sent).")
    async def goal_resource(session_id: str) -> str:
        result = await _resource(link.session_request(Resolved(session_id, "given"), "goal/get", {}))
        return _json(result)

    @server.resource("ctxd://sessions/{session_id}/checkpoints", name="checkpoints", mime_type="application/json",
                     description="A session's checkpoints (summaries of older turns), oldest first.")
    async def checkpoints_resource(session_id: str) -> str:
        result = await _resource(link.session_request(Resolved(session_id, "given"), "context/checkpoints", {}))
        return _json(result)

    return server


async def _resource(awaitable: Any) -> Any:
    try:
        return await awaitable
    except NotFound as exc:
        raise ResourceNotFoundError(str(exc)) from None
    except ToolError as exc:
        raise ResourceError(str(exc)) from None


# --- text -----------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


def _session_summary(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("sessionId", "title", "model", "provider", "tags", "createdAt", "lastActivity", "messageCount",
            "tokenCount", "contextTokens", "contextWindow", "checkpointCount", "compressionCount", "lastSeq")
    return {k: s[k] for k in keys if k in s}


def _session_line(s: dict[str, Any]) -> str:
    title = f" {s['title']!r}" if s.get("title") else ""
    model = f" · {s['model']}" if s.get("model") else ""
    count = s.get("messageCount", 0)
    return (f"- {s['sessionId']}{title}{model} · {count:,} message{'' if count == 1 else 's'}, "
            f"{s.get('tokenCount', 0):,} tokens in history, {s.get('contextTokens', 0):,}/"
            f"{s.get('contextWindow', 0):,} in the prompt · last active {s.get('lastActivity', '?')}")


def _checkpoint_text(c: dict[str, Any]) -> str:
    ranges = ", ".join(f"#{a}-#{b}" if a != b else f"#{a}" for a, b in c.get("messageRanges", []))
    lines = [f"--- checkpoint {c['id']} · {c.get('kind', '')} · level {c.get('level', '?')} · messages "
             f"{ranges or 'none'} · {c.get('tokens', 0):,} tokens for {c.get('originalTokens', 0):,}",
             c.get("summary", "")]
    if c.get("filesModified"):
        lines.append("files: " + ", ".join(c["filesModified"]))
    if c.get("keyDecisions"):
        lines.append("decisions: " + "; ".join(c["keyDecisions"]))
    return "\n".join(lines)


def _goal_text(result: dict[str, Any]) -> str:
    goal = result.get("goal")
    if not goal:
        return "Goal: none (set_goal sets one)."
    lines = [f"Goal [{goal.get('status', 'active')}, {goal.get('priority', 'medium')} priority]: "
             f"{goal.get('description', '')}"]
    for d in goal.get("decisions") or []:
        marks = [m for m, on in (("locked", d.get("locked")), ("architecture", d.get("architecture"))) if on]
        lines.append(f"- decision{' (' + ', '.join(marks) + ')' if marks else ''}: {d.get('description', '')}")
    for c in goal.get("checkpoints") or []:
        lines.append(f"- milestone: {c.get('description', c)}")
    if goal.get("nextSteps"):
        lines.append("- next: " + "; ".join(goal["nextSteps"]))
    lines.append(f"({result.get('tokens', 0):,} tokens in the prompt)")
    return "\n".join(lines)


def _snapshot_line(x: dict[str, Any]) -> str:
    label = f" {x['label']!r}" if x.get("label") else ""
    return (f"- {x['snapshotId']}{label} · {x.get('trigger', '')} · {x.get('createdAt', '')} · up to message "
            f"#{x.get('lastSeq', 0)} · context {x.get('contextTokens', 0):,} tokens, "
            f"{x.get('checkpointCount', 0)} checkpoints")


def _stats_text(s: Resolved, info: dict[str, Any], stats: dict[str, Any], goal: dict[str, Any],
                fmt: str | None = None) -> str:
    b = stats.get("budget") or {}
    rel = stats.get("reliability") or {}
    title = f" {info['title']!r}" if info.get("title") else ""
    lines = [
        f"{s.label()}{title} · model {info.get('model') or '?'} · encoding {stats.get('encoding', '?')}"
        + (" (estimated)" if stats.get("tokensEstimated") else ""),
        f"history: {stats.get('messageCount', 0):,} messages, {stats.get('tokenCount', 0):,} tokens "
        f"(last #{info.get('lastSeq', 0)}); every message stays searchable",
        f"prompt now{f' ({fmt} format)' if fmt else ''}: {stats.get('contextTokens', 0):,} tokens "
        f"(conversation {b.get('used', 0):,})",
        f"budget: window {b.get('contextWindow', 0):,}, usable {b.get('usable', 0):,}, reserved output "
        f"{b.get('reservedOutput', 0):,}, max prompt {b.get('maxPromptTokens', 0):,}; "
        f"system {b.get('systemTokens', 0):,}, "
        f"pinned {b.get('pinnedTokens', 0):,}, checkpoints {b.get('checkpointTokens', 0):,}; available "
        f"{b.get('available', 0):,}, compression triggers at {b.get('triggerAt', 0):,}, free {b.get('free', 0):,}",
        f"compression: {stats.get('compressionCount', 0)} passes, {stats.get('checkpointCount', 0)} checkpoints "
        f"({stats.get('checkpointTokens', 0):,} tokens), watermark #{stats.get('watermarkSeq', 0)}, pruned through "
        f"#{stats.get('prunedThroughSeq', 0)}",
        "pinned: " + (", ".join(f"#{n}" for n in stats.get("pinned") or []) or "none"),
    ]
    if rel:
        level = rel.get("level") or rel.get("status")
        lines.append(f"reliability: {level if level is not None else _json(rel)}")
    lines.append(_goal_text(goal))
    return "\n".join(lines) + "\n"


# --- the command ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxd mcp", description=(
        "An MCP server over stdio: ctxd's history, checkpoints, goal and snapshots as tools for an agent. "
        "It connects to the ctxd daemon on the socket (starting one when none answers, like ctxd-cli)."))
    p.add_argument("--socket", metavar="PATH", help="the daemon's socket (default: as configured, like ctxd-cli)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory of a daemon this command starts")
    p.add_argument("--config", metavar="FILE", help="configuration file (default ~/.config/ctxd/config.toml)")
    p.add_argument("--session", metavar="ID",
                   help=f"the session tools mean when the agent names none (default: ${SESSION_ENV}, "
                        "else the most recently active session)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help=f"default cap of a tool result in tokens ({MIN_MAX_TOKENS}-{HARD_MAX_TOKENS}; "
                        f"default ${MAX_TOKENS_ENV} or {DEFAULT_MAX_TOKENS})")
    p.add_argument("--no-autostart", action="store_true", help="never start a daemon; fail when none runs")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr: -v info, -vv debug")
    return p


def _runtime_dir_fallback() -> None:
    """MCP clients often start servers with a few whitelisted variables (PATH, HOME...),
    without ``XDG_RUNTIME_DIR``: the default socket would then differ from the one
    ``ctxd-cli`` uses in the user's shell, and a second daemon would start. Use the
    systemd convention's directory when it exists and is ours."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    candidate = f"/run/user/{os.getuid()}"
    try:
        if os.path.isdir(candidate) and os.stat(candidate).st_uid == os.getuid():
            os.environ["XDG_RUNTIME_DIR"] = candidate
    except OSError:
        pass



def _fail(message: str) -> None:
    """A start-up failure, on stderr (stdout carries the MCP protocol; the exit code is 2)."""
    sys.stderr.write(f"ctxd mcp: {message}\n")
    sys.stderr.flush()

def main(argv: list[str] | None = None) -> int:
    from ctxd.config import ConfigError, load_config

    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose >= 2 else logging.INFO if args.verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(level)

    max_tokens = args.max_tokens
    if max_tokens is None and os.environ.get(MAX_TOKENS_ENV):
        try:
            max_tokens = int(os.environ[MAX_TOKENS_ENV])
        except ValueError:
            _fail(f"{MAX_TOKENS_ENV}={os.environ[MAX_TOKENS_ENV]!r} is not a number")
            return 2
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not MIN_MAX_TOKENS <= max_tokens <= HARD_MAX_TOKENS:
        _fail(f"--max-tokens must be {MIN_MAX_TOKENS}-{HARD_MAX_TOKENS}")
        return 2

    _runtime_dir_fallback()
    overrides: dict[str, Any] = {}
    if args.socket:
        overrides.setdefault("daemon", {})["socket"] = args.socket
    if args.data_dir:
        overrides.setdefault("daemon", {})["data_dir"] = args.data_dir
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        _fail(f"configuration error: {exc}")
        return 2
    link = DaemonLink(Path(config.socket_path), data_dir=args.data_dir, config_file=args.config,
                      autostart=not args.no_autostart, default_session=args.session)
    server = build_server(link, max_tokens=max_tokens)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        return 130
    return 0
