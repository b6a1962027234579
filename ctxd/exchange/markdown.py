"""Markdown export: a session people can read (and ctxd can import again).

Roles as headings, tool calls and results folded in ``<details>``, long outputs
shortened on screen, compression points marked where each checkpoint ends. Every
message is also embedded whole in an HTML comment (invisible once rendered), which
is what ``session/import`` reads back, so the round trip is lossless.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from ctxd.exchange import DocumentError, ExportedMessage, SessionDocument
from ctxd.exchange.document import from_header, header
from ctxd.protocol.message import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    image_text,
    tool_result_text,
)

SHOW_LINES = 60
_COMMENT = re.compile(r"^<!-- ctxd:(session|message) (.*?) -->$", re.DOTALL | re.MULTILINE)
_LOOKALIKE = re.compile(r"^(<!-- ctxd:)", re.MULTILINE)
_ROLE = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}


def _hide(data: Any) -> str:
    # "--" cannot appear inside an HTML comment; \u002d decodes back to "-".
    return json.dumps(msgspec.to_builtins(data), ensure_ascii=False).replace("--", "-\\u002d")


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _shorten(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= SHOW_LINES:
        return text
    return "\n".join(lines[:SHOW_LINES]) + f"\n… ({len(lines) - SHOW_LINES} more lines)"


def _result(call_id: str, text: str, is_error: bool, names: dict[str, str]) -> str:
    name = names.get(call_id, "tool")
    lines = text.count("\n") + 1 if text else 0
    flag = " (error)" if is_error else ""
    return (f"<details><summary>Result of <code>{name}</code>{flag}, {lines} lines</summary>\n\n"
            f"{_fence(_shorten(text))}\n\n</details>")


def _call(name: str, arguments: str) -> str:
    try:
        pretty = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False) if arguments.strip() else ""
    except ValueError:
        pretty = arguments
    short = " ".join(arguments.split())
    short = short if len(short) <= 80 else short[:79] + "…"
    return (f"<details><summary>Tool call <code>{name}</code> {_html(short)}</summary>\n\n"
            f"{_fence(pretty, 'json')}\n\n</details>")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _defuse(text: str) -> str:
    """Message text quoting a ctxd export must not read as this document's data lines."""
    return _LOOKALIKE.sub("\u200b\\1", text)


def _body(m: Message, names: dict[str, str]) -> list[str]:
    out: list[str] = []
    content = m.content
    if m.role == "tool":
        text = content if isinstance(content, str) else "\n".join(
            b.text for b in content or () if isinstance(b, TextBlock))
        if text or not isinstance(content, list):
            out.append(_result(m.tool_call_id or "", text or "", False, names))
    elif isinstance(content, str):
        if content:
            out.append(content)
    for block in content if isinstance(content, list) else ():
        if isinstance(block, TextBlock):
            out.append(block.text)
        elif isinstance(block, ImageBlock):
            out.append(f"![{image_text(block)[1:-1]}]({block.url})" if block.url else image_text(block))
        elif isinstance(block, ThinkingBlock):
            out.append(f"<details><summary>Thinking</summary>\n\n{_fence(_shorten(block.thinking))}\n\n</details>")
        elif isinstance(block, ToolUseBlock):
            names[block.id] = block.name
            out.append(_call(block.name, json.dumps(block.input, ensure_ascii=False)))
        elif isinstance(block, ToolResultBlock):
            out.append(_result(block.tool_use_id, tool_result_text(block), block.is_error, names))
    for call in m.tool_calls or ():
        names[call.id] = call.name
        out.append(_call(call.name, call.text))
    return out


def export_markdown(doc: SessionDocument, exported_at: str) -> str:
    title = doc.title or f"Session {doc.session_id}"
    out = [f"<!-- ctxd:session {_hide(header(doc))} -->", f"# {title}", "",
           "| | |", "|---|---|", f"| Session | `{doc.session_id}` |"]
    if doc.model:
        out.append(f"| Model | {doc.model}" + (f" ({doc.provider})" if doc.provider else "") + " |")
    out += [f"| Created | {doc.created_at} |", f"| Messages | {len(doc.messages)} |",
            f"| Compressions | {len(doc.compressions)} |", f"| Exported | {exported_at} |", ""]
    if doc.system_prompt:
        out += ["<details><summary>System prompt</summary>", "", _fence(doc.system_prompt), "", "</details>", ""]
    if doc.goal:
        out += [f"**Goal:** {doc.goal.get('description', '')}", ""]
    ends: dict[int, list[dict[str, Any]]] = {}
    for cp in doc.checkpoints:
        ends.setdefault(int(cp.get("seqTo", 0)), []).append(cp)
    names: dict[str, str] = {}
    for item in doc.messages:
        m = item.message
        when = f" · {m.timestamp or item.created_at}" if (m.timestamp or item.created_at) else ""
        name = f" ({m.name})" if m.name else ""
        out += ["", f"<!-- ctxd:message {_hide({'seq': item.seq, 'createdAt': item.created_at, 'message': m})} -->",
                f"### {_ROLE.get(m.role, m.role)}{name} · #{item.seq}{when}", ""]
        out += [_defuse("\n\n".join(_body(m, names)))]
        for cp in ends.get(item.seq, ()):
            kind = cp.get("kind", "summary")
            out += ["", f"> **Compressed up to here** ({kind}, {cp.get('level', '')}): messages "
                        f"{cp.get('seqFrom')}–{cp.get('seqTo')}, {cp.get('originalTokens')} → {cp.get('tokens')} "
                        f"tokens, checkpoint `{cp.get('id')}`."]
    return "\n".join(out).rstrip() + "\n"


def is_ctxd_markdown(text: str) -> bool:
    return "<!-- ctxd:session " in text[:100_000]


def import_markdown(text: str) -> SessionDocument:
    head: dict[str, Any] | None = None
    messages: list[ExportedMessage] = []
    for match in _COMMENT.finditer(text):
        kind, raw = match.group(1), match.group(2)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            line = text.count("\n", 0, match.start()) + 1
            raise DocumentError(f"line {line}: damaged ctxd:{kind} comment ({exc})") from None
        if kind == "session":
            head = data
        else:
            try:
                messages.append(ExportedMessage(int(data["seq"]), data.get("createdAt", ""),
                                                msgspec.convert(data["message"], Message)))
            except (KeyError, TypeError, ValueError, msgspec.ValidationError) as exc:
                line = text.count("\n", 0, match.start()) + 1
                raise DocumentError(f"line {line}: damaged message ({exc})") from None
    if head is None:
        raise DocumentError("not a ctxd Markdown export (no ctxd:session comment)")
    return from_header(head, messages)
