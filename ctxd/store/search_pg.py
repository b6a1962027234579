r"""Full-text search on PostgreSQL: tsvector + GIN, the same calls and hits as ``search.py``.

``messages_fts`` holds each message's text and its tsvector (the ``simple``
configuration over the text's ``\w+`` words: lower-cased, no stemming, split where FTS5's
unicode61 splits); a GIN index
answers ``@@``. Messages wait in ``search_pending`` (filled by a trigger in the push's
transaction) until an indexer takes them: with several daemons, any daemon's indexer
may, and ``FOR UPDATE`` makes each message indexed exactly once (a watermark over
message ids would skip ids whose transaction committed late). Ranking is
``ts_rank_cd`` on the index alone; snippets (``ts_headline``) and rows are fetched for
the winners only.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ctxd.protocol.message import Message, message_text

_decoder = msgspec.json.Decoder(Message)
_QUOTED_WORDS = re.compile(r'^\s*("[^"]+"\s*)+$')
_WORD = re.compile(r"\w+", re.UNICODE)
CONFIG = "simple"


def words(text: str) -> str:
    """Text as the words FTS5's tokenizer and ``search.fts_query`` see (``\\w+`` runs), which
    is what gets indexed: PostgreSQL's own parser would keep ``9.3`` or ``foo-bar`` whole,
    and a words query (split the same way) would never find them."""
    return " ".join(_WORD.findall(text))


def _tsquery(query: str) -> tuple[str, str]:
    """(SQL for the tsquery, its argument) from what ``search.fts_query`` produced: quoted
    words (all required) become ``plainto_tsquery``; anything else is read as a web-search
    expression (quotes for phrases, ``or``, ``-`` to exclude), which never fails to parse."""
    if _QUOTED_WORDS.match(query):
        return f"plainto_tsquery('{CONFIG}', %s)", " ".join(_WORD.findall(query))
    return f"websearch_to_tsquery('{CONFIG}', %s)", query


def search(conn: Any, query: str, *, session_id: str | None, role: str | None, limit: int,
           with_body: bool, snippet_tokens: int, hit: Any, query_error: type[Exception]) -> list[Any]:
    raw = conn.raw
    tsq, arg = _tsquery(query)
    rank_sql = f"SELECT f.id, ts_rank_cd(f.tsv, q) AS score FROM messages_fts f, {tsq} AS q"
    args: list[object] = [arg]
    filtered = session_id is not None or role is not None
    if filtered:  # joined to messages only to filter
        rank_sql += ", messages m"
    rank_sql += " WHERE f.tsv @@ q"
    if filtered:
        rank_sql += " AND m.id = f.id"
    if session_id is not None:
        rank_sql += " AND m.session_id = %s"
        args.append(session_id)
    if role is not None:
        rank_sql += " AND m.role = %s"
        args.append(role)
    rank_sql += " ORDER BY score DESC, f.id LIMIT %s"
    args.append(limit)
    ranked = raw.execute(rank_sql, args).fetchall()
    if not ranked:
        if not arg.strip() or raw.execute(f"SELECT numnode({tsq})", (arg,)).fetchone()[0] == 0:
            raise query_error("the query has no words to search for")
        return []
    ids = [rowid for rowid, _ in ranked]
    options = f"StartSel=[, StopSel=], MaxWords={snippet_tokens}, MinWords={max(1, snippet_tokens // 3)}, " \
              "ShortWord=0, FragmentDelimiter=…, MaxFragments=1"
    rows = raw.execute(
        f"SELECT f.id, m.session_id, m.seq, m.role, m.created_at, ts_headline('{CONFIG}', f.text, q, %s), s.title"
        + (", m.body" if with_body else ", NULL")
        + f" FROM messages_fts f JOIN messages m ON m.id = f.id JOIN sessions s ON s.id = m.session_id, {tsq} AS q"
        " WHERE f.id = ANY(%s)", (options, arg, ids)).fetchall()
    by_id = {row[0]: row[1:] for row in rows}
    hits = []
    for rowid, score in ranked:
        found = by_id.get(rowid)
        if found is not None:
            sid, seq, r, created, snip, title, body = found
            hits.append(hit(sid, seq, r, created, snip, round(float(score), 4), title,
                            bytes(body) if body is not None else None))
    return hits


def like_scan(conn: Any, needle: str, limit: int) -> list[tuple[str, int]]:
    rows = conn.raw.execute("SELECT session_id, seq FROM messages WHERE convert_from(body, 'UTF8') LIKE %s "
                            "LIMIT %s", (f"%{needle}%", limit)).fetchall()
    return [tuple(r) for r in rows]


def index_pending(conn: Any, limit: int, max_bytes: int | None) -> int:
    """Index up to ``limit`` waiting messages (about ``max_bytes`` of bodies, at least one);
    how many were taken off the queue (messages deleted meanwhile are just dropped)."""
    raw = conn.raw
    waiting = raw.execute(
        "SELECT p.id, coalesce(length(m.body), 0) FROM search_pending p LEFT JOIN messages m ON m.id = p.id "
        "ORDER BY p.id LIMIT %s FOR UPDATE OF p", (limit,)).fetchall()
    if not waiting:
        return 0
    taken: list[int] = []
    total = 0
    for rowid, size in waiting:
        if max_bytes is not None and taken and total + size > max_bytes:
            break
        total += size
        taken.append(rowid)
    raw.execute("DELETE FROM search_pending WHERE id = ANY(%s)", (taken,))
    rows = raw.execute("SELECT id, body FROM messages WHERE id = ANY(%s) ORDER BY id", (taken,)).fetchall()
    if rows:
        cursor = raw.cursor()
        cursor.executemany(
            f"INSERT INTO messages_fts (id, text, tsv) VALUES (%s, %s, to_tsvector('{CONFIG}', %s)) "
            "ON CONFLICT (id) DO NOTHING",
            [(i, text, words(text)) for i, text in ((i, message_text(_decoder.decode(b))) for i, b in rows)])
    return len(taken)
