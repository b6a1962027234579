"""The turn in progress keeps its thinking: an agent's tool-use loop with Anthropic's
extended thinking, far longer than the window, compressed by the real passes (pruning,
summaries, excerpts of an output bigger than the prompt), and every Anthropic prompt
checked against what was pushed (``validate_anthropic(..., history=)``): each assistant
message of the loop that is sent opens with its thinking blocks, signatures intact, and
the step answered last is always sent."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.engine.validate import turn_in_progress, validate_anthropic, validate_openai
from ctxd.protocol.message import Message
from ctxd.protocol.providers import AnthropicMessage, AnthropicThinking, OpenAIMessage
from ctxd.service import prompt, sessions
from ctxd.service.core import Service

from .service_helpers import params

SID = "thinking-loop"
WINDOW = 4096


def _step(n: int, output_words: int) -> list[dict[str, Any]]:
    """One step of the loop: the model's thinking (a visible summary), a word and a tool
    call, then the tool's output."""
    thought = f"step {n}: the tests said something about rounding; " + " ".join(f"idea{n}x{k}" for k in range(30))
    return [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": thought, "signature": f"EqQBCkYIBRgCKkD{n:04d}signature"},
            {"type": "text", "text": f"Step {n}: running the next command."},
            {"type": "tool_use", "id": f"toolu_{n:02d}", "name": "Bash", "input": {"command": f"python3 step{n}.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "toolUseId": f"toolu_{n:02d}",
             "content": "\n".join(f"line {k} of the output of step {n}: value {k * n}"
                                  for k in range(output_words // 12))}]},
    ]


async def _prompt(svc: Service, fmt: str, push: list[dict[str, Any]]) -> Any:
    return await prompt.prompt(svc, params("context/prompt", sessionId=SID, format=fmt, push=push))


def _anthropic(result: Any) -> list[AnthropicMessage]:
    return msgspec.convert(msgspec.to_builtins(result.messages), list[AnthropicMessage])


async def test_a_long_thinking_tool_loop_keeps_the_thinking_of_its_turn(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="claude-sonnet-4-6",
                                                  provider="anthropic", contextWindow=WINDOW,
                                                  systemPrompt="You are a coding agent."))
    task = "Fix the rounding bug in pricing.py, then run the tests."
    pushed: list[dict[str, Any]] = [{"role": "user", "content": task}]
    result = await _prompt(service, "anthropic", pushed)
    # Outputs of every size: small ones, some the pruning horizon clears, and one bigger
    # than any prompt the window allows (sent as an excerpt: it is the newest).
    sizes = [200, 900, 150, 1200, 300, 2500, 100, 600, 6000, 250, 400]
    excerpted = compressed = False
    for n, size in enumerate(sizes):
        step = _step(n, size)
        pushed += step
        result = await _prompt(service, "anthropic", step)
        history = [msgspec.convert(m, Message) for m in pushed]
        messages = _anthropic(result)
        assert validate_anthropic(result.system, messages, history=history) == [], n
        assert result.tokens <= result.budget.max_prompt_tokens, n
        turn = turn_in_progress(messages)
        # The step answered last is sent whole: its thinking first, as the model wrote it.
        newest = messages[turn[0]]
        assert newest.content[0] == AnthropicThinking(step[0]["content"][0]["thinking"],
                                                      step[0]["content"][0]["signature"]), n
        assert [b.id for b in newest.content if hasattr(b, "input")] == [f"toolu_{n:02d}"]
        excerpted = excerpted or "left out by ctxd" in str(msgspec.to_builtins(messages[-1]))
        compressed = compressed or result.compression_count > 0
        # The OpenAI shape has no place for it, and stays valid.
        openai = await _prompt(service, "openai", [])
        assert validate_openai(msgspec.convert(msgspec.to_builtins(openai.messages), list[OpenAIMessage])) == []
        assert "signature" not in str(msgspec.to_builtins(openai.messages))
    assert compressed and excerpted  # (the loop did go through the passes this is about)
    # The model answers and the user speaks: no loop in progress; the prompt stays valid.
    end = [{"role": "assistant", "content": [
              {"type": "thinking", "thinking": "done", "signature": "EqQBCkYIBRgCKkDdone"},
              {"type": "text", "text": "Fixed: prices round half up now."}]},
           {"role": "user", "content": "Thanks. Now the changelog, please."}]
    pushed += end
    result = await _prompt(service, "anthropic", end)
    messages = _anthropic(result)
    assert turn_in_progress(messages) == []
    assert validate_anthropic(result.system, messages,
                              history=[msgspec.convert(m, Message) for m in pushed]) == []
