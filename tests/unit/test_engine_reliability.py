"""Reliability: model factor x compression penalty x confidence."""

from __future__ import annotations

import pytest

from ctxd.engine.reliability import RECOMMENDATIONS, level_of, model_factor, model_size_billions, reliability

from ._engine_helpers import simple_budget

CALM = simple_budget(10_000, used=100)  # well within the trigger: confidence 1.0


@pytest.mark.parametrize("size, factor", [
    (405, 0.95), (70, 0.95), (69.9, 0.85), (30, 0.85), (29, 0.70), (13, 0.70), (12.9, 0.50), (8, 0.50),
    (7, 0.50), (6.9, 0.30), (3, 0.30), (0.5, 0.30),
])
def test_model_factors(size, factor):
    assert model_factor("some-model", size) == factor


@pytest.mark.parametrize("name, size", [
    ("llama3.2:3b", 3.0),
    ("qwen2.5:14b", 14.0),
    ("mixtral:8x7b", 56.0),
    ("llama3.1:70b-instruct-q4_K_M", 70.0),
    ("qwen2.5-coder:1.5b", 1.5),
    ("deepseek-r1:671b", 671.0),
    ("mistral-7b-instruct", 7.0),
    ("meta-llama/Llama-3.1-8B-Instruct", 8.0),
    ("hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", 3.0),
    ("gemma2:27b", 27.0),
    ("smollm2:135m", 0.135),
    ("smollm2:360m-instruct-q8_0", 0.36),
    ("phi3:mini", None),
    ("gpt-4o-mini", None),
    ("llama3:8b-instruct-q4_K_M", 8.0),
    ("llama3.2", None),
    ("gpt-4o", None),
    (None, None),
])
def test_model_size_from_names(name, size):
    assert model_size_billions(name) == size


@pytest.mark.parametrize("parameter_size, size", [("3.2B", 3.2), ("70.6B", 70.6), ("8x7B", 56.0),
                                                   ("494.03M", 0.49403), ("135M", 0.135)])
def test_model_size_from_ollama_parameter_size(parameter_size, size):
    assert model_size_billions("llama3.2", parameter_size) == pytest.approx(size)


def test_parameter_size_wins_over_the_name():
    assert model_size_billions("mymodel:7b", "13B") == 13.0
    assert model_size_billions("mymodel:7b", "") == 7.0
    assert model_size_billions("mymodel:7b", "weird") == 7.0


def test_unknown_and_frontier_models():
    assert model_factor("gpt-4o", None) == 0.95
    assert model_factor("openai/gpt-5", None) == 0.95
    assert model_factor("claude-sonnet-4", None) == 0.95
    assert model_factor("gemini-2.0-flash", None) == 0.95
    assert model_factor("o3-mini", None) == 0.95
    assert model_factor("phi3:mini", None) == 0.70  # size unknown: counted as 13B
    assert model_factor(None, None) == 0.70


@pytest.mark.parametrize("count, penalty", [(0, 1.0), (1, 0.85), (2, 0.70), (3, 0.55), (4, 0.40), (5, 0.30),
                                            (10, 0.30)])
def test_compression_penalty_15_percent_floored_at_30(count, penalty):
    r = reliability("llama3:70b", None, count, CALM, lossy=False)
    assert r.compression_penalty == pytest.approx(penalty)
    assert r.score == pytest.approx(round(0.95 * penalty, 4))
    assert r.compression_count == count
    assert r.context_confidence == 1.0


@pytest.mark.parametrize("score, level", [(1.0, "high"), (0.85, "high"), (0.8499, "medium"), (0.60, "medium"),
                                          (0.5999, "low"), (0.40, "low"), (0.3999, "critical"), (0.0, "critical")])
def test_levels(score, level):
    assert level_of(score) == level


def test_warning_case_small_model_three_compressions():
    r = reliability("llama3.2:3b", None, 3, CALM, lossy=False)
    assert r.model_size_billions == 3.0 and r.model_factor == 0.30
    assert r.score == pytest.approx(0.30 * 0.55)
    assert r.level == "critical"
    assert r.recommendations == RECOMMENDATIONS["critical"] and r.recommendations


def test_a_session_nothing_was_compressed_out_of_is_never_critical():
    fresh = reliability("llama3.2:3b", None, 0, CALM, lossy=False)
    assert fresh.score == pytest.approx(0.30)  # the score still tells the model is small
    assert fresh.level == "low" and fresh.recommendations == RECOMMENDATIONS["low"]
    assert reliability("llama3.2:3b", None, 0, CALM, lossy=True).level == "critical"
    assert reliability("llama3.2:3b", None, 1, CALM, lossy=False).level == "critical"


def test_levels_of_typical_models():
    assert reliability("llama3:70b", None, 0, CALM, False).level == "high"
    assert reliability("qwen2.5:32b", None, 0, CALM, False).level == "high"  # 0.85
    assert reliability("qwen2.5:14b", None, 0, CALM, False).level == "medium"  # 0.70
    assert reliability("qwen2.5:14b", None, 1, CALM, False).level == "low"  # 0.595
    assert reliability("llama3.1:8b", None, 0, CALM, False).level == "low"  # 0.50
    assert reliability("llama3.1:8b", None, 1, CALM, False).level == "low"  # 0.425
    assert reliability("llama3.1:8b", None, 2, CALM, False).level == "critical"  # 0.35


def test_context_confidence_falls_toward_the_largest_prompt():
    at_trigger = simple_budget(10_000, used=8_000)
    assert reliability("x:70b", None, 0, at_trigger, False).context_confidence == 1.0
    full = simple_budget(10_000, used=10_000 - 3)  # prompt == max prompt
    assert reliability("x:70b", None, 0, full, False).context_confidence == pytest.approx(0.7)
    half = simple_budget(10_000, used=9_000)
    assert 0.7 < reliability("x:70b", None, 0, half, False).context_confidence < 1.0
    over = simple_budget(10_000, used=20_000)
    assert reliability("x:70b", None, 0, over, False).context_confidence == pytest.approx(0.7)


def test_lossy_lowers_confidence():
    r = reliability("x:70b", None, 0, CALM, lossy=True)
    assert r.context_confidence == pytest.approx(0.85)
    assert r.score == pytest.approx(0.95 * 0.85)


def test_score_is_the_product():
    b = simple_budget(10_000, used=9_500)
    r = reliability("qwen2.5:14b", "14.8B", 2, b, lossy=True)
    assert r.score == pytest.approx(r.model_factor * r.compression_penalty * r.context_confidence, abs=1e-3)
    assert r.model_size_billions == 14.8


def test_the_score_depends_on_the_budget_only_through_budget_inputs():
    """What a caller compares to keep a score (``budget_inputs``) is all of the budget the
    score reads: budgets alike there score alike, within the trigger whatever their size."""
    import msgspec

    from ctxd.engine.reliability import budget_inputs

    budgets = [simple_budget(window, used=used, system_tokens=system, checkpoint_tokens=checkpoints,
                             trigger_fraction=fraction)
               for window in (0, 1_000, 8_192, 200_000) for used in (0, 1, 500, 800, 801, 6_000, 9_000, 250_000)
               for system in (0, 300) for checkpoints in (0, 150) for fraction in (0.5, 0.8, 1.0)]
    seen: dict[object, bytes] = {}
    within = set()
    for budget in budgets:
        for count, lossy in ((0, False), (2, True)):
            key = (budget_inputs(budget), count, lossy)
            score = msgspec.json.encode(reliability("llama3.1:8b", None, count, budget, lossy))
            assert seen.setdefault(key, score) == score, (budget, count, lossy)
            if key[0] is None:
                within.add(budget.prompt_tokens)
    assert len(within) > 10  # (many prompt sizes within the trigger, each the same score)
