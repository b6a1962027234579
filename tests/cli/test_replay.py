"""replay: every transcript format, idempotency, the bundled example, bad files."""

from __future__ import annotations

import json
from pathlib import Path

from ctxd.importers import FORMATS, load_transcripts
from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
TRANSCRIPTS = sorted(p for p in FIXTURES.iterdir() if p.name != "ATTRIBUTION.md")


def test_replay_every_fixture(cli: Cli) -> None:
    formats = set()
    replayed = {}
    for path in TRANSCRIPTS:
        expected = load_transcripts(path)
        out = cli.json("replay", str(path))
        assert out["file"] == str(path) and len(out["sha256"]) == 64
        assert len(out["sessions"]) == len(expected), path
        for session, transcript in zip(out["sessions"], expected):
            formats.add(session["sourceFormat"])
            assert session["created"] and session["sourceFormat"] == transcript.source_format
            assert session["pushed"] == len(transcript.messages) == session["messageCount"], path
            assert session["duplicates"] == 0 and session["tokenCount"] > 0
            assert session["warnings"] == transcript.warnings
            replayed[session["sessionId"]] = (len(transcript.messages), transcript.source_format)
    assert formats == set(FORMATS)  # the fixtures cover every importer
    stored = cli.json("sessions", "list", "--tag", "replay")["sessions"]
    assert {s["sessionId"]: (s["messageCount"], s["tags"][-1]) for s in stored} == replayed


def test_replay_twice_into_the_same_session_stores_nothing_twice(cli: Cli) -> None:
    path = FIXTURES / "mini_swe_agent.traj.json"
    first = cli.json("replay", str(path), "--session", "run", "--batch", "5", "--title", "demo")["sessions"][0]
    assert first["created"] and first["pushed"] == 12 and first["messageCount"] == 12
    second = cli.json("replay", str(path), "--session", "run", "--batch", "7")["sessions"][0]
    assert not second["created"]
    assert second["pushed"] == 0 and second["duplicates"] == 12
    assert second["messageCount"] == 12 and second["tokenCount"] == first["tokenCount"]
    assert cli.json("sessions", "show", "run")["title"] == "demo"

    text = cli("replay", str(path), "--session", "run").stdout
    assert "0 messages pushed, 12 already stored" in text

    locomo = FIXTURES / "locomo_synthetic.json"  # two conversations: run-1, run-2... here loco-1, loco-2
    cli.json("replay", str(locomo), "--session", "loco")
    again = cli.json("replay", str(locomo), "--session", "loco")["sessions"]
    assert [s["sessionId"] for s in again] == ["loco-1", "loco-2"]
    assert all(s["pushed"] == 0 and s["duplicates"] == s["messages"] for s in again)


def test_replay_example(cli: Cli) -> None:
    out = cli.json("replay", "--example")
    [session] = out["sessions"]
    assert session["sourceFormat"] == "mini_swe_agent" and session["title"] == "django__django-11099"
    assert session["pushed"] == session["messageCount"] == 86
    assert session["budget"]["contextWindow"] == 8192
    assert out["file"].endswith("django__django-11099.traj.json")
    # ~17k tokens of history in an 8k window: the daemon compresses, and the replay
    # reports the figures after compression settled, not those of the last push.
    assert session["tokenCount"] > 8192
    assert session["compression"]["passes"] >= 1 and not session["compression"]["running"]
    assert session["contextTokens"] <= session["budget"]["maxPromptTokens"]
    assert session["compressionCount"] == session["compression"]["passes"]

    text = cli("replay", "--example", "--context-window", "32768")
    for word in ("86 messages pushed", "history", "prompt", "32,768", "max prompt", "available",
                 "trigger", "free", "warnings"):
        assert word in text.stdout, word
    assert "mini-swe-agent" in text.stderr  # the credit line goes to stderr


def test_bad_files_exit_4_with_one_line(cli: Cli) -> None:
    (cli.root / "notes.txt").write_text("just some text\n")
    (cli.root / "other.json").write_text(json.dumps({"hello": "world"}))
    (cli.root / "broken.json").write_text('{"messages": [')
    cases = {
        "notes.txt": "not JSON or JSONL",
        "other.json": "not a recognised transcript",
        "broken.json": "not valid JSON",
        "missing.json": "no such file",
    }
    for name, words in cases.items():
        line = cli("replay", str(cli.root / name), expect=4).error_line()
        assert words in line and name in line
    wrong_format = cli("replay", str(FIXTURES / "openhands_events.json"), "--format", "locomo", expect=4)
    assert "does not look like locomo" in wrong_format.error_line()
    assert not cli.socket.exists()  # a bad file never needs a daemon
    assert "FILE or --example" in cli("replay", expect=2).stderr
