"""What a summarizer is asked and what it answers.

The engine builds a ``SummaryRequest`` for each checkpoint (and for each aging step,
passing the older summaries as assistant messages with ``kind="checkpoint_merge"``);
a summarizer returns the text plus enough bookkeeping to show in status output which
summarizer produced it, what it cost, and why a fallback happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

import msgspec

from ctxd.protocol.message import Message

Level = Literal["detailed", "moderate", "compact", "ultra"]
RequestKind = Literal["conversation", "checkpoint_merge"]

Count = Callable[[str], int]
"""Counts tokens of a text (the daemon injects its tiktoken counter)."""

LEVELS: tuple[Level, ...] = ("detailed", "moderate", "compact", "ultra")


class SummaryRequest(msgspec.Struct, kw_only=True):
    """What to summarize and how small the result must be.

    ``goal`` is an already rendered goal block (goal-aware summarization); ``focus``
    is the user's steering text (like ``/compact <focus>``).
    """

    messages: list[Message]
    level: Level
    target_tokens: int
    goal: str | None = None
    focus: str | None = None
    kind: RequestKind = "conversation"


class SummaryResult(msgspec.Struct, kw_only=True):
    """A summary and how it was made.

    ``summarizer`` names who wrote ``text`` ("extractive", "ollama:llama3.2:3b").
    ``chunks`` counts the model calls made over pieces of the input (1 when it fit in
    one call, 0 for the extractive summarizer); ``calls`` counts every model call,
    merges included. ``fallback_reason`` is set when an earlier summarizer of a chain
    failed: "<kind>: <detail>" with kind one of backend_error, timeout, garbage, error.
    """

    text: str
    summarizer: str
    input_tokens: int
    output_tokens: int
    chunks: int = 0
    calls: int = 0
    fallback_reason: str | None = None


class SummarizeError(Exception):
    """A summarizer cannot do this request at all (e.g. its model's window is too small)."""


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns a ``SummaryRequest`` into a ``SummaryResult``."""

    name: str

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        ...
