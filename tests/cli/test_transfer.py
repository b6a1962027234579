"""export and import: round trips in every format, atomic writes, bad files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctxd.cli import transfer
from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def bodies(cli: Cli, session_id: str) -> list[dict]:
    return [m["message"] for m in cli.json("history", session_id, "--all")["messages"]]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_export_import_round_trip_in_every_format(cli: Cli, backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "postgresql":  # the daemon ctxd-cli starts stores in PostgreSQL
        cli.env["CTXD_STORAGE_URL"] = request.getfixturevalue("pg_server").create_database()
    # A real agent run: tool calls, tool results, usage, timestamps.
    cli("replay", str(FIXTURES / "mini_swe_agent.traj.json"), "--session", "src")
    cli("push", "src", "--content", "a last word with ünïcode ✓")
    original = bodies(cli, "src")
    assert len(original) == 13

    for suffix, fmt in ((".json", "json"), (".md", "markdown"), (".jsonl", "jsonl")):
        path = cli.root / f"out{suffix}"
        written = cli.json("sessions", "export", "src", "-o", str(path))  # format from the suffix
        assert written["format"] == fmt and written["file"] == str(path) and written["messageCount"] == 13
        assert path.stat().st_size == written["bytes"] > 0
        imported = cli.json("sessions", "import", str(path), "--session", f"copy-{fmt}", "--title", f"copy {fmt}")
        assert imported["sessionIds"] == [f"copy-{fmt}"] and imported["messageCount"] == 13
        assert imported["format"] == fmt
        assert bodies(cli, f"copy-{fmt}") == original, fmt
        assert cli.json("sessions", "show", f"copy-{fmt}")["title"] == f"copy {fmt}"

    # The top-level aliases, stdout, and text output.
    doc = cli("export", "src", "-o", "-", "--format", "jsonl").stdout
    assert len(doc.splitlines()) == 13  # one chat message a line, the session's fields on the first
    (cli.root / "piped.jsonl").write_text(doc)
    assert "into session piped" in cli("import", str(cli.root / "piped.jsonl"), "--session", "piped").stdout
    assert bodies(cli, "piped") == original
    text = cli("export", "src", "-o", str(cli.root / "plain.md")).stdout
    assert "exported 13 messages of session src" in text and "markdown" in text

    # A transcript, not an export: every importer format goes through session/import.
    transcript = cli.json("import", str(FIXTURES / "claude_code_session.jsonl"))
    assert transcript["format"] == "claude_code" and transcript["messageCount"] > 0

    exists = cli("import", str(cli.root / "out.json"), expect=1).error_line()
    assert "already exists" in exists and "--session" in exists


def test_a_failed_export_leaves_the_old_file_alone(cli: Cli) -> None:
    target = cli.root / "keep.json"
    target.write_text("the old content\n")
    missing = cli("sessions", "export", "nope", "-o", str(target), expect=1)
    assert "nope" in missing.error_line()
    assert target.read_text() == "the old content\n"
    assert sorted(p.name for p in cli.root.iterdir() if p.name.startswith(".")) == []  # no temporary file left

    nowhere = cli("export", "nope", "-o", str(cli.root / "no" / "such" / "dir.json"), expect=2).error_line()
    assert "does not exist" in nowhere
    assert "is a directory" in cli("export", "nope", "-o", str(cli.root), expect=2).error_line()

    cli("push", "s", "--create", "--content", "hello")
    cli("export", "s", "-o", str(target))
    assert '"ctxd.session"' in target.read_text()


def test_import_bad_files_exit_4(cli: Cli) -> None:
    (cli.root / "notes.txt").write_text("just some text\n")
    (cli.root / "empty.json").write_text("")
    (cli.root / "latin1.json").write_bytes(b"caf\xe9")
    for name, words in (("notes.txt", "not JSON"), ("empty.json", "empty"), ("latin1.json", "not UTF-8"),
                        ("missing.json", "no such file")):
        line = cli("sessions", "import", str(cli.root / name), expect=4).error_line()
        assert words in line and name in line, line
    bad_md = cli.root / "bad.md"
    bad_md.write_text("# not a ctxd export\n")
    assert "bad.md" in cli("import", str(bad_md), expect=4).error_line()


def test_write_atomically_never_leaves_half_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "doc.json"
    target.write_text("old")
    os.chmod(target, 0o640)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(transfer.os, "fsync", broken_fsync)
        with pytest.raises(OSError):
            transfer.write_atomically(target, b"new content that never lands")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]

    transfer.write_atomically(target, b"new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o640  # mode kept
    link = tmp_path / "link.json"
    link.symlink_to(target)
    transfer.write_atomically(link, b"through the link")
    assert link.is_symlink() and target.read_text() == "through the link"
    assert transfer.format_for("x.MD", None) == "markdown" and transfer.format_for("x.ndjson", None) == "jsonl"
    assert transfer.format_for("-", None) == "json" and transfer.format_for("x.txt", "jsonl") == "jsonl"
