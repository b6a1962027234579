"""Structured facts pulled out of messages: files changed, tools, decisions, errors, next steps.

A checkpoint keeps these next to its summary so that what matters most survives even a
poor summary (structured extraction, and the goal markers for artifacts and
decisions). Pure and fast: it runs on every compression over everything being compressed,
so the bulk of the text (tool results, often whole files) is only touched by plain
substring searches, and the regexes run on short lines and short prose.

Recognised:

* files: write/edit tool calls (Claude Code ``Write``/``Edit``/``MultiEdit``, OpenHands
  and Anthropic ``str_replace_editor`` create/str_replace/insert, ``apply_patch``), shell
  commands that write (``sed -i``, ``> file``, ``>> file``, ``tee``, ``touch``,
  ``cat <<EOF > file``), tool results confirming a write, prose such as "Created
  src/x.py" and ``[ARTIFACT] Modified path``, and "Files" sections of earlier summaries;
* decisions: sentences with decided/chose/will use/we'll go with/settled on/…, and
  ``[DECISION]`` markers;
* next steps: ``[NEXT]``, "Next, I will …", "Next steps: …", ``TODO:``;
* errors: the last line of a traceback, ``Error:``/``error:``/``FAILED``/``fatal:`` lines,
  non-zero exit codes (mini-swe-agent ``<returncode>``, Claude Code ``Exit code N``,
  OpenHands ``exit code N``), results flagged ``is_error``;
* commands: every shell command run through a tool, and the single ```` ```bash ````
  block of an assistant message without tool calls (mini-swe-agent's text protocol).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ctxd.protocol.message import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    tool_result_text,
)


class ToolUsage(msgspec.Struct, frozen=True):
    """How often one tool was called, with up to three telling uses."""

    name: str
    count: int
    notable_uses: list[str] = []


class Extraction(msgspec.Struct):
    """What ``extract`` found, each list in order of appearance without duplicates."""

    files_modified: list[str] = []
    tools_used: list[ToolUsage] = []
    key_decisions: list[str] = []
    next_steps: list[str] = []
    errors: list[str] = []
    commands: list[str] = []

    def is_empty(self) -> bool:
        return not (self.files_modified or self.tools_used or self.key_decisions
                    or self.next_steps or self.errors or self.commands)


# ---- tool names ---------------------------------------------------------------------------

_SHELL_TOOLS = frozenset({
    "bash", "shell", "sh", "zsh", "execute_bash", "execute_command", "run_command", "run_shell_command",
    "run_terminal_cmd", "run_terminal_command", "terminal", "exec", "exec_command", "cmd", "powershell",
    "local_shell", "container.exec", "shell_command", "run_bash",
})
_EDIT_TOOLS = frozenset({
    "write", "edit", "multiedit", "notebookedit", "write_file", "edit_file", "create_file", "replace_in_file",
    "str_replace_editor", "str_replace_based_edit_tool", "text_editor", "file_editor", "edit_notebook",
    "insert_edit_into_file", "write_to_file", "apply_diff", "search_replace", "replace_file_content",
    "update_file", "modify_file", "overwrite_file", "append_to_file",
})
_PATCH_TOOLS = frozenset({"apply_patch", "patch", "applypatch"})
_VIEW_COMMANDS = frozenset({"view", "read", "list", "show"})
_PATH_KEYS = ("file_path", "path", "filepath", "filename", "file", "notebook_path", "target_file",
              "target", "absolute_path", "relative_path")
_COMMAND_VERBS = {"create": "Created", "str_replace": "Edited", "insert": "Edited", "undo_edit": "Reverted",
                  "write": "Wrote", "append": "Edited"}

# ---- regexes (run on short strings only) ------------------------------------------------

_PATH_TOKEN = r"(?:[\w.~+@-]*/[\w./~+@-]*[\w+@-]|[\w~+@-][\w.~+@-]*\.[A-Za-z][\w]{0,9})"
_PROSE_FILE = re.compile(
    r"(?i)(?:created|creating|modified|modifying|updated|updating|edited|editing|wrote|writing|rewrote|"
    r"patched|changed)\s+(?:the\s+|a\s+|new\s+|a\s+new\s+)?(?:file\s+|script\s+|module\s+|test\s+file\s+)?"
    r"(?:at\s+|to\s+)?[`'\"]?(" + _PATH_TOKEN + r")")
_ARTIFACT = re.compile(r"\[ARTIFACT\]\s*(?:(?:Created|Modified|Updated|Deleted|Edited|Wrote|Added)\s*:?\s*)?"
                       r"[`'\"]?(\S+)")
_RESULT_FILE = re.compile(
    r"(?:File created successfully at:?\s*|The file\s+|Successfully (?:wrote|created|edited|modified|updated|"
    r"saved)(?: to)?(?: file)?:?\s+|File (?:written|saved|updated|created):?\s+|Wrote (?:\d+ \w+ )?to\s+)"
    r"[`'\"]?(" + _PATH_TOKEN + r")")
_RESULT_FILE_TAIL = re.compile(r"\s+has been (?:updated|created|edited|modified|written|overwritten)")
_PATCH_HEADER = re.compile(r"^(?:\*\*\* (?:Add|Update|Delete) File:|\*\*\* Move to:|\+\+\+ (?:b/)?)\s*(\S+)",
                           re.MULTILINE)
_MARKER = re.compile(r"^[ \t]*(?:[-*•][ \t]*)?\[(DECISION|NEXT)\][ \t]*:?[ \t]*(.+?)[ \t]*$", re.MULTILINE)
_DECISION = re.compile(
    r"\b(?:decided|decide to|decision (?:is|was) to|chose|chosen|choose to|will use|'ll use|"
    r"go with|going with|settled on|settle on|opted (?:for|to)|agreed (?:on|to)|the plan is to)\b")
_NEXT_AT = re.compile(r"next,?\s+(?:i|we)(?:'ll|\s+will|\s+need\s+to|\s+should|\s+must)\b|next steps?\s*(?:is|are|:)")
_SECTION = re.compile(
    r"[ \t]*(?:#{1,6}[ \t]*|\*\*)?(?:\d+\.[ \t]*)?(key decisions|decisions(?: made)?|decision|"
    r"files(?: modified| changed| created| touched| and (?:key )?changes)?|modified files|artifacts|"
    r"commands(?: run)?|errors(?: seen)?|next(?: steps)?|planned next steps|what (?:we|i) plan to do next|"
    r"blockers)[ \t]*(?:\*\*)?[ \t]*:?[ \t]*(?:\*\*)?[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
# Prose is searched with plain ``find`` for these needles (much faster than one regex
# over the whole text); each hit is then checked with an anchored regex. Needles of
# the file, next and section groups must start a word; decision hits are checked on
# their sentence.
_G_FILE, _G_DECISION, _G_NEXT, _G_SECTION = 1, 2, 4, 8
_NEEDLES: dict[str, int] = {
    **{verb: _G_FILE for verb in ("creat", "modif", "updat", "edit", "wrot", "writing", "patched", "changed")},
    **{n: _G_DECISION for n in ("decid", "chose", "choos", "ll use", "go with", "going with",
                                "settle", "opted", "agreed", "plan is")},
    "decision": _G_DECISION | _G_SECTION,
    "next": _G_NEXT | _G_SECTION,
    **{n: _G_SECTION for n in ("files", "artifacts", "commands", "errors", "blockers")},
}
# Text next to tool calls: files come from the calls, sections from final reports.
_NEEDLES_LIGHT: dict[str, int] = {n: g & (_G_DECISION | _G_NEXT) for n, g in _NEEDLES.items()
                                  if g & (_G_DECISION | _G_NEXT)}
_WORD_START_GROUPS = _G_FILE | _G_NEXT | _G_SECTION
_BULLET = re.compile(r"^[ \t]*(?:[-*•+]|\d+[.)])[ \t]+(.+?)[ \t]*$")
_FENCE = re.compile(r"```[^\n]*\n.*?(?:```|\Z)", re.DOTALL)
_BASH_FENCE = re.compile(r"```(?:bash|sh|shell|console|zsh)[ \t]*\n(.*?)```", re.DOTALL)
_ERROR_LINE = re.compile(
    r"^(?:E\s+)?(?:"
    r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Failure|Exit|Interrupt)\b(?::.*)?"
    r"|(?:error|Error|ERROR|fatal|FATAL|Fatal error|panic)(?:\[\w+\])?\s*:\s*\S.*"
    r"|FAILED\b.*|npm ERR!.*|ERROR\s+\S.*"
    r"|[^\s:]+:\d+(?::\d+)?:\s*(?:error|fatal error|Error)\b.*"
    r"|[^\s(]+\(\d+,\d+\):\s*error\b.*"
    r")$")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Za-z_]\w*(?::\s.*)?$")
_INTERPRETER_NOTE = re.compile(r"\[Python Interpreter: [^\]]*\]$")
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_EXIT_CODE = re.compile(r"(?i)\bexit(?:ed with)? (?:code|status)[: ]+(-?\d+)")
_TAGS = re.compile(r"</?[a-z_]+>")
_SHELL_TOKEN = re.compile(
    r"""'([^']*)'?|"((?:[^"\\]|\\.)*)"?|(\d*>>?\|?|&>>?|>&|<<-?|<)|(&&|\|\||[;|\n&])|"""
    r"""((?:[^\s'"<>|;&\\]|\\.)+)|\S""")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1")

_ERROR_KEYS = ("Error", "error", "ERROR", "FAILED", "fatal", "Exception", "ERR!", "panic")
_MAX_LINE = 240
_MAX_ERRORS_PER_TEXT = 4
_ERROR_SCAN_HEAD = 4000
_ERROR_SCAN_TAIL = 8000


class _Ordered:
    """An insertion-ordered set of strings."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[str, None] = {}

    def add(self, value: str) -> None:
        if value and value not in self.items:
            self.items[value] = None

    def first(self, n: int) -> list[str]:
        return list(self.items)[:n]

    def last(self, n: int) -> list[str]:
        values = list(self.items)
        return values[-n:] if n else []


class _Collector:
    def __init__(self) -> None:
        self.files = _Ordered()
        self.decisions = _Ordered()
        self.next_steps = _Ordered()
        self.errors = _Ordered()
        self.commands = _Ordered()
        self.tool_counts: dict[str, int] = {}
        self.tool_notes: dict[str, list[str]] = {}
        # tool_call_id -> (tool name, shell command or None)
        self.calls: dict[str, tuple[str, str | None]] = {}
        # the command of a text-protocol turn (```bash block), until its output arrives
        self.pending_command: str | None = None

    # tool calls

    def tool_call(self, call_id: str | None, name: str, args: Any) -> None:
        self.tool_counts[name] = self.tool_counts.get(name, 0) + 1
        lname = name.lower()
        command = None
        note = None
        if isinstance(args, dict):
            command = _shell_command(lname, args)
            if command is not None:
                self.commands.add(_clip(command, 400))
                for path in _files_from_shell(command):
                    self.files.add(path)
                note = _clip(" ".join(command[:200].split()), 80)
            elif lname in _EDIT_TOOLS or lname in _PATCH_TOOLS or _looks_like_edit(lname, args):
                note = self._edit_call(lname, args)
            else:
                note = _first_arg(args)
        elif isinstance(args, str) and (lname in _PATCH_TOOLS or "*** Begin Patch" in args):
            for path in _patch_files(args):
                self.files.add(path)
                note = note or f"Patched {path}"
        if note:
            notes = self.tool_notes.setdefault(name, [])
            if len(notes) < 3 and note not in notes:
                notes.append(note)
        if call_id:
            self.calls[call_id] = (name, command)

    def _edit_call(self, lname: str, args: dict[str, Any]) -> str | None:
        sub = args.get("command") or args.get("action") or args.get("mode")
        sub = sub.lower() if isinstance(sub, str) else None
        if sub in _VIEW_COMMANDS:
            path = _path_arg(args)
            return f"Viewed {path}" if path else None
        patch = args.get("patch") or args.get("input") or args.get("diff")
        if lname in _PATCH_TOOLS or (isinstance(patch, str) and "*** Begin Patch" in patch):
            paths = _patch_files(patch) if isinstance(patch, str) else []
            for path in paths:
                self.files.add(path)
            return f"Patched {', '.join(paths[:3])}" if paths else None
        path = _path_arg(args)
        if not path:
            return None
        self.files.add(path)
        verb = _COMMAND_VERBS.get(sub or "", "Wrote" if lname.startswith("write") or lname == "create_file"
                                  else "Edited")
        return f"{verb} {path}"

    # text

    def prose(self, text: str, *, allow_fenced_command: bool, with_tool_calls: bool = False) -> None:
        """Scan message text; ``with_tool_calls`` skips what those calls report better."""
        if not text:
            return
        if allow_fenced_command and "```" in text:
            blocks = _BASH_FENCE.findall(text)
            if len(blocks) == 1 and blocks[0].strip():
                command = blocks[0].strip()
                self.pending_command = command
                self.commands.add(_clip(command, 400))
                for path in _files_from_shell(command):
                    self.files.add(path)
        plain = _FENCE.sub("\n", text) if "```" in text else text
        if "[" in plain:
            if "[ARTIFACT]" in plain:
                for match in _ARTIFACT.finditer(plain):
                    _add_path(self.files, match.group(1))
            if "[DECISION]" in plain or "[NEXT]" in plain:
                for match in _MARKER.finditer(plain):
                    target = self.decisions if match.group(1) == "DECISION" else self.next_steps
                    target.add(_clip(match.group(2), _MAX_LINE))
        low = _lower(plain)
        section_lines: list[int] = []
        for pos, group in _hits(low, _NEEDLES_LIGHT if with_tool_calls else _NEEDLES):
            if group == _G_FILE:
                found = _PROSE_FILE.match(plain, pos)
                if found:
                    _add_path(self.files, found.group(1))
                continue
            if group & _G_DECISION:
                sentence = _sentence_at(plain, pos, pos + 4)
                if _DECISION.search(sentence.lower()) and not sentence.startswith("[DECISION]"):
                    self.decisions.add(sentence)
            if group & _G_NEXT and _NEXT_AT.match(low, pos):
                sentence = _sentence_at(plain, pos, pos + 4)
                if not sentence.startswith("[NEXT]"):
                    self.next_steps.add(sentence)
            if group & _G_SECTION:
                start = low.rfind("\n", 0, pos) + 1
                if not low[start:pos].strip(" \t#*-0123456789.") and (not section_lines or section_lines[-1] != start):
                    section_lines.append(start)
        if "TODO:" in plain:
            pos = plain.find("TODO:")
            while pos != -1:
                self.next_steps.add(_sentence_at(plain, pos, pos + 5))
                pos = plain.find("TODO:", pos + 5)
        if section_lines:
            self._sections(plain, section_lines)

    def _sections(self, text: str, line_starts: list[int]) -> None:
        """Bullets under "Decisions" / "Files" / "Next steps" headings (earlier summaries)."""
        for start in line_starts:
            match = _SECTION.match(text, start)
            if not match:
                continue
            kind = match.group(1).lower()
            inline = match.group(2).strip().strip("*").strip()
            items: list[str] = []
            if inline:
                if kind.startswith("next") and not match.group(0).rstrip().endswith(":") and ":" not in \
                        match.group(0)[: match.start(2) - start]:
                    continue  # "Next, I will ..." is prose, not a heading
                separator = ", " if kind.startswith(("files", "modified", "artifacts")) else "; "
                items = [part.strip() for part in inline.split(separator) if part.strip()]
            else:
                pos = match.end() + 1
                while pos < len(text):
                    end = text.find("\n", pos)
                    end = len(text) if end == -1 else end
                    line = text[pos:end]
                    pos = end + 1
                    bullet = _BULLET.match(line)
                    if bullet:
                        items.append(bullet.group(1))
                    elif line.strip() or items:
                        break
            self._section_items(kind, items)

    def _section_items(self, kind: str, items: list[str]) -> None:
        for raw in items:
            item = _strip_md(raw)
            if not item:
                continue
            if kind.startswith(("files", "modified", "artifacts")):
                match = re.search(_PATH_TOKEN, item)
                if match:
                    _add_path(self.files, match.group(0))
            elif "decision" in kind:
                self.decisions.add(_clip(item.removeprefix("[DECISION]").strip(), _MAX_LINE))
            elif kind.startswith(("next", "planned", "what")):
                self.next_steps.add(_clip(item.removeprefix("[NEXT]").strip(), _MAX_LINE))
            elif kind.startswith("commands"):
                self.commands.add(_clip(item.strip("`"), 400))
            elif kind.startswith(("errors", "blockers")):
                self.errors.add(_clip(item, _MAX_LINE))

    def result(self, text: str, call_id: str | None, is_error: bool) -> None:
        if not text:
            return
        if call_id:
            command = self.calls.get(call_id, ("", None))[1]
        else:
            command, self.pending_command = self.pending_command, None
        head = text[:300]
        code = None
        if "<returncode>" in head:
            match = _RETURNCODE.search(head)
            code = int(match.group(1)) if match else None
        elif "xit" in head or "xit" in text[-300:]:
            match = _EXIT_CODE.search(head) or _EXIT_CODE.search(text[-300:])
            code = int(match.group(1)) if match else None
        if code and not (code == 1 and command and _status_one_is_an_answer(command)):
            what = f"`{_clip(' '.join(command[:200].split()), 80)}`" if command else "command"
            self.errors.add(f"{what} exited with code {code}")
        if is_error and code is None:
            first = next((line.strip() for line in _TAGS.sub("", text[:2000]).splitlines()
                          if line.strip() and not _EXIT_CODE.match(line.strip())), "")
            if first:
                self.errors.add(_clip(first, _MAX_LINE))
        _scan_errors(text, self.errors)
        start = text[:2000]
        if "successfully" in start or "has been" in start or "File " in start or "Wrote " in start:
            for match in _RESULT_FILE.finditer(start):
                path = match.group(1)
                if match.group(0).startswith("The file") and not _RESULT_FILE_TAIL.match(text, match.end()):
                    continue
                _add_path(self.files, path)

    def build(self, max_items: int) -> Extraction:
        order = {name: i for i, name in enumerate(self.tool_counts)}
        tools = sorted(self.tool_counts, key=lambda name: (-self.tool_counts[name], order[name]))
        return Extraction(
            files_modified=self.files.first(max_items * 2),
            tools_used=[ToolUsage(name, self.tool_counts[name], self.tool_notes.get(name, []))
                        for name in tools[:max_items]],
            key_decisions=self.decisions.first(max_items),
            next_steps=self.next_steps.last(min(max_items, 10)),
            errors=self.errors.last(max_items),
            commands=self.commands.last(max_items),
        )


def extract(messages: Sequence[Message] | Iterable[Message], *, max_items: int = 50) -> Extraction:
    """Files, tools, decisions, next steps, errors and commands found in ``messages``.

    Lists are capped: decisions and files keep the earliest (``max_items``, files twice
    that), next steps (at most 10), errors and commands keep the most recent.
    """
    out = _Collector()
    for message in messages:
        calls = message.tool_calls or ()
        for call in calls:
            out.tool_call(call.id, call.name, call.text if call.type == "custom" else _decode_args(call.text))
        content = message.content
        if content is None:
            continue
        if isinstance(content, str):
            if message.role == "tool":
                out.result(content, message.tool_call_id, False)
            else:
                out.prose(content, allow_fenced_command=message.role == "assistant" and not calls,
                          with_tool_calls=bool(calls))
                if message.role == "user":
                    out.result(content, None, False)  # observations come back as user turns in text protocols
            continue
        has_tool_use = bool(calls) or any(isinstance(b, ToolUseBlock) for b in content)
        for block in content:
            if isinstance(block, TextBlock):
                if message.role == "tool":
                    out.result(block.text, message.tool_call_id, False)
                else:
                    out.prose(block.text, allow_fenced_command=message.role == "assistant" and not has_tool_use,
                              with_tool_calls=has_tool_use)
            elif isinstance(block, ToolUseBlock):
                out.tool_call(block.id, block.name, block.input)
            elif isinstance(block, ToolResultBlock):
                out.result(tool_result_text(block), block.tool_use_id, block.is_error)
            elif isinstance(block, ThinkingBlock):
                continue
    return out.build(max_items)


# ---- helpers ------------------------------------------------------------------------------

_args_decoder = msgspec.json.Decoder()


def _decode_args(arguments: str) -> Any:
    if not arguments:
        return {}
    try:
        return _args_decoder.decode(arguments)
    except msgspec.DecodeError:
        return arguments


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _strip_md(text: str) -> str:
    text = text.strip()
    if text.startswith("**") and "**" in text[2:]:
        text = text.replace("**", "", 2)
    return text.strip()


_TRAILING = ".,:;)]}'\"`!?"
_LEADING = "(['\"`"


def _clean_path(raw: str) -> str:
    path = raw.strip().lstrip(_LEADING).rstrip(_TRAILING)
    return path


def _add_path(target: _Ordered, raw: str) -> None:
    path = _clean_path(raw)
    if _plausible_path(path):
        target.add(path)


def _plausible_path(path: str) -> bool:
    if not path or len(path) > 300 or path.startswith(("-", "http:", "https:", "/dev/", "&")):
        return False
    if "://" in path or "$(" in path or "*" in path:
        return False
    return any(c.isalnum() for c in path)


def _path_arg(args: dict[str, Any]) -> str | None:
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            path = _clean_path(value)
            return path if _plausible_path(path) else None
    return None


def _looks_like_edit(lname: str, args: dict[str, Any]) -> bool:
    """An unlisted tool that writes a file: a path plus new content."""
    if not any(isinstance(args.get(k), str) for k in _PATH_KEYS):
        return False
    return any(k in args for k in ("content", "file_text", "new_string", "new_str", "edits", "contents"))


def _first_arg(args: dict[str, Any]) -> str | None:
    for key, value in args.items():
        if isinstance(value, str) and value.strip():
            return _clip(f"{key}={' '.join(value.split())}", 80)
    return None


def _shell_command(lname: str, args: dict[str, Any]) -> str | None:
    if lname in _EDIT_TOOLS or lname in _PATCH_TOOLS:
        return None
    if lname not in _SHELL_TOOLS and not _is_shellish_name(lname):
        return None
    value = args.get("command", args.get("cmd"))
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if len(value) >= 3 and value[0] in ("bash", "sh", "zsh") and value[1] in ("-c", "-lc"):
            return value[2]
        return " ".join(v if v and " " not in v else repr(v) for v in value)
    return value if isinstance(value, str) and value.strip() else None


def _is_shellish_name(lname: str) -> bool:
    return any(word in lname for word in ("bash", "shell", "terminal", "command", "exec", "run"))


def _patch_files(patch: str) -> list[str]:
    out = _Ordered()
    for match in _PATCH_HEADER.finditer(patch):
        _add_path(out, match.group(1))
    return list(out.items)


def _lower(text: str) -> str:
    """Lower-case with offsets kept (``str.lower`` can lengthen some non-ASCII letters)."""
    low = text.lower()
    if len(low) != len(text):
        low = text.encode("ascii", "replace").decode("ascii").lower()
    return low


def _hits(low: str, needles: dict[str, int]) -> list[tuple[int, int]]:
    """(offset, needle group) of every needle in ``low``, sorted by offset."""
    found: list[tuple[int, int]] = []
    for needle, group in needles.items():
        pos = low.find(needle)
        while pos != -1:
            if (not group & _WORD_START_GROUPS or pos == 0
                    or not (low[pos - 1].isalnum() or low[pos - 1] == "_")):
                found.append((pos, group))
            pos = low.find(needle, pos + len(needle))
    found.sort()
    return found


def _sentence_at(text: str, start: int, end: int) -> str:
    """The sentence (or line) around ``text[start:end]``, clipped."""
    lo = text.rfind("\n", 0, start) + 1
    for sep in (". ", "! ", "? "):
        pos = text.rfind(sep, lo, start)
        if pos != -1:
            lo = max(lo, pos + 2)
    hi = len(text)
    for sep in ("\n", ". ", "! ", "? "):
        pos = text.find(sep, end)
        if pos != -1 and pos < hi:
            hi = pos + (1 if sep != "\n" else 0)
    sentence = " ".join(text[lo:hi].split()).lstrip("-*• ").strip()
    return _clip(sentence, _MAX_LINE)


def _scan_errors(text: str, errors: _Ordered) -> None:
    """Error lines of one text; plain ``find`` first so long clean outputs cost little.

    Of a long output only the head and the tail are read: that is where commands print
    their failures and test runners their summaries, and it bounds the cost of the
    30k-character file listings agents produce.
    """
    if len(text) > _ERROR_SCAN_HEAD + _ERROR_SCAN_TAIL:
        head = text[:_ERROR_SCAN_HEAD]
        _scan_errors(head[: head.rfind("\n") + 1] or head, errors)
        tail = text[-_ERROR_SCAN_TAIL:]
        _scan_errors(tail[tail.find("\n") + 1:] or tail, errors)
        return
    found = 0
    if "Traceback (most recent call last)" in text:
        pos = text.find("Traceback (most recent call last)")
        while pos != -1 and found < _MAX_ERRORS_PER_TEXT:
            line = _traceback_last_line(text, pos)
            if line:
                errors.add(line)
                found += 1
            pos = text.find("Traceback (most recent call last)", pos + 10)
    seen_lines: set[int] = set()
    for key in _ERROR_KEYS:
        if key not in text:
            continue
        pos = text.find(key)
        probes = 0
        while pos != -1 and found < _MAX_ERRORS_PER_TEXT and probes < 200:
            probes += 1
            lo = text.rfind("\n", 0, pos) + 1
            if lo not in seen_lines:
                seen_lines.add(lo)
                hi = text.find("\n", pos)
                hi = len(text) if hi == -1 else hi
                line = text[lo:hi].strip()
                if line.endswith("]") and "[Python Interpreter:" in line:
                    line = _INTERPRETER_NOTE.sub("", line).rstrip()
                if len(line) <= 1000 and _ERROR_LINE.match(line):
                    before = len(errors.items)
                    errors.add(_clip(line, _MAX_LINE))
                    found += len(errors.items) > before
                pos = text.find(key, hi)
            else:
                pos = text.find(key, pos + len(key))


def _traceback_last_line(text: str, pos: int) -> str | None:
    """The ``SomeError: message`` line that ends the traceback starting at ``pos``."""
    lines = text[pos: pos + 20000].splitlines()[1:]
    for line in lines:
        if not line or line[0] in " \t":
            continue
        stripped = line.strip()
        if stripped.startswith(("During handling", "The above exception", "Traceback")):
            continue
        stripped = _INTERPRETER_NOTE.sub("", stripped).rstrip()
        return _clip(stripped, _MAX_LINE) if _EXCEPTION_LINE.match(stripped) else None
    return None


def _drop_heredocs(command: str) -> str:
    """``command`` without heredoc bodies (their text is data, not shell)."""
    out: list[str] = []
    pos = 0
    while True:
        match = _HEREDOC.search(command, pos)
        line_end = command.find("\n", match.end()) if match else -1
        if match is None or line_end == -1:
            out.append(command[pos:])
            return "".join(out)
        out.append(command[pos:line_end])
        delimiter = match.group(2)
        end = len(command)
        search = line_end
        while (k := command.find(delimiter, search)) != -1:
            start = command.rfind("\n", 0, k) + 1
            stop = command.find("\n", k)
            stop = len(command) if stop == -1 else stop
            if command[start:stop].strip() == delimiter:
                end = stop
                break
            search = k + len(delimiter)
        pos = end


def _simple_commands(command: str) -> list[tuple[list[str], list[str]]]:
    """The simple commands of a shell snippet as (words, files stdout is redirected to):
    split on unquoted ``;``, ``&&``, ``||``, ``|``, ``&`` and newlines, quotes removed,
    heredoc bodies left out."""
    if "<<" in command:
        command = _drop_heredocs(command)
    commands: list[tuple[list[str], list[str]]] = []
    argv: list[str] = []
    targets: list[str] = []
    redirect_pending = False
    for match in _SHELL_TOKEN.finditer(command):
        single, double, redirect, separator, word = match.groups()
        if separator is not None:
            if argv or targets:
                commands.append((argv, targets))
                argv, targets = [], []
            redirect_pending = False
            continue
        if redirect is not None:
            # ">" and "1>" write stdout to a file; "2>", "&>", ">&", "<" do not count.
            redirect_pending = redirect in (">", ">>", ">|", "1>", "1>>")
            continue
        value = word if word is not None else single if single is not None else double
        if value is None:
            continue
        if redirect_pending:
            targets.append(value)
            redirect_pending = False
        else:
            argv.append(value)
    if argv or targets:
        commands.append((argv, targets))
    return commands


_STATUS_ONE_ANSWERS = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "diff", "cmp", "test", "[", "[["})


def _status_one_is_an_answer(command: str) -> bool:
    """Exit status 1 of grep ("no match"), diff ("differs") or test is an answer, not a failure."""
    commands = [argv for argv, _ in _simple_commands(command) if argv]
    return bool(commands) and commands[-1][0].rsplit("/", 1)[-1] in _STATUS_ONE_ANSWERS


def _writes_by_redirect(command: str) -> bool:
    """Whether ``command`` has a ``>`` that may write a file (not ``2>&1``, ``>&2``, ``->``)."""
    pos = command.find(">")
    while pos != -1:
        after = command[pos + 1: pos + 2]
        before = command[pos - 1: pos] if pos else ""
        if after != "&" and before not in ("2", "&", "-", "=") and after != "=":
            return True
        pos = command.find(">", pos + 1)
    return False


def _files_from_shell(command: str) -> list[str]:
    """Files a shell command writes: redirections, ``sed -i``, ``tee``, ``touch``, patches."""
    if "*** Begin Patch" in command:
        return _patch_files(command)
    if not (_writes_by_redirect(command) or "sed " in command or "tee " in command or "touch " in command):
        return []
    out = _Ordered()
    for argv, targets in _simple_commands(command):
        for target in targets:
            _add_path(out, target)
        if not argv:
            continue
        name = argv[0].rsplit("/", 1)[-1]
        args = argv[1:]
        if name == "sed" and any(a.startswith("-i") or a.startswith("--in-place") or
                                 (a.startswith("-") and not a.startswith("--") and "i" in a[1:])
                                 for a in args):
            operands: list[str] = []
            script_given = any(a in ("-e", "--expression", "-f") for a in args)
            skip = False
            for a in args:
                if skip:
                    skip = False
                    continue
                if a in ("-e", "--expression", "-f"):
                    skip = True
                    continue
                if a.startswith("-"):
                    continue
                operands.append(a)
            files = operands if script_given else operands[1:]
            for f in files:
                _add_path(out, f)
        elif name in ("tee", "touch"):
            for a in args:
                if not a.startswith("-"):
                    _add_path(out, a)
    return list(out.items)


def error_lines(text: str, limit: int = 3) -> list[str]:
    """Up to ``limit`` error lines of ``text`` (tracebacks' last lines, ``error:`` lines...).

    Used to keep the failures of a long tool output that is cut for a prompt.
    """
    found = _Ordered()
    _scan_errors(text, found)
    return found.first(limit)
