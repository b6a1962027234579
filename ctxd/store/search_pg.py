r"""Full-text search on PostgreSQL: tsvector + GIN, the same calls and hits as ``search.py``.

``messages_fts`` holds each message's text, session, role and tsvector (the ``simple``
configuration over the text's ``\w+`` words: lower-cased, no stemming, split where FTS5's
unicode61 splits); a GIN index
answers ``@@``. Messages wait in ``search_pending`` (filled by a trigger in the push's
transaction) until an indexer takes them: with several daemons, any daemon's indexer
may, and ``FOR UPDATE`` makes each message indexed exactly once (a watermark over
message ids would skip ids whose transaction committed late). Ranking is
``ts_rank_cd`` (length-normalized) on the index alone; snippets (``ts_headline``) and rows are fetched for
the winners only.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ctxd.protocol.message import Message, message_text

_decoder = msgspec.json.Decoder(Message)
_WORD = re.compile(r"\w+", re.UNICODE)
CONFIG = "simple"
RANK_NORMALIZATION = 1
"""``ts_rank_cd``'s rank divided by 1 + log(words in the message): a word said once in a long
message ranks below the same word in a short one, as FTS5's bm25 ranks them."""


def words(text: str) -> str:
    """Text as the words FTS5's tokenizer and ``search.fts_query`` see (``\\w+`` runs), which
    is what gets indexed: PostgreSQL's own parser would keep ``9.3`` or ``foo-bar`` whole,
    and a words query (split the same way) would never find them."""
    return " ".join(_WORD.findall(text))


NEAR_DEFAULT = 10
NEAR_EXPANDED = 50
"""``NEAR(a b, N)`` becomes every order and distance up to N (exact); past this N, both
phrases anywhere in the message (the AND of them)."""
_SPECIAL = "()*+:^,"


def _bareword_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_") or ord(c) >= 128 or c == "\x1a"


def _fts5_tokens(text: str, error: type[Exception]) -> list[tuple[str, str]]:
    """(kind, value) of an FTS5 query: ``str`` (a quoted string), ``word``, or one special
    character; anything FTS5 would refuse raises ``error``."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j, value = i + 1, []
            while True:
                if j >= len(text):
                    raise error("invalid search syntax: unterminated string")
                if text[j] == '"':
                    if text[j + 1:j + 2] == '"':
                        value.append('"')
                        j += 2
                        continue
                    break
                value.append(text[j])
                j += 1
            out.append(("str", "".join(value)))
            i = j + 1
        elif c in _SPECIAL:
            out.append((c, c))
            i += 1
        elif _bareword_char(c):
            j = i
            while j < len(text) and _bareword_char(text[j]):
                j += 1
            out.append(("word", text[i:j]))
            i = j
        else:
            raise error(f"invalid search syntax near {text[i:i + 10]!r}")
    return out


class _Fts5:
    """FTS5's query syntax (phrases, ``*`` prefixes, ``+``, ``NEAR``, ``AND``/``OR``/``NOT``,
    parentheses) as a ``to_tsquery`` expression, so ``syntax: "fts"`` means the same on both
    backends. Column filters and ``^`` have nothing to match on PostgreSQL and are refused."""

    def __init__(self, text: str, error: type[Exception]) -> None:
        self.tokens = _fts5_tokens(text, error)
        self.pos = 0
        self.error = error

    def fail(self, why: str) -> Exception:
        return self.error(f"invalid search syntax: {why}")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def keyword(self, word: str) -> bool:
        return self.peek() == ("word", word)

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.fail("the query ends too soon")
        self.pos += 1
        return token

    def parse(self) -> str:
        if not self.tokens:
            raise self.fail("the query is empty")
        out = self.or_expr()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return out

    def or_expr(self) -> str:
        parts = [self.and_expr()]
        while self.keyword("OR"):
            self.pos += 1
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"

    def and_expr(self) -> str:
        parts = [self.not_expr()]
        while True:
            if self.keyword("AND"):
                self.pos += 1
            elif self.peek() is None or self.peek()[0] == ")" or self.keyword("OR"):  # type: ignore[index]
                break
            parts.append(self.not_expr())
        return parts[0] if len(parts) == 1 else "(" + " & ".join(parts) + ")"

    def not_expr(self) -> str:
        out = self.primary()
        while self.keyword("NOT"):
            self.pos += 1
            out = f"({out} & !{self.primary()})"
        return out

    def primary(self) -> str:
        kind, value = self.take()
        if kind == "(":
            inner = self.or_expr()
            if self.take()[0] != ")":
                raise self.fail("a parenthesis is not closed")
            return inner
        if kind == "word" and value == "NEAR" and self.peek() == ("(", "("):
            return self.near()
        if kind == "word" and value in ("AND", "OR", "NOT"):
            raise self.fail(f"{value} needs something on both sides")
        self.pos -= 1
        return _phrase(self.phrase())

    def phrase(self) -> list[str]:
        """One phrase (``a + "b c"`` joined): its lexemes, the last marked ``:*`` if a prefix."""
        lexemes: list[str] = []
        while True:
            kind, value = self.take()
            if kind == "^":
                raise self.fail("^ (the first word of a message) is not supported on PostgreSQL")
            if kind not in ("str", "word"):
                raise self.fail(f"unexpected {value!r}")
            if self.peek() is not None and self.peek()[0] == ":":  # type: ignore[index]
                raise self.fail(f"no column named {value!r} (column filters are not supported)")
            found = _WORD.findall(value)  # (to_tsquery lower-cases them as to_tsvector did)
            if not found:
                raise self.fail(f"{value!r} has no words to search for")
            if self.peek() is not None and self.peek()[0] == "*":  # type: ignore[index]
                self.pos += 1
                found[-1] += ":*"
            lexemes += found
            if self.peek() is not None and self.peek()[0] == "+":  # type: ignore[index]
                self.pos += 1
                continue
            return lexemes

    def near(self) -> str:
        self.take()  # (
        groups = [self.phrase()]
        distance = NEAR_DEFAULT
        while True:
            token = self.peek()
            if token is None:
                raise self.fail("NEAR( is not closed")
            if token[0] == ")":
                self.pos += 1
                break
            if token[0] == ",":
                self.pos += 1
                kind, value = self.take()
                if kind != "word" or not value.isdigit():
                    raise self.fail(f"NEAR's distance must be a number, not {value!r}")
                distance = int(value)
                if self.take()[0] != ")":
                    raise self.fail("NEAR( is not closed after its distance")
                break
            groups.append(self.phrase())
        if len(groups) == 1:
            return _phrase(groups[0])
        pairs = []
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                if distance > NEAR_EXPANDED:
                    pairs.append(f"({_phrase(a)} & {_phrase(b)})")
                    continue
                ways = [f"{_phrase(x)} <{d}> {_phrase(y)}" for d in range(1, distance + 2) for x, y in ((a, b), (b, a))]
                pairs.append("(" + " | ".join(ways) + ")")
        return pairs[0] if len(pairs) == 1 else "(" + " & ".join(pairs) + ")"


def _phrase(lexemes: list[str]) -> str:
    quoted = [f"'{w[:-2]}':*" if w.endswith(":*") else f"'{w}'" for w in lexemes]
    return quoted[0] if len(quoted) == 1 else "(" + " <-> ".join(quoted) + ")"


def tsquery(query: str, error: type[Exception] = ValueError) -> str:
    """A ``to_tsquery('simple', ...)`` expression for an FTS5 query (what ``search.fts_query``
    produced: quoted words in words mode, the user's text in fts mode)."""
    return _Fts5(query, error).parse()


def search(conn: Any, query: str, *, session_id: str | None, role: str | None, limit: int,
           with_body: bool, snippet_tokens: int, hit: Any, query_error: type[Exception]) -> list[Any]:
    raw = conn.raw
    tsq, arg = f"to_tsquery('{CONFIG}', %s)", tsquery(query, query_error)
    rank_sql = f"SELECT f.id, ts_rank_cd(f.tsv, q, {RANK_NORMALIZATION}) AS score FROM messages_fts f, {tsq} AS q"
    args: list[object] = [arg]
    rank_sql += " WHERE f.tsv @@ q"
    if session_id is not None:  # (filtered before ranking: only that session's matches are ranked)
        rank_sql += " AND f.session_id = %s"
        args.append(session_id)
    if role is not None:
        rank_sql += " AND f.role = %s"
        args.append(role)
    rank_sql += " ORDER BY score DESC, f.id LIMIT %s"
    args.append(limit)
    ranked = raw.execute(rank_sql, args).fetchall()
    if not ranked:
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
    rows = raw.execute("SELECT id, session_id, role, body FROM messages WHERE id = ANY(%s) ORDER BY id",
                       (taken,)).fetchall()
    if rows:
        cursor = raw.cursor()
        cursor.executemany(
            f"INSERT INTO messages_fts (id, session_id, role, text, tsv) VALUES (%s, %s, %s, %s, "
            f"to_tsvector('{CONFIG}', %s)) ON CONFLICT (id) DO NOTHING",
            [(i, sid, r, text, words(text))
             for i, sid, r, text in ((i, sid, r, message_text(_decoder.decode(b))) for i, sid, r, b in rows)])
    return len(taken)
