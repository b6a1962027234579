"""``ctxd-cli push``: append one message (from flags or stdin) or a JSON batch to a session."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import EXIT_USAGE, CliError, bad_input, json_option, resolve_session_id, run, settings_of
from ctxd.cli.render import note
from ctxd.cli.sessions import session_argument
from ctxd.client import Client, RpcError
from ctxd.protocol.errors import ErrorCode


def read_stdin_text(what: str) -> str:
    if sys.stdin.isatty():
        render.note(f"reading {what} from stdin; end with Ctrl-D")
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_input(f"stdin: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_messages_json(text: str) -> list[dict[str, Any]]:
    """One ctxd Message object or a list of them; the daemon validates their fields."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input(f"stdin: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise bad_input("stdin: an empty JSON list; expected a message object or a list of them")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            where = f"item {index}" if isinstance(value, list) else "the value"
            raise bad_input(f"stdin: {where} is a JSON {type(item).__name__}, expected a message object "
                            '(e.g. {"role": "user", "content": "hi"})')
    return items


async def push_messages(client: Client, session_id: str, messages: list[dict[str, Any]], *,
                        create: bool = False, model: str | None = None) -> tuple[Any, bool, list[str]]:
    """Push, creating the session first when asked to and it is missing; returns (result,
    created, the sessions retention removed to make room for it)."""
    params = {"sessionId": session_id, "messages": messages}
    try:
        return await client.request("session/push", params), False, []
    except RpcError as exc:
        if not create or exc.code != ErrorCode.SessionNotFound:
            raise
    create_params: dict[str, Any] = {"sessionId": session_id}
    if model:
        create_params["model"] = model
    created = True
    removed: list[str] = []
    try:
        info = await client.request("session/create", create_params)
        removed = list(info.get("retentionRemoved") or [])
    except RpcError as exc:
        if exc.code != ErrorCode.SessionExists:  # someone else created it meanwhile: fine
            raise
        created = False
    return await client.request("session/push", params), created, removed


@click.command("push")
@session_argument(resolve=False)
@click.option("--role", type=click.Choice(["user", "assistant", "system", "tool"]),
              help="Role of the message (default: user).")
@click.option("--content", metavar="TEXT", help="Message text; without it the text is read from stdin "
              "(one trailing newline removed).")
@click.option("--tool-call-id", metavar="ID", help="The tool call a role=tool message answers.")
@click.option("--idempotency-key", metavar="K", help="Pushing the same key again stores nothing twice.")
@click.option("--message-json", is_flag=True, help="Read a full ctxd Message object (or a list of them) "
              "as JSON from stdin instead.")
@click.option("--create", is_flag=True, help="Create the session if it does not exist.")
@click.option("--model", metavar="M", help="Model of a session --create makes.")
@json_option
@click.pass_context
def push(ctx: click.Context, session_id: str, role: str | None, content: str | None, tool_call_id: str | None,
         idempotency_key: str | None, message_json: bool, create: bool, model: str | None) -> None:
    """Append a message to SESSION and print its sequence number and tokens.

    SESSION is an id, a unique prefix of one, or last; with --create, the exact id of
    the session to create when there is none of that id.

    \b
      ctxd-cli push s1 --content "hello"
      echo "hello" | ctxd-cli push s1 --create --model gpt-4o
      echo '[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]' \\
          | ctxd-cli push s1 --message-json
    """
    settings = settings_of(ctx)
    if model and not create:
        raise click.UsageError("--model only applies to a session --create makes")
    if message_json:
        given = [name for name, value in (("--role", role), ("--content", content), ("--tool-call-id", tool_call_id),
                                          ("--idempotency-key", idempotency_key)) if value is not None]
        if given:
            raise click.UsageError(f"--message-json reads whole messages; {', '.join(given)} cannot be combined "
                                   "with it (put those fields in the JSON)")
        messages = parse_messages_json(read_stdin_text("message JSON"))
    else:
        if content is None:
            content = read_stdin_text("the message")
            content = content.removesuffix("\n").removesuffix("\r")
            if not content:
                raise CliError("no message text: give --content TEXT or pipe the text on stdin", EXIT_USAGE)
        message: dict[str, Any] = {"role": role or "user", "content": content}
        if tool_call_id is not None:
            message["toolCallId"] = tool_call_id
        if idempotency_key is not None:
            message["idempotencyKey"] = idempotency_key
        messages = [message]

    async def work(client: Client) -> tuple[Any, bool, list[str]]:
        nonlocal session_id
        if not create:  # (--create names the session exactly: a prefix of another id is a new session)
            session_id = await resolve_session_id(client, session_id)
        return await push_messages(client, session_id, messages, create=create, model=model)

    result, created, removed = run(settings, work)
    if removed:
        # Said even with --json (on stderr): sessions just went away.
        note(f"retention removed {render.count(len(removed), 'session')} to make room for {session_id} "
             f"(sessions.max_sessions; the least recently active): {', '.join(removed)}", style="yellow")
    if settings.json:
        render.print_json(result)
        return
    if created:
        render.line(render.Styled(f"created session {session_id}" + (f" ({model})" if model else ""), "green"))
    for sent, landed in zip(messages, result["messages"]):
        parts: list[Any] = [f"seq {landed['seq']}", str(sent.get("role", "?")).ljust(9),
                            f"{render.num(landed['tokens'])} tokens"]
        if landed.get("duplicate"):
            parts.append(render.Styled("(duplicate: already stored, nothing added)", "yellow"))
        render.line(*parts, sep="  ")
    render.line(f"session {result['sessionId']}: {render.count(result['messageCount'], 'message')}, "
                f"{render.num(result['tokenCount'])} history tokens; prompt",
                render.budget_use(result["budget"], result["contextTokens"]))
