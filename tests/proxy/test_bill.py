"""What a proxied request costs: the ``X-Ctxd-Bill*`` response headers, and the session's
bill in ``context/stats`` from the usage the upstream reported."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai

from tests.proxy.conftest import both_modes, ctxd_client, sessions
from tests.proxy.upstream import MODEL

SYSTEM = "You are a careful agent. " + " ".join(f"rule {k}: check twice." for k in range(300))


def _parse(value: str) -> dict[str, float]:
    return {k.strip(): float(v) for k, v in (part.split("=") for part in value.split(";"))}


async def _stats(daemon: Any, session_id: str) -> dict[str, Any]:
    client = await ctxd_client(daemon)
    try:
        return await client.request("context/stats", {"sessionId": session_id})
    finally:
        await client.close()


async def _bill_once_measured(daemon: Any, session_id: str, requests: int) -> dict[str, Any]:
    """The session's bill once ``requests`` replies' usage is in (the proxy pushes a reply
    without waiting for it: it may land just after the client has its answer), or as it
    is after 10 s."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        bill = (await _stats(daemon, session_id))["bill"]
        if bill["measured"] >= requests or asyncio.get_running_loop().time() > deadline:
            return bill
        await asyncio.sleep(0.05)


@both_modes
async def test_anthropic_requests_carry_their_bill(proxy, upstream, ctxd_daemon) -> None:
    upstream.count_all = True  # (input tokens as a provider counts them: the system prompt too)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0)
    messages: list[dict[str, Any]] = []
    heads = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn}: what changed in module {turn}?"})
        raw = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=200, system=SYSTEM, messages=messages)
        heads.append(raw.headers)
        reply = await raw.parse()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-anthropic-")]
    assert all(h["x-ctxd-session"] == info["sessionId"] for h in heads)
    first, third = _parse(heads[0]["x-ctxd-bill"]), _parse(heads[2]["x-ctxd-bill"])
    # The first request writes its prompt to the cache; the third reads the second's.
    assert first["cache-read"] == 0 and first["cache-write"] > 1024 and first["usd"] > 0
    # (In the provider's count, which the fake upstream's usage calibrates to 0.8 of ctxd's.)
    assert third["cache-read"] > 1024 and third["cache-write"] < third["cache-read"] / 4
    assert third["billed"] < first["billed"] / 2
    direct = _parse(heads[2]["x-ctxd-bill-direct"])  # nothing compressed: what ctxd sends
    assert abs(direct["cache-read"] - third["cache-read"]) <= 0.05 * third["cache-read"]
    session = _parse(heads[2]["x-ctxd-bill-session"])
    assert session["requests"] == 3 and abs(session["ratio"] - 1.0) < 0.05
    # The replies' usage (the fake upstream's cache counts: the longest prefix shared with
    # an earlier request, in 128-token blocks) is shown beside ctxd's estimate of them.
    reported = _parse(heads[2]["x-ctxd-bill-reported"])
    assert reported["requests"] == 2 and reported["billed"] > 0 and reported["estimated"] > 0
    bill = (await _stats(ctxd_daemon, info["sessionId"]))["bill"]
    assert (bill["provider"], bill["cache"], bill["requests"], bill["measured"]) == ("anthropic", "breakpoints", 3, 3)
    said = [upstream_report for upstream_report in upstream.reports]
    assert bill["reported"]["cacheRead"] == sum(read for _, read, _ in said) > 1024
    assert bill["reported"]["cacheWrite"] == sum(written for _, _, written in said)
    assert bill["ratio"] == 1.0  # nothing compressed: the same requests, estimated alike
    # The streamed and whole answers pass the upstream's own headers back too.
    assert heads[0]["content-type"].startswith("application/json")


async def test_openai_streamed_requests_carry_their_bill(proxy, upstream, ctxd_daemon) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(2):
        messages.append({"role": "user", "content": f"Question {turn}."})
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, stream=True)
        headers = raw.headers
        text = ""
        async for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        messages.append({"role": "assistant", "content": text})
    bill = _parse(headers["x-ctxd-bill"])
    # OpenAI caches the previous request's prefix in steps of 128 tokens, writes nothing.
    assert bill["cache-write"] == 0 and bill["cache-read"] > 1024 and bill["cache-read"] % 128 == 0
    assert "x-ctxd-bill-direct" in headers and _parse(headers["x-ctxd-bill-session"])["requests"] == 2
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-openai-")]
    stats = (await _stats(ctxd_daemon, info["sessionId"]))["bill"]
    # No usage in these streams (the client did not ask for it): ctxd's estimates.
    assert (stats["provider"], stats["requests"], stats["measured"]) == ("openai", 2, 0)


async def test_a_cache_that_missed_does_not_make_ctxd_look_dearer(proxy, upstream, ctxd_daemon) -> None:
    """The provider reports nothing read from its cache (it missed, or caches by rules of its
    own): direct's requests would have missed alike, so the session's ratio compares ctxd's
    estimate with direct's, and the report is shown beside it."""
    upstream.count_all = True
    upstream.caching = False
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0)
    messages: list[dict[str, Any]] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn}: what changed in module {turn}?"})
        reply = await client.messages.create(model=MODEL, max_tokens=200, system=SYSTEM, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
    [info] = [s for s in await sessions(ctxd_daemon) if s["sessionId"].startswith("proxy-anthropic-")]
    # (The last reply's push, which carries its usage, is not waited for by the proxy.)
    bill = await _bill_once_measured(ctxd_daemon, info["sessionId"], 3)
    assert bill["measured"] == 3 and bill["reported"].get("cacheRead", 0) == 0
    assert bill["reported"]["billed"] > bill["reportedEstimate"]
    assert bill["ratio"] == 1.0


async def test_the_fake_upstream_reports_what_a_caching_provider_caches(upstream) -> None:
    """The proxy tests' and benchmarks' upstream reports cached tokens as providers do: the
    longest prefix shared with an earlier request, from 1,024 tokens in blocks of 128
    (Anthropic: up to the last breakpoint, the rest of it written; none without one)."""
    import httpx

    upstream.count_all = True
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    history = [{"role": "user", "content": "Question 0."}]
    async with httpx.AsyncClient(base_url=upstream.url) as http:
        async def ask(body: dict[str, Any], path: str = "/v1/messages") -> dict[str, Any]:
            response = await http.post(path, json={"model": MODEL, "max_tokens": 50, **body})
            return response.json()["usage"]

        first = await ask({"system": system, "messages": history})
        assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 1024
        history += [{"role": "assistant", "content": "Answer 0."}, {"role": "user", "content": "Question 1."}]
        second = await ask({"system": system, "messages": history})
        read = second["cache_read_input_tokens"]
        assert read > 1024 and (read - 1024) % 128 == 0 and read <= first["cache_creation_input_tokens"]
        # Nothing after the breakpoint on the system part is written; the messages are input.
        assert second["input_tokens"] > 0
        plain = await ask({"system": SYSTEM, "messages": history})
        assert (plain["cache_read_input_tokens"], plain["cache_creation_input_tokens"]) == (0, 0)
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question 0."}]
        await ask({"messages": chat}, "/v1/chat/completions")
        again = await ask({"messages": [*chat, {"role": "assistant", "content": "A."}]}, "/v1/chat/completions")
        cached = again["prompt_tokens_details"]["cached_tokens"]
        assert 1024 < cached < again["prompt_tokens"] and (cached - 1024) % 128 == 0
