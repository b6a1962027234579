"""snapshot, search, history, compress, checkpoints, expand, pin and goal, end to end."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


def complete(cli: Cli, words: str) -> str:
    env = {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
           "_CTXD_CLI_COMPLETE": "bash_complete"}
    return cli(env=env, expect=None).stdout


def test_snapshots_search_and_history(cli: Cli) -> None:
    cli("push", "s", "--create", "--content", "we chose the zeppelin architecture for the queue")
    cli("push", "s", "--role", "assistant", "--content", "noted: zeppelin it is")

    created = cli.json("snapshot", "create", "s", "--label", "before the detour")
    snap = created["snapshotId"]
    assert created["trigger"] == "manual" and created["label"] == "before the detour" and created["lastSeq"] == 2
    listed = cli.json("snapshot", "list", "s")["snapshots"]
    assert [s["snapshotId"] for s in listed] == [snap]
    assert snap in cli("snapshot", "list", "s").stdout
    content = cli.json("snapshot", "show", "s", snap)
    assert content["info"]["snapshotId"] == snap and len(content["userMessages"]) == 1
    text = cli("snapshot", "show", "s", snap).stdout
    for words in ("user messages", "other messages", "checkpoints", "goal", "watermark", "zeppelin"):
        assert words in text, words
    assert snap in complete(cli, f"ctxd-cli snapshot show s {snap[:7]}")  # snapshot ids complete

    cli("push", "s", "--content", "actually, let us try a detour")
    restored = cli.json("snapshot", "restore", "s", snap, "--yes")  # --yes: no question even on a terminal
    assert restored["snapshotId"] == snap and restored["backupSnapshotId"] != snap
    assert (restored["rolledBackFrom"], restored["rolledBackTo"]) == (3, 3)
    history = cli.json("history", "s")
    assert [m["status"] for m in history["messages"]] == ["context", "context", "rolled_back"]
    assert history["events"][0]["kind"] == "restore"
    plain = cli("history", "s").stdout
    assert "rolled_back" in plain and f"restored snapshot {snap}, seq 3 rolled back" in plain
    backup = restored["backupSnapshotId"]
    restore_text = cli("snapshot", "restore", "s", backup).stdout  # no terminal: it goes ahead (undoable)
    assert f"restored session s to snapshot {backup}" in restore_text and "backup" in restore_text
    assert cli.json("snapshot", "delete", "s", snap, "--yes")["deleted"] == [snap]
    assert cli("snapshot", "show", "s", snap, expect=1).error_line().endswith("(-33020)")

    found = cli.json("search", "zeppelin")
    assert sorted((h["sessionId"], h["seq"], h["role"]) for h in found["hits"]) == [("s", 1, "user"),
                                                                                      ("s", 2, "assistant")]
    assert found["tookMs"] >= 0 and all("[zeppelin]" in h["snippet"] for h in found["hits"])
    assert [h["seq"] for h in cli.json("search", "zeppelin", "--role", "assistant")["hits"]] == [2]
    assert len(cli.json("search", "zeppelin", "--session", "s", "--limit", "1")["hits"]) == 1
    assert cli.json("search", "zeppel*", "--fts")["hits"]
    table = cli("search", "zeppelin")
    assert "[zeppelin]" in table.stdout and "\x1b[" not in table.stdout  # markers kept off a terminal
    assert "2 hits" in table.stderr and "ms" in table.stderr
    assert "FTS5" in cli("search", '"unclosed', "--fts", expect=1).error_line()
    assert cli.json("sessions", "search", "detour")["hits"][0]["seq"] == 3  # the name other chat CLIs give it

    cli("push", "p", "--create", "--message-json",
        input=json.dumps([{"role": "user", "content": f"page message {i}"} for i in range(6)]))
    first = cli.json("history", "p", "--limit", "4")
    assert [m["seq"] for m in first["messages"]] == [1, 2, 3, 4] and first["nextSeq"] == 5
    assert [m["seq"] for m in cli.json("history", "p", "--from", "5", "--limit", "4")["messages"]] == [5, 6]
    everything = cli.json("history", "p", "--limit", "2", "--all")
    assert [m["seq"] for m in everything["messages"]] == [1, 2, 3, 4, 5, 6] and everything["nextSeq"] is None
    paged = cli("history", "p", "--limit", "4")
    assert "next page: ctxd-cli history p --from 5" in paged.stderr


def test_compress_checkpoints_expand_pin_goal(cli: Cli) -> None:
    cli("replay", str(FIXTURES / "mini_swe_agent.traj.json"), "--session", "r")
    result = cli.json("compress", "r", "--focus", "the json bug")
    assert result["compressed"] and result["afterTokens"] < result["beforeTokens"] and result["checkpointIds"]
    checkpoint = result["checkpointIds"][0]

    listed = cli.json("checkpoints", "r")
    assert [c["id"] for c in listed["checkpoints"]] == [checkpoint] and listed["tokens"] > 0
    assert checkpoint in cli("checkpoints", "r").stdout
    assert checkpoint in complete(cli, "ctxd-cli expand r ")
    expanded = cli.json("expand", "r", checkpoint)
    ranges = expanded["checkpoint"]["messageRanges"]
    assert [m["seq"] for m in expanded["messages"]] == [s for a, b in ranges for s in range(a, b + 1)]
    text = cli("expand", "r", checkpoint).stdout
    assert "Summary" in text and "Original messages" in text
    again = cli("compress", "r").stdout  # exit 0 whether or not a second pass finds anything
    assert "compressed session r" in again or "nothing compressed in session r" in again

    pinned = cli.json("pin", "r", "3")
    assert pinned["pinned"] and 3 in pinned["seqs"]
    assert "pinned now: 3" in cli("pin", "r", "5").stdout
    assert not cli.json("pin", "r", "5", "--unpin")["pinned"]
    assert cli("pin", "r", "999", expect=1).error_line().endswith("(-33014)")

    assert "has no goal" in cli("goal", "show", "r").stderr
    goal = cli.json("goal", "set", "r", "fix from_json", "--priority", "high", "--milestone", "reproduce")
    assert goal["goal"]["description"] == "fix from_json" and goal["goal"]["priority"] == "high"
    updated = cli.json("goal", "update", "r", "--milestone", "reproduce=completed", "--milestone", "patch=in-progress",
                       "--decision", "keep the public API", "--locked", "--next", "run the tests",
                       "--artifact", "pydicom/jsonrep.py", "--status", "paused")["goal"]
    assert [(c["description"], c["status"]) for c in updated["checkpoints"]] == \
        [("reproduce", "completed"), ("patch", "in-progress")]
    assert updated["decisions"][0] == {"description": "keep the public API", "locked": True}
    assert updated["nextSteps"] == ["run the tests"] and updated["status"] == "paused"
    assert updated["artifacts"][0]["path"] == "pydicom/jsonrep.py"
    shown = cli("goal", "show", "r").stdout
    for words in ("fix from_json", "[x] reproduce", "[~] patch", "keep the public API (locked)", "run the tests"):
        assert words in shown, words
    assert cli.json("goal", "show", "r")["goal"]["status"] == "paused"
    assert "TEXT=STATUS" in cli("goal", "update", "r", "--milestone", "no status", expect=2).stderr
    assert "--decision" in cli("goal", "update", "r", "--locked", expect=2).stderr
