"""Would the provider accept this prompt? The structural rules that make OpenAI,
Anthropic and Ollama answer 400, checked on rendered messages.

Used by the tests that render and compress sessions (and replay long ones); each
function returns the list of problems found (empty: valid).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ctxd.protocol.message import Message, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ctxd.protocol.providers import (
    AnthropicMessage,
    AnthropicText,
    AnthropicThinking,
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


def validate_anthropic(system: str | list[AnthropicText] | None, messages: list[AnthropicMessage],
                       history: Sequence[Message] | None = None) -> list[str]:
    """``history``: the messages pushed (oldest first), to check the thinking of the turn in
    progress against (:func:`validate_turn_thinking`)."""
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
        problems += _thinking_problems(i, m)
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
    if history is not None:
        problems += validate_turn_thinking(history, messages)
    return problems


def _thinking_problems(i: int, m: AnthropicMessage) -> list[str]:
    """Thinking blocks go in assistant messages only, before everything else in theirs,
    signed (Anthropic checks the signature)."""
    problems = []
    other = False
    for j, block in enumerate(m.content):
        if not isinstance(block, AnthropicThinking):
            other = True
            continue
        if m.role != "assistant":
            problems.append(f"[{i}] thinking block in a {m.role} message")
        elif other:
            problems.append(f"[{i}] thinking block {j} after other content (it must open the message)")
        if not block.signature:
            problems.append(f"[{i}] thinking block {j} without its signature")
    return problems


def turn_in_progress(messages: list[AnthropicMessage]) -> list[int]:
    """The indexes of the assistant messages of the tool-use loop the prompt ends in (the
    last message holds tool results; each assistant message before it whose tool calls
    the next message answers, back to the last user message that is not tool results),
    newest first; empty when the prompt does not end in one."""
    out: list[int] = []
    i = len(messages) - 1
    while i >= 1 and messages[i].role == "user" and any(isinstance(b, AnthropicToolResult)
                                                        for b in messages[i].content):
        if messages[i - 1].role != "assistant" or not any(isinstance(b, AnthropicToolUse)
                                                          for b in messages[i - 1].content):
            break
        out.append(i - 1)
        i -= 2
    return out


def validate_turn_thinking(history: Sequence[Message], messages: list[AnthropicMessage]) -> list[str]:
    """With extended thinking on, Anthropic refuses a tool-use loop whose last assistant
    message does not start with its thinking blocks, as the model wrote them (signature
    included). ctxd's rule, stricter: every assistant message of the turn in progress
    that is sent opens with the signed thinking blocks ``history`` holds for the message
    that made its tool calls, unchanged (after those of a message merged into it), and the
    newest of them (the step the last results answer) is sent whenever ``history`` itself
    ends in such a loop."""
    problems: list[str] = []
    turn = turn_in_progress(messages)
    made: dict[str, list[Message]] = {}  # a call id -> the history messages that made it, oldest first
    for message in history:
        content = message.content
        ids = [c.id for c in message.tool_calls or ()]
        if message.role == "assistant" and isinstance(content, list):
            ids += [b.id for b in content if isinstance(b, ToolUseBlock)]
        for call_id in dict.fromkeys(ids):
            made.setdefault(call_id, []).append(message)
    for i in turn:  # (newest first: each takes the newest message left that made its first call)
        calls = [b.id for b in messages[i].content if isinstance(b, AnthropicToolUse)]
        sources = made.get(calls[0])
        if not sources:
            continue  # (a call ctxd made up: none of ctxd's, but not about thinking)
        source = sources.pop()
        want = [(b.thinking, b.signature) for b in source.content or ()
                if isinstance(b, ThinkingBlock) and b.signature]
        sent = messages[i].content
        lead = 0
        while lead < len(sent) and isinstance(sent[lead], AnthropicThinking):
            lead += 1
        have = [(b.thinking, b.signature) for b in sent[:lead] if isinstance(b, AnthropicThinking)]
        # (Merged with an assistant message before it, whose thinking then comes first.)
        if want and not any(have[k:k + len(want)] == want for k in range(lead - len(want) + 1)):
            problems.append(f"[{i}] the turn in progress: the assistant message of calls {calls} must start with "
                            f"its {len(want)} thinking block(s) as pushed (it starts with {len(have)} "
                            "thinking block(s), not those)")
    last = _history_loop_step(history)
    if last is not None:
        newest = [b.id for b in messages[turn[0]].content if isinstance(b, AnthropicToolUse)] if turn else []
        if not set(last) & set(newest):
            problems.append(f"[end] the turn in progress: the step answered last (calls {last}) is not sent "
                            "as the last assistant message")
    return problems


def _history_loop_step(history: Sequence[Message]) -> list[str] | None:
    """The call ids of the newest assistant message of ``history`` when ``history`` ends
    with results to its calls (a tool-use loop in progress), else None."""
    answered: set[str] = set()
    for message in reversed(history):
        content = message.content
        if message.role == "assistant":
            calls = [c.id for c in message.tool_calls or ()]
            if isinstance(content, list):
                calls += [b.id for b in content if isinstance(b, ToolUseBlock)]
            return calls if calls and answered & set(calls) else None
        if message.role == "tool" and message.tool_call_id:
            answered.add(message.tool_call_id)
        elif isinstance(content, list):
            ids = [b.tool_use_id for b in content if isinstance(b, ToolResultBlock)]
            if not ids:
                return None
            answered.update(ids)
        elif message.role != "system":
            return None
    return None


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
