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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

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


def _picture(match: re.Match[str]) -> str:
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
    wrap: bool = False
    """In a flex column: continue on the next lines instead of ending in an ellipsis."""

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


def rich_cell(cell: str | Styled | Marked) -> Text:
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
class Rule:
    """A row of its own across the whole table (history's compression and restore
    markers): printed at the full width, wrapped when longer, between the rows around it."""

    text: str
    style: str = ""


@dataclass(frozen=True)
class Column:
    """A table column. Cells stay on one line and are never cut, except in ``flex``
    columns: those share what is left of the width and end in an ellipsis when too long
    (or, with ``wrap``, continue on the next lines)."""

    header: str
    justify: str = "left"  # "left" | "right"
    no_wrap: bool = False  # (every column but a flex one is kept on one line)
    flex: bool = False
    wrap: bool = False


def is_terminal() -> bool:
    """Whether stdout is an interactive terminal (the only case that gets colour and live output)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@lru_cache(maxsize=1)
def console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


@lru_cache(maxsize=1)
def plain_console() -> Console:
    """Tables through a pipe: 80 columns (or ``$COLUMNS``), no colour, no terminal codes."""
    from rich.console import Console

    return Console(color_system=None, force_terminal=False, force_interactive=False, highlight=False,
                   soft_wrap=False, emoji=False, markup=False)


def _console_of_width(terminal: bool, width: int) -> Console:
    """:func:`console` (or :func:`plain_console`), ``width`` columns wide."""
    from rich.console import Console

    if terminal:
        return Console(highlight=False, soft_wrap=False, width=width)
    return Console(color_system=None, force_terminal=False, force_interactive=False, highlight=False,
                   soft_wrap=False, emoji=False, markup=False, width=width)


@lru_cache(maxsize=1)
def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


# --- printing ----------------------------------------------------------------------


# Characters JSON may carry raw but a terminal acts on: DEL and the C1 controls (U+0080-
# U+009F: U+009B is CSI, U+009D OSC, U+009C ST...). JSON escapes C0 controls itself.
JSON_UNSAFE = re.compile("[\x7f-\x9f]")


def json_text(value: Any, *, compact: bool = False) -> str:
    """``value`` as JSON, readable (non-ASCII text as is) but never with a character a
    terminal would act on: DEL and C1 controls are written as ``\\u`` escapes, which
    decode to the same value."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if compact else \
        json.dumps(value, ensure_ascii=False, indent=2)
    return JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(value: Any, *, compact: bool = False) -> None:
    """The one thing ``--json`` prints: the value, as JSON, on stdout."""
    click.echo(json_text(value, compact=compact))


def line(*parts: str | Styled | Marked, sep: str = " ") -> None:
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


def _cell(cell: str | Styled | Marked, terminal: bool) -> Text:
    if terminal:
        return rich_cell(cell)
    from rich.text import Text

    return Text(safe(str(cell)))  # plain: no styles; search markers stay as [brackets]


def table(columns: Sequence[Column], rows: Iterable[Sequence[str | Styled | Marked] | Rule], *,
          title: str | None = None) -> None:
    """Rows under a header, as wide as the output: the terminal's width, or 80 columns
    (``$COLUMNS``) through a pipe. Only flex columns give way (ellipsis or wrapping);
    through a pipe there are no colours, no rules, and no trailing spaces. A :class:`Rule`
    is a line of its own, across the table."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    terminal = is_terminal()
    out = console() if terminal else plain_console()
    items = [r if isinstance(r, Rule) else list(r) for r in rows]
    plain_rows = [r for r in items if not isinstance(r, Rule)]
    cells = {id(r): [_cell(c, terminal) for c in r] for r in plain_rows}
    gap = 3 if terminal else 2  # padding on both sides, plus the (blank) divider on a terminal

    def longest(text: Text) -> int:
        return max((Text(line).cell_len for line in text.plain.split("\n")), default=0)

    natural = [max([Text(col.header).cell_len] + [longest(cells[id(r)][i]) for r in plain_rows])
               for i, col in enumerate(columns)]
    flexible = [i for i, col in enumerate(columns) if col.flex]
    room = out.width - gap * (len(columns) - 1) - sum(w for i, w in enumerate(natural) if i not in flexible)
    widths = list(natural)
    if flexible:
        wanted = sum(natural[i] for i in flexible)
        for i in flexible:
            widths[i] = min(natural[i], max(8, room * natural[i] // max(wanted, 1)))
    # When even the flex columns at their narrowest leave too little room, the table is
    # wider than the output (the terminal wraps it, a pipe gets longer lines) rather than
    # the other columns cut: an id, a count or a time that ends in an ellipsis is useless.
    render_width = max(out.width, sum(widths) + gap * (len(columns) - 1))

    def new_table(header: bool) -> Table:
        t = Table(title=Text(safe(title)) if title and terminal and header else None, title_justify="left",
                  title_style="bold", header_style="bold" if terminal else "", show_header=header,
                  box=box.SIMPLE_HEAD if terminal else None, show_edge=False, pad_edge=False, padding=(0, 1))
        for i, col in enumerate(columns):
            wraps = col.flex and col.wrap
            t.add_column(Text(col.header), justify=col.justify, width=widths[i],  # type: ignore[arg-type]
                         no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
        return t

    def row_cells(row: list[Any]) -> list[Text]:
        out_cells = cells[id(row)]
        for j, col in enumerate(columns):
            cell = out_cells[j]
            if col.flex and isinstance(row[j], Styled) and row[j].wrap:
                cell.no_wrap, cell.overflow = False, "fold"
            elif col.flex and not col.wrap:
                cell.no_wrap, cell.overflow = True, "ellipsis"
                if "\n" in cell.plain:  # each line of a multi-line cell cut on its own
                    lines = cell.split("\n")
                    for line_ in lines:
                        line_.truncate(widths[j], overflow="ellipsis")
                    out_cells[j] = Text("\n").join(lines)
        return out_cells

    # (rich never prints wider than its console: a wider table gets a console of its width)
    wide = out if render_width <= out.width else _console_of_width(terminal, render_width)

    def emit(renderable: Any) -> None:
        target = wide if isinstance(renderable, Table) else out
        if terminal:
            target.print(renderable)
            return
        with target.capture() as captured:
            target.print(renderable)
        for text_line in captured.get().splitlines():
            click.echo(text_line.rstrip())

    if title and not terminal:
        click.echo(safe(title))
    current = new_table(header=True)
    header_shown = False
    for item in items:
        if isinstance(item, Rule):
            if current.row_count or not header_shown:
                emit(current)
                header_shown = True
            current = new_table(header=False)
            emit(Text(safe(item.text), style=item.style if terminal else ""))
            continue
        current.add_row(*row_cells(item))
    if current.row_count or not header_shown:
        emit(current)


def fields(pairs: Sequence[tuple[str, str | Styled | Marked]], *, title: str | None = None) -> None:
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


def prompt_use(prompt_tokens: int | None, max_prompt: int | None, window: int | None = None) -> str | Styled:
    """The one denominator: the prompt against the largest prompt that may be sent
    (``maxPromptTokens``), with the window beside it: ``2,914 / 4,311 (68%), window 8,192``;
    red when the prompt does not fit."""
    text = f"{num(prompt_tokens)} / {num(max_prompt)} ({percent(prompt_tokens or 0, max_prompt or 0)})"
    if window:
        text += f", window {num(window)}"
    return Styled(text, "bold red") if max_prompt and (prompt_tokens or 0) > max_prompt else text


def budget_use(budget: dict[str, Any] | None, prompt_tokens: int | None = None) -> str | Styled:
    """:func:`prompt_use` from a Budget (``prompt_tokens`` when known better, e.g. a push result's)."""
    budget = budget or {}
    prompt = budget.get("promptTokens") if prompt_tokens is None else prompt_tokens
    return prompt_use(prompt, budget.get("maxPromptTokens"), budget.get("contextWindow"))


def parse_time(iso: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def ago(iso: str | None, now: datetime | None = None) -> str:
    """A timestamp as people say it: ``just now``, ``5 min ago``, ``3 days ago``."""
    moment = parse_time(iso or "")
    if moment is None:
        return iso or "-"
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
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


def budget_pairs(budget: dict[str, Any]) -> list[tuple[str, str | Styled]]:
    """The budget figures everyone asks about, in the order they are derived. ``prompt``
    is everything sent (system part, pinned messages, checkpoints and the conversation),
    against ``max prompt``; ``used`` is the conversation alone, which compression
    watches: it compresses once ``used`` passes ``trigger``."""
    free = budget.get("free", 0)
    used = budget.get("used", 0)
    trigger = budget.get("triggerAt", 0)
    free_cell: str | Styled = num(free)
    if free < 0:
        free_cell = Styled(f"{num(free)} (over budget)", "bold red")
    used_cell: str | Styled = f"{num(used)} / trigger {num(trigger)}"
    if trigger and used > trigger:
        used_cell = Styled(f"{num(used)} / trigger {num(trigger)} (past it: compression is due)", "yellow")
    room = f"usable {num(budget.get('usable'))} - reserved output {num(budget.get('reservedOutput'))}"
    ratio, overhead = budget.get("tokenRatio", 1.0), budget.get("tokenOverhead", 0)
    if ratio != 1.0 or overhead:
        # Learned from the usage replies carried: the window is the provider's count.
        room = f"{num(budget.get('usable'))} usable - {num(budget.get('reservedOutput'))} reserved"
        if overhead:
            room += f" - {num(overhead)} added"
        # (A ratio of 1 divides nothing: only the provider's added tokens were learned.)
        room = f"({room}) / {ratio:.2f} provider ratio" if ratio != 1.0 else room
    return [
        ("window", num(budget.get("contextWindow"))),
        ("max prompt", f"{num(budget.get('maxPromptTokens'))} ({room})"),
        ("prompt", prompt_use(budget.get("promptTokens"), budget.get("maxPromptTokens"))),
        ("used", used_cell),
        ("available", (f"{num(budget.get('available'))} (after system {num(budget.get('systemTokens'))}, "
                       f"pinned {num(budget.get('pinnedTokens'))}, checkpoints {num(budget.get('checkpointTokens'))}, "
                       f"margin {num(budget.get('safetyMargin'))})")),
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


def reliability(rel: dict[str, Any] | None) -> str | Styled:
    """``medium (score 0.63)`` in the level's colour."""
    if not rel:
        return "-"
    level = str(rel.get("level", "-"))
    score = rel.get("score")
    text = level + (f" (score {score:.2f})" if isinstance(score, (int, float)) else "")
    return Styled(text, RELIABILITY_STYLES.get(level, ""))


def reliability_pairs(rel: dict[str, Any] | None) -> list[tuple[str, str | Styled]]:
    """The level and score, what the score is made of, and the advice that comes with the
    level (``stats``, ``sessions show``), a line each."""
    pairs: list[tuple[str, str | Styled]] = [("reliability", reliability(rel))]
    pairs += [("", ("= " if index == 0 else "x ") + part) for index, part in enumerate(reliability_parts(rel or {}))]
    for index, advice in enumerate((rel or {}).get("recommendations") or []):
        pairs.append(("advice" if index == 0 else "", advice))
    return pairs


RELIABILITY_HELP = """\
Reliability is how far the session's answers can be trusted as its context
is compressed: score = model x compressions x context, each from 0 to 1.
  model         the model's size: 70B and up (and hosted frontier models)
                0.95, 30B 0.85, 13B 0.70 (also a size ctxd cannot tell),
                7B 0.50, smaller 0.30
  compressions  1.00 less 0.15 for each compression pass so far, never
                below 0.30
  context       1.00 while the prompt is under the compression trigger,
                down to 0.70 as it reaches the largest prompt; x 0.85 once
                anything was truncated or folded
Levels: high from 0.85, medium from 0.60, low from 0.40, critical below
(never critical while nothing was compressed). Each level comes with advice
(sessions show, --json: reliability.recommendations)."""


def reliability_parts(rel: dict[str, Any]) -> list[str]:
    """The factors of a reliability score, in words: ``model 0.70 (size unknown: counted
    as 13B)``, ``compressions 0.85 (1 pass)``, ``context 1.00``."""
    model, penalty, confidence = rel.get("modelFactor"), rel.get("compressionPenalty"), rel.get("contextConfidence")
    if not all(isinstance(v, (int, float)) for v in (model, penalty, confidence)):
        return []
    size = rel.get("modelSizeBillions")
    if isinstance(size, (int, float)):
        size_text = f"{size:g}B"
    elif model >= 0.95:  # type: ignore[operator]
        size_text = "a hosted frontier model"
    else:
        size_text = "size unknown: counted as 13B"
    passes = rel.get("compressionCount") or 0
    return [f"model {model:.2f} ({size_text})", f"compressions {penalty:.2f} ({count(passes, 'pass')})",
            f"context {confidence:.2f}"]


def reliability_why(rel: dict[str, Any]) -> str:
    """:func:`reliability_parts` on one line."""
    return " x ".join(reliability_parts(rel))


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
            elif kind == "image":
                parts.append(f"[image: {block.get('description', '')}]" if block.get("description") else "[image]")
    for call in message.get("toolCalls") or ():
        function = call.get("function") or call.get("custom") or {}
        parts.append(f"[tool call {function.get('name')}({function.get('arguments', function.get('input', ''))})]")
    return " ".join(p for p in parts if p)


def _short_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value is not None else ""


def message_preview(message: dict[str, Any], width: int = 100) -> str:
    return shorten(message_text(message), width) or "-"
