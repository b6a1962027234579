"""Output for ctxd-cli: rich tables and colours on a terminal, plain aligned text otherwise.

Scripts read ctxd-cli's stdout through a pipe, so anything decorative (box drawing,
colour, live progress) is drawn only when stdout is a terminal; ``--json`` bypasses
all of this and prints the daemon's result as it came.

Everything shown here comes from stored content that anyone who could push a message
wrote, so every string goes through :func:`safe` on its way out: terminal control
sequences (colours, but also OSC 52 clipboard writes, window titles, device control
strings) and control characters never reach the terminal as such.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

# Terminal control sequences, 7-bit and 8-bit forms (ECMA-48): CSI ... final byte; OSC to
# BEL or ST; DCS, SOS, PM, APC strings to ST; any other ESC sequence (ESC c resets the
# terminal, ESC 7/8, ESC ( B...; an unterminated string loses only its introducer, and
# its text stays visible).
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
)
# What is left: C0 controls but newline and tab, DEL, C1 controls (a lone ESC among them).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _picture(match: "re.Match[str]") -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the control pictures: ␛ for ESC, ␇ for BEL, ␍ for CR...
    return "\u2421" if code == 0x7F else "\ufffd"


def safe(text: str) -> str:
    """``text`` with nothing a terminal would act on: control sequences removed, other
    control characters shown as symbols (a lone ESC as ␛); newlines and tabs stay, CRLF
    becomes a newline. For human output only: ``--json`` prints content exactly."""
    if text.isprintable():
        return text
    text = _SEQUENCE.sub("", text.replace("\r\n", "\n"))
    return _CONTROL.sub(_picture, text)


@dataclass(frozen=True)
class Styled:
    """A cell with a rich style; the style is dropped in plain output."""

    text: str
    style: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Marked:
    """Text with ``[match]`` markers (search snippets): on a terminal the marked words
    are highlighted and the brackets dropped; plain output keeps the brackets."""

    text: str
    style: str = "bold black on yellow"

    def __str__(self) -> str:
        return self.text


MARK = re.compile(r"(?<![^\W_])\[([^\[\]\n]+)\]")


def rich_cell(cell: "str | Styled | Marked") -> "Text":
    """A cell as rich Text: styled, highlighted, or plain."""
    from rich.text import Text

    if isinstance(cell, Styled):
        return Text(safe(cell.text), style=cell.style)
    if isinstance(cell, Marked):
        text = Text()
        pos = 0
        raw = safe(cell.text)
        for match in MARK.finditer(raw):
            text.append(raw[pos:match.start()])
            text.append(match.group(1), style=cell.style)
            pos = match.end()
        text.append(raw[pos:])
        return text
    return Text(safe(str(cell)))


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"  # "left" | "right"
    no_wrap: bool = False


def is_terminal() -> bool:
    """Whether stdout is an interactive terminal (the only case that gets colour and live output)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@lru_cache(maxsize=1)
def console() -> "Console":
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


@lru_cache(maxsize=1)
def err_console() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False)


# --- printing ----------------------------------------------------------------------


def print_json(value: Any, *, compact: bool = False) -> None:
    """The one thing ``--json`` prints: the value, as JSON, on stdout."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if compact else \
        json.dumps(value, ensure_ascii=False, indent=2)
    click.echo(text)


def line(*parts: "str | Styled | Marked", sep: str = " ") -> None:
    """One line on stdout; styled parts are coloured on a terminal."""
    if is_terminal():
        from rich.text import Text

        text = Text()
        for i, part in enumerate(parts):
            if i:
                text.append(sep)
            text.append_text(rich_cell(part))
        console().print(text)
    else:
        click.echo(safe(sep.join(str(p) for p in parts)))


def note(message: str, *, style: str = "dim") -> None:
    """An informational line on stderr (never on stdout, so it cannot spoil piped output)."""
    if sys.stderr.isatty():
        from rich.text import Text

        err_console().print(Text(safe(message), style=style))
    else:
        click.echo(safe(message), err=True)


def table(columns: Sequence[Column], rows: Iterable[Sequence["str | Styled | Marked"]], *,
          title: str | None = None) -> None:
    rows = [list(r) for r in rows]
    if is_terminal():
        from rich.table import Table

        t = Table(title=safe(title) if title else None, title_justify="left", title_style="bold",
                  header_style="bold")
        for col in columns:
            t.add_column(col.header, justify=col.justify, no_wrap=col.no_wrap,  # type: ignore[arg-type]
                         overflow="fold" if col.no_wrap else "ellipsis")
        for row in rows:
            t.add_row(*(rich_cell(c) for c in row))
        console().print(t)
        return
    if title:
        click.echo(safe(title))
    cells = [[c.header for c in columns]] + [[safe(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for r in cells:
        out = []
        for i, (value, col) in enumerate(zip(r, columns)):
            last = i == len(columns) - 1
            if col.justify == "right":
                out.append(value.rjust(widths[i]))
            else:
                out.append(value if last else value.ljust(widths[i]))
        click.echo("  ".join(out).rstrip())


def fields(pairs: Sequence[tuple[str, "str | Styled | Marked"]], *, title: str | None = None) -> None:
    """A key/value block (``sessions show``, ``daemon status``, summaries)."""
    if is_terminal():
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for key, value in pairs:
            grid.add_row(Text(safe(key)), rich_cell(value))
        if title:
            console().print(Text(safe(title), style="bold underline"))
        console().print(grid)
        return
    if title:
        click.echo(safe(title))
    width = max((len(k) for k, _ in pairs), default=0)
    indent = "  " if title else ""
    for key, value in pairs:
        click.echo(safe(f"{indent}{key.ljust(width)}  {value}".rstrip()))


# --- numbers and times -------------------------------------------------------------


def num(value: int | float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def count(n: int | None, noun: str) -> str:
    """``1 message``, ``2 messages``, ``1,024 tokens``."""
    return f"{num(n)} {noun}{'' if n == 1 else 's'}"


def percent(part: float, whole: float) -> str:
    if not whole:
        return "-"
    return f"{100 * part / whole:.0f}%"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def window_use(context_tokens: int, window: int) -> "str | Styled":
    """``1,234 / 8,192 (15%)``, red when over the window."""
    text = f"{num(context_tokens)} / {num(window)} ({percent(context_tokens, window)})"
    return Styled(text, "bold red") if window and context_tokens > window else text


def parse_time(iso: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def ago(iso: str | None, now: datetime | None = None) -> str:
    """A timestamp as people say it: ``just now``, ``5 min ago``, ``3 days ago``."""
    moment = parse_time(iso or "")
    if moment is None:
        return iso or "-"
    seconds = ((now or datetime.now(timezone.utc)) - moment).total_seconds()
    if seconds < 0:
        return "just now" if seconds > -60 else moment.strftime("%Y-%m-%d %H:%M")
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    if seconds < 86400 * 30:
        days = int(seconds // 86400)
        return f"{days} day{'s' if days != 1 else ''} ago"
    return moment.strftime("%Y-%m-%d")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} days {hours % 24} h"


def budget_pairs(budget: dict[str, Any]) -> list[tuple[str, "str | Styled"]]:
    """The budget figures everyone asks about, in the order they are derived."""
    free = budget.get("free", 0)
    used = budget.get("used", 0)
    trigger = budget.get("triggerAt", 0)
    free_cell: "str | Styled" = num(free)
    if free < 0:
        free_cell = Styled(f"{num(free)} (over budget)", "bold red")
    used_cell: "str | Styled" = num(used)
    if trigger and used > trigger:
        used_cell = Styled(f"{num(used)} (past the compression trigger)", "yellow")
    return [
        ("window", num(budget.get("contextWindow"))),
        ("max prompt", (f"{num(budget.get('maxPromptTokens'))} (usable {num(budget.get('usable'))}"
                        f" - reserved output {num(budget.get('reservedOutput'))})")),
        ("available", (f"{num(budget.get('available'))} (after system {num(budget.get('systemTokens'))}, "
                       f"pinned {num(budget.get('pinnedTokens'))}, checkpoints {num(budget.get('checkpointTokens'))}, "
                       f"margin {num(budget.get('safetyMargin'))})")),
        ("trigger at", num(trigger)),
        ("used", used_cell),
        ("prompt", num(budget.get("promptTokens"))),
        ("free", free_cell),
    ]


def session_label(info: dict[str, Any]) -> str:
    title = info.get("title")
    model = info.get("model")
    if title and model:
        return f"{title} ({model})"
    return title or model or "-"


# --- ctxd's vocabulary -------------------------------------------------------------

RELIABILITY_STYLES = {"high": "green", "medium": "yellow", "low": "dark_orange", "critical": "bold red"}
STATUS_STYLES = {"context": "green", "kept": "cyan", "compressed": "magenta", "rolled_back": "red"}


def reliability(rel: dict[str, Any] | None) -> "str | Styled":
    """``medium (score 0.63)`` in the level's colour."""
    if not rel:
        return "-"
    level = str(rel.get("level", "-"))
    score = rel.get("score")
    text = level + (f" (score {score:.2f})" if isinstance(score, (int, float)) else "")
    return Styled(text, RELIABILITY_STYLES.get(level, ""))


def status(value: str) -> Styled:
    return Styled(value, STATUS_STYLES.get(value, ""))


def seq_range(seq_from: Any, seq_to: Any) -> str:
    return f"{seq_from}" if seq_from == seq_to else f"{seq_from}-{seq_to}"


def shorten(text: str, width: int) -> str:
    """One line of at most ``width`` characters (whitespace runs collapsed)."""
    flat = " ".join(safe(text).split())  # (first: a sequence cut in two would no longer be one)
    return flat if len(flat) <= width else flat[: max(width - 3, 0)].rstrip() + "..."


def message_text(message: dict[str, Any]) -> str:
    """A wire Message as readable text: its words, then its tool calls and results in brackets."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                parts.append(f"[tool call {block.get('name')}({_short_json(block.get('input'))})]")
            elif kind == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = " ".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
                parts.append(f"[tool result{' (error)' if block.get('isError') else ''}: {inner or ''}]")
            elif kind == "thinking":
                parts.append(f"[thinking: {block.get('thinking', '')}]")
    for call in message.get("toolCalls") or ():
        function = call.get("function") or {}
        parts.append(f"[tool call {function.get('name')}({function.get('arguments', '')})]")
    return " ".join(p for p in parts if p)


def _short_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value is not None else ""


def message_preview(message: dict[str, Any], width: int = 100) -> str:
    return shorten(message_text(message), width) or "-"
