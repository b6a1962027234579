"""One token count per prompt: ``context/prompt``'s ``tokens``, its ``budget.promptTokens``,
``context/stats``, ``session/get``'s ``contextTokens`` and a push's budget say the same
number, whatever the renderer adds to keep tool calls and results paired (a stand-in
result for a call without one, a label for a result without its call), with the context
loaded or not (a restarted daemon), on both backends."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.config import Config
from ctxd.service import ingest, prompt, sessions, stats
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents

from .service_helpers import params

SID = "one"


def call(call_id: str, command: str = "ls -la") -> dict[str, Any]:
    return {"role": "assistant", "content": "Let me look.",
            "toolCalls": [{"id": call_id, "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'}}]}


def result(call_id: str, output: str = "a.py\nb.py") -> dict[str, Any]:
    return {"role": "tool", "toolCallId": call_id, "content": output}


async def figures(svc: Service, fmt: str = "openai") -> dict[str, int]:
    got = await prompt.prompt(svc, params("context/prompt", sessionId=SID, format=fmt))
    st = await stats.stats(svc, SID)
    info = await sessions.get_session(svc, SID)
    return {"tokens": got.tokens, "prompt.budget": got.budget.prompt_tokens, "stats": st.budget.prompt_tokens,
            "stats.contextTokens": st.context_tokens, "session/get": info.context_tokens}


def one(found: dict[str, int]) -> int:
    assert len(set(found.values())) == 1, found
    return found["tokens"]


async def test_every_view_gives_the_rendered_prompts_count(service_config: Config) -> None:
    svc = await Service.open(service_config, events=CollectingEvents())
    try:
        await sessions.create_session(svc, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=128_000))
        pushed = await ingest.push(svc, params("session/push", sessionId=SID, messages=[
            {"role": "user", "content": "List the files."}, call("c1")]))
        # The call has no result yet: the prompt carries a stand-in for it, and says so in its count.
        first = one(await figures(svc))
        assert first == pushed.context_tokens == pushed.budget.prompt_tokens
        pushed = await ingest.push(svc, params("session/push", sessionId=SID, messages=[result("c1")]))
        assert pushed.budget.prompt_tokens == pushed.context_tokens == one(await figures(svc))
        # A result whose call the conversation does not hold goes out as labelled text.
        await ingest.push(svc, params("session/push", sessionId=SID, messages=[
            result("ghost", "stray output"), {"role": "user", "content": "And the tests?"}, call("c2", "ls tests")]))
        loaded = one(await figures(svc))
        for fmt in ("ollama", "anthropic"):
            one(await figures(svc, fmt))
    finally:
        await svc.close()
    # A restarted daemon: pushes before anything loads the context keep the same count.
    svc = await Service.open(service_config, events=CollectingEvents())
    try:
        info = await sessions.get_session(svc, SID)
        assert info.context_tokens == loaded
        pushed = await ingest.push(svc, params("session/push", sessionId=SID, messages=[result("c2", "test_a.py")]))
        st = await stats.stats(svc, SID)
        assert pushed.context_tokens == st.budget.prompt_tokens == one(await figures(svc))
    finally:
        await svc.close()


async def test_an_anthropic_prompt_that_needs_an_opening_turn_counts_it(service: Service) -> None:
    """Anthropic's shape alone needs a user turn first: its prompt's count and its budget
    both include it (the other shapes do not send one)."""
    await sessions.create_session(service, params("session/create", sessionId=SID, model="claude-sonnet-4-5",
                                                  contextWindow=200_000))
    await ingest.push(service, params("session/push", sessionId=SID, messages=[
        {"role": "assistant", "content": "Welcome back: where were we?"}, {"role": "user", "content": "The parser."}]))
    openai = await prompt.prompt(service, params("context/prompt", sessionId=SID, format="openai"))
    anthropic = await prompt.prompt(service, params("context/prompt", sessionId=SID, format="anthropic"))
    assert openai.tokens == openai.budget.prompt_tokens
    assert anthropic.tokens == anthropic.budget.prompt_tokens > openai.tokens
    assert anthropic.budget.free == anthropic.budget.max_prompt_tokens - anthropic.tokens


THOUGHT = "The parser fails on nested brackets; the tokenizer splits them too early. " * 6


def thinking(text: str, signature: str | None = "sig-1") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "thinking", "thinking": text}
    if signature is not None:
        block["signature"] = signature
    return block


def conversation(with_thinking: bool, prefill: bool) -> list[dict[str, Any]]:
    """A user turn, an assistant answer carrying signed thinking (and an unsigned block,
    which no shape sends), then either the user's next turn or an assistant prefill that
    carries thinking as well (which the Anthropic shape cannot send)."""
    first = [thinking(THOUGHT), thinking("Other provider's reasoning.", None)] if with_thinking else []
    messages = [{"role": "user", "content": "Why does the parser fail?"},
                {"role": "assistant", "content": [*first, {"type": "text", "text": "Nested brackets."}]}]
    messages.append({"role": "user", "content": "Fix it."})
    if prefill:
        last = [thinking(THOUGHT + " Again.", "sig-2")] if with_thinking else []
        messages.append({"role": "assistant", "content": [*last, {"type": "text", "text": "The fix is"}]})
    return messages


async def test_the_count_is_of_the_thinking_each_shape_sends(service: Service) -> None:
    """Thinking is sent back in the Anthropic shape only, and only an assistant message's
    signed blocks, and never in a final assistant turn (a prefill): each shape's prompt
    count, and its budget, are of what that shape sends. A twin session without the
    thinking gives what the rest costs."""
    for prefill in (False, True):
        got: dict[tuple[bool, str], int] = {}
        for with_thinking in (True, False):
            sid = f"t-{prefill}-{with_thinking}"
            await sessions.create_session(service, params("session/create", sessionId=sid, model="claude-sonnet-4-5",
                                                          contextWindow=200_000))
            await ingest.push(service, params("session/push", sessionId=sid,
                                              messages=conversation(with_thinking, prefill)))
            for fmt in ("openai", "ollama", "anthropic"):
                out = await prompt.prompt(service, params("context/prompt", sessionId=sid, format=fmt))
                assert out.tokens == out.budget.prompt_tokens
                assert out.budget.free == out.budget.max_prompt_tokens - out.tokens
                sent = msgspec.json.encode(out.messages).decode()
                assert ("Other provider's reasoning" in sent) is False
                got[with_thinking, fmt] = out.tokens
        for fmt in ("openai", "ollama"):
            assert got[True, fmt] == got[False, fmt], (prefill, fmt, got)
        state = await service.cache.get("t-False-True")
        signed = state.counter.count(THOUGHT)
        assert signed > 0
        # The Anthropic shape sends the first answer's signed thinking; a prefill's it cannot.
        assert got[True, "anthropic"] == got[False, "anthropic"] + signed, (prefill, got)


async def test_stats_for_a_format_count_as_that_formats_prompt(service: Service) -> None:
    """``context/stats`` with ``format`` gives the figures of that shape's prompt: with signed
    thinking in the conversation, an OpenAI prompt (which sends none) counted fewer tokens
    than stats said (24 against 114). Without ``format``: the context's own count, as
    ``session/get`` gives it, signed thinking included."""
    await sessions.create_session(service, params("session/create", sessionId=SID, model="claude-sonnet-4-5",
                                                  contextWindow=200_000))
    await ingest.push(service, params("session/push", sessionId=SID, messages=conversation(True, False)))
    plain = await stats.stats(service, SID)
    info = await sessions.get_session(service, SID)
    assert plain.context_tokens == plain.budget.prompt_tokens == info.context_tokens
    for fmt in ("openai", "ollama", "anthropic"):
        shaped = await stats.stats(service, SID, fmt)  # (before the prompt: nothing rendered yet)
        out = await prompt.prompt(service, params("context/prompt", sessionId=SID, format=fmt))
        assert shaped.context_tokens == shaped.budget.prompt_tokens == out.tokens, (fmt, shaped.budget, out.tokens)
        assert shaped.budget == out.budget, fmt
        assert msgspec.structs.replace(shaped, budget=plain.budget, context_tokens=plain.context_tokens,
                                       prompt_cache=plain.prompt_cache, bill=plain.bill) == plain
    signed = (await service.cache.get(SID)).counter.count(THOUGHT)
    assert (await stats.stats(service, SID, "openai")).budget.prompt_tokens < plain.budget.prompt_tokens - signed
    # The wire's params: the format is optional, and checked.
    assert params("context/stats", sessionId=SID).format is None
    assert params("context/stats", sessionId=SID, format="anthropic").format == "anthropic"
    try:
        params("context/stats", sessionId=SID, format="gemini")
    except msgspec.ValidationError as exc:
        assert "format" in str(exc)
    else:
        raise AssertionError("an unknown format was accepted")
