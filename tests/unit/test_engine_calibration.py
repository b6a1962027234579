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


def test_empty_and_partial_reports_teach_nothing():
    assert calibration.pair(0, (3_000,), None) is None
    assert calibration.pair(900, (0,), None) is None
    # A runtime that counted only what its prompt cache did not hold (older Ollama): not the
    # prompt's size, and read as one it would set a ratio of 0.3.
    assert calibration.pair(900, (3_000,), None) is None
    # A small prompt beside a large constant (Claude Code's first call) is the best view of it.
    assert calibration.pair(18_549, (35,), None) == (35, 18_549)


def test_a_line_through_the_reports_separates_ratio_and_overhead():
    # ~18.5k of system prompt and tools never pushed, 1.3 per ctxd token, counts that spread
    # over more than a tenth of the window.
    samples = [(c, round(1.3 * c) + 18_500) for c in (600, 5_000, 12_000, 21_000, 30_000)]
    fit = calibration.fit(samples, 200_000)
    assert abs(fit.ratio - 1.3) < 0.01 and abs(fit.overhead - 18_500) < 50
    for c, r in samples:
        assert abs(fit.predict(c) - r) / r < 0.01


def test_one_report_off_the_others_does_not_move_the_line():
    """Seven reports on one line (1.15 per ctxd token, 4,000 beside) and one that is not
    (a report paired with another prompt than its own): the line stays the seven's. A
    least-squares slope read 0.90 and 27,562 beside from them, and predicted the next call
    4.4% under what the provider counts: a prompt that much over the window."""
    for at, odd in ((2, (45_000, 150_000)), (0, (10_000, 60_000)), (5, (90_000, 190_000)), (3, (60_000, 30_000))):
        samples = [(c, round(1.15 * c) + 4_000) for c in (20_000, 35_000, 50_000, 65_000, 80_000, 95_000, 110_000)]
        samples.insert(at, odd)
        fit = calibration.fit(samples, 200_000)
        assert abs(fit.ratio - 1.15) < 0.01 and abs(fit.overhead - 4_000) < 100, (odd, fit)


def test_a_constant_beside_a_little_conversation_is_not_taken_for_a_ratio():
    """Claude Code's usage (its ~18.5k of system prompt and tools never in the transcript,
    the conversation 35 to 2,926 tokens by ctxd's count): the constant is the overhead, the
    ratio stays 1 until the counts spread over a tenth of the window. The fit used to read
    it as a ratio (2.0, its clamp: 84,000 of 200,000). The later reports are predicted
    within 3%, and the budget leaves at least 130k."""
    series = [(35, 18_549), (169, 18_754), (545, 19_276), (1_362, 20_322), (1_559, 20_550), (1_722, 20_897),
              (1_902, 21_168), (2_030, 21_367), (2_290, 21_667), (2_361, 21_793), (2_517, 22_000),
              (2_788, 22_345), (2_829, 22_628), (2_926, 22_899)]
    samples: list[tuple[int, int]] = []
    for k, (c, r) in enumerate(series):
        if k >= 3:
            assert abs(calibration.fit(samples, 200_000).predict(c) - r) / r < 0.03, k
        samples = calibration.remember(samples, calibration.pair(r, (c,), calibration.fit(samples, 200_000), 200_000))
    fit = calibration.fit(samples, 200_000)
    assert fit.ratio == 1.0 and 19_000 < fit.overhead < 20_500
    budget = budget_for(BudgetPolicy(usable_fraction=1.0), context_window=200_000, output_limit=32_000,
                        calibration=fit)
    assert budget.max_prompt_tokens >= 130_000


def test_without_spread_the_difference_is_the_overhead_and_it_is_bounded():
    assert calibration.fit([], 8192) == Fit()
    assert calibration.fit([(10_000, 12_700)], 200_000) == Fit(1.0, 2_700)
    # The overhead never takes more than half the window (an agent's tool definitions can
    # take over a third of a small one: Claude Code's ~20k at 48k).
    assert calibration.fit([(1_000, 9_000)], 8192) == Fit(1.0, 8192 // 2)
    assert calibration.fit([(1_000, 18_000)], 48_000) == Fit(1.0, 17_000)
    samples = [(c, c + 60_000) for c in (1_000, 2_000, 4_000)]
    assert calibration.fit(samples, 32_768).overhead == 32_768 // 2
    # A provider that counts less than ctxd: a ratio below 1 (bounded), no overhead.
    assert calibration.fit([(10_000, 9_000)], 8192) == Fit(0.9, 0)
    assert calibration.fit([(10_000, 5_000)], 8192) == Fit(calibration.LOW, 0)


def test_a_ratio_is_learned_once_the_counts_spread():
    """DeepSeek through mini-swe-agent: 1.12 per ctxd token and ~250 of framing. Within a
    tenth of an 8k window the slope is fitted; the prediction holds where it was measured."""
    samples = [(c, round(1.12 * c) + 250) for c in (1_200, 1_900, 2_600, 3_300)]
    fit = calibration.fit(samples, 8192)
    assert abs(fit.ratio - 1.12) < 0.01 and abs(fit.overhead - 250) < 5


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


def test_a_slope_out_of_bounds_is_held_to_its_bounds_and_keeps_the_overhead():
    # Reports that fall as the prompt grows are not one client on one line: the lower bound,
    # and what the newest calls say beyond it as the overhead.
    samples = [(1_000, 1_500), (2_000, 1_400), (4_000, 1_300)]
    assert calibration.fit(samples, 8192) == Fit(calibration.LOW, 0)
    # A steep line keeps its constant instead of folding it into a clamped ratio.
    steep = [(c, 3 * c + 5_000) for c in (1_000, 5_000, 9_000)]
    fit = calibration.fit(steep, 32_768)
    assert fit.ratio == calibration.HIGH and fit.overhead > 5_000


def test_a_report_larger_than_the_window_teaches_nothing():
    # An OpenHands run recorded with a 200k window, replayed at 8k: 82k reported input is
    # no prompt of this session; learning a 2x ratio from it would halve the budget.
    assert calibration.pair(82_372, (31_753, 31_753), None, 8192) is None
    assert calibration.pair(8_000, (6_000, 31_753), None, 8192) == (6_000, 8_000)
    assert calibration.pair(82_372, (31_753,), None) == (31_753, 82_372)  # window unknown
