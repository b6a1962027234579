"""``ctxd-cli prompt``: the prompt to send next, as the provider's request body."""

from __future__ import annotations

from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import json_option, request, settings_of
from ctxd.cli.sessions import session_argument

FORMATS = ("openai", "anthropic", "ollama")


def provider_body(result: dict[str, Any]) -> dict[str, Any]:
    """The part of a ``context/prompt`` result that goes into the provider's request as is:
    ``messages`` (OpenAI, Ollama), plus ``system`` for Anthropic when there is one."""
    body: dict[str, Any] = {}
    if result.get("format") == "anthropic" and result.get("system") is not None:
        body["system"] = result["system"]
    body["messages"] = result["messages"]
    return body


@click.command("prompt")
@session_argument
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="openai", show_default=True,
              help="Provider wire shape.")
@click.option("--summary", is_flag=True, help="Print a short table (messages, tokens, budget) instead of the JSON.")
@click.option("--preview", is_flag=True,
              help="Only to look: not billed as a request, nor paired with the next reply's usage.")
@json_option
@click.pass_context
def prompt(ctx: click.Context, session_id: str, fmt: str, summary: bool, preview: bool) -> None:
    """Print the prompt to send next for SESSION.

    By default prints the provider request body ({"messages": [...]}, with "system"
    for anthropic), ready to merge with a model name:

    \b
      ctxd-cli prompt s1 | jq '. + {model: "gpt-4o"}' | curl ... -d @-

    --json prints the daemon's whole result (tokens, budget, lastSeq as well).
    --preview asks for a look (the same prompt): the session's bill counts only the
    prompts that are sent.
    """
    settings = settings_of(ctx)
    params: dict[str, Any] = {"sessionId": session_id, "format": fmt}
    if preview:
        params["preview"] = True
    result = request(settings, "context/prompt", params)
    if settings.json:
        render.print_json(result)
        return
    if not summary:
        render.print_json(provider_body(result))
        return
    roles: dict[str, int] = {}
    for message in result["messages"]:
        roles[message.get("role", "?")] = roles.get(message.get("role", "?"), 0) + 1
    budget = result["budget"]
    pairs: list[tuple[str, Any]] = [
        ("session", result["sessionId"]),
        ("format", result["format"]),
        ("messages", (f"{render.num(len(result['messages']))} in the prompt "
                      f"({', '.join(f'{n} {r}' for r, n in roles.items()) or 'none'}); "
                      f"{render.num(result['messageCount'])} in history, last seq {result['lastSeq']}")),
        ("tokens", render.num(result["tokens"]) + (" (estimated)" if result.get("tokensEstimated") else "")),
    ]
    if result.get("format") == "anthropic":
        pairs.append(("system", "yes" if result.get("system") else "none"))
    render.fields(pairs + render.budget_pairs(budget))
