"""The dynamic budget: the checkpoint-ageing and six-stage designs' worked examples, and the defaults."""

from __future__ import annotations

import math

import pytest

from ctxd.engine.budget import BudgetPolicy, budget_for, compute_budget, reserved_output
from ctxd.tokens import PROMPT_PRIMING


def ageing_8k(checkpoint_tokens: int = 0, used: int = 0):
    return compute_budget(context_window=8000, usable_fraction=0.85, reserved_output=0, safety_margin=0,
                          trigger_fraction=0.80, system_tokens=500, checkpoint_tokens=checkpoint_tokens, used=used)


def test_ageing_8k_initial_state():
    b = ageing_8k()
    assert b.usable == 6800  # "Ollama context: 6800 tokens (FIXED, 85% of 8K)"
    assert b.max_prompt_tokens == 6800
    assert b.available == 6300
    assert b.trigger_at == 5040


@pytest.mark.parametrize("checkpoints, available, trigger", [
    ([3400], 2900, 2320),              # after the 1st compression
    ([1500, 2000], 2800, 2240),        # after the 2nd: one aged, one recent
    ([800, 1200, 1800], 2500, 2000),   # after the 3rd: ancient, old, recent
])
def test_ageing_8k_after_compressions(checkpoints, available, trigger):
    b = ageing_8k(checkpoint_tokens=sum(checkpoints))
    assert b.usable == 6800
    assert b.checkpoint_tokens == sum(checkpoints)
    assert b.available == available
    assert b.trigger_at == trigger


def test_ageing_8k_available_shrinks_but_ageing_keeps_it_sustainable():
    figures = [ageing_8k(checkpoint_tokens=sum(c)).available for c in ([], [3400], [1500, 2000], [800, 1200, 1800])]
    assert figures == [6300, 2900, 2800, 2500]
    assert all(f > 0 for f in figures)


def test_six_stage_8k_example():
    b = compute_budget(context_window=8192, usable_fraction=0.85, reserved_output=1000, safety_margin=1000,
                       trigger_fraction=0.75, system_tokens=500)
    assert b.usable == 6963  # floor(8192 * 0.85)
    assert b.max_prompt_tokens == 5963
    assert b.available == 4463  # 6963 - 500 - 1000 - 1000
    assert b.trigger_at == 3347  # floor(4463 * 0.75)


def test_six_stage_timeline_triggers_at_turn_three():
    def over(messages: int) -> bool:
        b = compute_budget(context_window=8192, usable_fraction=0.85, reserved_output=1000, safety_margin=1000,
                           trigger_fraction=0.75, system_tokens=500, used=messages)
        return b.used > b.trigger_at

    assert not over(1000)
    assert not over(2000)
    assert over(3500)
    assert not over(80 + 1000)  # after compression: checkpoint + recent


def test_used_prompt_and_free_figures():
    b = compute_budget(context_window=10_000, usable_fraction=0.9, reserved_output=1000, safety_margin=100,
                       trigger_fraction=0.8, system_tokens=300, pinned_tokens=50, checkpoint_tokens=200, used=1234)
    assert b.usable == 9000
    assert b.max_prompt_tokens == 8000
    assert b.available == 8000 - 100 - 300 - 50 - 200
    assert b.trigger_at == math.floor(b.available * 0.8)
    assert b.prompt_tokens == PROMPT_PRIMING + 300 + 50 + 200 + 1234
    assert b.free == b.max_prompt_tokens - b.prompt_tokens
    # pinned tokens count against the budget but not in "used"
    assert b.used == 1234


def test_available_never_negative():
    b = compute_budget(context_window=1000, usable_fraction=1.0, reserved_output=0, safety_margin=0,
                       trigger_fraction=0.8, system_tokens=600, checkpoint_tokens=600)
    assert b.available == 0
    assert b.trigger_at == 0
    assert b.free < 0


# --- reserved_output and budget_for ---------------------------------------------------


def test_policy_defaults():
    p = BudgetPolicy()
    assert (p.usable_fraction, p.reserved_output_cap, p.reserved_output_fraction,
            p.safety_margin_fraction, p.trigger_fraction) == (0.85, 32_000, 0.125, 0.02, 0.90)


@pytest.mark.parametrize("window, output_limit, expected", [
    (8192, None, 1024),          # no output limit known: 1/8 of the window
    (8192, 1000, 1000),          # a small output limit is what it is
    (8192, 4096, 2048),          # a known limit never takes more than a quarter of the window
    (8192, 8192, 2048),          # gpt-4 (8K in, 8K out)
    (128_000, 4096, 4096),       # gpt-4o
    (200_000, 8192, 8192),       # Claude Sonnet
    (1_000_000, 8192, 8192),     # Gemini
    (1_000_000, None, 32_000),   # capped at 32k (what coding agents reserve)
    (1_000_000, 100_000, 32_000),
    (4096, 0, 0),
])
def test_reserved_output(window, output_limit, expected):
    assert reserved_output(window, output_limit, BudgetPolicy()) == expected


def test_reserved_output_never_negative():
    assert reserved_output(8192, -5, BudgetPolicy()) == 0


def test_budget_for_defaults():
    b = budget_for(BudgetPolicy(), context_window=8192, output_limit=None, system_tokens=500)
    assert b.usable == 6963
    assert b.reserved_output == 1024
    assert b.safety_margin == math.ceil(8192 * 0.02) == 164
    assert b.max_prompt_tokens == 6963 - 1024
    assert b.available == 6963 - 1024 - 164 - 500
    assert b.trigger_fraction == 0.90
    assert b.trigger_at == math.floor(b.available * 0.90)


def test_budget_for_reproduces_the_ageing_8k_example_with_a_policy():
    policy = BudgetPolicy(usable_fraction=0.85, reserved_output_cap=0, safety_margin_fraction=0.0,
                          trigger_fraction=0.80)
    b = budget_for(policy, context_window=8000, output_limit=None, system_tokens=500, checkpoint_tokens=3400)
    assert (b.usable, b.reserved_output, b.safety_margin, b.available, b.trigger_at) == (6800, 0, 0, 2900, 2320)


def test_budget_for_passes_every_figure_through():
    b = budget_for(BudgetPolicy(), context_window=128_000, output_limit=4096, system_tokens=10,
                   pinned_tokens=20, checkpoint_tokens=30, used=40)
    assert (b.system_tokens, b.pinned_tokens, b.checkpoint_tokens, b.used) == (10, 20, 30, 40)
    assert b.context_window == 128_000
    assert b.prompt_tokens == PROMPT_PRIMING + 100


# --- the session's own reply size (SessionSettings.outputTokens) -----------------------


@pytest.mark.parametrize("window, output_limit, output_tokens, expected", [
    (8192, None, 2000, 2000),        # reserved as asked, in place of 1/8 of the window (1024)
    (8192, None, 256, 256),          # a small reply leaves the prompt more room than the default
    (8192, 4096, 300, 300),          # in place of the model's limit too
    (8192, None, 8192, 2048),        # never more than a quarter of the window
    (1_000_000, None, 64_000, 64_000),  # not held to reserved_output_cap: it is what the client asks for
    (1_000_000, 8192, 300_000, 250_000),
])
def test_reserved_output_of_the_session(window, output_limit, output_tokens, expected):
    assert reserved_output(window, output_limit, BudgetPolicy(output_tokens=output_tokens)) == expected


def test_the_sessions_reply_size_moves_the_max_prompt():
    default = budget_for(BudgetPolicy(), context_window=8192, output_limit=None, system_tokens=500)
    large = budget_for(BudgetPolicy(output_tokens=2000), context_window=8192, output_limit=None, system_tokens=500)
    small = budget_for(BudgetPolicy(output_tokens=100), context_window=8192, output_limit=None, system_tokens=500)
    assert (default.reserved_output, large.reserved_output, small.reserved_output) == (1024, 2000, 100)
    assert large.max_prompt_tokens == default.max_prompt_tokens - 976 == 6963 - 2000
    assert small.max_prompt_tokens == 6963 - 100
    assert large.available == default.available - 976 and large.trigger_at < default.trigger_at < small.trigger_at
    # What is reserved and what may be sent never pass the usable window together.
    for b in (default, large, small):
        assert b.max_prompt_tokens + b.reserved_output == b.usable
