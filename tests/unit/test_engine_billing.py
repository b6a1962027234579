"""engine/billing.py and the cost side of engine/trigger.py: what a prompt bills, and when a
pass pays, as pure functions."""

from __future__ import annotations

import dataclasses
import math

from ctxd.config import load_config
from ctxd.engine.billing import (
    NO_CACHE,
    Bill,
    CacheRules,
    common_prefix,
    cycle_turns,
    measured,
    split,
    worth_a_pass,
)
from ctxd.engine.budget import compute_budget
from ctxd.engine.context import CompressionState
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.trigger import Economy, decide, low_water
from ctxd.protocol.message import Usage
from ctxd.service.state import billing_table

ANTHROPIC = CacheRules(provider="anthropic", cache="breakpoints", min_tokens=1024, read=0.1, write=1.25,
                       max_breakpoints=4, input_price=3.0)
OPENAI = CacheRules(provider="openai", cache="automatic", min_tokens=1024, step=128, read=0.1)


def test_anthropic_reads_the_kept_prefix_and_writes_the_rest() -> None:
    bill = split(10_000, 8_000, ANTHROPIC)
    assert bill == Bill(uncached=0, written=2_000, read=8_000)
    assert bill.billed(ANTHROPIC) == 2_000 * 1.25 + 8_000 * 0.1
    # A prompt below the provider's minimum is not cached at all.
    assert split(900, 800, ANTHROPIC) == Bill(uncached=900)
    # A prefix below the minimum is not read, the whole prompt is written.
    assert split(5_000, 1_000, ANTHROPIC) == Bill(written=5_000)


def test_openai_caches_in_steps_of_128_from_1024() -> None:
    assert split(5_000, 4_000, OPENAI) == Bill(uncached=5_000 - 3_968, read=3_968)  # 31 x 128
    assert split(5_000, 1_000, OPENAI) == Bill(uncached=5_000)
    assert split(5_000, 9_000, OPENAI).read == 4_992  # never more than the prompt


def test_nothing_is_cached_without_a_cache() -> None:
    assert split(5_000, 5_000, NO_CACHE) == Bill(uncached=5_000)
    assert not NO_CACHE.caches and NO_CACHE.rewrite == 0


def test_usage_says_what_was_cached() -> None:
    anthropic = Usage(input_tokens=12, cache_read_tokens=9_000, cache_write_tokens=700)
    assert measured(anthropic, ANTHROPIC) == Bill(12, 700, 9_000)
    openai = Usage(input_tokens=5_000, cached_input_tokens=3_968)
    assert measured(openai, OPENAI) == Bill(1_032, 0, 3_968)
    # An OpenAI report without its cached part does not say how it was billed.
    assert measured(Usage(input_tokens=5_000), OPENAI) is None
    assert measured(Usage(input_tokens=5_000), NO_CACHE) == Bill(5_000)
    assert measured(Usage(output_tokens=3), OPENAI) is None


def test_common_prefix_counts_the_pieces_shared_from_the_start() -> None:
    before = [("system", 100), ("a", 50), ("b", 60)]
    assert common_prefix(before, before + [("c", 10)]) == 210
    assert common_prefix(before, [("system", 100), ("x", 50), ("b", 60)]) == 100
    assert common_prefix([], before) == 0


def test_the_best_cycle_grows_with_what_a_pass_breaks_and_the_growth() -> None:
    # sqrt(2 g C / r): C = 1.15 x 4,000 rewritten, g = 160, r = 0.1
    assert math.isclose(cycle_turns(4_000, 0, 160, ANTHROPIC) or 0, math.sqrt(2 * 160 * 1.15 * 4_000 / 0.1))
    assert cycle_turns(4_000, 0, 0, ANTHROPIC) is None  # growth unknown
    assert cycle_turns(4_000, 0, 160, NO_CACHE) is None
    best = cycle_turns(4_000, 0, 160, ANTHROPIC) or 0
    assert worth_a_pass(math.ceil(best), 4_000, 0, 160, ANTHROPIC)
    assert not worth_a_pass(math.floor(best) - 1, 4_000, 0, 160, ANTHROPIC)
    # A pass's own cost (an LLM summary) makes it pay later.
    assert not worth_a_pass(math.ceil(best), 4_000, 5_000, 160, ANTHROPIC)


def _budget(used: int, window: int = 100_000):
    return compute_budget(context_window=window, usable_fraction=1.0, reserved_output=0, safety_margin=0,
                          trigger_fraction=0.97, used=used)


def test_a_cached_session_compresses_early_when_it_pays() -> None:
    policy = CompressionPolicy(low_water_fraction=0.55, min_growth_fraction=0.10, room_fraction=0.6)
    economy = Economy(rules=ANTHROPIC, growth=200)
    target = low_water(policy, _budget(0), economy)
    best = cycle_turns(target, 0, 200, ANTHROPIC) or 0
    assert target + best < 97_000  # (the window would not force a pass there)
    below = decide(CompressionState(), _budget(target + math.floor(best) - 10), policy, economy)
    assert not below.compress
    above = decide(CompressionState(), _budget(target + math.ceil(best) + 10), policy, economy)
    assert above.compress and "costs less" in above.reason
    # Without a cache (or without the economy) only the trigger decides.
    assert not decide(CompressionState(), _budget(target + math.ceil(best) + 10), policy).compress
    # Never before the loop guard's step since the last pass.
    state = CompressionState(last_after_used=target + math.ceil(best) + 10 - 5_000)
    assert not decide(state, _budget(target + math.ceil(best) + 10), policy, economy).compress


def test_a_pass_that_cannot_go_below_the_users_words_comes_no_earlier() -> None:
    """What a pass frees is measured from where it really leaves the conversation: the
    user's words it keeps verbatim (``Economy.floor``) when they are above the low-water
    mark. Measured from the mark, a pass came early for savings it could not make."""
    policy = CompressionPolicy(low_water_fraction=0.55, min_growth_fraction=0.10, room_fraction=0.6)
    economy = Economy(rules=ANTHROPIC, growth=200)
    target = low_water(policy, _budget(0), economy)
    best = math.ceil(cycle_turns(target, 0, 200, ANTHROPIC) or 0)
    used = target + best + 10
    assert decide(CompressionState(), _budget(used), policy, economy).compress
    words = dataclasses.replace(economy, floor=target + 2_000)
    assert not decide(CompressionState(), _budget(used), policy, words).compress
    # Once the conversation is far enough above the words, the pass pays again.
    best = math.ceil(cycle_turns(target + 2_000, 0, 200, ANTHROPIC) or 0)
    assert decide(CompressionState(), _budget(target + 2_000 + best + 10), policy, words).compress


def test_an_expired_cache_makes_a_pass_free() -> None:
    policy = CompressionPolicy(low_water_fraction=0.55, min_growth_fraction=0.10, room_fraction=0.6)
    cold = Economy(rules=ANTHROPIC, growth=0, cold=True)
    target = low_water(policy, _budget(0), cold)
    assert decide(CompressionState(), _budget(target + 10_000), policy, cold).compress
    # ... but a pass must still free a loop guard's step.
    assert not decide(CompressionState(), _budget(target + 9_000), policy, cold).compress


def test_cost_alone_never_compresses_a_window_mostly_unused() -> None:
    """Below the quality-first mark (``room_fraction``) no pass comes early, however much
    it would save: a chat growing slowly in a large window would otherwise be kept small."""
    policy = CompressionPolicy(low_water_fraction=0.4, min_growth_fraction=0.05, room_fraction=0.9)
    cheap = Economy(rules=ANTHROPIC, growth=10, cold=True)
    assert low_water(policy, _budget(0), cheap) == 90_000  # (a slow chat: the quality-first mark)
    assert not decide(CompressionState(), _budget(89_000), policy, cheap).compress
    deep = Economy(rules=ANTHROPIC, growth=5_000, cold=True)
    assert low_water(policy, _budget(0), deep) == 40_000
    assert not decide(CompressionState(), _budget(89_000), policy, deep).compress
    assert decide(CompressionState(), _budget(90_000), policy, deep).compress


def test_passes_go_as_deep_as_they_pay() -> None:
    """Where the provider caches, the low-water mark is ``T - sqrt(2 g w' T / r)``: a chat
    at a large window keeps the quality-first mark, an agent goes to the floor."""
    policy = CompressionPolicy(low_water_fraction=0.4, min_growth_fraction=0.10, room_fraction=0.87)
    budget = _budget(0, window=32_000)
    slow = low_water(policy, budget, Economy(rules=ANTHROPIC, growth=10))
    assert slow == math.floor(0.87 * budget.available)
    chat = low_water(policy, budget, Economy(rules=ANTHROPIC, growth=30))
    assert 0.8 * budget.available < chat < slow
    middle = low_water(policy, budget, Economy(rules=ANTHROPIC, growth=200))
    trigger = 0.97 * budget.available
    assert middle == math.floor(trigger - math.sqrt(2 * 200 * 1.15 * trigger / 0.1))
    assert 0.4 * budget.available < middle < 0.87 * budget.available
    agent = low_water(policy, budget, Economy(rules=ANTHROPIC, growth=1_500))
    assert agent == math.floor(0.4 * budget.available)
    # Growth not known yet (the first requests): the quality-first mark; no cache: the policy's.
    assert low_water(policy, budget, Economy(rules=ANTHROPIC)) == slow
    assert low_water(policy, budget) == math.floor(0.4 * budget.available)


def test_the_trigger_still_forces_a_pass_and_the_guard_still_holds() -> None:
    policy = CompressionPolicy(low_water_fraction=0.55, min_growth_fraction=0.10)
    economy = Economy(rules=ANTHROPIC, growth=10)
    assert decide(CompressionState(), _budget(98_000), policy, economy).compress
    guarded = decide(CompressionState(last_after_used=90_000), _budget(98_000), policy, economy)
    assert not guarded.compress and guarded.skip_kind == "growth"


def test_billing_configuration_merges_onto_the_defaults() -> None:
    config = load_config(overrides={"billing": {"providers": {"openai": {"read": 0.5}, "vllm": {"cache": "automatic"}},
                                                "models": {"my-model": {"provider": "vllm"}}}}, environ={})
    table = billing_table(config)
    openai = table.rules("openai", "gpt-5")
    assert (openai.cache, openai.step, openai.read, openai.min_tokens) == ("automatic", 128, 0.5, 1024)
    assert table.rules("anthropic", "claude-sonnet-4-5").write == 1.25  # untouched defaults stay
    assert table.rules(None, "my-model-7b").provider == "vllm"


def test_rules_by_provider_and_model() -> None:
    table = billing_table(load_config(environ={}))
    anthropic = table.rules("anthropic", "claude-sonnet-4-5")
    assert (anthropic.cache, anthropic.read, anthropic.write, anthropic.ttl_seconds, anthropic.max_breakpoints) == \
        ("breakpoints", 0.1, 1.25, 300, 4)
    assert table.rules("anthropic", "claude-3-5-haiku-latest").min_tokens == 2048
    assert table.rules(None, "claude-opus-4-1").provider == "anthropic"  # by the model's name
    openai = table.rules("openai", "gpt-4o-mini")
    assert (openai.cache, openai.min_tokens, openai.step, openai.read) == ("automatic", 1024, 128, 0.5)
    assert table.rules("openai", "deepseek-chat").provider == "deepseek"  # DeepSeek through the OpenAI API
    assert not table.rules("ollama", "llama3.2").caches and table.rules("ollama", "llama3.2").input_price == 0
    assert not table.rules(None, "some-local-model").caches
    assert table.rules("azure", "gpt-5").provider == "openai"  # a provider not in the table: by the model
    assert not table.rules("azure", "my-deployment").caches
