"""Learning the provider's count (engine/calibration.py) and applying it to the budget."""

from __future__ import annotations

from ctxd.engine import calibration
from ctxd.engine.budget import BudgetPolicy, budget_for
from ctxd.engine.calibration import Fit


def test_a_report_pairs_with_the_count_it_is_nearest_to():
    # The client sent its whole history (10,000 by ctxd's count), not ctxd's 3,000-token prompt.
    assert calibration.pair(12_700, (3_000, 10_000), None) == (10_000, 12_700)
    # The client sent ctxd's prompt.
    assert calibration.pair(3_300, (3_000, 10_000), None) == (3_000, 3_300)
    # With a fitted overhead, the prediction decides: 18,000 of tool schemas + 1.2 x 3,000.
    assert calibration.pair(21_600, (3_000, 10_000), Fit(1.2, 18_000)) == (3_000, 21_600)


def test_small_calls_and_empty_reports_teach_nothing():
    assert calibration.pair(900, (100, 200), None) is None
    assert calibration.pair(0, (3_000,), None) is None


def test_a_line_through_the_reports_separates_ratio_and_overhead():
    # Claude Code style: ~18.5k of system prompt and tools never pushed, 1.3 per ctxd token.
    samples = [(c, round(1.3 * c) + 18_500) for c in (600, 1_400, 2_900, 5_000, 9_000)]
    fit = calibration.fit(samples, 200_000)
    assert abs(fit.ratio - 1.3) < 0.01 and abs(fit.overhead - 18_500) < 50
    for c, r in samples:
        assert abs(fit.predict(c) - r) / r < 0.01


def test_without_spread_only_a_ratio_is_learned_and_it_is_bounded():
    assert calibration.fit([], 8192) == Fit()
    assert calibration.fit([(10_000, 12_700)], 8192) == Fit(1.27, 0)
    assert calibration.fit([(1_000, 9_000)], 8192) == Fit(calibration.HIGH, 0)
    assert calibration.fit([(10_000, 5_000)], 8192) == Fit(calibration.LOW, 0)
    # The overhead never takes more than a quarter of the window.
    samples = [(c, c + 60_000) for c in (1_000, 2_000, 4_000)]
    assert calibration.fit(samples, 32_768).overhead == 32_768 // 4


def test_samples_keep_the_newest():
    samples: list[tuple[int, int]] = []
    for i in range(20):
        samples = calibration.remember(samples, (1_000 + i, 1_100 + i))
    assert len(samples) == calibration.SAMPLES and samples[-1] == (1_019, 1_119)
    assert calibration.remember(samples, None) is samples


def test_the_budget_gives_the_providers_room_less_overhead_divided_by_the_ratio():
    plain = budget_for(BudgetPolicy(), context_window=8192, output_limit=None)
    scaled = budget_for(BudgetPolicy(), context_window=8192, output_limit=None, calibration=Fit(1.25, 400))
    assert (scaled.token_ratio, scaled.token_overhead) == (1.25, 400)
    assert scaled.max_prompt_tokens == int((plain.max_prompt_tokens - 400) / 1.25)
    assert scaled.available < plain.available and scaled.trigger_at < plain.trigger_at
    assert scaled.max_prompt_tokens * 1.25 + 400 <= plain.max_prompt_tokens  # fits as the provider counts


def test_a_slope_out_of_bounds_falls_back_to_the_ratio():
    # Reports that fall as the prompt grows are not one client on one line.
    samples = [(1_000, 1_500), (2_000, 1_400), (4_000, 1_300)]
    assert calibration.fit(samples, 32_768) == Fit(calibration.LOW, 0)


def test_a_report_larger_than_the_window_teaches_nothing():
    # An OpenHands run recorded with a 200k window, replayed at 8k: 82k reported input is
    # no prompt of this session; learning a 2x ratio from it would halve the budget.
    assert calibration.pair(82_372, (31_753, 31_753), None, 8192) is None
    assert calibration.pair(8_000, (6_000, 31_753), None, 8192) == (6_000, 8_000)
    assert calibration.pair(82_372, (31_753,), None) == (31_753, 82_372)  # window unknown
