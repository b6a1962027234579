"""``session/export`` and ``session/import`` over the protocol, against a real daemon.

A session mixing everything a message can carry (OpenAI- and Anthropic-style tool
calls, thinking blocks with signatures, usage, metadata, timestamps, names,
multi-line and unicode text with emoji, CJK, ``-->``, ``--`` and backticks) goes out
in each of the three formats and comes back in as a new session: every message must
be byte-equal (msgspec JSON encoding), with the same creation times, the same tool
pairing (each result after its call, ids identical), and the session's goal,
settings and descriptive fields. Claude Code transcripts import with the right
message count. Bad documents fail with -33030 naming the problem and store nothing;
importing over an existing session id fails with -33002.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.history_helpers import (
    Conn,
    encoded,
    full_history,
    push,
    read_db,
    rpc_error,
    running,
)

# Every test here runs on SQLite and on PostgreSQL (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("storage_backend")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"

TRICKY = ("Multi-line 多行テキスト 🚀🧪 — ends with -->\nline 2 has -- and --- and <!-- a comment -->\n"
          "```python\nprint('fenced')\n```\n````\nfour ticks\n````\n  indented `code` and \\-- backslash\n"
          "tab\there, CJK 中文字符, emoji 👩‍💻, combining é, RTL עברית, zero-width\u200bspace\n")

SYSTEM = "You are a careful agent -->\nNever say `rm -rf /` -- ever. 系统提示 ✅"


def rich_messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Session rules: be brief -- really.", "timestamp": "2025-01-02T03:04:05Z"},
        {"role": "user", "content": TRICKY, "name": "alice", "timestamp": "2025-01-02T03:04:06.123+02:00",
         "metadata": {"client": "e2e", "nested": {"list": [1, 2.5, None, True], "text": "-->"}}},
        {"role": "assistant", "content": "Let me look 👀 at two files.",
         "toolCalls": [
             {"id": "call_A1", "type": "function",
              "function": {"name": "read_file", "arguments": '{"path": "src/主.py", "note": "a -- b"}'}},
             {"id": "call_A2", "type": "function", "function": {"name": "list_dir", "arguments": ""}}],
         "usage": {"inputTokens": 1200, "outputTokens": 42, "totalTokens": 1242, "cacheReadTokens": 1000,
                   "reasoningTokens": 7},
         "metadata": {"model": "gpt-4o", "finish": "tool_calls"}, "timestamp": "2025-01-02T03:04:07Z"},
        {"role": "tool", "toolCallId": "call_A1", "name": "read_file",
         "content": "def main():\n    return '-->'  # 注释\n```\nnot closed fence"},
        {"role": "tool", "toolCallId": "call_A2", "content": "a.py\nb.py\n"},
        {"role": "assistant", "content": None, "toolCalls": [
            {"id": "call_B1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]},
        {"role": "tool", "toolCallId": "call_B1", "content": ""},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Hmm -- the user wants <!-- x --> handled.\n思考中…",
             "signature": "sig-abc123=="},
            {"type": "text", "text": "Running grep and a shell command."},
            {"type": "tool_use", "id": "toolu_C1", "name": "grep", "input": {"pattern": "-->", "flags": ["-n", "--"]}},
            {"type": "tool_use", "id": "toolu_C2", "name": "run_shell", "input": {}}],
         "usage": {"inputTokens": 900, "outputTokens": 77}, "timestamp": "2025-01-02T03:05:00Z"},
        {"role": "user", "content": [
            {"type": "tool_result", "toolUseId": "toolu_C1", "content": "src/a.py:3: -->"},
            {"type": "tool_result", "toolUseId": "toolu_C2",
             "content": [{"type": "text", "text": "exit 1"}, {"type": "text", "text": "stderr: ✗ failed"}],
             "isError": True},
            {"type": "text", "text": "Both results above. Next?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "no signature here"},
                                          {"type": "text", "text": "Done.\n\n| a | b |\n|---|---|\n| 1 | 2 |"}]},
        {"role": "user", "content": "", "name": "bob"},
        {"role": "user", "content": "Thanks! 🙏 `inline` ``double`` and a trailing backslash \\",
         "idempotencyKey": "key-1"},
        {"role": "assistant", "content": "\n\nleading and trailing blank lines\n\n"},
    ]


GOAL = {"description": "Port the parser -- keep `--strict` semantics 🚀", "priority": "high",
        "checkpoints": [{"description": "tokenizer", "status": "completed"},
                        {"description": "grammar", "status": "in-progress"}],
        "decisions": [{"description": "Use PEG -- no yacc", "locked": True}]}
SETTINGS = {"autoCompress": True, "strategy": "truncate", "keepRecent": 7, "triggerFraction": 0.7}
DESCRIPTIVE = ("model", "provider", "contextWindow", "systemPrompt", "title", "tags", "metadata", "settings")


async def make_rich(conn: Conn, session_id: str) -> None:
    await conn.call("session/create", {
        "sessionId": session_id, "model": "llama3.1:8b", "provider": "ollama", "contextWindow": 32768,
        "systemPrompt": SYSTEM, "title": "Rich -- session 🚀", "tags": ["e2e", "ünïcode"],
        "metadata": {"project": "ctxd", "depth": {"a": [1, 2]}}, "settings": SETTINGS})
    await conn.call("goal/set", {"sessionId": session_id, **GOAL})
    await push(conn, session_id, rich_messages()[:5])
    await push(conn, session_id, rich_messages()[5:])


def pairing(entries: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    """(result seq, call id, call seq) of every tool result, asserting each answers a call
    made earlier."""
    calls: dict[str, int] = {}
    out = []
    for e in entries:
        m, seq = e["message"], e["seq"]
        results = []
        if m["role"] == "tool" and m.get("toolCallId"):
            results.append(m["toolCallId"])
        content = m.get("content")
        if isinstance(content, list):
            for b in content:
                if b["type"] == "tool_use":
                    calls[b["id"]] = seq
                elif b["type"] == "tool_result":
                    results.append(b["toolUseId"])
        for c in m.get("toolCalls") or ():
            calls[c["id"]] = seq
        for rid in results:
            assert rid in calls and calls[rid] < seq, f"result {rid} at {seq} answers no earlier call"
            out.append((seq, rid, calls[rid]))
    return out


async def session_count(conn: Conn) -> int:
    return len((await conn.call("session/list", {}))["sessions"])


@pytest.mark.parametrize("fmt", ["json", "markdown", "jsonl"])
async def test_export_import_round_trip_loses_nothing(fmt):
    async with running() as d:
        conn = await d.connect()
        await make_rich(conn, "orig")
        original = await full_history(conn, "orig")
        assert original["messageCount"] == len(rich_messages())
        # What was pushed is what history holds (the idempotency key is not part of the message).
        for entry, pushed in zip(original["messages"], rich_messages()):
            pushed = {k: v for k, v in pushed.items() if k != "idempotencyKey"}
            assert encoded(entry["message"]) == encoded(pushed), entry["seq"]
        info = await conn.call("session/get", {"sessionId": "orig"})
        goal = (await conn.call("goal/get", {"sessionId": "orig"}))["goal"]

        exported = await conn.call("session/export", {"sessionId": "orig", "format": fmt})
        assert exported["format"] == fmt and exported["messageCount"] == len(rich_messages())
        assert exported["filename"].endswith({"json": ".json", "markdown": ".md", "jsonl": ".jsonl"}[fmt])
        document = exported["document"]
        if fmt == "markdown":  # readable: the words are there, not only inside the hidden comments
            assert "Both results above. Next?" in document and "### Assistant" in document

        for how in (fmt, "auto"):
            new_id = f"copy-{how}"
            result = await conn.call("session/import", {"document": document, "format": how, "sessionId": new_id})
            assert result["sessionIds"] == [new_id]
            assert result["messageCount"] == len(rich_messages())
            assert result["format"] == fmt
            copy = await full_history(conn, new_id)
            assert copy["messageCount"] == original["messageCount"]
            assert [e["seq"] for e in copy["messages"]] == [e["seq"] for e in original["messages"]]
            for a, b in zip(original["messages"], copy["messages"]):
                assert encoded(b["message"]) == encoded(a["message"]), f"{how}: message {a['seq']} changed"
                assert b["message"] == a["message"]
                assert b["createdAt"] == a["createdAt"], f"{how}: createdAt of {a['seq']} changed"
                assert b["tokens"] == a["tokens"]
            assert pairing(copy["messages"]) == pairing(original["messages"])
            assert len(pairing(copy["messages"])) == 5
            new_info = await conn.call("session/get", {"sessionId": new_id})
            for key in DESCRIPTIVE:
                assert new_info.get(key) == info.get(key), f"{how}: {key} {new_info.get(key)!r} != {info.get(key)!r}"
            assert new_info["tokenCount"] == info["tokenCount"]
            assert (await conn.call("goal/get", {"sessionId": new_id}))["goal"] == goal
            # The copy is a working session: its prompt renders, and it takes new messages.
            prompt = await conn.call("context/prompt", {"sessionId": new_id, "format": "anthropic"})
            assert prompt["system"][0]["text"].startswith(SYSTEM)
            pushed = await push(conn, new_id, [{"role": "user", "content": "after import"}])
            assert pushed["messages"][0]["seq"] == len(rich_messages()) + 1


async def test_import_without_session_id_keeps_the_exported_id_and_refuses_a_clash():
    async with running() as d:
        conn = await d.connect()
        await make_rich(conn, "orig")
        docs = {fmt: (await conn.call("session/export", {"sessionId": "orig", "format": fmt}))["document"]
                for fmt in ("json", "markdown", "jsonl")}
        before = await session_count(conn)
        for fmt, doc in docs.items():
            err = await rpc_error(conn, "session/import", {"document": doc, "format": fmt}, -33002)
            assert "orig" in err.message
            err = await rpc_error(conn, "session/import", {"document": doc, "format": fmt, "sessionId": "orig"},
                                  -33002)
            assert "orig" in err.message
        assert await session_count(conn) == before
        assert (await conn.call("session/get", {"sessionId": "orig"}))["messageCount"] == len(rich_messages())
        # Elsewhere (here: after deleting the original) the id comes back as it was.
        await conn.call("session/delete", {"sessionId": "orig"})
        result = await conn.call("session/import", {"document": docs["jsonl"]})
        assert result["sessionIds"] == ["orig"] and result["format"] == "jsonl"


def _claude_code_expected(path: Path) -> int:
    """User records, plus one assistant message per API reply (records sharing ``message.id``)."""
    users, replies = 0, set()
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "user":
            users += 1
        elif record.get("type") == "assistant":
            replies.add(record["message"]["id"])
    return users + len(replies)


async def test_import_claude_code_transcript():
    path = FIXTURES / "claude_code_session.jsonl"
    expected = _claude_code_expected(path)
    async with running() as d:
        conn = await d.connect()
        for fmt in ("claude_code", "auto"):
            await _import_claude_code(conn, path, fmt, expected)


async def _import_claude_code(conn: Conn, path: Path, fmt: str, expected: int) -> None:
    result = await conn.call("session/import", {"document": path.read_text(), "format": fmt})
    assert result["format"] == "claude_code"
    assert len(result["sessionIds"]) == 1 and result["messageCount"] == expected
    sid = result["sessionIds"][0]
    history = await full_history(conn, sid)
    assert history["messageCount"] == expected == len(history["messages"])
    assert pairing(history["messages"])  # tool results answer the calls before them
    first = history["messages"][0]["message"]
    assert first["role"] == "user" and "multiply_numbers" in first["content"]
    for prompt_fmt in ("openai", "anthropic"):
        await conn.call("context/prompt", {"sessionId": sid, "format": prompt_fmt})


async def test_import_aider_history_by_name_and_by_content():
    """aider's .aider.chat.history.md: one session per run with messages, whether the
    format is named or told from the content."""
    text = (FIXTURES / "aider.chat.history.md").read_text()
    async with running() as d:
        conn = await d.connect()
        for fmt in ("aider", "auto"):
            result = await conn.call("session/import", {"document": text, "format": fmt})
            assert result["format"] == "aider" and len(result["sessionIds"]) == 2
            first = await full_history(conn, result["sessionIds"][0])
            assert any(m["message"]["content"].startswith("make slugify() drop accents")
                       for m in first["messages"] if m["message"]["role"] == "user")
        err = await rpc_error(conn, "session/import", {"document": "# Not aider\n\nhello\n", "format": "aider"},
                              -33030)
        assert "aider" in err.message


def _bad_documents(good_json: str, good_jsonl: str, good_md: str) -> list[tuple[str, str, str, list[str]]]:
    """(case, format, document, words the error message must contain)."""
    data = json.loads(good_json)
    no_role = json.loads(good_json)
    del no_role["messages"][1]["message"]["role"]
    bad_rule = json.loads(good_json)
    bad_rule["messages"][1]["message"] = {"role": "user", "content": "x", "toolCallId": "call_zz"}
    bad_time = json.loads(good_json)
    bad_time["messages"][2]["message"]["timestamp"] = "yesterday"
    newer = dict(data, version=99)
    jsonl_lines = good_jsonl.splitlines()
    broken_line = "\n".join(jsonl_lines[:3] + ['{"role": "user", "content": "x", "ctxd": {"seq": '] + jsonl_lines[4:])
    md_damaged = good_md.replace("<!-- ctxd:message {", "<!-- ctxd:message {broken", 1)
    return [
        ("not json", "json", "{this is not json", ["json"]),
        ("wrong format tag", "json", json.dumps({**data, "format": "something.else"}), ["ctxd.session"]),
        ("newer version", "json", json.dumps(newer), ["version", "99"]),
        ("message without role", "json", json.dumps(no_role), ["role"]),
        ("message breaking a rule", "json", json.dumps(bad_rule), ["toolCallId"]),
        ("bad timestamp", "json", json.dumps(bad_time), ["yesterday"]),
        ("no header line", "jsonl", "\n".join(jsonl_lines[1:]), ["line 1"]),
        ("broken line", "jsonl", broken_line, ["line 4"]),
        ("empty jsonl", "jsonl", "\n\n", ["empty"]),
        ("no session comment", "markdown", "# Just a title\n\nSome text.\n", ["ctxd:session"]),
        ("damaged message comment", "markdown", md_damaged, ["damaged", "line"]),
        ("unrecognised", "auto", "hello, this is no transcript", []),
    ]


async def test_bad_documents_fail_and_store_nothing():
    async with running() as d:
        conn = await d.connect()
        await make_rich(conn, "orig")
        docs = {fmt: (await conn.call("session/export", {"sessionId": "orig", "format": fmt}))["document"]
                for fmt in ("json", "jsonl", "markdown")}
        await conn.call("session/delete", {"sessionId": "orig"})  # so the exported id itself would be free
        await conn.call("session/create", {"sessionId": "keeper"})
        await push(conn, "keeper", [{"role": "user", "content": "I stay"}])
        stored = read_db(d.db_path, "SELECT count(*) FROM messages")
        assert stored == [(1,)]
        for case, fmt, document, words in _bad_documents(docs["json"], docs["jsonl"], docs["markdown"]):
            err = await rpc_error(conn, "session/import", {"document": document, "format": fmt}, -33030)
            assert err.message, case
            for word in words:
                assert word.lower() in err.message.lower(), f"{case}: {word!r} not in {err.message!r}"
            assert await session_count(conn) == 1, f"{case}: a session was stored"
            assert read_db(d.db_path, "SELECT count(*) FROM messages") == stored, f"{case}: messages were stored"
        assert (await conn.call("daemon/status"))["sessions"] == 1
        # The good document still imports whole.
        result = await conn.call("session/import", {"document": docs["markdown"], "format": "auto"})
        assert result["sessionIds"] == ["orig"] and result["messageCount"] == len(rich_messages())
        assert await session_count(conn) == 2


async def test_markdown_round_trip_of_text_that_looks_like_an_export():
    """A user pasting a ctxd Markdown export into the chat: the pasted comments are
    message text, not messages."""
    pasted = ('Here is my old export:\n<!-- ctxd:message {"seq": 1, "createdAt": "", '
              '"message": {"role": "user", "content": "smuggled"}} -->\nwhat do you think?')
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "paste"})
        await push(conn, "paste", [{"role": "user", "content": pasted}, {"role": "assistant", "content": "ok"}])
        doc = (await conn.call("session/export", {"sessionId": "paste", "format": "markdown"}))["document"]
        result = await conn.call("session/import", {"document": doc, "format": "markdown", "sessionId": "copy"})
        assert result["messageCount"] == 2
        copy = await full_history(conn, "copy")
        assert [e["message"] for e in copy["messages"]] == [
            {"role": "user", "content": pasted}, {"role": "assistant", "content": "ok"}]


async def test_round_trip_of_unicode_line_separators():
    """Characters Python treats as line breaks (U+2028, U+2029, U+0085, \\x0b, \\x0c, \\x1c-\\x1e)
    are ordinary text in a message, in every format (plain messages take JSONL's OpenAI path,
    the others its embedded-original path)."""
    text = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\x1dh\x1ei\r\nj\rk"
    async with running() as d:
        conn = await d.connect()
        await conn.call("session/create", {"sessionId": "seps", "title": text, "systemPrompt": text})
        await push(conn, "seps", [{"role": "user", "content": text},
                                  {"role": "assistant", "content": [{"type": "text", "text": text}],
                                   "metadata": {"k": text}}])
        original = await full_history(conn, "seps")
        for fmt in ("json", "markdown", "jsonl"):
            doc = (await conn.call("session/export", {"sessionId": "seps", "format": fmt}))["document"]
            await conn.call("session/import", {"document": doc, "format": fmt, "sessionId": f"copy-{fmt}"})
            copy = await full_history(conn, f"copy-{fmt}")
            assert [encoded(e["message"]) for e in copy["messages"]] == [encoded(e["message"])
                                                                          for e in original["messages"]], fmt
            info = await conn.call("session/get", {"sessionId": f"copy-{fmt}"})
            assert info["title"] == text and info["systemPrompt"] == text, fmt


# --- a session with a past: compressions, pins, a watermark, a goal, snapshots, a restore ------


def _wire(path: Path) -> list[dict[str, Any]]:
    import msgspec

    from ctxd.importers import load_transcripts

    return [msgspec.to_builtins(m) for m in load_transcripts(path)[0].messages]


async def _lived_session(conn: Conn, sid: str) -> None:
    """A real Claude Code session (with its usage) pushed in three parts at a 32k window:
    compressed, a message pinned, a goal with a locked decision, a snapshot, more pushes, a
    goal change and a compression, then that snapshot restored (its goal back, the pushes
    after it rolled back), the last part pushed, the watermark moved and compressed again."""
    messages = _wire(FIXTURES / "claude_code_usage_session.jsonl")
    third = len(messages) // 3
    await conn.call("session/create", {"sessionId": sid, "model": "claude-opus-4-5-20251101",
                                       "contextWindow": 32768, "systemPrompt": "You are Claude Code."})
    await push(conn, sid, messages[:third])
    await conn.call("context/compress", {"sessionId": sid})
    await conn.call("message/pin", {"sessionId": sid, "seq": 1})
    await conn.call("goal/set", {"sessionId": sid, "description": "multiply_numbers with tests",
                                 "decisions": [{"description": "keep src/math_utils.py pure", "locked": True}]})
    snapshot = await conn.call("snapshot/create", {"sessionId": sid, "label": "before the edit"})
    await push(conn, sid, messages[third:2 * third])
    await conn.call("goal/update", {"sessionId": sid, "description": "and a release"})
    await conn.call("context/compress", {"sessionId": sid})
    await conn.call("snapshot/restore", {"sessionId": sid, "snapshotId": snapshot["snapshotId"]})
    await push(conn, sid, messages[2 * third:])
    await conn.call("context/watermark", {"sessionId": sid, "seq": 2 * third + 6})
    await conn.call("context/compress", {"sessionId": sid})


async def _everything(conn: Conn, sid: str) -> dict[str, Any]:
    """What a client can see of a session, without what differs between two copies of it
    by nature (its id, when it was last active)."""
    history = await full_history(conn, sid)
    stats = await conn.call("context/stats", {"sessionId": sid})
    checkpoints = await conn.call("context/checkpoints", {"sessionId": sid})
    snapshots = (await conn.call("snapshot/list", {"sessionId": sid}))["snapshots"]
    expanded = [await conn.call("checkpoint/expand", {"sessionId": sid, "checkpointId": cid})
                for c in history.get("compressions", []) for cid in c["checkpointIds"]]
    for s in snapshots:
        s.pop("sessionId")
    stats.pop("sessionId")
    stats.pop("promptCache")  # (prompts this daemon handed out for the session: not the session's)
    return {
        "statuses": [(e["seq"], e["status"], e.get("pruned", False), e.get("filtered", False))
                     for e in history["messages"]],
        "messages": [encoded(e["message"]) for e in history["messages"]],
        "compressions": history.get("compressions", []), "events": history.get("events", []),
        "checkpoints": checkpoints["checkpoints"], "checkpointTokens": checkpoints["tokens"],
        "expanded": [(x["checkpoint"]["id"], [m["seq"] for m in x["messages"]]) for x in expanded],
        "goal": (await conn.call("goal/get", {"sessionId": sid}))["goal"],
        "stats": stats, "snapshots": snapshots,
        "prompts": {fmt: sent(await conn.call("context/prompt", {"sessionId": sid, "format": fmt}))
                    for fmt in ("openai", "anthropic", "ollama")},
    }


def sent(result: dict[str, Any]) -> dict[str, Any]:
    return {"system": result.get("system"), "messages": result["messages"], "tokens": result["tokens"],
            "budget": result["budget"], "checkpointCount": result["checkpointCount"],
            "compressionCount": result["compressionCount"]}


@pytest.mark.parametrize("fmt", ["json", "jsonl", "markdown"])
async def test_a_session_with_a_past_comes_back_the_same(fmt):
    """After compressions, a pin, a watermark, a goal with a decision, a snapshot, more
    pushes and a restore: export, then import, gives the same session: each message's
    status (compressed, kept, rolled back, pruned, filtered), the checkpoints (the active
    ones and those merged away, which checkpoint/expand still answers for), the goal and
    its decisions, the pins, the watermark, the calibration learned from the transcript's
    usage, the snapshots, the record of compressions and events, and the same prompt in
    every format. (It used to come back as a new session: 15 messages in the prompt
    instead of 7, "compressed" and "rolled back" turned "context", new checkpoints.)"""
    async with running() as d:
        conn = await d.connect()
        await _lived_session(conn, "lived")
        original = await _everything(conn, "lived")
        assert {s for _, s, _, _ in original["statuses"]} >= {"compressed", "kept", "rolled_back", "context"}
        assert original["stats"]["pinned"] == [1] and original["stats"]["watermarkSeq"] > 0
        assert original["stats"]["budget"]["tokenOverhead"] > 0 and len(original["snapshots"]) >= 2
        assert original["goal"]["decisions"][0]["locked"]
        document = (await conn.call("session/export", {"sessionId": "lived", "format": fmt}))["document"]
        result = await conn.call("session/import", {"document": document, "sessionId": "copy"})
        assert result["format"] == fmt
        copy = await _everything(conn, "copy")
        for key in original:
            assert copy[key] == original[key], key
        # And it lives on as the original would: the next push and prompt agree too.
        for sid in ("lived", "copy"):
            await push(conn, sid, [{"role": "user", "content": "one more thing"}])
        assert (await _everything(conn, "copy"))["prompts"] == (await _everything(conn, "lived"))["prompts"]
