"""watch: the plain line-per-event mode with compression events, and the live view's rendering."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from rich.console import Console

from ctxd.cli import render
from ctxd.cli.watch import LiveState, context_line, render_live
from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


class Lines:
    """A process's output lines, read by a thread (a pipe read with select would miss lines
    already in the reader's buffer)."""

    def __init__(self, stream: IO[str]) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.queue.put(line)

    def until(self, word: str, seconds: float = 20) -> list[str]:
        lines: list[str] = []
        deadline = time.monotonic() + seconds
        while True:
            try:
                line = self.queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {word!r} within {seconds} s in {lines}") from None
            lines.append(line)
            if word in line:
                return lines


@pytest.mark.process("ctxd-cli watch read while it runs, then Ctrl-C")
def test_plain_watch_shows_compression_events(cli: Cli) -> None:
    cli("replay", str(FIXTURES / "mini_swe_agent.traj.json"), "--session", "w")
    plain = cli.popen("watch", "w")  # stdout is a pipe: one line per event, no live view
    json_lines = cli.popen("watch", "w", "--json")
    for proc in (plain, json_lines):
        assert proc.stderr is not None
        assert "watching session w" in proc.stderr.readline()
    assert "compressed session w" in cli("compress", "w").stdout

    assert plain.stdout is not None and json_lines.stdout is not None
    lines = Lines(plain.stdout).until("context/compressed")
    assert any("context/compressing" in line and "%" in line for line in lines)
    done = lines[-1]
    assert " -> " in done and "tokens" in done and "summarize" in done and "\x1b[" not in done
    events = [json.loads(line) for line in Lines(json_lines.stdout).until('"context/compressed"')]
    stages = [e["params"]["stage"] for e in events if e["method"] == "context/compressing"]
    assert stages and stages[0] == "identification"
    compressed = events[-1]["params"]
    assert compressed["sessionId"] == "w" and compressed["afterTokens"] < compressed["beforeTokens"]
    for proc in (plain, json_lines):
        proc.send_signal(2)  # Ctrl-C
        assert proc.wait(timeout=10) == 0


def rendered(state: LiveState, width: int = 100) -> tuple[str, Console]:
    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    console.print(render_live(state))
    return console.export_text(), console


def styles_of(console: Console, renderable: object, text: str) -> list[str]:
    return [str(seg.style) for seg in console.render(renderable) if seg.text.strip() == text]  # type: ignore[arg-type]


def test_live_view_rendering() -> None:
    state = LiveState("s1", title="refactor", model="llama3.2:3b", prompt_tokens=5234, max_prompt_tokens=6800,
                      compressions=2, reliability={"level": "high", "score": 0.9}, message_count=40, last_seq=40)
    state.context_window = 8192
    assert context_line(state) == "Prompt: 5,234 / 6,800 (77%), window 8,192"
    text, console = rendered(state, width=80)
    assert "Prompt: 5,234 / 6,800 (77%), window 8,192" in text and "2 compressions" in text
    assert "s1 · refactor · llama3.2:3b" in text and "Reliability: high" in text
    assert "no compression, checkpoint or snapshot events yet" in text and "Compressing" not in text
    assert any("green" in s for s in styles_of(console, render_live(state), "high"))

    # A compression runs: the progress bar follows context/compressing.
    at = "12:00:01"
    state.apply("context/compressing", {"sessionId": "s1", "stage": "summarization", "percentage": 25}, at)
    text, _ = rendered(state)
    assert "Compressing: summarization 25%" in text
    refresh = state.apply("context/compressed", {
        "sessionId": "s1", "layers": ["prune", "summarize"], "beforeTokens": 6100, "afterTokens": 3000,
        "freedTokens": 3100, "ratio": 0.49, "checkpointIds": ["ckpt_1"], "durationMs": 4.0,
        "compressionNumber": 3, "trigger": "auto"}, "12:00:02")
    assert refresh  # the budget is fetched again after a compression
    for method, params in (
            ("checkpoint/created", {"checkpoint": {"id": "ckpt_1", "kind": "summary", "level": "detailed",
                                                   "seqFrom": 1, "seqTo": 30, "tokens": 200, "originalTokens": 2900}}),
            ("snapshot/created", {"snapshot": {"snapshotId": "snap_9", "trigger": "auto", "label": "before"}}),
            ("context/threshold", {"level": "critical", "promptTokens": 6500, "maxPromptTokens": 6800, "used": 6000,
                                   "triggerAt": 4000}),
            ("context/overflow", {"policy": "fold", "action": "folded 3 messages", "promptTokens": 7000,
                                  "maxPromptTokens": 6800}),
            ("context/reliability", {"reliability": {"level": "critical", "score": 0.21}, "previousLevel": "low"}),
            ("session/updated", {"reason": "push", "pushed": 2, "lastSeq": 42, "messageCount": 42,
                                 "tokenCount": 9000, "contextTokens": 3100})):
        state.apply(method, {"sessionId": "s1", **params}, "12:00:03")
    text, console = rendered(state)
    assert "Compressing" not in text  # the bar is gone once the pass ended
    assert "Prompt: 3,100 / 6,800 (46%), window 8,192" in text and "3 compressions" in text
    assert "6,100 → 3,000 tokens (freed 3,100) prune+summarize, #3, auto" in text
    for words in ("ckpt_1 summary/detailed seq 1-30: 2,900 → 200 tokens", "snap_9 (auto) before",
                  "threshold critical", "fold: folded 3 messages", "low → critical", "last update 12:00:03 push +2",
                  "messages 42 (last seq 42)"):
        assert words in text, words
    assert any("red" in s for s in styles_of(console, render_live(state), "critical"))

    for i in range(15):  # only the last ten events stay
        state.apply("snapshot/created", {"sessionId": "s1", "snapshot": {"snapshotId": f"snap_{i}", "trigger": "auto"}},
                    "12:01:00")
    text, _ = rendered(state)
    assert "Last 10 events" in text and "snap_14" in text and "snap_4 " not in text
    assert not state.apply("something/new", {"sessionId": "s1"}, "12:02:00")  # unknown methods are ignored
    state.apply("session/deleted", {"sessionId": "s1"}, "12:03:00")
    assert state.deleted and "session deleted" in rendered(state)[0]

    for level, colour in (("medium", "yellow"), ("low", "dark_orange")):
        state.reliability = {"level": level, "score": 0.5}
        console = Console(record=True, width=100, force_terminal=True, color_system="truecolor")
        assert any(colour in s for s in styles_of(console, render_live(state), level)), level


def test_snippet_and_message_text() -> None:
    console = Console(record=True, width=120, force_terminal=True, color_system="truecolor")
    console.print(render.rich_cell(render.Marked("…the [zeppelin] queue, a[0] and from_[json]…")))
    assert console.export_text() == "…the zeppelin queue, a[0] and from_json…\n"  # marked words highlighted
    assert str(render.Marked("the [zeppelin]")) == "the [zeppelin]"  # plain output keeps the markers
    message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"},
                                                {"type": "text", "text": "Let me look"},
                                                {"type": "tool_use", "id": "t1", "name": "bash",
                                                 "input": {"cmd": "ls"}}]}
    assert render.message_text(message) == '[thinking: hmm] Let me look [tool call bash({"cmd":"ls"})]'
    assert render.message_preview({"role": "tool", "content": "a\n  b " * 50}, 20) == "a b a b a b a b a..."


def test_an_image_that_came_with_a_message_is_shown_as_what_it_shows() -> None:
    """An ``image`` block (typed content beside the words) reads as ``[image: ...]`` in
    ``ctxd-cli`` and in ``ctxd mcp``'s recall, as every provider is sent it; it was left out."""
    from ctxd.mcp.render import message_body

    message = {"role": "user", "content": [{"type": "text", "text": "Look at her!"},
                                           {"type": "image", "description": "a grey cat on a sofa",
                                            "url": "https://example.invalid/cat.jpg"}]}
    assert render.message_text(message) == "Look at her! [image: a grey cat on a sofa]"
    assert message_body(message) == "Look at her!\n[image: a grey cat on a sofa]"
