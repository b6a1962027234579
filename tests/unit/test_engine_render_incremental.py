"""The incremental renderer gives exactly what a full render gives, after every push."""

from __future__ import annotations

import random

import msgspec
import pytest

from ctxd.engine.render import RENDERERS, IncrementalRenderer, PromptPlan
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

count = TokenCounter.for_encoding("cl100k_base").count


def conversation(seed: int, n: int) -> list[Message]:
    """Both tool-call styles, late results, results never pushed, orphans, mid-conversation
    system messages, whitespace-only text, signed thinking (assistant messages in a row
    merge in the Anthropic shape, thinking first)."""
    rng = random.Random(seed)
    out: list[Message] = [Message(role="system", content="You are an agent.")]
    open_calls: list[str] = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.25:
            out.append(Message(role="user", content=rng.choice([f"question {i}", "  ", f"do thing {i}\n"])))
        elif kind < 0.45:
            call = f"c{i}"
            if rng.random() < 0.5:
                out.append(Message(role="assistant", content=f"calling {i}",
                                   tool_calls=[ToolCall(id=call, function=FunctionCall(name="bash",
                                                                                        arguments='{"cmd": "ls"}'))]))
            else:
                # (Now and then opened by signed thinking, which the Anthropic shape sends.)
                thought = [ThinkingBlock(thinking=f"why {i}", signature=f"s{i}")] if i % 2 else []
                out.append(Message(role="assistant", content=[*thought, TextBlock(text=f"using {i} "),
                                                              ToolUseBlock(id=call, name="read", input={"p": i})]))
            open_calls.append(call)
        elif kind < 0.7 and open_calls:
            call = open_calls.pop(rng.randrange(len(open_calls)))
            if rng.random() < 0.5:
                out.append(Message(role="tool", tool_call_id=call, content=f"output {i}"))
            else:
                out.append(Message(role="user", content=[ToolResultBlock(tool_use_id=call, content=f"res {i}")]))
        elif kind < 0.78:
            out.append(Message(role="tool", tool_call_id=f"ghost{i}", content="orphan"))
        elif kind < 0.82:
            out.append(Message(role="system", content=f"note {i}"))
        elif kind < 0.9:
            out.append(Message(role="assistant", content=rng.choice([f"answer {i}", f"answer {i}  \n"])))
        else:
            out.append(Message(role="assistant", content=[ThinkingBlock(thinking="", signature=f"t{i}"),
                                                          TextBlock(text=f"said {i}")]))
    return out


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "ollama"])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_equals_full_after_every_push(fmt, seed):
    messages = conversation(seed, 160)
    renderer = IncrementalRenderer(fmt)
    context = ["## goal", "## checkpoints"] if seed % 2 else []
    system = ["sys prompt"] if seed % 3 else []
    for n in range(1, len(messages) + 1):
        plan = PromptPlan(system_parts=system, messages=messages[:n], context_parts=context)
        got = renderer.render(plan, count)
        want = RENDERERS[fmt](plan, count)
        assert msgspec.json.encode(got.messages) == msgspec.json.encode(want.messages), n
        assert (got.system, got.extra_tokens, got.format_tokens, got.repairs, got.system_head) == \
               (want.system, want.extra_tokens, want.format_tokens, want.repairs, want.system_head), n
    assert len(renderer.prefix) > 50  # the reused part grew with the conversation


def test_a_changed_message_renders_everything_again():
    messages = conversation(1, 80)
    renderer = IncrementalRenderer("openai")
    renderer.render(PromptPlan(system_parts=[], messages=messages), count)
    changed = list(messages)
    changed[5] = Message(role="user", content="edited by a compression")
    got = renderer.render(PromptPlan(system_parts=[], messages=changed), count)
    want = RENDERERS["openai"](PromptPlan(system_parts=[], messages=changed), count)
    assert msgspec.json.encode(got.messages) == msgspec.json.encode(want.messages)


def _call(call_id: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=FunctionCall(name="bash",
                                                                                         arguments='{"cmd": "ls"}'))])


def _same_after_every_push(messages: list[Message]) -> None:
    for fmt in ("openai", "anthropic", "ollama"):
        renderer = IncrementalRenderer(fmt)
        for n in range(1, len(messages) + 1):
            plan = PromptPlan(system_parts=["sys"], messages=messages[:n])
            got, want = renderer.render(plan, count), RENDERERS[fmt](plan, count)
            assert msgspec.json.encode(got.messages) == msgspec.json.encode(want.messages), (fmt, n)
            assert got.repairs == want.repairs, (fmt, n)
        fresh = IncrementalRenderer(fmt).render(PromptPlan(system_parts=["sys"], messages=messages), count)
        whole = RENDERERS[fmt](PromptPlan(system_parts=["sys"], messages=messages), count)
        assert msgspec.json.encode(fresh.messages) == msgspec.json.encode(whole.messages), fmt


def test_a_result_arriving_long_after_its_call_moves_up_as_in_a_full_render():
    messages = [Message(role="user", content="task"), _call("X")]
    messages += [Message(role="user" if i % 2 == 0 else "assistant", content=f"turn {i}") for i in range(40)]
    messages += [_call("Y"), Message(role="tool", tool_call_id="X", content="late result of X")]
    _same_after_every_push(messages)


def test_call_ids_repeated_before_their_results_pair_as_in_a_full_render():
    # Clients that number their calls per turn reuse ids.
    messages = [Message(role="user", content="go"), _call("0"), _call("0"),
                Message(role="tool", tool_call_id="0", content="first"),
                Message(role="tool", tool_call_id="0", content="second")]
    messages += [Message(role="user" if i % 2 == 0 else "assistant", content=f"t{i}") for i in range(12)]
    _same_after_every_push(messages)


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "ollama"])
@pytest.mark.parametrize("seed", range(6))
def test_append_equals_full_render(fmt, seed):
    """``append`` (the caller hands over only the messages pushed since) gives what a full
    render of the whole plan gives, whatever came before it: pushes of one or several
    messages, and now and then a change before them (a compression) rendered whole."""
    rng = random.Random(seed)
    messages = conversation(seed, 160)
    renderer = IncrementalRenderer(fmt)
    context = ["## goal", "## checkpoints"] if seed % 2 else []
    system = ["sys prompt"] if seed % 3 else []
    current = messages[:1]
    renderer.render(PromptPlan(system_parts=system, messages=current, context_parts=context), count)
    n = 1
    while n < len(messages):
        step = rng.choice([1, 1, 1, 2, 3, 9])
        new = messages[n:n + step]
        n += len(new)
        if rng.random() < 0.05:  # a change before the new messages: the whole plan again
            current = [Message(role="user", content=f"summary {n}")] + current[len(current) // 2:] + new
            got = renderer.render(PromptPlan(system_parts=system, messages=current, context_parts=context), count)
        else:
            current = current + new
            got = renderer.append(new, count)
        want = RENDERERS[fmt](PromptPlan(system_parts=system, messages=current, context_parts=context), count)
        assert msgspec.json.encode(got.messages) == msgspec.json.encode(want.messages), n
        assert (got.system, got.extra_tokens, got.format_tokens, got.repairs, got.system_head) == \
               (want.system, want.extra_tokens, want.format_tokens, want.repairs, want.system_head), n


def test_append_after_a_late_result_of_a_stand_in_call():
    """A result that turns up after its call was rendered with a stand-in in the reused
    part makes ``append`` start afresh, as ``render`` does."""
    messages = [Message(role="user", content="task"), _call("X")]
    messages += [Message(role="user" if i % 2 == 0 else "assistant", content=f"turn {i}") for i in range(40)]
    for fmt in ("openai", "anthropic", "ollama"):
        renderer = IncrementalRenderer(fmt)
        renderer.render(PromptPlan(system_parts=["sys"], messages=messages), count)
        assert "X" in renderer.unanswered
        late = [Message(role="tool", tool_call_id="X", content="late result of X")]
        got = renderer.append(late, count)
        want = RENDERERS[fmt](PromptPlan(system_parts=["sys"], messages=messages + late), count)
        assert msgspec.json.encode(got.messages) == msgspec.json.encode(want.messages), fmt
