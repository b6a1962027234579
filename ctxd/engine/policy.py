"""The knobs of compression, as one frozen value the engine functions take.

``config.CompressionConfig`` (with a session's ``SessionSettings`` on top) fills it;
the engine never reads configuration itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVELS = ("ultra", "compact", "moderate", "detailed")


@dataclass(frozen=True)
class CompressionPolicy:
    auto: bool = True
    strategy: str = "summarize"
    """``summarize`` (checkpoints by summary) or ``truncate`` (checkpoints that only say
    what was dropped)."""
    overflow_policy: str = "fold"
    keep_recent: int = 5
    """Newest messages never summarized (the identification stage): a floor, not the target."""
    recent_share: float = 0.5
    """At most this share of the available budget is protected as 'recent'."""
    low_water_fraction: float = 0.7
    """A compression takes the oldest part of the conversation just far enough to leave it at
    this share of the available budget, and no further."""
    room_fraction: float = 0.7
    """The quality-first low-water mark, even where the provider caches and passes go
    deeper: a pass that could not reach the low-water mark (the user's words fill the
    conversation) shortens the summaries to this share at most (summaries are where older
    turns live), and a pass before the trigger because it pays waits until the
    conversation fills this share of the window."""
    min_growth_fraction: float = 0.10
    """Automatic compression waits until the conversation grew by this share of the
    available budget since the last one (no compaction loops)."""
    pass_interval: int = 0
    """Where the provider caches (0 elsewhere): a pass leaves room for this many requests
    of the session's growth before the next, shortening the summaries for it when it
    must (down to ``LEVEL_CAP["ultra"]`` of the largest prompt)."""
    prune_minimum: int = 20_000
    prune_protect: int = 40_000
    prune_minimum_fraction: float = 0.25
    prune_protect_fraction: float = 0.5
    protected_tools: tuple[str, ...] = ()
    watermark_tools: tuple[str, ...] = ("compress_to_checkpoint", "deactivate_augments")
    max_checkpoints: int = 4
    """More summary checkpoints than this and the two oldest merge (into an "ultra" one)."""
    fold_share: float = 0.25
    """Folded user words may take this share of the prompt at most."""
    checkpoint_share: float = 0.25
    """Summary checkpoints age (oldest first) only when together they take more than this
    share of the largest prompt."""
    user_share: float = 0.5
    """The user's messages stay verbatim in the conversation while they take at most this
    share of the largest prompt; only past it does the overflow policy fold the oldest."""
    fold_floor: float = 0.5
    """A fold past ``user_share`` leaves the user's words at least this share of it (as
    deep as the low-water mark asks, no deeper)."""
    working_share: float = 0.12
    """An agent's working set (the newest read of each file its tool calls read,
    ``engine/workset.py``) is kept verbatim while it takes at most this share of the largest
    prompt, the client's and the user's pins included."""
    critical_fraction: float = 0.98
    """``context/threshold`` says "critical" when the prompt reaches this share of the largest
    prompt: above the trigger (0.95 of what the conversation may use), so a client hears
    "warning" first, and "critical" only when a pass could not keep up."""

    def prune_thresholds(self, available: int) -> tuple[int, int]:
        """(minimum, protect) for pruning: 20k/40k (three-layer compaction's), scaled down for windows
        where those absolute figures would never apply."""
        minimum = min(self.prune_minimum, math.ceil(available * self.prune_minimum_fraction))
        protect = min(self.prune_protect, math.ceil(available * self.prune_protect_fraction))
        return minimum, protect


# Level targets: (share of the input it summarizes, share of the largest prompt it may take).
# Checkpoint ageing: a new checkpoint is 50-70% compressed; ageing compresses to 60%, then
# 50%, and merged checkpoints to 40%; its 8K figures (~2000/1200/800/400) are these caps.
LEVEL_RATIO = {"detailed": 0.40, "moderate": 0.60, "compact": 0.50, "ultra": 0.40}
LEVEL_CAP = {"detailed": 0.25, "moderate": 0.15, "compact": 0.08, "ultra": 0.05}
MIN_TARGET = 48


def target_tokens(level: str, input_tokens: int, max_prompt: int) -> int:
    """How long a summary at ``level`` of ``input_tokens`` may be."""
    target = min(input_tokens * LEVEL_RATIO[level], max_prompt * LEVEL_CAP[level])
    return max(MIN_TARGET, int(target))


def initial_level(input_tokens: int, max_prompt: int) -> str:
    """The preparation stage's "level by size", its 2000/3000-token bounds scaled to the window
    (they are a third and a half of an 8K prompt)."""
    if input_tokens > max_prompt * 0.5:
        return "compact"
    if input_tokens > max_prompt / 3:
        return "moderate"
    return "detailed"


def lower(level: str) -> str:
    index = LEVELS.index(level)
    return LEVELS[max(0, index - 1)]
