"""aider's chat history (``.aider.chat.history.md`` in the repository aider ran in).

aider appends every run to the same Markdown file (``aider/io.py``): a run starts with
``# aider chat started at YYYY-MM-DD HH:MM:SS``; what the user typed is written as
``#### `` lines (one per line of input, ``####  `` for an empty one, ``#### <blank>``
for an empty input); aider's own output (warnings, confirmations and their answers,
``Added x.py to the chat``, ``Applied edit to x.py``, ``Tokens: ...``, command output) as
``> `` lines; the model's reply as plain Markdown between them. aider ends the lines it
writes itself (user input and ``>`` output) with two spaces, a Markdown line break.

Mapping, one transcript per run (runs with no message are skipped, with a warning):

* ``####`` lines in a row → one ``user`` message; an input that is an aider command
  (``/add x.py``, ``/commit``, ``/code ...``) keeps its text and has
  ``metadata.command`` (``"/add"``...).
* ``>`` lines in a row (blank lines between them included) → one ``user`` message with
  ``metadata.observation = true`` and ``observationType: "aider"``: tool output, which
  ctxd compresses like any other, never the user's words.
* everything else → the ``assistant`` reply, up to the next user or aider line. Inside
  a fenced code block every line is the reply's; in a file whose aider lines end in two
  spaces, a ``#### `` or ``> `` line without them is the reply's own Markdown (a
  heading, a quote); in a file whose trailing spaces were trimmed, every such line
  outside a code block is aider's.
* The model is read from aider's ``Main model: <name> with <format> edit format`` line
  (``Model:`` in older versions); the run's start time, aider's version and the edit
  format go to the transcript metadata. No per-message times or usage: the file has
  none (``Tokens: 3.2k sent`` is rounded, and stays in the observation's text).
* Title: the run's first user input that is not an aider command (else the first).
"""

from __future__ import annotations

import re
from typing import Any

from ctxd.protocol.message import Message

from ._base import Builder, Document, Transcript, guess_provider, title_from_text

NAME = "aider"
DESCRIPTION = "aider chat history (.aider.chat.history.md: one conversation per \"# aider chat started at\")"

_HEADER = re.compile(r"^# aider chat started at (.*?)\s*$")
_HEADER_BYTES = re.compile(rb"(?m)^# aider chat started at ")
_MODEL = re.compile(r"^(?:Main model|Model): (\S+)(?: with (\S+) edit format)?")
_VERSION = re.compile(r"^Aider v(\S+)")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")


def looks_like_aider(data: bytes) -> bool:
    """Whether (the start of) a file is aider's chat history."""
    return _HEADER_BYTES.search(data) is not None


def detect(doc: Document) -> bool:
    return doc.text is not None and looks_like_aider(doc.text[:65536].encode("utf-8", "replace"))


class _Run:
    """One aider run being read: its messages as (role, lines, where) drafts."""

    def __init__(self, started_at: str | None, line: int) -> None:
        self.started_at = started_at
        self.line = line
        self.drafts: list[tuple[str, list[str], int]] = []
        self.kind: str | None = None  # "user", "assistant", "aider" (its output) or None
        self.lines: list[str] = []
        self.start = 0
        self.user_open = False  # the last line was a #### line: the next one continues the input
        self.fence: str | None = None

    def flush(self) -> None:
        if self.kind is not None:
            while self.lines and not self.lines[-1].strip():
                self.lines.pop()
            while self.lines and not self.lines[0].strip() and self.kind != "user":
                self.lines.pop(0)
            if self.lines or self.kind == "user":
                self.drafts.append((self.kind, self.lines, self.start))
        self.kind, self.lines, self.user_open, self.fence = None, [], False, None

    def begin(self, kind: str, number: int) -> None:
        self.flush()
        self.kind, self.start = kind, number


def _user_text(line: str) -> str:
    text = line[5:] if line.startswith("#### ") else ""
    return text.rstrip()


def _split_runs(text: str) -> list[_Run]:
    lines = text.replace("\r\n", "\n").split("\n")
    # aider ends its own lines with two spaces; a file whose trailing spaces were trimmed
    # (an editor, a pre-commit hook) is read by line starts alone.
    marked = any(line.endswith("  ") and (line.startswith("#### ") or line.startswith(">")) for line in lines)
    runs: list[_Run] = []
    run: _Run | None = None
    for number, line in enumerate(lines, start=1):
        if run is not None and run.kind == "assistant" and run.fence is not None:
            run.lines.append(line)
            fence = _FENCE.match(line)
            if fence and fence.group(1)[0] == run.fence[0] and len(fence.group(1)) >= len(run.fence) \
                    and not line.strip().strip(run.fence[0]):
                run.fence = None
            continue
        header = _HEADER.match(line)
        if header:
            if run is not None:
                run.flush()
            run = _Run(header.group(1) or None, number)
            runs.append(run)
            continue
        if run is None:
            if not line.strip():
                continue
            run = _Run(None, number)  # (a file whose first header was cut off)
            runs.append(run)
        aider_written = not marked or line.endswith("  ")
        if (line.startswith("#### ") or line.rstrip() == "####") and aider_written:
            if not (run.kind == "user" and run.user_open):
                run.begin("user", number)
            content = _user_text(line)
            run.lines.append("" if content == "<blank>" else content)
            run.user_open = True
            continue
        if (line.startswith("> ") or line.rstrip() == ">") and aider_written:
            if run.kind != "aider":
                run.begin("aider", number)
            run.lines.append(line[2:].rstrip())
            run.user_open = False
            continue
        if not line.strip():
            if run.kind == "user":
                run.user_open = False
            elif run.kind is not None:
                run.lines.append("")
            continue
        if run.kind != "assistant":
            run.begin("assistant", number)
        run.lines.append(line)
        fence = _FENCE.match(line)
        if fence:
            run.fence = fence.group(1)
    if run is not None:
        run.flush()
    return runs


def _command(text: str) -> str | None:
    if text.startswith("/") and len(text) > 1 and not text.startswith("//"):
        word = text.split(None, 1)[0]
        if re.fullmatch(r"/[a-z][a-z-]*", word):
            return word
    return None


def parse(doc: Document) -> list[Transcript]:
    assert doc.text is not None
    out: list[Transcript] = []
    empty: list[str] = []
    for index, run in enumerate(_split_runs(doc.text)):
        b = Builder(NAME)
        model = edit_format = version = None
        first_words: str | None = None
        first_any: str | None = None
        for kind, lines, start in run.drafts:
            where = f"line {start}"
            text = "\n".join(lines)
            metadata: dict[str, Any] = {}
            if kind == "aider":
                for line in lines:
                    found = _MODEL.match(line)
                    if found and model is None:
                        model, edit_format = found.group(1), found.group(2)
                    found = _VERSION.match(line)
                    if found and version is None:
                        version = found.group(1)
                metadata = {"observation": True, "observationType": "aider"}
                b.add(Message(role="user", content=text, metadata=metadata), where)
                continue
            if kind == "user":
                command = _command(text)
                if command:
                    metadata["command"] = command
                elif first_words is None and text.strip():
                    first_words = text
                if first_any is None and text.strip():
                    first_any = text
                b.add(Message(role="user", content=text, metadata=metadata or None), where)
                continue
            b.add(Message(role="assistant", content=text), where)
        if not any(m.role == "assistant" or not (m.metadata or {}).get("observation") for m in b.messages):
            empty.append(run.started_at or f"line {run.line}")
            continue
        metadata = {"run": index + 1, "line": run.line}
        if run.started_at:
            metadata["startedAt"] = run.started_at
        if version:
            metadata["aiderVersion"] = version
        if edit_format:
            metadata["editFormat"] = edit_format
        title = title_from_text(first_words or first_any or "")
        out.append(b.finish(title=title, model=model, provider=guess_provider(model), metadata=metadata))
    if empty and out:
        shown = ", ".join(empty[:5]) + (", ..." if len(empty) > 5 else "")
        out[0].warnings.append(f"skipped {len(empty)} aider run{'s' if len(empty) != 1 else ''} without "
                               f"messages (started {shown})")
    return out
