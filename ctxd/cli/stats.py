"""``ctxd-cli stats``: where a session's tokens go, and whether the counts can be trusted."""

from __future__ import annotations

from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import json_option, request, settings_of
from ctxd.cli.prompt import FORMATS
from ctxd.cli.sessions import session_argument


def _prompt_cache(cache: dict[str, Any]) -> str:
    """How many prompts this daemon handed out started with the previous one (cacheable)."""
    prompts = cache.get("prompts", 0)
    share = cache.get("prefixKeptShare")
    if not prompts or share is None:
        return f"{render.num(prompts)} prompts served"
    return (f"{render.num(prompts)} served; {render.num(cache.get('prefixKept', 0))} of "
            f"{render.num(cache.get('compared', 0))} started with the previous one ({share:.0%})")


def _money(usd: float | None) -> str:
    return "" if usd is None else f", ${usd:,.4f}" if usd < 1 else f", ${usd:,.2f}"


def _input_bill(bill: dict[str, Any]) -> str:
    """A bill's three parts and what they weigh, in uncached input tokens (and dollars)."""
    return (f"uncached {render.num(bill.get('uncached', 0))}, written {render.num(bill.get('cacheWrite', 0))}, "
            f"read {render.num(bill.get('cacheRead', 0))}: {render.num(round(bill.get('billed', 0)))} billed"
            f"{_money(bill.get('usd'))}")


CACHES = {"breakpoints": "cache breakpoints", "automatic": "automatic prefix cache", "none": "no prompt cache"}


def bill_pairs(bill: dict[str, Any]) -> list[tuple[str, Any]]:
    """``context/stats``' bill as label/value pairs: the session's input billed through ctxd
    and as the client's own requests would have been, the passes' share, the newest request."""
    requests = bill.get("requests", 0)
    pairs: list[tuple[str, Any]] = [
        ("provider", f"{bill.get('provider')} ({CACHES.get(bill.get('cache', ''), bill.get('cache'))})"),
        ("requests", f"{render.num(requests)} ({render.num(bill.get('measured', 0))} reported by the provider)"
         if requests else "none yet"),
    ]
    if not requests:
        return pairs
    ratio = bill.get("ratio")
    pairs += [
        ("through ctxd", _input_bill(bill.get("ctxd") or {})),
        ("direct", _input_bill(bill.get("direct") or {})),
        ("ratio", render.Styled(f"{ratio:.2f}x direct", "yellow") if ratio is not None and ratio > 1.0
         else "-" if ratio is None else f"{ratio:.2f}x direct (both estimated)"),
        ("passes", f"{render.num(bill.get('passes', 0))}, which billed {render.num(round(bill.get('passCost', 0)))} "
                   f"again of what was cached"),
    ]
    reported = bill.get("reported")
    if reported:
        pairs.append(("reported", f"{_input_bill(reported)} for {render.num(bill.get('measured', 0))} requests "
                                  f"ctxd estimated at {render.num(round(bill.get('reportedEstimate') or 0))}"))
    last = bill.get("lastRequest")
    if last:
        said = last.get("reported")
        how = f"; the provider's usage: {_input_bill(said)}" if said else ""
        pairs.append(("last request", f"{_input_bill(last.get('ctxd') or {})}; direct "
                                      f"{render.num(round((last.get('direct') or {}).get('billed', 0)))}{how}"))
    if bill.get("budgetNote"):
        pairs.append(("budget", bill["budgetNote"]))
    return pairs


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
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Count the prompt as `prompt --format` sends it (OpenAI and Ollama send no thinking). "
                   "Default: the context's own count, which fits any shape.")
@json_option
@click.pass_context
@_with_reliability
def stats(ctx: click.Context, session_id: str, fmt: str | None) -> None:
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

    
    The bill, per request (a prompt and the push after it) and for the session:
      uncached    input tokens billed at the input price
      written     written to the provider's prompt cache (Anthropic: 1.25x)
      read        read from it (about 0.1x)
      billed      the three weighed by the provider's rules ([billing]), in
                  uncached input tokens (and dollars when the price is known)
      direct      the same for the client's own requests (its whole history,
                  its previous request cached), had it gone direct
    """
    settings = settings_of(ctx)

    params = {"sessionId": session_id} if fmt is None else {"sessionId": session_id, "format": fmt}
    result = request(settings, "context/stats", params)
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
    if result.get("bill"):
        render.fields(bill_pairs(result["bill"]), title="Bill (input tokens, as the provider counts them)")
