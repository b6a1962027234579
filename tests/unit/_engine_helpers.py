"""Small builders for the engine tests: messages in both tool-call styles, history
entries counted with a real (exact, offline) token counter, and active contexts."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ctxd.engine.budget import BudgetPolicy, budget_for, compute_budget
from ctxd.engine.context import ActiveContext, CompressionState, Entry
from ctxd.protocol.compression import Checkpoint
from ctxd.protocol.context import Budget
from ctxd.protocol.message import (
    FunctionCall,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
)
from ctxd.tokens import TokenCounter

COUNTER = TokenCounter.for_model("gpt-4")
count = COUNTER.count

NOW = "2026-01-27T10:00:00Z"


WORDS = ("data", "code", "file", "test", "user", "text", "line", "time", "work", "list",
         "page", "note", "item", "name", "case", "plan", "form", "road", "tree", "bird")
"""Words that are one token each with cl100k (so ``words(n, w)`` is exactly ``n`` tokens)."""


def words(n: int, word: str = "data") -> str:
    """About ``n`` tokens of text (one token per repeated word with cl100k)."""
    return " ".join([word] * n)


# --- messages -------------------------------------------------------------------------


def system(text: str) -> Message:
    return Message(role="system", content=text)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def thinking(text: str, thought: str = "hmm") -> Message:
    return Message(role="assistant", content=[ThinkingBlock(thinking=thought), TextBlock(text=text)])


def signed(message: Message, thought: str = "", signature: str | None = None) -> Message:
    """``message`` (an assistant message) opened by an Anthropic thinking block with its
    signature, as a client pushes what the model wrote."""
    content = message.content
    blocks: list[Any] = [TextBlock(text=content)] if isinstance(content, str) else list(content or [])
    sig = signature if signature is not None else f"sig-{abs(hash((thought, repr(blocks)))) % 10**8}"
    return Message(role="assistant", content=[ThinkingBlock(thinking=thought, signature=sig), *blocks],
                   tool_calls=message.tool_calls)


def a_call(*calls: tuple[str, str] | tuple[str, str, dict[str, Any]], text: str | None = None) -> Message:
    """Anthropic style: an assistant message with ``tool_use`` blocks ((id, name[, input]), ...)."""
    blocks: list[Any] = [TextBlock(text=text)] if text else []
    for call in calls:
        call_id, name = call[0], call[1]
        arguments = call[2] if len(call) > 2 else {"path": f"/src/{call_id}.py"}  # type: ignore[misc]
        blocks.append(ToolUseBlock(id=call_id, name=name, input=arguments))
    return Message(role="assistant", content=blocks)


def a_result(*results: tuple[str, str], text: str | None = None, error: bool = False) -> Message:
    """Anthropic style: a user message with ``tool_result`` blocks ((id, output), ...)."""
    blocks: list[Any] = [ToolResultBlock(tool_use_id=i, content=out, is_error=error) for i, out in results]
    if text:
        blocks.append(TextBlock(text=text))
    return Message(role="user", content=blocks)


def o_call(*calls: tuple[str, str] | tuple[str, str, Any], text: str | None = None) -> Message:
    """OpenAI style: an assistant message with ``tool_calls`` ((id, name[, arguments]), ...)."""
    out = []
    for call in calls:
        call_id, name = call[0], call[1]
        arguments = call[2] if len(call) > 2 else {"path": f"/src/{call_id}.py"}  # type: ignore[misc]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments)))
    return Message(role="assistant", content=text, tool_calls=out)


def o_result(call_id: str, output: str) -> Message:
    """OpenAI style: a ``role: tool`` message."""
    return Message(role="tool", tool_call_id=call_id, content=output)


# --- entries and contexts -------------------------------------------------------------


def entry(seq: int, message: Message) -> Entry:
    return Entry.of(seq, message, COUNTER.count_message(message))


def entries(messages: Iterable[Message], start: int = 1) -> list[Entry]:
    return [entry(start + i, m) for i, m in enumerate(messages)]


def refresh(ctx: ActiveContext, protected: tuple[str, ...] = ()) -> ActiveContext:
    """What the service does after every state change: system part, then views."""
    ctx.refresh_system(count)
    ctx.refresh(count, protected)
    return ctx


def make_ctx(messages: Iterable[Message], *, system_prompt: str | None = None,
             state: CompressionState | None = None, checkpoints: list[Checkpoint] | None = None,
             pinned: Iterable[int] = (), protected: tuple[str, ...] = (), start: int = 1,
             goal_text: str | None = None) -> ActiveContext:
    """An active context with every message after the boundary (seqs from ``start``)."""
    state = state or CompressionState()
    state.pinned = sorted(set(state.pinned) | set(pinned))
    ctx = ActiveContext(system_prompt=system_prompt, state=state, checkpoints=list(checkpoints or []),
                        recent=entries(messages, start), goal_text=goal_text)
    return refresh(ctx, protected)


def budget_of(ctx: ActiveContext, *, window: int = 8192, output_limit: int | None = 1000,
              policy: BudgetPolicy | None = None) -> Budget:
    return budget_for(policy or BudgetPolicy(), context_window=window, output_limit=output_limit,
                      system_tokens=ctx.system_tokens, pinned_tokens=ctx.pinned_tokens,
                      checkpoint_tokens=ctx.checkpoint_tokens, used=ctx.used)


def simple_budget(window: int, *, used: int = 0, system_tokens: int = 0, checkpoint_tokens: int = 0,
                  trigger_fraction: float = 0.8) -> Budget:
    """A budget with round figures: the whole window usable, nothing reserved, no margin."""
    return compute_budget(context_window=window, usable_fraction=1.0, reserved_output=0, safety_margin=0,
                          trigger_fraction=trigger_fraction, system_tokens=system_tokens,
                          checkpoint_tokens=checkpoint_tokens, used=used)


def seqs(items: Iterable[Entry]) -> list[int]:
    return [e.seq for e in items]
