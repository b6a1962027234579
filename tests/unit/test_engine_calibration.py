"""Learning the provider's count (engine/calibration.py) and applying it to the budget."""

from __future__ import annotations

from ctxd.engine import calibration
from ctxd.engine.budget import BudgetPolicy, budget_for


def test_a_sample_uses_the_count_the_report_is_nearest_to():
    # The client sent its whole history (10,000 by ctxd's count), not ctxd's 3,000-token prompt.
    assert calibration.sample(12_700, (3_000, 10_000)) == 1.27
    # The client sent ctxd's prompt.
    assert calibration.sample(3_300, (3_000, 10_000)) == 1.1


def test_small_prompts_and_empty_reports_teach_nothing():
    assert calibration.sample(900, (100, 300)) is None
    assert calibration.sample(0, (3_000,)) is None


def test_the_applied_ratio_is_the_bounded_median_of_the_newest_samples():
    assert calibration.applied([]) == 1.0
    recent: list[float] = []
    for r in [1.2, 1.3, 5.0, 1.25, 1.27]:
        recent = calibration.remember(recent, r)
    assert calibration.applied(recent) == 1.27  # one wild sample does not move it
    for _ in range(calibration.SAMPLES):
        recent = calibration.remember(recent, 0.5)
    assert len(recent) == calibration.SAMPLES
    assert calibration.applied(recent) == calibration.LOW
    assert calibration.applied([9.0]) == calibration.HIGH


def test_the_budget_divides_the_providers_room_by_the_ratio():
    plain = budget_for(BudgetPolicy(), context_window=8192, output_limit=None)
    scaled = budget_for(BudgetPolicy(), context_window=8192, output_limit=None, token_ratio=1.25)
    assert scaled.token_ratio == 1.25
    assert scaled.max_prompt_tokens == int(plain.max_prompt_tokens / 1.25)
    assert scaled.available < plain.available and scaled.trigger_at < plain.trigger_at
    assert scaled.max_prompt_tokens * 1.25 <= plain.max_prompt_tokens  # fits as the provider counts
