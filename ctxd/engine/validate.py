"""Would the provider accept this prompt? The structural rules that make OpenAI,
Anthropic and Ollama answer 400, checked on rendered messages.

Used by compression's validation stage and by the tests that replay long sessions;
each function returns the list of problems found (empty: valid).
"""

from __future__ import annotations

import msgspec

from ctxd.protocol.providers import (
    AnthropicMessage,
    AnthropicText,
    AnthropicToolResult,
    AnthropicToolUse,
    OllamaMessage,
    OpenAIMessage,
)


def validate_openai(messages: list[OpenAIMessage]) -> list[str]:
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.role == "tool":
            if m.tool_call_id not in open_calls:
                problems.append(f"[{i}] tool message {m.tool_call_id!r} answers no pending tool call")
            else:
                open_calls.discard(m.tool_call_id)
            continue
        if open_calls:
            problems.append(f"[{i}] {m.role} message before results of calls {sorted(open_calls)}")
            open_calls = set()
        if m.role == "assistant":
            if not m.content and not m.tool_calls:
                problems.append(f"[{i}] assistant message with neither content nor tool_calls")
            ids = [c.id for c in m.tool_calls or ()]
            if len(set(ids)) != len(ids):
                problems.append(f"[{i}] duplicate tool call ids {ids}")
            open_calls = set(ids)
        elif not m.content:
            problems.append(f"[{i}] empty {m.role} message")
    if open_calls:
        problems.append(f"[end] tool calls without results {sorted(open_calls)}")
    return problems


def validate_anthropic(system: "str | list[AnthropicText] | None", messages: list[AnthropicMessage]) -> list[str]:
    problems: list[str] = []
    if isinstance(system, list):  # (typed blocks, or the decoded JSON of a prompt result)
        blocks = [b if isinstance(b, AnthropicText) else msgspec.convert(b, AnthropicText) for b in system]
        if any(not b.text for b in blocks):
            problems.append("system: empty text block")
    if not messages:
        return problems
    if messages[0].role != "user":
        problems.append("[0] first message is not a user message")
    previous_calls: set[str] = set()
    for i, m in enumerate(messages):
        if i and messages[i - 1].role == m.role:
            problems.append(f"[{i}] two {m.role} messages in a row")
        if not m.content:
            problems.append(f"[{i}] empty content")
        has_text = any(isinstance(b, AnthropicText) and b.text.strip() for b in m.content)
        for block in m.content:
            if isinstance(block, AnthropicText) and not block.text:
                problems.append(f"[{i}] empty text block")
            elif isinstance(block, AnthropicText) and not block.text.strip() and not has_text:
                problems.append(f"[{i}] text block without non-whitespace text")
        if m.role == "user":
            results = [b for b in m.content if isinstance(b, AnthropicToolResult)]
            ids = {b.tool_use_id for b in results}
            if previous_calls and ids != previous_calls:
                problems.append(f"[{i}] results {sorted(ids)} do not answer calls {sorted(previous_calls)}")
            if not previous_calls and results:
                problems.append(f"[{i}] tool_result without a tool_use in the previous message")
            seen_other = False
            for block in m.content:
                if isinstance(block, AnthropicToolResult):
                    if seen_other:
                        problems.append(f"[{i}] tool_result after other content")
                        break
                else:
                    seen_other = True
            previous_calls = set()
        else:
            if any(isinstance(b, AnthropicToolResult) for b in m.content):
                problems.append(f"[{i}] tool_result in an assistant message")
            previous_calls = {b.id for b in m.content if isinstance(b, AnthropicToolUse)}
            if i == len(messages) - 1:
                last = m.content[-1] if m.content else None
                if isinstance(last, AnthropicText) and last.text != last.text.rstrip():
                    problems.append(f"[{i}] final assistant text ends with whitespace")
    if previous_calls and messages[-1].role == "assistant":
        problems.append(f"[end] tool calls without results {sorted(previous_calls)}")
    return problems


def validate_ollama(messages: list[OllamaMessage]) -> list[str]:
    problems: list[str] = []
    expected = 0
    for i, m in enumerate(messages):
        if m.role == "tool":
            if expected <= 0:
                problems.append(f"[{i}] tool message without a pending tool call")
            expected -= 1
            continue
        if expected > 0:
            problems.append(f"[{i}] {m.role} message before all tool results arrived")
        expected = len(m.tool_calls or ()) if m.role == "assistant" else 0
        if m.role == "assistant":
            for call in m.tool_calls or ():
                if not isinstance(call.function.arguments, dict):
                    problems.append(f"[{i}] tool call arguments are not an object")
        elif not m.content:
            problems.append(f"[{i}] empty {m.role} message")
    if expected > 0:
        problems.append("[end] tool calls without results")
    return problems
