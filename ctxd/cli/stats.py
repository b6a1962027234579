"""``ctxd-cli stats``: where a session's tokens go, and whether the counts can be trusted."""

from __future__ import annotations

from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import json_option, request, settings_of
from ctxd.cli.sessions import session_argument


def _prompt_cache(cache: dict[str, Any]) -> str:
    """How many prompts this daemon handed out started with the previous one (cacheable)."""
    prompts = cache.get("prompts", 0)
    share = cache.get("prefixKeptShare")
    if not prompts or share is None:
        return f"{render.num(prompts)} prompts served"
    return (f"{render.num(prompts)} served; {render.num(cache.get('prefixKept', 0))} of "
            f"{render.num(cache.get('compared', 0))} started with the previous one ({share:.0%})")


def drift_cell(value: float | None) -> Any:
    """A drift ratio, highlighted when the encoding is clearly not the model's."""
    if value is None:
        return "-"
    text = render.ratio(value)
    return render.Styled(text, "yellow") if abs(value - 1.0) > 0.15 else text


def _with_reliability(fn: Any) -> Any:
    fn.__doc__ = fn.__doc__.replace("{reliability}", render.RELIABILITY_HELP.replace("\n", "\n    "))
    return fn


@click.command("stats")
@session_argument
@json_option
@click.pass_context
@_with_reliability
def stats(ctx: click.Context, session_id: str) -> None:
    """Counts and tokens by role and kind, counted-vs-reported drift, and the budget.

    \b
    The budget, in ctxd's own token count:
      window      the model's context window
      max prompt  the largest prompt that may be sent: the usable share of the
                  window less the tokens reserved for the reply
      prompt      everything sent next (system part with the goal, pinned
                  messages, checkpoints, the conversation), against max prompt
      used        the conversation alone (messages since the compression
                  boundary); compression starts once it passes trigger
      available   max prompt less the system part, pins, checkpoints and margin:
                  the room for the conversation (trigger is a share of it)
      free        max prompt less prompt

    \b
    {reliability}
    """
    settings = settings_of(ctx)

    result = request(settings, "context/stats", {"sessionId": session_id})
    if settings.json:
        render.print_json(result)
        return
    total = result["tokenCount"]
    render.fields([
        ("session", result["sessionId"]),
        ("messages", render.num(result["messageCount"])),
        ("history tokens", render.num(total)),
        ("prompt / max", render.budget_use(result["budget"], result["contextTokens"])),
        ("encoding", result["encoding"] + (" (estimated: not the model's own tokenizer)"
                                           if result.get("tokensEstimated") else "")),
    ])
    by_role = sorted(result["byRole"].items(), key=lambda kv: -kv[1].get("tokens", 0))
    render.table([render.Column("ROLE"), render.Column("MESSAGES", "right"), render.Column("TOKENS", "right"),
                  render.Column("SHARE", "right")],
                 ([role, render.num(v.get("messages", 0)), render.num(v.get("tokens", 0)),
                   render.percent(v.get("tokens", 0), total)] for role, v in by_role),
                 title="By role")
    kind_total = sum(v.get("tokens", 0) for v in result["byKind"].values())
    render.table([render.Column("KIND"), render.Column("BLOCKS", "right"), render.Column("TOKENS", "right"),
                  render.Column("SHARE", "right")],
                 ([kind, render.num(v.get("blocks", 0)), render.num(v.get("tokens", 0)),
                   render.percent(v.get("tokens", 0), kind_total)] for kind, v in result["byKind"].items()),
                 title="By kind")
    drift = result["usageDrift"]
    render.fields([
        ("messages with usage", render.num(drift.get("messagesWithUsage", 0))),
        ("output", (f"reported {render.num(drift.get('reportedOutputTokens', 0))}, "
                    f"counted {render.num(drift.get('countedOutputTokens', 0))}")),
        ("output ratio", drift_cell(drift.get("outputRatio"))),
        ("input", (f"reported {render.num(drift.get('reportedInputTokens', 0))}, "
                   f"counted {render.num(drift.get('countedInputTokens', 0))}")),
        ("input ratio", drift_cell(drift.get("inputRatio"))),
    ], title="Drift (reported / counted)")
    if "compressionCount" in result:
        reliability = result.get("reliability") or {}
        render.fields([
            ("compressions", render.num(result.get("compressionCount"))),
            ("checkpoints", (f"{render.num(result.get('checkpointCount'))} "
                             f"({render.num(result.get('checkpointTokens'))} tokens)")),
            ("pruned through", f"seq {result.get('prunedThroughSeq', 0)}"),
            ("watermark", f"seq {result.get('watermarkSeq', 0)}"),
            ("pinned", ", ".join(str(s) for s in result.get("pinned") or []) or "none"),
            *render.reliability_pairs(reliability),
            ("prompt cache", _prompt_cache(result.get("promptCache") or {})),
        ], title="Compression")
    render.fields(render.budget_pairs(result["budget"]), title="Budget")
