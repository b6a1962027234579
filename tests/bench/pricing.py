"""What recorded upstream requests cost, priced the way providers bill a cached prompt.

Each request is read in the order a provider's prompt cache sees it (tool definitions,
the system part, then every message's blocks, breakpoints left out), counted with
tiktoken, and compared with the requests before it: the longest prefix it shares with
one of them that is still cached counts as read from the cache, in whole 128-token
blocks from 1,024 tokens on (how the issue priced the four agent CLIs); the rest is
written to the cache (Anthropic, 1.25x) or sent uncached (OpenAI). An entry lives
``ttl_seconds`` after it was last used. Independent of ctxd's own accounting
(``ctxd/engine/billing.py`` only supplies the arithmetic of one bill), so the benchmark
can check what ctxd reports against it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ctxd.engine.billing import Bill, CacheRules, split

BLOCK, FIRST = 128, 1024

ANTHROPIC = CacheRules(provider="anthropic", cache="breakpoints", min_tokens=FIRST, step=BLOCK, read=0.1,
                       write=1.25, ttl_seconds=300, max_breakpoints=4, input_price=3.0)
OPENAI = CacheRules(provider="openai", cache="automatic", min_tokens=FIRST, step=BLOCK, read=0.1,
                    ttl_seconds=300, input_price=1.25)


def _canon(value: Any) -> str:
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def pieces(api: str, body: dict[str, Any]) -> list[str]:
    """The request as its prompt cache reads it, one piece per block."""
    out = [_canon(tool) for tool in body.get("tools") or []]
    if api == "responses":
        if isinstance(body.get("instructions"), str):
            out.append(body["instructions"])
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        return out + [_canon(item) for item in items]
    system = body.get("system")
    if isinstance(system, str):
        out.append(system)
    elif isinstance(system, list):
        out += [_canon(block) for block in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if api == "anthropic" and isinstance(content, str):
            content = [{"type": "text", "text": content}]  # (one prompt to the provider)
        head = {k: v for k, v in message.items() if k != "content"}
        out.append(_canon(head))
        if isinstance(content, list):
            out += [_canon(block) for block in content]
        else:
            out.append(_canon(content))
    return out


@dataclass
class Priced:
    tokens: int
    kept: int
    """The longest prefix shared with a cached earlier request (tokens)."""
    bill: Bill
    follows: bool
    """The whole previous request is this one's prefix."""


@dataclass
class _Entry:
    pieces: list[str]
    sums: list[int]
    used: float


@dataclass
class Pricer:
    """Prices one client's requests, in the order sent."""

    rules: CacheRules
    count: Callable[[str], int]
    history: int = 64
    """Earlier requests compared with (the newest)."""
    entries: list[_Entry] = field(default_factory=list)
    _counts: dict[str, int] = field(default_factory=dict)

    def _tokens(self, piece: str) -> int:
        n = self._counts.get(piece)
        if n is None:
            n = self._counts[piece] = self.count(piece)
        return n

    def price(self, api: str, body: dict[str, Any], at: float) -> Priced:
        parts = pieces(api, body)
        sums = [0]
        for piece in parts:
            sums.append(sums[-1] + self._tokens(piece))
        best, best_entry = 0, None
        alive = [e for e in self.entries[-self.history:] if at - e.used <= self.rules.ttl_seconds]
        for entry in alive:
            n = 0
            limit = min(len(parts), len(entry.pieces))
            while n < limit and parts[n] == entry.pieces[n]:
                n += 1
            kept = sums[n]
            if n < limit:  # part of the first differing piece, as tokens
                a, b = parts[n], entry.pieces[n]
                k = 0
                while k < min(len(a), len(b)) and a[k] == b[k]:
                    k += 1
                kept += self.count(a[:k]) if k else 0
            if kept > best:
                best, best_entry = kept, entry
        if best_entry is not None:
            best_entry.used = at
        previous = self.entries[-1] if self.entries else None
        follows = previous is not None and len(parts) >= len(previous.pieces) and \
            parts[:len(previous.pieces)] == previous.pieces
        self.entries.append(_Entry(parts, sums, at))
        total = sums[-1]
        return Priced(total, best, split(total, best, self.rules), follows)


def billed(priced: list[Priced], rules: CacheRules) -> float:
    return sum(p.bill.billed(rules) for p in priced)
