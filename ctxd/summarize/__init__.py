"""Summarizers: the model-backed one, the offline extractive one, and the chain of both."""

from ctxd.summarize.base import (
    LEVELS,
    Count,
    Level,
    SummarizeError,
    Summarizer,
    SummaryRequest,
    SummaryResult,
)
from ctxd.summarize.chain import SummarizerChain, garbage_reason
from ctxd.summarize.extractive import ExtractiveSummarizer
from ctxd.summarize.llm import LLMSummarizer

__all__ = [
    "LEVELS", "Count", "ExtractiveSummarizer", "LLMSummarizer", "Level", "SummarizeError", "Summarizer",
    "SummarizerChain", "SummaryRequest", "SummaryResult", "garbage_reason",
]
