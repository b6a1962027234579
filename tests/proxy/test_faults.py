"""Faults between the proxy and the upstream: errors, a cut stream, a client that hangs
up, an upstream that hangs. The client gets the upstream's error or a clear one, the
session keeps everything acknowledged, and the proxy keeps serving."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import openai
import pytest

from tests.proxy.conftest import both_modes, history, sessions
from tests.proxy.upstream import MODEL


async def _wait(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@both_modes
async def test_upstream_errors_reach_the_client_as_sent(proxy, upstream, ctxd_daemon) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    messages = [{"role": "user", "content": "Hello, fragile world."}]
    upstream.mode = "500"
    with pytest.raises(openai.InternalServerError) as error:
        await client.chat.completions.create(model=MODEL, messages=messages)
    assert error.value.status_code == 500 and error.value.body["message"] == "upstream exploded"
    upstream.mode = "429"
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model=MODEL, messages=messages, stream=True)
    assert limited.value.response.headers["retry-after"] == "7"
    upstream.mode = "ok"
    reply = await client.chat.completions.create(model=MODEL, messages=messages)
    assert reply.choices[0].message.content == "Answer to: Hello, fragile world."
    [info] = await sessions(ctxd_daemon)
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["content"] for m in stored] == ["Hello, fragile world.", "Answer to: Hello, fragile world."]


@both_modes
async def test_a_cut_stream_is_an_error_and_pushes_no_partial_reply(proxy, upstream, ctxd_daemon) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "Tell me a long story."}]
    upstream.mode = "cut"
    with pytest.raises(anthropic.APIError):
        async with client.messages.stream(model=MODEL, max_tokens=100, messages=messages) as stream:
            async for _ in stream.text_stream:
                pass
    with pytest.raises((anthropic.APIError, anthropic.APIConnectionError)):
        await client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    [info] = await sessions(ctxd_daemon)
    assert [m["content"] for m in await history(ctxd_daemon, info["sessionId"])] == ["Tell me a long story."]
    upstream.mode = "ok"
    ollama_like = await client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    assert ollama_like.content[0].text == "Answer to: Tell me a long story."
    # The reply's push is not waited for (the session's next request waits for it).
    deadline = asyncio.get_running_loop().time() + 20
    while len(stored := await history(ctxd_daemon, info["sessionId"])) < 2:
        assert asyncio.get_running_loop().time() < deadline, "the reply was never stored"
        await asyncio.sleep(0.02)
    assert stored[1]["role"] == "assistant" and "Answer to: Tell me a long story." in str(stored[1]["content"])


@both_modes
async def test_a_client_that_hangs_up_cancels_the_upstream(proxy, upstream, ctxd_daemon) -> None:
    upstream.mode = "slow"
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "A slow answer, please."}]}
    # (the key the SDK sends below: a session is continued only under its own key)
    async with httpx.AsyncClient(timeout=30, headers={"authorization": "Bearer sk-x"}) as http:
        async with http.stream("POST", proxy.url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                assert chunk.startswith(b"data: ")  # the first event arrives before the stream ends
                break
    await _wait(lambda: upstream.disconnects == 1, "the upstream to see the client go")
    assert upstream.completed_streams == 0
    # Others are still served, and the session kept the user's message.
    upstream.mode = "ok"
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    reply = await client.chat.completions.create(model=MODEL, messages=body["messages"])
    assert reply.choices[0].message.content == "Answer to: A slow answer, please."
    [info] = await sessions(ctxd_daemon)
    assert [m["content"] for m in await history(ctxd_daemon, info["sessionId"])] == \
        ["A slow answer, please.", "Answer to: A slow answer, please."]


@both_modes
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages/count_tokens", "/v1/models"])
async def test_a_client_that_hangs_up_before_the_answer_cancels_the_upstream(proxy, upstream, ctxd_daemon,
                                                                            path: str) -> None:
    """A whole answer awaited for a client that left: the upstream request is closed at
    once (a real LLM would go on generating, and billing, until the proxy's timeout)."""
    upstream.mode = "hang"
    body = {"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "Hello? Anyone?"}]}
    headers = {"x-api-key": "sk-x", "anthropic-version": "2023-06-01"} if "messages" in path else {}
    async with httpx.AsyncClient(timeout=30) as http:
        request = http.get(proxy.url + path) if path == "/v1/models" else \
            http.post(proxy.url + path, json=body, headers=headers)
        waiting = asyncio.create_task(request)
        await _wait(lambda: len(upstream.received) == 1, "the request to reach the upstream")
        waiting.cancel()  # the client hangs up: httpx closes its connection
        with pytest.raises(asyncio.CancelledError):
            await waiting
    await _wait(lambda: upstream.hung_up == 1, "the upstream to see the proxy go", timeout=10)
    # The proxy keeps serving, and the session kept the user's message.
    upstream.mode = "ok"
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    reply = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Still there?"}])
    assert reply.choices[0].message.content == "Answer to: Still there?"
    if path == "/v1/chat/completions":
        stored = {m["content"] for s in await sessions(ctxd_daemon) for m in await history(ctxd_daemon, s["sessionId"])}
        assert "Hello? Anyone?" in stored


async def test_an_upstream_that_hangs_gets_a_clear_timeout(start_proxy, upstream, ctxd_daemon) -> None:
    proxy = start_proxy("--set", "proxy.upstream_timeout_seconds=1")
    upstream.mode = "hang"
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    messages = [{"role": "user", "content": "Are you there?"}]
    other = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0,
                               default_headers={"X-Ctxd-Session": "other"})
    hung = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=messages))
    await _wait(lambda: len(upstream.chats()) == 1, "the hanging request to reach the upstream")
    with pytest.raises(openai.APIStatusError) as error:
        await hung
    assert error.value.status_code == 504 and "did not answer in time" in error.value.message
    upstream.mode = "ok"
    reply = await other.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Still up?"}])
    assert reply.choices[0].message.content == "Answer to: Still up?"
    ids = {s["sessionId"] for s in await sessions(ctxd_daemon)}
    assert "other" in ids and len(ids) == 2
