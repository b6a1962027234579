"""Excerpts of tool outputs too big for the prompt (engine/clip.py)."""

from __future__ import annotations

from ctxd.engine.clip import clip_message, excerpt
from ctxd.protocol.message import Message, TextBlock, ToolResultBlock

from ._engine_helpers import COUNTER, count


def log(lines: int) -> str:
    return "\n".join(f"2026-11-22T02:{i % 60:02d}:00 worker-{i % 7} processed batch {i} in {i % 13} ms"
                     for i in range(lines))


def test_small_output_is_sent_as_it_is():
    text = log(5)
    assert excerpt(text, 1000, count) is text


def test_big_output_keeps_head_and_tail_within_the_limit():
    text = log(2000)
    out = excerpt(text, 600, count)
    assert count(out) <= 600
    lines = out.split("\n")
    assert lines[0] == text.split("\n")[0]  # the head starts where the output does
    assert lines[-1] == text.split("\n")[-1]  # and the tail ends where it ends
    notice = next(line for line in lines if "left out by ctxd" in line)
    assert "history" in notice
    # Whole lines on both sides of the notice, and the count of lines left out is right.
    kept = [line for line in lines if line is not notice]
    assert all(line in text.split("\n") for line in kept)
    left_out = int(notice.split(" lines")[0].split()[-1])
    assert left_out == 2000 - len(kept)


def test_one_huge_line_is_cut_by_characters():
    text = "x" * 200 + "".join(f"{i:05d}," for i in range(30_000))
    out = excerpt(text, 300, count)
    assert count(out) <= 300 and out.startswith("x" * 50) and out.endswith("29999,")


def test_an_excerpt_never_costs_more_than_the_output():
    for text in (log(1), log(2), log(3), "ok"):
        for limit in (1, 10, 40):
            out = excerpt(text, limit, count)
            assert out == text or count(out) < count(text)


def test_clip_message_counts_what_it_sends():
    for message in (
        Message(role="tool", tool_call_id="c1", content=log(1500)),
        Message(role="user", content=[ToolResultBlock(tool_use_id="a", content=log(900)),
                                      ToolResultBlock(tool_use_id="b", content=[TextBlock(text=log(700))]),
                                      TextBlock(text="and what now?")]),
    ):
        tokens = COUNTER.count_message(message)
        view, cost = clip_message(message, tokens, 500, count)
        assert cost == COUNTER.count_message(view).context
        assert cost < tokens.context and COUNTER.count_message(view).tool_result <= 500 + 20
        if message.role == "user":
            assert [b.tool_use_id for b in view.content[:2]] == ["a", "b"]  # pairing kept
            assert view.content[2] == TextBlock(text="and what now?")  # the user's words untouched
