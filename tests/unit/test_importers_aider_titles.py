"""aider's .aider.chat.history.md, and the titles imported sessions get (Claude Code:
the first words the user typed; OpenHands: the instance id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxd.importers import TranscriptError, detect_format, load_transcripts, load_transcripts_from_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
AIDER = FIXTURES / "aider.chat.history.md"


def kinds(transcript) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for m in transcript.messages:
        meta = m.metadata or {}
        out.append("aider" if meta.get("observation") else meta.get("command") or m.role)
    return out


def test_aider_history_one_session_per_run() -> None:
    first, second = load_transcripts(AIDER)  # the first of three runs has no message: skipped
    assert first.source_format == "aider" and detect_format(AIDER) == "aider"
    assert first.warnings == ["skipped 1 aider run without messages (started 2025-03-02 09:14:05)"]
    assert kinds(first) == ["aider", "/add", "aider", "user", "assistant", "aider", "/run", "aider", "user",
                            "assistant", "aider"]
    assert first.model == "anthropic/claude-3-7-sonnet-20250219" and first.provider == "anthropic"
    assert first.metadata["startedAt"] == "2025-03-02 09:20:41" and first.metadata["aiderVersion"] == "0.75.1"
    assert first.metadata["editFormat"] == "diff"
    assert first.title == "make slugify() drop accents instead of removing the letters"

    by_kind = first.messages
    # Two #### lines in a row: one input, the line break kept, aider's trailing spaces not.
    assert by_kind[3].content == 'make slugify() drop accents instead of removing the letters,\n' \
                                 'so that "Crème brûlée" becomes "creme-brulee"'
    reply = by_kind[4].content
    assert isinstance(reply, str)
    # The reply's own Markdown stays in it: a heading, a quote, code with SEARCH/REPLACE blocks.
    assert reply.startswith("#### Plan\n") and "> Note: the regex below" in reply
    assert reply.count("<<<<<<< SEARCH") == 2 and reply.endswith("```")
    assert by_kind[5].content.startswith("Tokens: 2.4k sent, 187 received.") and \
        "Applied edit to slugify.py" in by_kind[5].content
    assert "1 failed, 2 passed" in by_kind[7].content  # /run output, as aider logged it
    assert second.title == "what does slugify do with emoji?" and second.model == "openai/gpt-4o"
    assert kinds(second) == ["aider", "user", "assistant", "aider"]


def test_aider_history_with_trailing_spaces_trimmed() -> None:
    """An editor or a pre-commit hook stripped aider's two-space line ends: the lines'
    starts still tell the parts apart."""
    text = "\n".join(line.rstrip() for line in AIDER.read_text().splitlines())
    trimmed = load_transcripts_from_bytes(text.encode(), name="history.md")
    original = load_transcripts(AIDER)
    assert [kinds(t) for t in trimmed][1] == kinds(original[1])
    assert trimmed[0].messages[3].content == original[0].messages[3].content


def test_aider_code_blocks_keep_their_lines() -> None:
    text = ("# aider chat started at 2025-05-18 10:00:00\n\n"
            "#### add a guard clause  \n\n"
            "Here is the change:\n```go\nif x == nil {\n> not aider's output, a quote in the code  \n"
            "#### nor a user line  \n}\n```\nDone.\n\n"
            "> Tokens: 1.2k sent, 80 received.  \n")
    (t,) = load_transcripts_from_bytes(text.encode(), format="aider", name="h.md")
    assert kinds(t) == ["user", "assistant", "aider"]
    assert "> not aider's output" in t.messages[1].content and "#### nor a user line" in t.messages[1].content
    assert t.messages[1].content.endswith("```\nDone.")


def test_aider_errors() -> None:
    with pytest.raises(TranscriptError, match="aider"):  # other Markdown: named among the expected formats
        load_transcripts_from_bytes(b"# Notes\n\nsome text\n", name="notes.md")
    with pytest.raises(TranscriptError, match="does not look like aider"):
        load_transcripts_from_bytes(json.dumps([{"role": "user", "content": "hi"}]).encode(), format="aider")
    with pytest.raises(TranscriptError, match="no conversations"):
        load_transcripts_from_bytes(b"\n# aider chat started at 2025-01-01 00:00:00\n\n> Aider v0.1  \n",
                                    name="h.md")


def test_claude_code_title_is_the_first_words_typed() -> None:
    (t,) = load_transcripts(FIXTURES / "claude_code_session.jsonl")  # no summary record in it
    assert t.title == "Add a function called multiply_numbers(a: int, b: int)..."

    def record(i: int, kind: str, content: object, **extra: object) -> str:
        return json.dumps({"type": kind, "uuid": f"u{i}", "parentUuid": f"u{i - 1}" if i else None,
                           "sessionId": "s", "message": {"role": kind, "content": content}, **extra})

    lines = [
        record(0, "user", "<command-message>init is analyzing</command-message>\n<command-name>/init</command-name>"),
        record(1, "user", "Caveat: The messages below were generated by the user while running local commands.",
               isMeta=True),
        record(2, "user", [{"type": "text", "text": "  Why do the   login tests\nfail on CI?"}]),
        record(3, "assistant", [{"type": "text", "text": "Let me look."}]),
    ]
    (t,) = load_transcripts_from_bytes("\n".join(lines).encode(), name="abc.jsonl")
    assert t.title == "Why do the login tests"
    renamed = lines + [json.dumps({"type": "ai-title", "aiTitle": "CI login failures", "sessionId": "s"})]
    assert load_transcripts_from_bytes("\n".join(renamed).encode())[0].title == "CI login failures"
    renamed.append(json.dumps({"type": "custom-title", "customTitle": "login-ci", "sessionId": "s"}))
    (t,) = load_transcripts_from_bytes("\n".join(renamed).encode())
    assert t.title == "login-ci"  # a /rename wins over the others


def test_openhands_titles_name_the_instance() -> None:
    data = (FIXTURES / "openhands_completion.json").read_bytes()
    where = "outputs/CodeActAgent/llm_completions/astropy__astropy-12907/litellm_proxy__claude-1733339462.43.json"
    (t,) = load_transcripts_from_bytes(data, name=where)
    assert t.title == "astropy__astropy-12907" and t.metadata["instance_id"] == "astropy__astropy-12907"
    # Elsewhere (session/import has no path): the repository the task names.
    (t,) = load_transcripts_from_bytes(data, name="document")
    assert t.title == "astropy__astropy__4.3"
    (t,) = load_transcripts(FIXTURES / "openhands_events.json")  # an event stream without an instance id
    assert t.title == "what's 1+1?"
    events = json.loads((FIXTURES / "openhands_events.json").read_text())
    run = {"instance_id": "django__django-11099", "history": events}
    (t,) = load_transcripts_from_bytes((json.dumps(run) + "\n" + json.dumps(run)).encode())[:1]
    assert t.title == "django__django-11099"
