"""``ctxd-cli replay``: import a transcript file into ctxd sessions, in batches.

Each message is pushed with an idempotency key made of the file's SHA-256 and the
message's position, so replaying the same file into the same ``--session`` again (to
finish an interrupted replay, or by mistake) stores nothing twice.

The daemon compresses in the background once a session passes its trigger, so the
replay follows that session's compression notifications and reports the figures
after compression has settled, not the ones of the last push.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import click
import msgspec

from ctxd.cli import render
from ctxd.cli.main import EXIT_REFUSED, CliError, bad_input, json_option, run, settings_of
from ctxd.client import Client, RpcError
from ctxd.importers import FORMATS, Transcript, TranscriptError, load_transcripts_from_bytes
from ctxd.protocol.errors import ErrorCode

EXAMPLE_FILE = "django__django-11099.traj.json"
EXAMPLE_CONTEXT_WINDOW = 8192
EXAMPLE_CREDIT = ("example: a real mini-swe-agent run (DeepSeek) on SWE-bench django__django-11099, "
                  "from github.com/SWE-agent/mini-swe-agent (MIT; see ctxd/examples/ATTRIBUTION.md)")
WARNINGS_SHOWN = 3
# How long a compression may take to start after the last push, and to finish.
COMPRESSION_GRACE_SECONDS = 2.0
COMPRESSION_TIMEOUT_SECONDS = 120.0
COMPRESSION_END = ("context/compressed", "context/compressionFailed", "context/compressionSkipped",
                   "context/overflow")
COMPRESSION_EVENTS = ("context/compressing", *COMPRESSION_END)
SETTLE_ROUNDS = 3


def _over(budget: dict[str, Any]) -> bool:
    """Past the trigger, or a prompt that does not fit: a pass is due."""
    return (budget.get("used", 0) > budget.get("triggerAt", 0)
            or budget.get("promptTokens", 0) > budget.get("maxPromptTokens", 0))


@dataclass
class Target:
    """One conversation of the file and the session it goes to."""

    index: int
    transcript: Transcript
    session_id: str | None
    title: str | None
    model: str | None
    provider: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)


class CompressionWatch:
    """The compression notifications of the sessions being replayed, as they arrive."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        self._changed = asyncio.Event()

    def __call__(self, method: str, params: Any) -> None:
        if method in COMPRESSION_EVENTS and isinstance(params, dict):
            self.events[str(params.get("sessionId"))].append((method, params))
            self._changed.set()

    def mark(self, session_id: str) -> int:
        return len(self.events[session_id])

    def running(self, session_id: str) -> bool:
        methods = [m for m, _ in self.events[session_id]]
        return bool(methods) and methods[-1] == "context/compressing"

    async def settle(self, session_id: str, *, since: int, expected: bool,
                     on_stage: Callable[[str], None]) -> bool:
        """Wait until no pass runs and, when one was ``expected`` (past the trigger), until
        one has ended after ``since`` or a grace period passed. False: gave up waiting."""
        now = time.monotonic()
        grace_until = now + (COMPRESSION_GRACE_SECONDS if expected else 0.0)
        give_up = now + COMPRESSION_TIMEOUT_SECONDS
        while True:
            events = self.events[session_id]
            if self.running(session_id):
                params = events[-1][1]
                on_stage(f"compressing: {params.get('stage')} {params.get('percentage', 0)}%")
                deadline = give_up
            elif any(m in COMPRESSION_END for m, _ in events[since:]) or time.monotonic() >= grace_until:
                return True
            else:
                deadline = grace_until
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                if self.running(session_id):
                    return False

    def summary(self, session_id: str) -> dict[str, Any]:
        """What compression did to this session during the replay."""
        passes = [p for m, p in self.events[session_id] if m == "context/compressed"]
        out: dict[str, Any] = {"passes": len(passes)}
        if passes:
            out.update(beforeTokens=passes[0].get("beforeTokens"), afterTokens=passes[-1].get("afterTokens"),
                       freedTokens=sum(p.get("freedTokens", 0) for p in passes),
                       checkpointIds=[c for p in passes for c in p.get("checkpointIds", [])],
                       layers=sorted({la for p in passes for la in p.get("layers", [])}),
                       summarizers=sorted({p["summarizer"] for p in passes if p.get("summarizer")}))
        for method, key in (("context/compressionFailed", "failed"), ("context/compressionSkipped", "skipped"),
                            ("context/overflow", "overflow")):
            found = [p for m, p in self.events[session_id] if m == method]
            if found:
                out[key] = found[-1]
        out["running"] = self.running(session_id)
        return out


@dataclass
class Outcome:
    target: Target
    session_id: str
    created: bool
    pushed: int = 0
    duplicates: int = 0
    result: dict[str, Any] = field(default_factory=dict)
    compression: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        t = self.target.transcript
        return {
            "sessionId": self.session_id,
            "created": self.created,
            "title": self.target.title,
            "sourceFormat": t.source_format,
            "model": self.target.model,
            "messages": len(self.target.messages),
            "pushed": self.pushed,
            "duplicates": self.duplicates,
            "messageCount": self.result.get("messageCount"),
            "tokenCount": self.result.get("tokenCount"),
            "contextTokens": self.result.get("contextTokens"),
            "tokensEstimated": self.result.get("tokensEstimated"),
            "budget": self.result.get("budget"),
            "compressionCount": self.result.get("compressionCount"),
            "checkpointCount": self.result.get("checkpointCount"),
            "compression": self.compression,
            "warnings": list(t.warnings),
        }


def read_source(file: str) -> tuple[bytes, str]:
    """The file's bytes and the name used in messages (``-`` is stdin)."""
    if file == "-":
        return sys.stdin.buffer.read(), "<stdin>"
    path = Path(file)
    try:
        return path.read_bytes(), str(path)
    except IsADirectoryError:
        raise bad_input(f"{path}: is a directory, expected a transcript file") from None
    except FileNotFoundError:
        raise bad_input(f"{path}: no such file") from None
    except OSError as exc:
        raise bad_input(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_example() -> tuple[bytes, str]:
    resource = resources.files("ctxd").joinpath("examples", EXAMPLE_FILE)
    try:
        return resource.read_bytes(), str(resource)
    except OSError:
        raise bad_input(f"the bundled example {EXAMPLE_FILE} is missing from this installation "
                        "(reinstall ctxd)") from None


def message_key(digest: str, conversation: int, index: int) -> str:
    """Stable per message of a given file: same bytes, same position, same key."""
    return f"replay:{digest[:32]}:{conversation}:{index}"


def plan(transcripts: list[Transcript], digest: str, *, session_id: str | None, title: str | None,
         model: str | None) -> list[Target]:
    """Which conversation goes to which session; several conversations get ``SESSION-1``, ``SESSION-2``..."""
    many = len(transcripts) > 1
    targets = []
    for i, t in enumerate(transcripts):
        sid = f"{session_id}-{i + 1}" if session_id and many else session_id
        name = (f"{title} {i + 1}/{len(transcripts)}" if many else title) if title else t.title
        target = Target(index=i, transcript=t, session_id=sid, title=name, model=model or t.model,
                        provider=None if model else t.provider)
        for j, message in enumerate(t.messages):
            wire = msgspec.to_builtins(message)
            wire.setdefault("idempotencyKey", message_key(digest, i, j))
            target.messages.append(wire)
        targets.append(target)
    return targets


async def open_session(client: Client, target: Target, *, context_window: int | None, tags: list[str],
                       metadata: dict[str, Any]) -> tuple[str, bool]:
    """The session to replay into: the given one if it exists, else a new one."""
    if target.session_id is not None:
        try:
            await client.request("session/get", {"sessionId": target.session_id})
            return target.session_id, False
        except RpcError as exc:
            if exc.code != ErrorCode.SessionNotFound:
                raise
    params: dict[str, Any] = {"tags": tags, "metadata": metadata}
    for key, value in (("sessionId", target.session_id), ("model", target.model), ("provider", target.provider),
                       ("contextWindow", context_window), ("title", target.title),
                       ("systemPrompt", target.transcript.system_prompt)):
        if value is not None:
            params[key] = value
    try:
        info = await client.request("session/create", params)
    except RpcError as exc:
        if exc.code == ErrorCode.SessionExists and target.session_id is not None:
            return target.session_id, False  # created by someone else just now
        raise
    return info["sessionId"], True


def progress_bar(total: int, enabled: bool) -> tuple[ContextManager[Any], Callable[[str, int], None]]:
    """A rich progress bar on a terminal; a no-op otherwise."""
    if not enabled:
        return nullcontext(), lambda description, advance: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("messages"), TimeElapsedColumn(), console=render.console())
    task = bar.add_task("replaying", total=total)

    def advance(description: str, n: int) -> None:
        bar.update(task, description=description, advance=n)

    return bar, advance


def compression_text(summary: dict[str, Any], budget: dict[str, Any]) -> Any:
    """One line on what the daemon's compression did while the replay ran."""
    parts: list[str] = []
    passes = summary.get("passes", 0)
    if passes:
        checkpoints = len(summary.get("checkpointIds", []))
        how = "+".join(summary.get("layers", []))
        if checkpoints:
            how += f", {checkpoints} checkpoint" + ("s" if checkpoints != 1 else "")
        if passes == 1:
            parts.append(f"1 pass: prompt {render.num(summary.get('beforeTokens'))} -> "
                         f"{render.num(summary.get('afterTokens'))} tokens ({how})")
        else:
            parts.append(f"{passes} passes freed {render.num(summary.get('freedTokens'))} tokens ({how})")
    if summary.get("running"):
        parts.append("still running in the background")
    for key in ("failed", "skipped"):
        if key in summary:
            parts.append(f"{key}: {summary[key].get('reason')}")
    if "overflow" in summary:
        parts.append(f"overflow ({summary['overflow'].get('policy')}): {summary['overflow'].get('action')}")
    if parts:
        text = "; ".join(parts)
        return render.Styled(text, "yellow") if set(summary) & {"failed", "skipped", "overflow"} else text
    if budget and budget.get("used", 0) <= budget.get("triggerAt", 0):
        used, trigger = render.num(budget.get("used")), render.num(budget.get("triggerAt"))
        return f"not needed (conversation {used} of trigger {trigger})"
    return "none"


def summarize(outcome: Outcome, source: str) -> None:
    t = outcome.target.transcript
    result = outcome.result
    budget = result.get("budget") or {}
    stored = f"{render.count(outcome.pushed, 'message')} pushed"
    if outcome.duplicates:
        stored += f", {render.num(outcome.duplicates)} already stored (nothing added twice)"
    pairs: list[tuple[str, Any]] = [
        ("session", outcome.session_id + (" (new)" if outcome.created else " (existing)")),
        ("source", f"{source} ({t.source_format}, {render.count(len(t.messages), 'message')})"),
        ("model", outcome.target.model or "-"),
        ("pushed", stored),
        ("compression", compression_text(outcome.compression, budget)),
        ("history", f"{render.count(result.get('messageCount'), 'message')}, "
                    f"{render.count(result.get('tokenCount'), 'token')}"
                    + (" (estimated)" if result.get("tokensEstimated") else "")),
    ]
    pairs += render.budget_pairs(budget)
    if t.warnings:
        pairs.append(("warnings", render.Styled(f"{len(t.warnings)} from the importer", "yellow")))
        for warning in t.warnings[:WARNINGS_SHOWN]:
            pairs.append(("", f"- {warning}"))
        if len(t.warnings) > WARNINGS_SHOWN:
            pairs.append(("", f"... and {len(t.warnings) - WARNINGS_SHOWN} more (--json lists them all)"))
    else:
        pairs.append(("warnings", "none"))
    render.fields(pairs, title=f"Replayed {outcome.target.title or 'conversation ' + str(outcome.target.index + 1)}")


@click.command("replay")
@click.argument("file", required=False, metavar="FILE")
@click.option("--example", is_flag=True, help="Replay the bundled example (a real mini-swe-agent run, "
              f"86 messages) with a {EXAMPLE_CONTEXT_WINDOW}-token window.")
@click.option("--format", "fmt", type=click.Choice(["auto", *FORMATS]), default="auto", show_default=True,
              help="Transcript format (auto: decided from the content).")
@click.option("--session", "session_id", metavar="ID", help="Replay into this session (created if missing); "
              "a file with several conversations uses ID-1, ID-2...")
@click.option("--model", metavar="M", help="Model of the new session (default: the transcript's).")
@click.option("--context-window", type=click.IntRange(min=1), metavar="N",
              help="Context window of the new session (default: the model's).")
@click.option("--batch", type=click.IntRange(min=1), default=200, show_default=True, metavar="N",
              help="Messages per push.")
@click.option("--title", metavar="T", help="Title of the new session (default: the transcript's).")
@json_option
@click.pass_context
def replay(ctx: click.Context, file: str | None, example: bool, fmt: str, session_id: str | None,
           model: str | None, context_window: int | None, batch: int, title: str | None) -> None:
    """Import a transcript FILE (or - for stdin) into a new session, or into --session.

    Formats: see --format; a file with several conversations (LoCoMo) becomes one
    session per conversation. Replaying the same file into the same --session again
    stores nothing twice, so an interrupted replay can simply be re-run.
    """
    settings = settings_of(ctx)
    if example == (file is not None):
        raise click.UsageError("give a transcript FILE or --example (not both)")
    tags = ["replay"]
    if example:
        data, source = read_example()
        context_window = context_window or EXAMPLE_CONTEXT_WINDOW
        tags.append("example")
        if not settings.json:
            render.note(EXAMPLE_CREDIT)
    else:
        assert file is not None
        data, source = read_source(file)
    try:
        transcripts = load_transcripts_from_bytes(data, format=fmt, name=source)
    except TranscriptError as exc:
        raise bad_input(str(exc)) from None
    digest = hashlib.sha256(data).hexdigest()
    targets = plan(transcripts, digest, session_id=session_id, title=title, model=model)
    total = sum(len(t.messages) for t in targets)
    show_progress = render.is_terminal() and not settings.json

    async def work(client: Client) -> list[Outcome]:
        outcomes: list[Outcome] = []
        watch = CompressionWatch()
        client.on_notification(watch)
        bar, advance = progress_bar(total, show_progress)
        with bar:
            for target in targets:
                metadata = {**target.transcript.metadata,
                            "replay": {"file": source, "sha256": digest, "format": target.transcript.source_format,
                                       "conversation": target.index}}
                sid, created = await open_session(client, target, context_window=context_window,
                                                  tags=tags + [target.transcript.source_format], metadata=metadata)
                outcome = Outcome(target=target, session_id=sid, created=created)
                label = target.title or sid
                await client.request("session/subscribe", {"sessionId": sid})
                mark = watch.mark(sid)
                for start in range(0, len(target.messages), batch):
                    chunk = target.messages[start:start + batch]
                    mark = watch.mark(sid)  # compression this push triggers is reported after here
                    try:
                        result = await client.request("session/push", {"sessionId": sid, "messages": chunk})
                    except RpcError as exc:
                        raise CliError(
                            f"{exc.message} ({exc.code}); {start} of {len(target.messages)} messages of "
                            f"{label} are in session {sid}: re-run with --session {sid} to finish",
                            EXIT_REFUSED) from None
                    duplicates = sum(1 for m in result["messages"] if m.get("duplicate"))
                    outcome.duplicates += duplicates
                    outcome.pushed += len(chunk) - duplicates
                    advance(label, len(chunk))
                    outcome.result = result
                budget = outcome.result.get("budget") or {}

                def show_stage(stage: str, label: str = label) -> None:
                    advance(f"{label} ({stage})", 0)

                await watch.settle(sid, since=mark, expected=_over(budget), on_stage=show_stage)
                stats = await client.request("context/stats", {"sessionId": sid})
                for _ in range(SETTLE_ROUNDS):
                    # A pass that was running when the last push arrived ends first; the
                    # daemon then starts another for what came meanwhile: report after it.
                    if not _over(stats.get("budget") or {}):
                        break
                    await watch.settle(sid, since=watch.mark(sid), expected=True, on_stage=show_stage)
                    stats = await client.request("context/stats", {"sessionId": sid})
                advance(label, 0)
                await client.request("session/unsubscribe", {"sessionId": sid})
                outcome.result = stats
                outcome.compression = watch.summary(sid)
                outcomes.append(outcome)
        return outcomes

    outcomes = run(settings, work)
    if settings.json:
        render.print_json({"file": source, "sha256": digest, "sessions": [o.to_json() for o in outcomes]})
        return
    for i, outcome in enumerate(outcomes):
        if i:
            render.line("")
        summarize(outcome, source)
