"""An agent's working set: the files it reads with tool calls, each as last shown to the model.

A coding agent reads a file (Codex's ``sed -n '1,400p' x``, Claude Code's ``Read``,
opencode's ``read``), then edits it. Its read is a tool result, not the client's own
context (aider's files, ``context/prompt`` ``current``): compression summarized it like any
output, and the model was asked to patch a file it no longer saw. The working set is the
newest read of each file the conversation read, kept verbatim (pinned, with its call) while
it fits in ``room`` tokens: first the files read and then touched again (edited, patched,
read again: the ones it is working on), the newest first, then the files read once, the
newest first. An older read of a file is never in it (a newer copy says more).

Paths come only from documented tool-call shapes, never from outputs:
- arguments naming a file (``path``, ``file_path``, ``filePath``, ...): an edit when the
  call carries new text (``old_string``/``new_string``, ``content``, ``new_str``...), else
  a read;
- patches in any argument or a freeform call's text: ``*** Update File: x`` (Codex's
  ``apply_patch``), ``--- a/x``/``+++ b/x`` (unified diffs): edits;
- a shell command (``cmd``/``command``, a string or an argv) that is one simple command of
  a POSIX file printer (``cat``, ``head``, ``tail``, ``nl``, ``sed -n``...): a read of its
  operands; ``sed -i`` edits them. Pipelines, lists and redirections show something else.
Plain functions over the active context's entries; the service pins what they choose.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ctxd.engine.context import ActiveContext, Entry, FileRead, never_compressed
from ctxd.protocol.message import CustomCall, ToolUseBlock
from ctxd.tokens import PROMPT_PRIMING

READ, EDIT = "read", "edit"

PATH_KEYS = ("path", "file_path", "filePath", "filename", "file", "target_file", "absolute_path")
"""Argument names that name one file (Claude Code, opencode, OpenHands, Gemini CLI...)."""
EDIT_KEYS = ("old_string", "new_string", "oldString", "newString", "content", "old_str", "new_str",
             "file_text", "edits", "insert_line", "new_content", "replacement")
"""Arguments that carry a file's new text: a call with one edits the file it names."""
SHELL_KEYS = ("cmd", "command")
PRINTERS = frozenset({"cat", "head", "tail", "nl", "sed", "less", "more", "bat", "batcat", "tac"})
"""POSIX (and common) programs whose output is the file they are given."""
SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
_PATCH = re.compile(r"^(?:\*\*\* (?:Update|Add|Delete) File: (?P<codex>.+?)"
                    r"|\+\+\+ b/(?P<plus>.+?)|--- a/(?P<minus>.+?))\s*$", re.MULTILINE)
_OPERATORS = frozenset("|&;<>()")


@dataclass(frozen=True)
class Touch:
    """A tool call naming a file: ``kind`` read or edit."""

    call_id: str
    path: str
    kind: str


def _norm(path: str) -> str:
    path = path.strip().strip("\"'")
    while path.startswith("./"):
        path = path[2:]
    return path


def _looks_like_path(word: str) -> bool:
    return bool(word) and not word.startswith("-") and ("/" in word or "." in word.strip(".")) \
        and not any(c in word for c in "*?$`{}=,\n")


def _shell_touches(command: Any) -> list[tuple[str, str]]:
    """``(path, kind)`` of a shell command that is one simple command of a file printer."""
    if isinstance(command, list):
        words = [w for w in command if isinstance(w, str)]
        if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in SHELLS and words[1] in ("-c", "-lc"):
            command = words[2]
        else:
            command = shlex.join(words)
    if not isinstance(command, str) or "\n" in command.strip():
        return []
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return []
    if not words or any(w and set(w) <= _OPERATORS for w in words):
        return []
    program = words[0].rsplit("/", 1)[-1]
    if program not in PRINTERS:
        return []
    args = words[1:]
    kind = READ
    if program == "sed":
        if any(a.startswith("-i") or a == "--in-place" for a in args):
            kind = EDIT
        # sed's first operand is its script unless given by -e/-f
        script = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
        if script is not None and not any(a in ("-e", "-f") or a.startswith("--expression") for a in args):
            args = args[:script] + args[script + 1:]
    paths = [_norm(a) for a in args if _looks_like_path(a)]
    return [(p, kind) for p in paths]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _patch_paths(text: str) -> list[str]:
    out = []
    for m in _PATCH.finditer(text):
        path = m.group("codex") or m.group("plus") or m.group("minus")
        if path and path != "/dev/null":
            out.append(_norm(path))
    return list(dict.fromkeys(out))


def call_touches(call_id: str, arguments: Any, freeform: str | None = None) -> list[Touch]:
    """The files a tool call reads or edits, from its ``arguments`` (a dict, or JSON text)
    or a freeform call's text."""
    if freeform is not None:
        return [Touch(call_id, p, EDIT) for p in _patch_paths(freeform)]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return [Touch(call_id, p, EDIT) for p in _patch_paths(arguments)]
    if not isinstance(arguments, dict):
        return []
    touches: list[Touch] = []
    patched = [p for s in _strings(arguments) for p in _patch_paths(s)]
    touches += [Touch(call_id, p, EDIT) for p in dict.fromkeys(patched)]
    if patched:
        return touches
    edit = any(k in arguments for k in EDIT_KEYS)
    for key in PATH_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            touches.append(Touch(call_id, _norm(value), EDIT if edit else READ))
            break
    if not touches:
        for key in SHELL_KEYS:
            if key in arguments:
                touches += [Touch(call_id, p, k) for p, k in _shell_touches(arguments[key])]
                break
    return touches


def message_touches(entry: Entry) -> list[Touch]:
    """The files an assistant message's tool calls read or edit, in call order."""
    out: list[Touch] = []
    content = entry.message.content
    if isinstance(content, list):
        for block in content:
            if isinstance(block, ToolUseBlock):
                out += call_touches(block.id, block.input)
    for call in entry.message.tool_calls or ():
        if isinstance(call.custom, CustomCall):
            out += call_touches(call.id, None, call.text)
        else:
            out += call_touches(call.id, call.text)
    return out


def index_reads(entries: Sequence[Entry], cost: Callable[[Entry], int],
                prior: Sequence[FileRead] = ()) -> list[FileRead]:
    """The newest read of each file, from ``entries`` (oldest first: the messages in the
    prompt now) and ``prior`` (the index an earlier pass kept: reads since summarized or
    folded out of the prompt stay known, so they come back when there is room again). A
    file touched (read, edited, patched) after its read is marked ``again``."""
    in_memory = {e.seq for e in entries}
    reads = {r.path: r for r in prior if r.call_seq not in in_memory and r.result_seq not in in_memory}
    call_seq: dict[str, int] = {}
    result_seq: dict[str, int] = {}
    by_seq = {e.seq: e for e in entries}
    touches: list[tuple[int, Touch]] = []
    for entry in entries:
        for result_id in entry.result_ids:
            if result_id in call_seq and result_id not in result_seq:
                result_seq[result_id] = entry.seq
        if not entry.call_ids:
            continue
        for touch in message_touches(entry):
            call_seq[touch.call_id] = entry.seq
            result_seq.pop(touch.call_id, None)  # (ids may repeat: the nearest result answers)
            touches.append((entry.seq, touch))
    for seq, touch in sorted(touches, key=lambda t: t[0]):
        known = reads.get(touch.path)
        later = known is not None and seq > known.call_seq
        if later and known is not None and not known.again:
            reads[touch.path] = known = msgspec.structs.replace(known, again=True)
        if touch.kind == READ and touch.call_id in result_seq and (known is None or later):
            call, result = by_seq[call_seq[touch.call_id]], by_seq[result_seq[touch.call_id]]
            reads[touch.path] = FileRead(touch.path, call.seq, result.seq, cost(call), cost(result), later)
    return sorted(reads.values(), key=lambda r: r.result_seq)


def working_set(reads: Sequence[FileRead], room: int) -> list[int]:
    """The seqs to keep verbatim: of each read in ``reads`` (:func:`index_reads`), its call's
    message and its result's, chosen in order (files touched again after their read first,
    then the newest reads) while they fit in ``room`` tokens; a pair that does not fit is
    passed over for smaller ones. Sorted."""
    order = sorted(reads, key=lambda r: (not r.again, -r.result_seq))
    chosen: set[int] = set()
    used = 0
    for read in order:
        extra = (0 if read.call_seq in chosen else read.call_tokens) \
            + (0 if read.result_seq in chosen else read.result_tokens)
        if used + extra > room:
            continue
        chosen |= {read.call_seq, read.result_seq}
        used += extra
    return sorted(chosen)


SLACK_SHARE = 0.05
"""Of the largest prompt, left free beside the working set and the newest turn: the
summary of everything else, and the next step's output, need room too."""


def newest_turn(entries: Sequence[Entry]) -> list[Entry]:
    """The newest message and, when it holds tool results, the messages of their calls:
    what the model is answering now, sent whole before any older file."""
    if not entries:
        return []
    last = entries[-1]
    ids = set(last.result_ids)
    return [e for e in entries[:-1] if ids & set(e.call_ids)] + [last]


def plan_working_set(ctx: ActiveContext, max_prompt_tokens: int,
                     share: float) -> tuple[list[int], list[FileRead]]:
    """The working set (and the index of reads it comes from, to store), within ``share``
    of ``max_prompt_tokens``, less what the other pins (the user's, the client's current
    context) already take, and never at the newest turn's expense: what the prompt holds
    besides the conversation (system part, checkpoints), what is never compressed (the
    user's words, system messages), the newest turn and a slack of ``SLACK_SHARE`` come
    first."""
    working = set(ctx.state.working)
    pinned = ctx.pinned_set
    entries = ctx.entries()
    others = sum(e.view_tokens for e in entries if e.seq in pinned and e.seq not in working)
    turn = newest_turn(ctx.recent)
    fixed = (PROMPT_PRIMING + ctx.system_tokens + ctx.checkpoint_tokens + others
             + sum(e.view_tokens for e in ctx.kept if e.seq not in pinned and never_compressed(e))
             + sum(e.tokens.overhead + e.tokens.text for e in ctx.recent
                   if e.seq not in pinned and never_compressed(e) and e not in turn)
             + sum(e.sent_tokens for e in turn if e.seq not in pinned))
    room = min(math.floor(share * max_prompt_tokens) - others,
               max_prompt_tokens - fixed - math.ceil(SLACK_SHARE * max_prompt_tokens))
    reads = index_reads(entries, lambda e: e.sent_tokens,
                        [r for r in ctx.state.reads if not ctx.state.is_out(r.call_seq)
                         and not ctx.state.is_out(r.result_seq)])
    declined = set(ctx.state.declined)
    wanted = [r for r in reads if r.call_seq not in declined and r.result_seq not in declined]
    return working_set(wanted, max(0, room)), reads


def plan_yield(ctx: ActiveContext, max_prompt_tokens: int) -> list[int]:
    """The working set that stays when the prompt is over ``max_prompt_tokens`` with
    everything else already summarized or cut: it yields before the user's words are
    folded, the least wanted reads first (the order of :func:`working_set`: files read
    once, the oldest first), as many as the excess needs. ``[]`` when all must go."""
    working = set(ctx.state.working)
    if not working:
        return []
    over = ctx.prompt_tokens - max_prompt_tokens
    if over <= 0:
        return sorted(working)
    sent = {e.seq: e.view_tokens for e in ctx.entries() if e.seq in working}
    room = sum(sent.values()) - over
    reads = [msgspec.structs.replace(r, call_tokens=sent[r.call_seq], result_tokens=sent[r.result_seq])
             for r in ctx.state.reads if r.call_seq in sent and r.result_seq in sent]
    return working_set(reads, max(0, room))


def missing(ctx: ActiveContext, seqs: list[int]) -> list[int]:
    """The seqs of the working set no longer in the prompt (to read from history)."""
    present = {e.seq for e in ctx.entries()}
    return [s for s in seqs if s not in present]


def working_changes(ctx: ActiveContext, seqs: list[int]) -> bool:
    """Whether :func:`apply_working_set` would change anything."""
    before = set(ctx.state.working)
    return set(seqs) - (set(ctx.state.pinned) - before) != before


def apply_working_set(ctx: ActiveContext, seqs: list[int], reads: list[FileRead] | None = None,
                      loaded: Sequence[Entry] = ()) -> bool:
    """Pin ``seqs`` as the working set and unpin what an earlier pass pinned as such and
    they no longer name (an older copy of a file, one that no longer fits); a pin of the
    user's own or of the client's current context is left alone. ``loaded``: the messages
    of ``seqs`` no longer in the prompt (read from history), which come back behind the
    boundary. A message unpinned behind the boundary leaves the prompt (its content was
    never summarized: the index of reads keeps it, and it comes back when there is room).
    ``reads`` is stored as the index. The caller refreshes the views. Whether the pins
    changed."""
    state = ctx.state
    if reads is not None:
        state.reads = reads
    present = {e.seq for e in ctx.entries()}
    seqs = [s for s in seqs if s in present or any(e.seq == s for e in loaded)]
    if not working_changes(ctx, seqs):
        return False
    before = set(state.working)
    others = set(state.pinned) - before
    working = set(seqs) - others
    drop = before - working
    kept_users = {e.seq for e in ctx.kept if never_compressed(e)}
    ctx.kept = sorted([e for e in ctx.kept if e.seq not in drop or e.seq in kept_users]
                      + [e for e in loaded if e.seq in working and e.seq not in present], key=lambda e: e.seq)
    state.kept_seqs = [e.seq for e in ctx.kept]
    state.pinned = sorted(others | working)
    state.working = sorted(working)
    return True
