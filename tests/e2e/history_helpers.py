"""Helpers of the history end-to-end tests (tests/behaviour/test_{snapshots,history,transfer,retention}.py).

Everything talks to real ctxd daemons over their sockets (run in the test process: see
:class:`tests.e2e.compression_helpers.CtxdProc`) and reads real SQLite files;
nothing is mocked. Here:

* :func:`running`, a daemon for the length of an ``async with`` (stopped, its files
  removed, whatever happens), whose :meth:`Running.connect` hands out clients that
  record their notifications and are closed before the daemon stops;
* :func:`chat_turns`, a deterministic conversation (user requests, assistant turns
  with OpenAI- and Anthropic-style tool calls, tool results) in which every message
  carries a unique marker word, so searches and prompts can be checked message by
  message;
* small checks: error codes, canonical message encodings, prompt comparison, paging
  through ``session/history``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxd.client import RpcError
from ctxd.protocol.message import Message
from tests.e2e.compression_helpers import WORDS, Conn, CtxdProc, remove_root, short_root
from tests.e2e.helpers import db_query, pg_url_of

# --- daemons -----------------------------------------------------------------------------


@dataclass
class Running:
    proc: CtxdProc
    conns: list[Conn] = field(default_factory=list)

    async def connect(self, *subscriptions: str) -> Conn:
        conn = await self.proc.connect()
        self.conns.append(conn)
        for session_id in subscriptions:
            await conn.call("session/subscribe", {"sessionId": session_id})
        return conn

    async def close_all(self) -> None:
        for conn in self.conns:
            try:
                await conn.close()
            except Exception:  # the daemon may be gone already
                await conn.drop()
        self.conns.clear()

    @property
    def db_path(self) -> Path:
        return self.proc.data_dir / "ctxd.db"

    async def stop(self) -> None:
        await self.close_all()
        self.proc.stop()
        assert self.proc.returncode == 0, self.proc.stderr_text()


@asynccontextmanager
async def running(*sets: str) -> AsyncIterator[Running]:
    """A daemon started with ``--set`` assignments ``sets``, stopped afterwards."""
    root = short_root()
    run = Running(CtxdProc(root, sets=list(sets)).start())
    try:
        yield run
    finally:
        try:
            await run.close_all()
        finally:
            run.proc.stop()
            remove_root(root)


def read_db(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` from the database of the daemon whose file would be ``path``
    (``Running.db_path``): that file opened read-only, or the test's PostgreSQL database."""
    return db_query(path.parent, sql, args)


def index_progress(path: Path) -> tuple[int, int]:
    """(how far the search index is, where it is going), read from the database: on SQLite
    the last message id indexed and the newest id; on PostgreSQL the messages no longer
    waiting in ``search_pending`` and every message."""
    if pg_url_of(path.parent) is not None:
        (waiting, total), = read_db(path, "SELECT (SELECT count(*) FROM search_pending), "
                                          "(SELECT count(*) FROM messages)")
        return total - waiting, total
    (through, last), = read_db(path, "SELECT (SELECT indexed_through FROM search_state), "
                                     "(SELECT coalesce(max(id), 0) FROM messages)")
    return through, last


async def index_settled(path: Path, timeout: float = 30.0) -> None:
    """Wait until the search index holds every stored message (read from the database):
    no indexing is then under way or pending, so a search cannot race the background
    indexer (see test_history's race test for why that matters)."""
    deadline = time.monotonic() + timeout
    while True:
        through, last = index_progress(path)
        if through >= last:
            return
        assert time.monotonic() < deadline, f"the search index stayed at {through} of {last} messages"
        await asyncio.sleep(0.01)


# --- errors ------------------------------------------------------------------------------


async def rpc_error(conn: Conn, method: str, params: Any, code: int) -> RpcError:
    """The error ``method`` must fail with (asserting its code)."""
    with pytest.raises(RpcError) as info:
        await conn.call(method, params)
    assert info.value.code == code, f"{method}: expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


# --- the conversation --------------------------------------------------------------------


@dataclass
class Turn:
    messages: list[dict[str, Any]]
    markers: list[str]


class Markers:
    """Unique words: ``mk<tag><n>`` (one FTS5 token, never a prefix of another)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return f"mk{self.tag}q{self.n:05d}z"


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def chat_turns(seed: int, turns: int, *, tag: str = "a", tools: bool = True,
               sizes: tuple[int, int] = (15, 45), user_sizes: tuple[int, int] | None = None) -> list[Turn]:
    """``turns`` pushes of a deterministic conversation. Each message carries its own
    marker word (the message's marker is the first word of its text). With ``tools``,
    assistant turns alternate OpenAI style (``toolCalls`` + ``tool`` messages) and
    Anthropic style (``tool_use`` blocks + a user message of ``tool_result`` blocks).
    ``sizes``: words per message (tool outputs twice that); ``user_sizes``: of user requests."""
    rng = random.Random(seed)
    mk = Markers(tag)
    out: list[Turn] = []
    call = 0
    for i in range(turns):
        kind = i % 4 if tools else i % 2
        if kind == 0:
            m = mk.next()
            words = rng.randint(*(user_sizes or sizes))
            out.append(Turn([{"role": "user", "content": f"{m} please look at {_prose(rng, words)}"}], [m]))
        elif kind == 1 or not tools:
            m = mk.next()
            out.append(Turn([{"role": "assistant", "content": f"{m} {_prose(rng, rng.randint(*sizes))}"}], [m]))
        elif kind == 2:  # OpenAI style
            m, r = mk.next(), mk.next()
            call += 1
            cid = f"call_{tag}{call:04d}"
            out.append(Turn([
                {"role": "assistant", "content": f"{m} reading", "toolCalls": [
                    {"id": cid, "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/{m}.py"})}}]},
                {"role": "tool", "toolCallId": cid, "content": f"{r} {_prose(rng, rng.randint(*sizes) * 2)}"},
            ], [m, r]))
        else:  # Anthropic style
            m, r = mk.next(), mk.next()
            call += 1
            cid = f"toolu_{tag}{call:04d}"
            out.append(Turn([
                {"role": "assistant", "content": [
                    {"type": "text", "text": f"{m} running"},
                    {"type": "tool_use", "id": cid, "name": "grep", "input": {"pattern": m}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "toolUseId": cid, "content": f"{r} {_prose(rng, rng.randint(*sizes))}"}]},
            ], [m, r]))
    return out


def flatten(turns: list[Turn]) -> list[dict[str, Any]]:
    return [m for t in turns for m in t.messages]


_MARKER = re.compile(r"mk\w+?q\d{5}z")


def marker_of(message: dict[str, Any]) -> str:
    """The marker word of a message made by :func:`chat_turns`."""
    match = _MARKER.search(json.dumps(message))
    assert match, message
    return match.group(0)


# --- messages and prompts ------------------------------------------------------------------

_encode = msgspec.json.Encoder().encode


def encoded(message: dict[str, Any]) -> bytes:
    """The msgspec JSON encoding of a message (what ctxd stores)."""
    return _encode(msgspec.convert(message, Message))


def canonical(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False)


async def push(conn: Conn, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return await conn.call("session/push", {"sessionId": session_id, "messages": messages})


async def prompt(conn: Conn, session_id: str, fmt: str = "openai") -> dict[str, Any]:
    return await conn.call("context/prompt", {"sessionId": session_id, "format": fmt})


def sent(result: dict[str, Any]) -> dict[str, Any]:
    """What a prompt sends (system part and messages), without the session's figures."""
    return {"system": result.get("system"), "messages": result["messages"], "tokens": result["tokens"],
            "checkpointCount": result["checkpointCount"]}


async def prompts(conn: Conn, session_id: str) -> dict[str, dict[str, Any]]:
    return {fmt: sent(await prompt(conn, session_id, fmt)) for fmt in ("openai", "anthropic", "ollama")}


def prompt_text(result: dict[str, Any]) -> str:
    """Everything a prompt sends, as one string (for "is this word sent?")."""
    return json.dumps({"system": result.get("system"), "messages": result["messages"]}, ensure_ascii=False)


async def full_history(conn: Conn, session_id: str, limit: int = 1000) -> dict[str, Any]:
    """Every page of ``session/history`` joined: ``messages`` in order, the first page's
    compressions and events, and the number of pages."""
    first = None
    entries: list[dict[str, Any]] = []
    pages = 0
    seq: int | None = 1
    while seq is not None:
        page = await conn.call("session/history", {"sessionId": session_id, "from": seq, "limit": limit})
        pages += 1
        first = first or page
        entries += page["messages"]
        seq = page["nextSeq"]
    assert first is not None
    return {**first, "messages": entries, "pages": pages}
