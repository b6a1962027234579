"""A session's bill (service/billing.py): each prompt priced through ctxd and direct, the
reply's usage beside ctxd's estimate, passes and what they rewrite, on a real Service."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ctxd.config import Config
from ctxd.protocol.context import InputBill
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service import controls, ingest, prompt, sessions, stats
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents
from tests.unit.service_helpers import params, settle

SID = "bill"
SYSTEM = "You are a careful assistant. " + " ".join(f"rule{k}: answer plainly." for k in range(400))


async def _create(svc: Service, session_id: str = SID, **extra: Any) -> None:
    fields = {"model": "claude-sonnet-4-5", "provider": "anthropic", "contextWindow": 16_000,
              "systemPrompt": SYSTEM, **extra}
    await sessions.create_session(svc, params("session/create", sessionId=session_id, **fields))


async def _turn(svc: Service, i: int, *, usage: dict[str, int] | None = None, words: int = 30) -> Any:
    """Push a user message, take the prompt, push the reply (with ``usage``)."""
    await ingest.push(svc, params("session/push", sessionId=SID, messages=[
        {"role": "user", "content": f"question {i}: " + " ".join(f"q{i}x{k}" for k in range(words))}]))
    await settle(svc)
    result = await prompt.prompt(svc, params("context/prompt", sessionId=SID, format="anthropic"))
    reply: dict[str, Any] = {"role": "assistant", "content": f"answer {i}: " + " ".join(
        f"a{i}y{k}" for k in range(words))}
    if usage is not None:
        reply["usage"] = usage
    await ingest.push(svc, params("session/push", sessionId=SID, messages=[reply]))
    return result


async def test_prompts_are_billed_through_ctxd_and_direct(service: Service) -> None:
    await _create(service)
    first = await _turn(service, 0)
    # The first request: nothing cached, everything written (Anthropic); direct the same.
    assert first.bill.ctxd.cache_read == 0 and first.bill.ctxd.cache_write == first.tokens
    assert first.bill.direct.cache_write == first.tokens and first.bill.session_requests == 1
    second = await _turn(service, 1)
    # The second starts with the whole first prompt: read from the cache, the rest written.
    assert second.bill.ctxd.cache_read == first.tokens
    assert second.bill.ctxd.cache_write == second.tokens - first.tokens
    assert second.bill.ctxd.billed == pytest.approx(first.tokens * 0.1 + (second.tokens - first.tokens) * 1.25, abs=0.1)
    assert second.bill.ctxd.usd == pytest.approx(second.bill.ctxd.billed * 3.0 / 1e6, rel=1e-3)
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and (bill.provider, bill.cache, bill.requests, bill.measured) == ("anthropic",
                                                                                             "breakpoints", 2, 0)
    assert bill.ratio == 1.0  # nothing compressed: ctxd's prompt is the client's
    assert bill.ctxd.billed == pytest.approx(first.bill.ctxd.billed + second.bill.ctxd.billed, abs=0.2)
    assert bill.last_request is not None and not bill.last_request.measured


async def test_the_reply_usage_is_shown_beside_the_estimate(service: Service) -> None:
    await _create(service)
    first = await _turn(service, 0, usage={"inputTokens": 7, "cacheWriteTokens": 3_000, "cacheReadTokens": 0,
                                           "outputTokens": 40})
    second = await _turn(service, 1, usage={"inputTokens": 5, "cacheWriteTokens": 90, "cacheReadTokens": 3_000,
                                            "outputTokens": 40})
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and (bill.requests, bill.measured) == (2, 2)
    # What the provider said, for the requests it reported, beside ctxd's estimate of them.
    assert bill.reported == InputBill(uncached=12, cache_write=3_090, cache_read=3_000,
                                      billed=pytest.approx(12 + 3_090 * 1.25 + 300, abs=0.1),
                                      usd=pytest.approx((12 + 3_090 * 1.25 + 300) * 3e-6, rel=1e-3))
    assert bill.reported_estimate == pytest.approx(first.bill.ctxd.billed + second.bill.ctxd.billed, abs=0.2)
    assert bill.last_request is not None and bill.last_request.measured
    assert bill.last_request.reported is not None
    assert (bill.last_request.reported.uncached, bill.last_request.reported.cache_read) == (5, 3_000)
    # The comparison is estimate against estimate: nothing compressed, the same request.
    assert bill.ctxd.billed == pytest.approx(bill.reported_estimate, abs=0.2)
    assert bill.ratio == 1.0 and bill.direct.cache_read == bill.ctxd.cache_read


async def test_a_provider_reporting_little_cached_does_not_make_ctxd_dearer(service: Service) -> None:
    """A provider (or a cache that missed) reporting 3 tokens read where ctxd estimated the
    whole previous prompt: direct's requests would have missed alike, so the ratio is
    estimate over estimate, and the report stands beside it."""
    await _create(service)
    for i in range(3):
        result = await _turn(service, i, usage={"inputTokens": 2_000, "cacheWriteTokens": 0,
                                                "cacheReadTokens": 3, "outputTokens": 40})
        assert result.bill.ctxd.billed == pytest.approx(result.bill.direct.billed, rel=0.01)
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and bill.measured == 3
    assert bill.ratio == 1.0  # nothing compressed: ctxd's prompt is the client's
    assert bill.reported is not None and bill.reported.cache_read == 9
    assert bill.reported.billed > bill.reported_estimate  # the provider cached less than ctxd expected
    later = await _turn(service, 3)
    assert later.bill.session_measured == 3 and later.bill.session_reported == pytest.approx(bill.reported.billed,
                                                                                             abs=0.1)


async def test_an_openai_reply_reports_its_cached_part(service: Service) -> None:
    await _create(service, model="gpt-5", provider="openai")
    await _turn(service, 0, usage={"inputTokens": 3_200, "cachedInputTokens": 0})
    await _turn(service, 1, usage={"inputTokens": 3_300, "cachedInputTokens": 3_072})
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and bill.cache == "automatic" and bill.measured == 2
    assert bill.reported is not None
    assert (bill.reported.uncached, bill.reported.cache_write, bill.reported.cache_read) == (3_428, 0, 3_072)


async def test_a_pass_rewrites_what_follows_the_system_part(service: Service, events: CollectingEvents) -> None:
    await _create(service)
    for i in range(6):
        await _turn(service, i, words=60)
    before = await _turn(service, 6, words=60)
    assert (await controls.compress(service, params("context/compress", sessionId=SID))).compressed
    await settle(service)
    after = await _turn(service, 7, words=60)
    # Only the system prompt and what comes before the first change stay cached.
    assert 0 < after.bill.ctxd.cache_read < before.tokens
    assert after.bill.ctxd.cache_read >= after.budget.system_tokens
    await _turn(service, 8, words=60)
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and bill.passes == 1 and bill.pass_cost > 0
    # The client's own request kept growing, its previous request always cached.
    assert bill.last_request is not None and bill.last_request.direct.cache_read > before.tokens


async def test_an_expired_cache_is_billed_whole(service_config: Config, events: CollectingEvents) -> None:
    config = msgspec.structs.replace(service_config, billing=msgspec.convert(
        {"providers": {"anthropic": {"cache": "breakpoints", "read": 0.1, "write": 1.25, "ttl_seconds": 0}}},
        type(service_config.billing)))
    svc = await Service.open(config, events=events)
    try:
        await _create(svc)
        await _turn(svc, 0)
        second = await _turn(svc, 1)
        assert second.bill.ctxd.cache_read == 0 and second.bill.direct.cache_read == 0
    finally:
        await svc.close()


async def test_a_provider_without_a_cache_bills_every_token_and_nothing_in_money(service: Service) -> None:
    await _create(service, model="llama3.2", provider="ollama")
    await _turn(service, 0)
    second = await _turn(service, 1)
    assert second.bill.ctxd == InputBill(uncached=second.tokens, billed=float(second.tokens), usd=None)
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and bill.cache == "none" and bill.ctxd.usd is None


async def test_a_window_below_the_models_says_what_it_costs(service: Service) -> None:
    await _create(service)  # 16,000 of claude-sonnet-4-5's 200,000
    await _turn(service, 0)
    bill = (await stats.stats(service, SID)).bill
    assert bill is not None and bill.budget_note is not None
    assert "16,000 tokens of claude-sonnet-4-5's 200,000" in bill.budget_note and "passes" in bill.budget_note
    await sessions.update_session(service, params("session/update", sessionId=SID, contextWindow=200_000))
    assert (await stats.stats(service, SID)).bill.budget_note is None  # type: ignore[union-attr]


async def test_an_llm_summary_is_a_cost_of_the_pass(service_config: Config, events: CollectingEvents) -> None:
    """The extractive summarizer costs a pass nothing; an LLM summary reads what it
    summarizes, at its model's price against the session's (a local server: nothing)."""
    from ctxd.service.billing import economy

    for backend, model, expected in (("anthropic", "claude-haiku-4-5", 1.0 / 3.0), ("anthropic", "", 1.0),
                                     ("ollama", "llama3.2", 0.0)):
        config = msgspec.structs.replace(service_config, summarizer=msgspec.structs.replace(
            service_config.summarizer, backend=backend, model=model, api_key_env="NO_SUCH_KEY_VARIABLE"))
        svc = await Service.open(config, events=events)
        try:
            await _create(svc, f"{backend}-{model}")
            state = await svc.cache.get(f"{backend}-{model}")
            found = economy(svc, state)
            assert found is not None and found.summary_price == pytest.approx(expected), (backend, model)
        finally:
            await svc.close()
    extractive = await Service.open(service_config, events=events)
    try:
        await _create(extractive, "extractive")
        found = economy(extractive, await extractive.cache.get("extractive"))
        assert found is not None and found.summary_price == 0.0
    finally:
        await extractive.close()


async def test_asking_twice_for_the_same_prompt_prices_it_the_same(service: Service) -> None:
    """A client may ask for the prompt again before it pushes (an editor's view, a retry):
    with nothing pushed between, direct's request is the same size (what was pushed since
    the last reply is not counted twice once a pass has left direct's size estimated)."""
    await _create(service)
    for i in range(6):
        await _turn(service, i, words=60)
    assert (await controls.compress(service, params("context/compress", sessionId=SID))).compressed
    await settle(service)
    for i in range(6, 9):
        await _turn(service, i, words=60)
    ask = params("context/prompt", sessionId=SID, format="anthropic")
    first = await prompt.prompt(service, ask)
    again = await prompt.prompt(service, ask)
    assert first.bill is not None and again.bill is not None
    assert again.bill.direct.cache_write + again.bill.direct.cache_read + again.bill.direct.uncached == \
        first.bill.direct.cache_write + first.bill.direct.cache_read + first.bill.direct.uncached


async def test_a_preview_is_not_billed_counted_or_paired_with_the_next_reply(service: Service) -> None:
    """An editor showing the prompt sends nothing: the reply pushed after it (to a request the
    client made from a later state) must leave the bill, the prompts handed out and the
    calibration samples as they would be without the look; a prompt that was handed out
    changes all three."""
    alone, looked, prompted = "bill-alone", "bill-looked", "bill-prompted"
    question = {"role": "user", "content": "question 1: " + " ".join(f"q1x{k}" for k in range(30))}
    follow_up = {"role": "user", "content": "and also: " + " ".join(f"f1x{k}" for k in range(200))}
    for sid in (alone, looked, prompted):
        await _create(service, sid)
        await ingest.push(service, params("session/push", sessionId=sid, messages=[
            {"role": "user", "content": "question 0: " + " ".join(f"q0x{k}" for k in range(30))}]))
        await prompt.prompt(service, params("context/prompt", sessionId=sid, format="anthropic"))
        await ingest.push(service, params("session/push", sessionId=sid, messages=[
            {"role": "assistant", "content": "answer 0", "usage": {"inputTokens": 9, "cacheWriteTokens": 3_000,
                                                                   "outputTokens": 4}}]))
        await ingest.push(service, params("session/push", sessionId=sid, messages=[question]))
    await settle(service)
    preview = await prompt.prompt(service, params("context/prompt", sessionId=looked, format="anthropic",
                                                  preview=True))
    sent = await prompt.prompt(service, params("context/prompt", sessionId=prompted, format="anthropic"))
    # The same prompt, budget and room; only the bill of a request that is sent.
    assert preview.bill is None and sent.bill is not None
    assert msgspec.structs.replace(preview, session_id=prompted) == msgspec.structs.replace(sent, bill=None)
    # The user adds to the question, the client sends its own request and pushes the reply,
    # whose provider count is that of the prompt looked at (so it would pair with it).
    reply = {"role": "assistant", "content": "answer 1",
             "usage": {"inputTokens": sent.tokens, "cacheReadTokens": 0, "outputTokens": 4}}
    for sid in (alone, looked, prompted):
        await ingest.push(service, params("session/push", sessionId=sid, messages=[follow_up]))
        await ingest.push(service, params("session/push", sessionId=sid, messages=[reply]))
    without, with_preview, with_prompt = [await stats.stats(service, sid) for sid in (alone, looked, prompted)]
    assert without.bill is not None and without.bill.requests == 1
    assert with_preview.bill == without.bill
    assert with_preview.usage_drift == without.usage_drift
    assert with_preview.prompt_cache == without.prompt_cache
    # A prompt handed out is a request: billed, counted, its count paired with the reply.
    assert with_prompt.bill is not None and with_prompt.bill.requests == 2
    assert with_prompt.prompt_cache.prompts == without.prompt_cache.prompts + 1
    assert (sent.tokens, sent.tokens) in with_prompt.usage_drift.samples
    assert with_prompt.usage_drift.samples != without.usage_drift.samples


@pytest.mark.parametrize(("field", "value"), [
    ("push", [{"role": "user", "content": "hello"}]), ("supersede", ["k1"]), ("current", [])])
async def test_a_preview_that_would_change_the_session_is_refused(service: Service, field: str,
                                                                  value: object) -> None:
    await _create(service)
    await ingest.push(service, params("session/push", sessionId=SID, messages=[
        {"role": "user", "content": "first", "idempotencyKey": "k1"}]))
    with pytest.raises(CtxdError) as info:
        await prompt.prompt(service, params("context/prompt", sessionId=SID, preview=True, **{field: value}))
    assert info.value.code == ErrorCode.InvalidParams and info.value.data == {"field": field}
    assert f"preview takes no {field}" in info.value.message
    after = await stats.stats(service, SID)  # nothing changed: the message is stored and still sent
    assert after.message_count == 1 and after.prompt_cache.prompts == 0
    sent = await prompt.prompt(service, params("context/prompt", sessionId=SID, format="ollama"))
    assert [m.content for m in sent.messages if m.role != "system"] == ["first"]
