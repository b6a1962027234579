"""Full history and search over the protocol, against a real daemon.

* ``session/history`` pages through every message exactly once, each with where it
  stands now (``context``, ``kept``: a user message behind the compression boundary,
  ``compressed``, ``rolled_back``), checked against the prompt and the checkpoints;
  the compressions and events (a restore) come with the first page.
* ``session/search`` and ``history/search``: ranked hits with snippets across
  sessions; a message compression took out of the active context is still found and
  returned whole; a message is found right after its push; FTS5 syntax characters in
  plain words never error, invalid ``syntax: "fts"`` queries are -32602; deleted
  sessions are not searched.
* Integrity: a database with garbage in the middle is refused at startup (exit 2, one
  line naming the file and ``ctxd-cli doctor``) and left byte-equal.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.compression_helpers import CHECKPOINT_OPENINGS, Driver, is_auto_pass, seqs_of
from tests.e2e.helpers import run_ctxd
from tests.e2e.history_helpers import (
    canonical,
    chat_turns,
    flatten,
    full_history,
    index_progress,
    index_settled,
    marker_of,
    prompt,
    prompt_text,
    push,
    rpc_error,
    running,
)

pytestmark = pytest.mark.usefixtures("storage_backend")

WINDOW = 2048


def _without_checkpoints(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation without ctxd's checkpoints, which are sent as user text in it (their
    summaries may quote a compressed message's words; Anthropic merges one into the user
    message before it as a block of its own)."""
    def ours(text: Any) -> bool:
        return isinstance(text, str) and text.startswith(CHECKPOINT_OPENINGS)

    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            out.append({**m, "content": [b for b in content if not (isinstance(b, dict) and ours(b.get("text")))]})
        elif not ours(content):
            out.append(m)
    return out


async def _session_with_every_status(conn: Any) -> dict[str, Any]:
    """A session whose history has compressed, kept, rolled-back and context messages."""
    await conn.call("session/create", {"sessionId": "h", "contextWindow": WINDOW, "systemPrompt": "Be brief."})
    turns = chat_turns(51, 400, tag="h", user_sizes=(3, 8))
    drive = Driver(conn, "h")
    n = 0
    while len(drive.runs) < 2:
        await drive.push(turns[n].messages)
        n += 1
    # The snapshot right after a pass: a pass leaves the low-water mark's room below the
    # trigger, which the three turns pushed after the restore fit in.
    snap = await conn.call("snapshot/create", {"sessionId": "h", "label": "S"})
    runs_before = len(drive.runs)
    while len(drive.runs) < runs_before + 2:
        await drive.push(turns[n].messages)
        n += 1
    restored = await conn.call("snapshot/restore", {"sessionId": "h", "snapshotId": snap["snapshotId"]})
    after = chat_turns(52, 3, tag="hnew", user_sizes=(3, 8))
    for turn in after:
        result = await push(conn, "h", turn.messages)
        drive.pushed.update({w["seq"]: m for m, w in zip(turn.messages, result["messages"])})
        # Below the trigger: no automatic pass can start behind the test's back.
        assert result["budget"]["used"] <= result["budget"]["triggerAt"]
    return {"drive": drive, "snapshot": snap, "restored": restored}


async def test_history_pages_through_everything_once_with_statuses():
    # Without the agent's working set: its pins (the session reads a file a turn) leave a
    # 2K window too little room above the snapshot for the three turns pushed after the
    # restore, which must not start a pass; the set has tests of its own.
    async with running("compression.working_share=0") as d:
        conn = await d.connect("*")
        built = await _session_with_every_status(conn)
        drive, restored = built["drive"], built["restored"]
        total = max(drive.pushed)

        whole = await full_history(conn, "h")
        pages: list[dict[str, Any]] = []
        seq: int | None = 1
        while seq is not None:
            page = await conn.call("session/history", {"sessionId": "h", "from": seq, "limit": 7})
            pages.append(page)
            assert page["messageCount"] == total
            if page["nextSeq"] is not None:
                assert len(page["messages"]) == 7 and page["nextSeq"] == page["messages"][-1]["seq"] + 1
            seq = page["nextSeq"]
        seqs = [e["seq"] for p in pages for e in p["messages"]]
        assert seqs == list(range(1, total + 1))
        assert len(pages) == -(-total // 7)
        assert [e for p in pages for e in p["messages"]] == whole["messages"]
        for entry in whole["messages"]:
            assert canonical(entry["message"]) == canonical(drive.pushed[entry["seq"]]), entry["seq"]

        # Compressions and events come with the first page only.
        assert pages[0]["compressions"] and pages[0]["events"]
        assert all(not p.get("compressions") and not p.get("events") for p in pages[1:])
        notes = [p for m, p in conn.notes if m == "context/compressed" and is_auto_pass(p)]
        records = pages[0]["compressions"]
        assert [r["number"] for r in records] == list(range(1, len(notes) + 1))
        assert [(r["layers"], r["beforeTokens"], r["afterTokens"], r["checkpointIds"], r["trigger"]) for r in records] \
            == [(n["layers"], n["beforeTokens"], n["afterTokens"], n["checkpointIds"], "auto") for n in notes]
        (event,) = pages[0]["events"]
        assert event["kind"] == "restore" and event["lastSeq"] == restored["rolledBackTo"]
        assert event["detail"]["snapshotId"] == built["snapshot"]["snapshotId"]
        assert event["detail"]["rolledBack"] == [restored["rolledBackFrom"], restored["rolledBackTo"]]

        # Statuses, checked against the rollback, the checkpoints and the prompt.
        status = {e["seq"]: e["status"] for e in whole["messages"]}
        by = {s: sorted(q for q, v in status.items() if v == s) for s in ("context", "kept", "compressed",
                                                                         "rolled_back")}
        assert all(by.values()), {k: len(v) for k, v in by.items()}
        assert by["rolled_back"] == list(range(restored["rolledBackFrom"], restored["rolledBackTo"] + 1))
        assert max(by["compressed"] + by["kept"]) < min(by["context"])
        assert all(drive.pushed[q]["role"] == "user" for q in by["kept"])
        checkpoints = (await conn.call("context/checkpoints", {"sessionId": "h"}))["checkpoints"]
        covered = {q for cp in checkpoints for q in seqs_of(cp)}
        assert set(by["compressed"]) <= covered
        for fmt in ("openai", "anthropic", "ollama"):
            result = await prompt(conn, "h", fmt)
            sent = [m for m in result["messages"] if m["role"] != "system"]
            conversation = prompt_text({"messages": _without_checkpoints(sent)})
            for q in by["kept"] + by["context"]:
                assert marker_of(drive.pushed[q]) in conversation, f"{fmt}: {q} ({status[q]}) is not sent"
            for q in by["compressed"]:
                assert marker_of(drive.pushed[q]) not in conversation, f"{fmt}: compressed {q} is sent verbatim"
            everything = prompt_text(result)
            for q in by["rolled_back"]:
                assert marker_of(drive.pushed[q]) not in everything, f"{fmt}: rolled-back {q} is sent"

        # Past the end: nothing, and no next page.
        tail = await conn.call("session/history", {"sessionId": "h", "from": total + 1, "limit": 10})
        assert tail["messages"] == [] and tail["nextSeq"] is None and tail["messageCount"] == total
        exact = await conn.call("session/history", {"sessionId": "h", "from": total - 4, "limit": 5})
        assert [e["seq"] for e in exact["messages"]] == list(range(total - 4, total + 1)) and exact["nextSeq"] is None


async def test_history_bad_params():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "h"})
        await push(conn, "h", [{"role": "user", "content": "hi"}])
        for params, field in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": -3}, "limit"),
                              ({"from": 0}, "from"), ({"from": -1}, "from")):
            err = await rpc_error(conn, "session/history", {"sessionId": "h", **params}, -32602)
            assert err.data and err.data.get("field") == field, (params, err.data)
        for params in ({"from": "1"}, {"limit": 2.5}):
            await rpc_error(conn, "session/history", {"sessionId": "h", **params}, -32602)
        # A field the method does not have is named, not ignored (a client written against
        # another version would otherwise silently get the wrong page).
        err = await rpc_error(conn, "session/history", {"sessionId": "h", "fromSeq": 3}, -32602)
        assert err.data == {"field": "fromSeq"} and "'fromSeq'" in err.message and "from" in err.message
        page = await conn.call("session/history", {"sessionId": "h", "workDoneToken": "t1"})  # LSP's own: fine
        assert [e["seq"] for e in page["messages"]] == [1]
        await rpc_error(conn, "session/history", {"sessionId": "nope"}, -33001)
        page = await conn.call("session/history", {"sessionId": "h"})
        assert [e["seq"] for e in page["messages"]] == [1] and page["nextSeq"] is None
        assert page["messages"][0]["status"] == "context"


# --- search --------------------------------------------------------------------------------------


async def test_search_ranks_and_snippets_across_sessions():
    async with running() as d:
        conn = await d.connect()
        for sid, title in (("alpha", "Alpha work"), ("beta", "Beta work")):
            await conn.call("session/create", {"sessionId": sid, "title": title})
        await push(conn, "alpha", [
            {"role": "user", "content": "zebra zebra zebra stripes everywhere"},
            {"role": "assistant", "content": "Long answer about many things: " + "filler words here " * 30
             + "and one zebra at the end"},
        ])
        await push(conn, "beta", [
            {"role": "user", "content": "A zebra crossed the road near the station today"},
            {"role": "assistant", "content": "No striped animals in this reply at all"},
            {"role": "tool", "toolCallId": "call_1", "content": "grep: zebra found twice: zebra"},
        ])
        await index_settled(d.db_path)  # (see the background indexer race test)
        result = await conn.call("session/search", {"query": "zebra"})
        hits = result["hits"]
        assert result["query"] == "zebra"
        assert {(h["sessionId"], h["seq"]) for h in hits} == {("alpha", 1), ("alpha", 2), ("beta", 1), ("beta", 3)}
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert (hits[0]["sessionId"], hits[0]["seq"]) == ("alpha", 1)  # densest
        assert (hits[-1]["sessionId"], hits[-1]["seq"]) == ("alpha", 2)  # one mention in a long text
        for h in hits:
            assert "[zebra]" in h["snippet"].lower(), h["snippet"]
            assert h["title"] == {"alpha": "Alpha work", "beta": "Beta work"}[h["sessionId"]]
            assert h["createdAt"] and h["role"] in ("user", "assistant", "tool")
            assert h.get("message") is None  # session/search gives snippets; history/search gives messages
        only_beta = await conn.call("session/search", {"query": "zebra", "sessionId": "beta"})
        assert {h["seq"] for h in only_beta["hits"]} == {1, 3}
        users = await conn.call("session/search", {"query": "zebra", "role": "user"})
        assert {(h["sessionId"], h["seq"]) for h in users["hits"]} == {("alpha", 1), ("beta", 1)}
        assert len((await conn.call("session/search", {"query": "zebra", "limit": 1}))["hits"]) == 1
        both = await conn.call("session/search", {"query": "zebra road"})
        assert [(h["sessionId"], h["seq"]) for h in both["hits"]] == [("beta", 1)]  # every word required
        assert (await conn.call("session/search", {"query": "giraffe"}))["hits"] == []
        await rpc_error(conn, "session/search", {"query": "zebra", "sessionId": "nope"}, -33001)
        await rpc_error(conn, "session/search", {"query": "zebra", "limit": 0}, -32602)
        await rpc_error(conn, "history/search", {"query": "zebra", "sessionId": "nope"}, -33001)


async def test_compressed_messages_are_still_found_and_returned_whole():
    async with running() as d:
        conn = await d.connect("*")
        await conn.call("session/create", {"sessionId": "long", "contextWindow": WINDOW})
        await conn.call("session/create", {"sessionId": "other"})
        await push(conn, "other", flatten(chat_turns(60, 6, tag="o")))
        drive = Driver(conn, "long")
        for turn in chat_turns(61, 400, tag="l"):
            await drive.push(turn.messages)
            if len(drive.runs) >= 4:
                break
        history = (await full_history(conn, "long"))["messages"]
        sent = " ".join([prompt_text(await prompt(conn, "long", fmt)) for fmt in ("openai", "anthropic", "ollama")])
        gone = [e for e in history if e["status"] == "compressed" and marker_of(e["message"]) not in sent]
        assert len(gone) >= 5, "compression left too little out of every prompt"
        boundary = min(e["seq"] for e in history if e["status"] == "context")
        await index_settled(d.db_path)  # (see the background indexer race test)
        for entry in gone[:: max(1, len(gone) // 8)]:
            marker = marker_of(entry["message"])
            assert entry["seq"] < boundary
            found = await conn.call("session/search", {"query": marker})
            assert [(h["sessionId"], h["seq"]) for h in found["hits"]] == [("long", entry["seq"])]
            assert f"[{marker}]" in found["hits"][0]["snippet"]
            recalled = await conn.call("history/search", {"sessionId": "long", "query": marker})
            (hit,) = recalled["hits"]
            assert hit["seq"] == entry["seq"] and hit["status"] == "compressed"
            assert canonical(hit["message"]) == canonical(drive.pushed[entry["seq"]])
        # history/search only looks in its session.
        other_marker = "mkoq00001z"
        assert (await conn.call("history/search", {"sessionId": "long", "query": other_marker}))["hits"] == []
        assert len((await conn.call("history/search", {"sessionId": "other", "query": other_marker}))["hits"]) == 1


async def test_search_finds_a_message_right_after_its_push():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "s"})
        for i in range(15):
            # Nothing left to index from before (so no background run can race this search: see
            # the race test below); then the search right after the push must find it.
            await index_settled(d.db_path)
            word = f"fresh{i:03d}word"
            result = await push(conn, "s", [{"role": "user", "content": f"note {word}"},
                                            {"role": "assistant", "content": "noted " * (i + 1)}])
            hits = (await conn.call("session/search", {"query": word}))["hits"]
            assert [h["seq"] for h in hits] == [result["messages"][0]["seq"]], i
            recalled = (await conn.call("history/search", {"sessionId": "s", "query": word}))["hits"]
            assert recalled[0]["message"] == {"role": "user", "content": f"note {word}"}
            assert recalled[0]["status"] == "context"


BULK = 10_000


async def test_search_while_the_background_indexer_runs_sees_every_acknowledged_message():
    async with running(f"limits.max_batch_messages={BULK}") as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "bulk"})
        filler = " ".join(["alpha beta gamma delta"] * 3)
        await push(conn, "bulk", [{"role": "user", "content": f"bulk{i:05d}x {filler}"} for i in range(BULK)])
        # No search yet: the background indexer takes this push in batches of 2000. Catch it part-way
        # (some batches committed, not all), then search for the newest message.
        while True:
            through, last = index_progress(d.db_path)
            if 0 < through < last:
                break
            if through >= last:
                pytest.skip("the background indexer finished before it could be seen part-way")
            await asyncio.sleep(0.002)
        hits = (await conn.call("session/search", {"query": f"bulk{BULK - 1:05d}x"}))["hits"]
        assert [h["seq"] for h in hits] == [BULK], "an acknowledged message is missing from search"


WORDS_QUERIES = ['"foo-bar"', "foo-bar", "a*b", 'say "hi', "NEAR(", "NEAR(foo bar", "foo) OR (bar", "^caret",
                 "col:umn", "AND", "OR NOT", "-minus +plus", "{braces}", "x AND", "'single'", "back\\slash",
                 "ünïcödé 中文", "emoji 🚀 rocket"]


async def test_fts_syntax_in_words_mode_never_errors():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "s"})
        await push(conn, "s", [{"role": "user", "content": 'Use foo-bar with a*b, NEAR( and col:umn; say "hi"'},
                               {"role": "assistant", "content": "ünïcödé 中文 and an emoji 🚀 rocket"}])
        await index_settled(d.db_path)
        for query in WORDS_QUERIES:
            for method, extra in (("session/search", {}), ("history/search", {"sessionId": "s"})):
                result = await conn.call(method, {"query": query, "syntax": "words", **extra})
                assert result["query"] == query
        found = {q: [h["seq"] for h in (await conn.call("session/search", {"query": q}))["hits"]]
                 for q in ('"foo-bar"', "a*b", "NEAR(", "col:umn", 'say "hi', "rocket 🚀")}
        assert found == {'"foo-bar"': [1], "a*b": [1], "NEAR(": [1], "col:umn": [1], 'say "hi': [1],
                         "rocket 🚀": [2]}
        for query in ("", "   ", "***", '"" ()'):
            err = await rpc_error(conn, "session/search", {"query": query}, -32602)
            assert err.data.get("field") == "query", err.data


async def test_fts_syntax_mode():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "s"})
        await push(conn, "s", [{"role": "user", "content": "the zebra has stripes"},
                               {"role": "assistant", "content": "a giraffe has spots"},
                               {"role": "assistant", "content": "zebrafish are different"}])
        await index_settled(d.db_path)

        async def seqs(query: str) -> list[int]:
            return sorted(h["seq"] for h in (await conn.call("session/search", {"query": query,
                                                                                 "syntax": "fts"}))["hits"])

        assert await seqs("zebra OR giraffe") == [1, 2]
        assert await seqs('"zebra has"') == [1]
        assert await seqs("zebra*") == [1, 3]
        assert await seqs("NEAR(zebra stripes, 2)") == [1]
        for query in ("NEAR(", "zebra AND", "(zebra", "OR", "col:zebra", "zebra)", "NOT zebra", ".", "x'y",
                      '"unterminated', "rank:zebra", "NEAR(zebra stripes, -1)"):
            for method, extra in (("session/search", {}), ("history/search", {"sessionId": "s"})):
                err = await rpc_error(conn, method, {"query": query, "syntax": "fts", **extra}, -32602)
                assert err.data.get("field") == "query", (query, err.data)
                assert "query" in err.message, err.message


async def test_fts_syntax_errors_sqlite_words_differently():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "s"})
        await push(conn, "s", [{"role": "user", "content": "the zebra has stripes"}])
        for query in ("*", "NEAR(zebra stripes, x)"):
            err = await rpc_error(conn, "session/search", {"query": query, "syntax": "fts"}, -32602)
            assert err.data.get("field") == "query", err.data


async def test_deleted_sessions_are_not_searched():
    async with running() as d:
        conn = await d.connect()
        for sid in ("keep", "gone"):
            await conn.call("session/create", {"sessionId": sid})
            await push(conn, sid, [{"role": "user", "content": f"shared okapi and {sid}only"}])
        await index_settled(d.db_path)
        assert len((await conn.call("session/search", {"query": "okapi"}))["hits"]) == 2
        await conn.call("session/delete", {"sessionId": "gone"})
        hits = (await conn.call("session/search", {"query": "okapi"}))["hits"]
        assert [h["sessionId"] for h in hits] == ["keep"]
        assert (await conn.call("session/search", {"query": "goneonly"}))["hits"] == []
        await rpc_error(conn, "history/search", {"sessionId": "gone", "query": "okapi"}, -33001)
        # A new session with the same id does not inherit the old one's messages.
        await conn.call("session/create", {"sessionId": "gone"})
        assert (await conn.call("history/search", {"sessionId": "gone", "query": "okapi"}))["hits"] == []
        await conn.call("session/clear", {"all": True})
        assert (await conn.call("session/search", {"query": "okapi"}))["hits"] == []


# --- integrity -----------------------------------------------------------------------------------


@pytest.mark.sqlite_only("damages the SQLite file itself")
@pytest.mark.process("ctxd's exit code and stderr when it refuses a database")
async def test_corrupt_database_is_refused_and_left_as_it_was(tmp_path):
    async with running() as d:
        conn = await d.connect()
        for i in range(3):
            await conn.call("session/create", {"sessionId": f"s{i}"})
            await push(conn, f"s{i}", flatten(chat_turns(70 + i, 120, tag=f"s{i}")))
            await conn.call("snapshot/create", {"sessionId": f"s{i}"})
        await index_settled(d.db_path)  # the search index is written too
        await d.stop()
        db = d.db_path
        assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
        data = bytearray(db.read_bytes())
        page_size = int.from_bytes(data[16:18], "big")
        pages = len(data) // page_size
        assert pages >= 40, pages
        rng = random.Random(4)
        first = pages // 2 - 3
        for page in range(first, first + 6):
            data[page * page_size:(page + 1) * page_size] = bytes(rng.randrange(256) for _ in range(page_size))
        db.write_bytes(bytes(data))
        for extra in (f"{db}-wal", f"{db}-shm"):
            Path(extra).unlink(missing_ok=True)
        # The premise: SQLite itself sees the damage (checked on a copy).
        probe = tmp_path / "probe.db"
        shutil.copy(db, probe)
        check = sqlite3.connect(probe)
        try:
            assert check.execute("PRAGMA quick_check").fetchall() != [("ok",)]
        except sqlite3.DatabaseError:
            pass
        finally:
            check.close()

        before = db.read_bytes()
        sock = d.proc.root / "again.sock"
        result = run_ctxd(["--config", str(d.proc.config_path), "--data-dir", str(d.proc.data_dir),
                           "--socket", str(sock)])
        assert result.returncode == 2, result.stderr.decode()
        text = result.stderr.decode()
        assert "Traceback" not in text
        lines = text.strip().splitlines()
        assert len(lines) == 1, lines
        assert str(db) in lines[0] and "ctxd-cli doctor" in lines[0], lines[0]
        assert db.read_bytes() == before, "the damaged file was modified"
        assert not sock.exists()


async def test_history_pages_of_every_size():
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "p"})
        messages = flatten(chat_turns(80, 20, tag="p"))
        await push(conn, "p", messages)
        total = len(messages)
        for limit in (1, 3, total // 2, total, 1000):
            got = await full_history(conn, "p", limit=limit)
            assert [canonical(e["message"]) for e in got["messages"]] == [canonical(m) for m in messages]
            assert got["pages"] == -(-total // limit), limit
