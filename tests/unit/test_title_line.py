"""A session's default title is read from the start of its first user message, never by
splitting a whole (up to 4 MB) message into lines inside the push's transaction."""

from __future__ import annotations

import random

import pytest

from ctxd.protocol.message import Message
from ctxd.service import ingest


def _old_title(text: str) -> str | None:
    """What the title was before: the whole text split into lines."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return None
    return line if len(line) <= ingest.TITLE_LENGTH else line[: ingest.TITLE_LENGTH - 1].rstrip() + "\u2026"


@pytest.mark.parametrize("seed", range(30))
def test_the_title_is_what_splitting_the_whole_text_gave(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(ingest, "TITLE_SCAN_CHARS", rng.choice([1, 5, 20, 90, 200]))
    bits = ["word", " ", "\n", "\r\n", "\r", "\u2028", "\x0c", "   ", "\t", "title words here", "x" * 100]
    for _ in range(50):
        text = "".join(rng.choice(bits) for _ in range(rng.randrange(0, 40)))
        message = Message(role="user", content=text)
        assert ingest._title_of(message) == _old_title(text), repr(text)


class Watched(str):
    """A text that records being split into lines whole."""

    split_whole = 0

    def splitlines(self, keepends: bool = False) -> list[str]:  # type: ignore[override]
        Watched.split_whole += 1
        return super().splitlines(keepends)


def test_a_large_message_is_not_split_into_lines() -> None:
    text = Watched("Fix the flaky cache test\n" + "log line of a tool's output\n" * 150_000)
    assert ingest._first_line(text) == "Fix the flaky cache test"
    long_first = Watched("y" * 500_000 + "\nsecond")
    assert ingest._first_line(long_first)[: ingest.TITLE_LENGTH] == "y" * ingest.TITLE_LENGTH
    assert Watched.split_whole == 0
