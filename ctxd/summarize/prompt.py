"""The summarization prompt: pure, deterministic text building.

It merges three designs' prompts: the level instruction and size target of the
six-stage compression pipeline, the PRESERVE / SUMMARIZE AGGRESSIVELY lists of
goal-aware compression, and the continuation-prompt framing of three-layer compaction
(accomplished, current work, files, next steps, decisions). Decisions, artifacts and
next steps are asked for as goal markers (``[DECISION]`` / ``[ARTIFACT]`` / ``[NEXT]``) inside the headings, so the
engine's extraction can read them back out of a summary when it ages.

Messages are rendered one per block as ``ROLE: text``; tool calls become
``→ tool name(args)`` lines and tool results are cut to their head and tail (keeping
error lines from the middle), because results are the bulk of agent transcripts and
rarely matter beyond their outcome.

The model gets the same target and the same list of what must survive as the
extractive summarizer uses (``extractive.must_survive``): files, errors, decisions and
next steps, and the names, numbers and dates of the most salient sentences. A chat
(people talking, no tools) is rendered ``[8 May 2023] Caroline: text`` when the
messages carry a speaker or a date, and the model is asked for a condensed transcript
that keeps who said what and when, instead of the coding-agent headings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from ctxd.engine.extract import error_lines
from ctxd.llm.base import ChatTurn
from ctxd.protocol.message import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    tool_result_text,
)
from ctxd.summarize.base import Level, SummaryRequest
from ctxd.summarize.chat import date_of, is_chat, is_chat_request, speaker_of
from ctxd.summarize.survive import MustSurvive, must_survive

RESULT_CHARS: dict[Level, int] = {"detailed": 2000, "moderate": 1200, "compact": 700, "ultra": 400}
ARGS_CHARS: dict[Level, int] = {"detailed": 600, "moderate": 300, "compact": 200, "ultra": 160}
THINKING_CHARS = 400

LEVEL_INSTRUCTIONS: dict[Level, str] = {
    "detailed": ("Write a DETAILED summary. Keep key decisions with their reasons, the code that matters "
                 "(short snippets only), exact file paths, commands, error messages and identifiers."),
    "moderate": ("Write a MODERATE summary: main points only. Refer to code by file and symbol name "
                 "instead of quoting it."),
    "compact": ("Write a COMPACT summary: critical information only. No code, no explanations, "
                "no intermediate steps."),
    "ultra": ("Write an ULTRA-COMPACT summary: a few lines holding only the context needed to "
              "continue."),
}

_SECTIONS = """Write it as a continuation prompt for someone who resumes this work WITHOUT the history.
Use these headings, and leave out any heading that would be empty:
## Accomplished
What was done so far.
## Current work
What was in progress when the conversation stopped.
## Files
One line per file created or modified: [ARTIFACT] Created|Modified <path> - <key change>
## Decisions
One line per decision: [DECISION] <decision> (and why, briefly)
## User instructions
Requirements and constraints the user stated, quoted word for word.
## Errors
Unresolved errors or blockers, with the exact message.
## Next steps
One line per planned step: [NEXT] <step>"""

_ULTRA_FORMAT = """Use plain lines, no headings: what the work is, the state it reached, each decision as a
[DECISION] line, the files as one [ARTIFACT] line, and the next step as a [NEXT] line."""

_RULES = """Rules:
- Quote the user's instructions and requirements verbatim; never paraphrase or drop them.
- Keep decisions marked LOCKED (or 🔒) word for word.
- Keep identifiers exact: file paths, function and class names, commands, error messages, numbers.
- Do not add anything that is not in the text below. Be technical and specific.
- Answer with the summary only: no preamble, no closing remarks."""

CHAT_LEVEL_INSTRUCTIONS: dict[Level, str] = {
    "detailed": "Write a DETAILED summary: every fact, event, plan and preference that was mentioned.",
    "moderate": "Write a MODERATE summary: the main facts, events and plans.",
    "compact": "Write a COMPACT summary: only the facts most likely to be asked about later.",
    "ultra": "Write an ULTRA-COMPACT summary: a few lines with the facts most worth remembering.",
}

_CHAT_FORMAT = """This is a conversation between people. Write the summary as a condensed transcript,
oldest first, one line per statement worth keeping, in the form
[<session date>] <Speaker>: <what they said>
Always keep who said it and the date of the session it was said in; keep relative times
("yesterday", "last week") together with that date. Quote their own words where they carry
facts. Keep every name, place, number, date, event, plan and preference; leave out
greetings, thanks and small talk."""

_CHAT_RULES = """Rules:
- Never attribute words, events or feelings to the wrong person.
- Keep names, places, numbers and dates exactly as written.
- Do not add anything that is not in the text below.
- Answer with the summary only: no preamble, no closing remarks."""

_GOAL_RULES = """Focus on progress toward the goal.
PRESERVE: decisions made toward the goal, checkpoints completed, files created or modified,
blockers encountered, technical details relevant to the goal, next steps planned.
SUMMARIZE AGGRESSIVELY: off-topic discussion, exploration, debugging steps that succeeded,
repeated information."""


def approx_words(tokens: int) -> int:
    return max(5, int(tokens * 0.75))


def system_prompt(request: SummaryRequest, *, part: tuple[int, int] | None = None, chat: bool | None = None) -> str:
    """Instructions: task, level, size, format, rules (the same for every chunk of a request)."""
    if chat is None:
        chat = is_chat_request(request)
    if request.kind == "checkpoint_merge":
        task = ("You merge earlier summaries (checkpoints) of one conversation, given oldest first, "
                "into ONE summary. When they disagree, the later one wins. ")
        task += ("Keep the lines that still matter whole, in order, each with its date (a line that is "
                 "only [a date] dates the lines under it), and drop the rest." if chat else
                 "Keep every decision, file and open next step that still matters.")
    elif chat:
        task = ("You summarize a long conversation between people so that questions about it (who, what, "
                "when, where, how many) can be answered from the summary alone.")
    else:
        task = "You summarize a conversation history so that the work can continue from the summary alone."
    if part is not None:
        index, total = part
        task += (f" The text below is part {index} of {total} of a longer input: summarize only this part; "
                 "the parts are merged afterwards.")
    size = (f"Length: at most {request.target_tokens} tokens (about {approx_words(request.target_tokens)} "
            "words). Shorter is fine; longer is not. When the text holds that much worth keeping, use the "
            "room: keep more facts rather than fewer.")
    if chat:
        return "\n\n".join((task, CHAT_LEVEL_INSTRUCTIONS[request.level] + " " + size, _CHAT_FORMAT, _CHAT_RULES))
    layout = _ULTRA_FORMAT if request.level == "ultra" else _SECTIONS
    return "\n\n".join((task, LEVEL_INSTRUCTIONS[request.level] + " " + size, layout, _RULES))


def user_prompt(request: SummaryRequest, transcript: str, *, part: tuple[int, int] | None = None,
                must: MustSurvive | None = None) -> str:
    """The goal block, the focus, what must survive, the text to summarize and the closing instruction."""
    pieces: list[str] = []
    if request.goal and request.goal.strip():
        pieces.append(request.goal.strip() + "\n\n" + _GOAL_RULES)
    if request.focus and request.focus.strip():
        pieces.append(f"The user asked that this summary focus on: {request.focus.strip()}\n"
                      "Give that topic more room and keep the rest brief.")
    if must is not None:
        listed = must_survive_block(must, request.target_tokens, part=part)
        if listed:
            pieces.append(listed)
    chat = must.chat if must is not None else is_chat_request(request)
    header = "CHECKPOINTS TO MERGE (oldest first):" if request.kind == "checkpoint_merge" \
        else "CONVERSATION TO SUMMARIZE:"
    if part is not None:
        header = header.rstrip(":") + f" (part {part[0]} of {part[1]}):"
    pieces.append(header + "\n" + transcript)
    purpose = "keeps who said what, and when" if chat else "keeps what is needed to continue the work"
    pieces.append(f"Now write the {request.level.upper()} summary (at most {request.target_tokens} tokens) "
                  f"that {purpose}.")
    return "\n\n".join(pieces)


def must_survive_block(must: MustSurvive, target_tokens: int, *, part: tuple[int, int] | None = None) -> str:
    """The MUST SURVIVE list, bounded to about half the target (a list longer than the
    summary may be cannot all survive), most important kinds first."""
    budget = max(240, min(target_tokens * 2, 4000))  # characters
    rows = [("Decisions", must.decisions, " | "), ("Files", must.files, ", "), ("Errors", must.errors, " | "),
            ("Next steps", must.next_steps, " | "), ("Speakers", must.speakers, ", "),
            ("Session dates", must.dates, ", "), ("Names", must.names, ", "),
            ("Numbers and dates", must.numbers, ", ")]
    lines: list[str] = []
    used = 0
    for label, values, separator in rows:
        kept: list[str] = []
        share = max(80, budget // 3)
        spent = 0
        for value in values:
            cost = len(value) + len(separator)
            if used + spent + cost > budget or spent + cost > share:
                break
            kept.append(value)
            spent += cost
        if kept:
            lines.append(f"- {label}: {separator.join(kept)}")
            used += spent + len(label) + 4
    if not lines:
        return ""
    where = ("found in the whole conversation; keep those that appear in this part" if part is not None
             else "found in the text below")
    return (f"MUST SURVIVE ({where}). Keep each of these in the summary, written exactly as here, "
            "unless a later message makes it obsolete:\n" + "\n".join(lines))


def build_prompt(request: SummaryRequest, *, rendered: Sequence[str] | None = None,
                 part: tuple[int, int] | None = None, must: MustSurvive | None = None) -> list[ChatTurn]:
    """The system and user turns for one summarization call.

    ``rendered`` are pre-rendered messages (a chunk of ``render_messages``); by default
    every message of the request is rendered. ``part`` is (index, total) for a chunk.
    ``must`` is ``must_survive(request)`` (computed here when not given; a caller making
    several calls for one request computes it once).
    """
    if must is None:
        must = must_survive(request)
    if rendered is None:
        rendered = render_messages(request, chat=must.chat)
    transcript = "\n\n".join(rendered)
    return [ChatTurn("system", system_prompt(request, part=part, chat=must.chat)),
            ChatTurn("user", user_prompt(request, transcript, part=part, must=must))]


def render_messages(request: SummaryRequest, *, chat: bool | None = None) -> list[str]:
    """Every message of the request rendered for the prompt, one string each. In a chat,
    a message with a speaker or a date is labelled ``[8 May 2023] Caroline``."""
    names = tool_names(request.messages)
    result_chars = RESULT_CHARS[request.level]
    args_chars = ARGS_CHARS[request.level]
    if chat is None:
        chat = request.kind != "checkpoint_merge" and is_chat(request.messages)
    out: list[str] = []
    checkpoint = 0
    for message in request.messages:
        label = None
        if request.kind == "checkpoint_merge" and message.role == "assistant":
            checkpoint += 1
            label = f"CHECKPOINT {checkpoint}"
        elif chat and message.role in ("user", "assistant"):
            label = chat_label(message)
        text = render_message(message, tool_names=names, result_chars=result_chars, args_chars=args_chars,
                              label=label)
        if text:
            out.append(text)
    return out


def chat_label(message: Message) -> str | None:
    """``[8 May 2023] Caroline`` for a chat turn that has a speaker or a date (None otherwise)."""
    metadata = message.metadata or {}
    has_speaker = bool(message.name) or isinstance(metadata.get("speaker"), str)
    date = date_of(message)
    if not has_speaker and not date:
        return None
    speaker = speaker_of(message) if has_speaker else message.role.upper()
    return f"[{date}] {speaker}" if date else speaker


def tool_names(messages: Sequence[Message]) -> dict[str, str]:
    """tool call id -> tool name, for labelling results that carry only the id."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.tool_calls or ():
            names[call.id] = call.name
        if isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolUseBlock):
                    names[block.id] = block.name
    return names


def render_message(message: Message, *, tool_names: Mapping[str, str] | None = None, result_chars: int = 1200,
                   args_chars: int = 300, label: str | None = None) -> str:
    """One message as prompt text: ``ROLE: text``, ``→ tool name(args)``, ``TOOL RESULT (name): ...``."""
    names = tool_names or {}
    role = label or message.role.upper()
    lines: list[str] = []
    content = message.content
    if message.role == "tool":
        name = message.name or names.get(message.tool_call_id or "", "tool")
        text = content if isinstance(content, str) else "\n".join(
            b.text if isinstance(b, TextBlock) else tool_result_text(b) if isinstance(b, ToolResultBlock) else ""
            for b in content or ())
        return f"TOOL RESULT ({name}): {cut_middle(text.strip(), result_chars)}"
    if isinstance(content, str):
        if content.strip():
            lines.append(f"{role}: {content.strip()}")
    elif content:
        for block in content:
            if isinstance(block, TextBlock):
                if block.text.strip():
                    lines.append(f"{role}: {block.text.strip()}")
            elif isinstance(block, ToolUseBlock):
                args = msgspec.json.encode(block.input).decode()
                lines.append(f"→ tool {block.name}({cut_middle(args, args_chars)})")
            elif isinstance(block, ToolResultBlock):
                name = names.get(block.tool_use_id, "tool")
                kind = "TOOL ERROR" if block.is_error else "TOOL RESULT"
                lines.append(f"{kind} ({name}): {cut_middle(tool_result_text(block).strip(), result_chars)}")
            elif isinstance(block, ThinkingBlock):
                if block.thinking.strip():
                    lines.append(f"{role} (thinking): {cut_middle(block.thinking.strip(), THINKING_CHARS)}")
    for call in message.tool_calls or ():
        lines.append(f"→ tool {call.name}({cut_middle(call.text, args_chars)})")
    return "\n".join(lines)


def cut_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: head and tail kept, error lines of the
    middle kept too, and a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    head_len = int(limit * 0.6)
    tail_len = max(0, limit - head_len - 40)
    head = text[:head_len]
    cut = head.rfind("\n")
    if cut > head_len // 2:
        head = head[:cut]
    tail = text[len(text) - tail_len:] if tail_len else ""
    cut = tail.find("\n")
    if 0 <= cut < len(tail) // 2:
        tail = tail[cut + 1:]
    middle = text[len(head): len(text) - len(tail)]
    kept = [line for line in error_lines(middle, 3) if line not in tail]
    omitted = len(middle)
    marker = f"[… {omitted} characters omitted …]"
    parts = [head.rstrip(), marker]
    parts.extend(kept)
    if tail.strip():
        parts.append(tail.lstrip("\n"))
    return "\n".join(parts)
