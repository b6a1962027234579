"""What a proxied request costs: the ``X-Ctxd-Bill*`` response headers, and the session's
bill in ``context/stats`` from the usage the upstream reported."""

from __future__ import annotations

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


@both_modes
async def test_anthropic_requests_carry_their_bill(proxy, upstream, ctxd_daemon) -> None:
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
    # The replies' usage (the fake upstream's cache counts) took the estimates' place.
    bill = (await _stats(ctxd_daemon, info["sessionId"]))["bill"]
    assert (bill["provider"], bill["cache"], bill["requests"], bill["measured"]) == ("anthropic", "breakpoints", 3, 3)
    assert bill["ctxd"]["cacheRead"] == 9  # 3 per reply, as the fake upstream reports
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
