"""The reliability score: how far a compressed conversation can still be trusted.

    score = model_factor x compression_penalty x context_confidence

- model factor from the model's size in billions of parameters (from its name, e.g.
  ``llama3.2:3b``, or Ollama's ``parameter_size``): 70B+ 0.95, 30B 0.85, 13B 0.70,
  7B 0.50, smaller 0.30. Hosted frontier models (gpt-4*, gpt-5, o-series, claude,
  gemini) count as 70B+; a model whose size cannot be told counts as 13B (0.70).
- compression penalty: 15% per compression, never below 30%.
- context confidence (ctxd's own measure): 1.0 while the prompt is within the
  compression trigger, falling linearly to 0.7 as it reaches the largest prompt that
  may be sent; times 0.85 once anything was truncated or folded.

The level follows the score, except that a session nothing was compressed out of is
never ``critical`` (at worst ``low``): what the critical level advises, start a
new conversation, cannot help a conversation that is still whole.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ctxd.protocol.compression import Reliability
from ctxd.protocol.context import Budget

_SIZE = re.compile(r"(?<![a-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)\s*b(?![a-z])", re.IGNORECASE)
_SIZE_M = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*m(?![a-z])", re.IGNORECASE)
_FRONTIER = ("gpt-4", "gpt-5", "o1", "o3", "o4", "claude", "gemini", "chatgpt")

RECOMMENDATIONS = {
    "high": [],
    "medium": ["Continue if making good progress."],
    "low": [
        "Continue if making good progress.",
        "Start a new conversation if you see hallucinations.",
        "Use a larger model for complex long-term tasks.",
    ],
    "critical": [
        "Start a new conversation (reliability below 40%).",
        "Use a larger model (13B+ recommended).",
        "Review and pin or lock important decisions before continuing.",
        "Create a snapshot before continuing.",
    ],
}


@lru_cache(maxsize=256)
def model_size_billions(model: str | None, parameter_size: str | None = None) -> float | None:
    """Parameters in billions from Ollama's ``parameter_size`` ("3.2B") or the name (kept
    per name: a turn asks for it several times)."""
    for text in (parameter_size, model):
        if not text:
            continue
        lowered = text.lower().replace("_", "-")
        match = _SIZE.search(lowered)
        if match:
            experts = int(match.group(1)) if match.group(1) else 1
            return float(match.group(2)) * experts
        match = _SIZE_M.search(lowered)  # "494.03M", "smollm2:135m"
        if match:
            return float(match.group(1)) / 1000
    return None


def model_factor(model: str | None, size: float | None) -> float:
    if size is None:
        name = (model or "").lower().split("/")[-1]
        return 0.95 if name.startswith(_FRONTIER) else 0.70
    if size >= 70:
        return 0.95
    if size >= 30:
        return 0.85
    if size >= 13:
        return 0.70
    if size >= 7:
        return 0.50
    return 0.30


def level_of(score: float) -> str:
    if score >= 0.85:
        return "high"
    if score >= 0.60:
        return "medium"
    if score >= 0.40:
        return "low"
    return "critical"


def budget_inputs(budget: Budget) -> tuple[int, int, int, int] | None:
    """What of ``budget`` the score depends on: nothing while the context is within the
    compression trigger (its confidence is whole, whatever the prompt's size), else the
    figures (a caller keeping a score compares these)."""
    if budget.max_prompt_tokens > 0 and budget.used > budget.trigger_at:
        return budget.max_prompt_tokens, budget.prompt_tokens, budget.used, budget.trigger_at
    return None


def reliability(model: str | None, parameter_size: str | None, compression_count: int, budget: Budget,
                lossy: bool) -> Reliability:
    size = model_size_billions(model, parameter_size)
    factor = model_factor(model, size)
    penalty = max(1.0 - compression_count * 0.15, 0.30)
    confidence = 1.0
    if budget_inputs(budget) is not None:  # (within the trigger, fill <= trigger_fill)
        fill = budget.prompt_tokens / budget.max_prompt_tokens
        trigger_fill = (budget.prompt_tokens - budget.used + budget.trigger_at) / budget.max_prompt_tokens
        if fill > trigger_fill and trigger_fill < 1:
            confidence -= 0.3 * min(1.0, (fill - trigger_fill) / (1 - trigger_fill))
    if lossy:
        confidence *= 0.85
    score = round(factor * penalty * confidence, 4)
    level = level_of(score)
    if level == "critical" and compression_count == 0 and not lossy:
        # Nothing was compressed or lost: a small model alone is a reason to pick a larger
        # one, not to "start a new conversation" (a one-message session is not critical).
        level = "low"
    return Reliability(score=score, level=level, model_factor=factor,  # type: ignore[arg-type]
                       compression_penalty=round(penalty, 4), context_confidence=round(confidence, 4),
                       compression_count=compression_count, model_size_billions=size,
                       recommendations=RECOMMENDATIONS[level])
