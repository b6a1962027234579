"""Retries, timeouts, dropped connections and cancellation, against a real server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from ctxd.llm import BackendError, BackendSettings, ChatTurn, make_backend
from ctxd.llm.retry import RetryPolicy, is_retryable_status, parse_retry_after
from tests.llm_servers import FakeLLMServer

TURNS = [ChatTurn("user", "USER: Summarize the work on the parser. It must stay fast.")]


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as s:
        yield s


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_retries_500_then_succeeds(server: FakeLLMServer, kind: str) -> None:
    server.fail_then_ok(2, "500")
    backend = make_backend(server.settings(kind, max_retries=2))  # type: ignore[arg-type]
    reply = await backend.chat(TURNS)
    await backend.aclose()
    assert reply.text.startswith("Summary:")
    assert len(server.chat_requests()) == 3


async def test_retry_backoff_grows(server: FakeLLMServer) -> None:
    server.fail_then_ok(3, "500")
    backend = make_backend(server.settings("openai", max_retries=3, backoff_seconds=0.05, backoff_max_seconds=1.0))
    await backend.chat(TURNS)
    await backend.aclose()
    times = [r.at for r in server.chat_requests()]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # jitter keeps each wait within 50-100% of 0.05, 0.1, 0.2 seconds
    assert gaps[0] >= 0.02 and gaps[1] >= 0.045 and gaps[2] >= 0.095
    assert gaps[2] > gaps[0]


async def test_retries_429_honouring_retry_after(server: FakeLLMServer) -> None:
    server.fail_then_ok(1, "429", retry_after=0.3)
    backend = make_backend(server.settings("anthropic", backoff_seconds=0.001))
    await backend.chat(TURNS)
    await backend.aclose()
    first, second = server.chat_requests()
    assert second.at - first.at >= 0.25


async def test_long_retry_after_is_not_waited_for(server: FakeLLMServer) -> None:
    server.fail("429", retry_after=120)
    backend = make_backend(server.settings("openai", retry_after_max_seconds=5))
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert time.monotonic() - started < 2
    assert caught.value.kind == "http_status" and caught.value.status == 429
    assert "120" in caught.value.message
    assert len(server.chat_requests()) == 1


async def test_gives_up_after_max_retries(server: FakeLLMServer) -> None:
    server.fail("500")
    backend = make_backend(server.settings("ollama", max_retries=2))
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "http_status" and caught.value.status == 500
    assert caught.value.attempts == 3
    assert len(server.chat_requests()) == 3


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_no_retry_on_400(server: FakeLLMServer, kind: str) -> None:
    server.fail("400")
    backend = make_backend(server.settings(kind, max_retries=3))  # type: ignore[arg-type]
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "http_status" and caught.value.status == 400
    assert "malformed" in caught.value.message
    assert len(server.chat_requests()) == 1


async def test_dropped_connection_is_retried_then_unreachable(server: FakeLLMServer) -> None:
    server.fail("drop")
    backend = make_backend(server.settings("openai", max_retries=1))
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "unreachable"
    assert len(server.chat_requests()) == 2


async def test_dropped_connection_then_ok(server: FakeLLMServer) -> None:
    server.fail_then_ok(1, "drop")
    backend = make_backend(server.settings("ollama"))
    reply = await backend.chat(TURNS)
    await backend.aclose()
    assert reply.text.startswith("Summary:")


async def test_timeout_is_reported_as_timeout(server: FakeLLMServer) -> None:
    server.slow(3)
    backend = make_backend(server.settings("ollama", timeout_seconds=0.3, max_retries=0))
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 2


async def test_unreachable_server() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = BackendSettings(kind="ollama", model="m", base_url=f"http://127.0.0.1:{port}", max_retries=1,
                               backoff_seconds=0.01)
    backend = make_backend(settings)
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "unreachable"
    assert caught.value.attempts == 2


async def test_cancellation_propagates_and_closes_the_request(server: FakeLLMServer) -> None:
    server.slow(5)
    backend = make_backend(server.settings("openai"))
    task = asyncio.create_task(backend.chat(TURNS))
    assert await asyncio.to_thread(server.wait_for, lambda s: len(s.chat_requests()) == 1)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 0.5
    # the server sees the client hang up: the in-flight request was closed, not left running
    assert await asyncio.to_thread(server.wait_for, lambda s: s.disconnects == 1, 3.0)
    assert len(server.chat_requests()) == 1  # and it was not retried
    await backend.aclose()


async def test_cancellation_during_backoff_propagates(server: FakeLLMServer) -> None:
    server.fail("500")
    backend = make_backend(server.settings("ollama", max_retries=5, backoff_seconds=5, backoff_max_seconds=5))
    task = asyncio.create_task(backend.chat(TURNS))
    assert await asyncio.to_thread(server.wait_for, lambda s: len(s.chat_requests()) == 1)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(server.chat_requests()) == 1
    await backend.aclose()


async def test_closed_backend_raises_cancelled(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("anthropic"))
    await backend.aclose()
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    assert caught.value.kind == "cancelled"
    assert server.chat_requests() == []


def test_parse_retry_after() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now


def test_retryable_statuses() -> None:
    assert all(is_retryable_status(s) for s in (408, 429, 500, 502, 503, 529))
    assert not any(is_retryable_status(s) for s in (400, 401, 403, 404, 413, 422))


def test_backoff_is_capped_with_jitter() -> None:
    import random

    policy = RetryPolicy(backoff_seconds=0.5, backoff_max_seconds=2.0)
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(8)]
    assert all(0.25 <= d <= 2.0 for d in delays)
    assert max(delays[4:]) <= 2.0 and min(delays[4:]) >= 1.0
