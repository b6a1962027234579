"""Request bodies decoded from what is new in them.

An agent resends its whole conversation with every request, and most append to the
previous one byte for byte: the same JSON up to the last message, a comma and the new
messages, then the same closing bytes (``]`` and the fields after the conversation). Such
a body is decoded from its new messages only; the rest is the previous request's decoded
value, its messages shared (the proxy never changes a client's message in place: what it
sends differently it copies). Beside saving the decode (proportional to the conversation:
~60 us for 35 kB, ~0.3 ms for 400 kB), the shared messages make the comparison with the
previous request (``sessions.conversation``) one of identities. Any other body, and one
whose new bytes msgspec does not decode whole, is decoded as a whole (``convert.loads``).

Exactness: the previous body ``P`` was decoded whole; its conversation array's bytes,
found once in ``P`` (and only when they occur there once), give where its last element
ends (``core``) and where its closing ``]`` is (``tail``). A body ``N`` longer than ``P``
that starts with ``P[:core]`` and ends with ``P[tail:]`` is ``P`` with the bytes between
replaced; when those are a comma and what decodes as the elements of a JSON array, ``N``
is ``P``'s value with those elements appended, and nothing else (the parser is in the same
state before and after them in both).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec

from ctxd.formats import Api
from ctxd.proxy.convert import loads

_WHITESPACE = b" \t\r\n"
KIN = 4096
"""Bytes two bodies start with alike, at least, to be taken for one conversation (``_Seen.kin``)."""
_top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_elements = msgspec.json.Decoder(list[Any]).decode


class _Seen:
    """A body decoded before: its bytes, its value (kept as decoded; a copy of its top
    level is handed out), and once found, where its conversation's last element ends
    (``core``) and where its closing bracket is (``tail``); ``core`` 0: not found yet,
    -1: the body has no conversation array to append to (or it is not found exactly)."""

    __slots__ = ("raw", "value", "field", "core", "tail")

    def __init__(self, raw: bytes, value: dict[str, Any], field: str, core: int = 0, tail: int = 0) -> None:
        self.raw = raw
        self.value = value
        self.field = field
        self.core = core
        self.tail = tail

    def handed(self) -> dict[str, Any]:
        """The value for a reader: its top level and conversation list copies (what a
        reader changes there stays its own), the messages themselves shared."""
        value = dict(self.value)
        if isinstance(value.get(self.field), list):
            value[self.field] = list(value[self.field])
        return value

    def locate(self) -> bool:
        """Find the conversation array in the bytes (once)."""
        if self.core == 0:
            self.core = -1
            try:
                found = _top(self.raw).get(self.field)
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                return False
            array = bytes(found) if found is not None else b""
            if not array.startswith(b"[") or not isinstance(self.value.get(self.field), list):
                return False
            at = self.raw.find(array)
            if at < 0 or self.raw.find(array, at + 1) >= 0:
                return False  # (the same bytes twice: which one is the conversation is not known)
            inner = len(array[:-1].rstrip(_WHITESPACE))
            if inner <= 1:
                return False  # (an empty array: nothing before a comma to append after)
            self.core, self.tail = at + inner, at + len(array) - 1
        return self.core > 0

    def kin(self, raw: bytes) -> bool:
        """Whether ``raw`` starts as this body does, up to half of its conversation and
        ``KIN`` bytes at least: the same conversation, most likely, sent again otherwise
        than appended to (small bodies alike in their framing alone are not: a title
        request, a summary; looking into them costs little)."""
        return self.core // 2 >= KIN and raw.startswith(self.raw[:self.core // 2])

    def extended(self, raw: bytes) -> _Seen | None:
        """``raw`` decoded as this body with elements appended to its conversation, or None."""
        if len(raw) <= len(self.raw) or not self.locate():
            return None
        core, closing = self.core, len(self.raw) - self.tail
        if not raw.endswith(self.raw[self.tail:]) or not raw.startswith(self.raw[:core]):
            return None
        added = raw[core:len(raw) - closing]
        new = added.lstrip(_WHITESPACE)
        if new[:1] != b",":
            return None
        try:
            elements = _elements(b"[" + new[1:] + b"]")
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None  # (not elements of an array, or what msgspec leaves to json: NaN)
        if not elements:
            return None
        value = dict(self.value)
        value[self.field] = self.value[self.field] + elements
        return _Seen(raw, value, self.field, core + len(added.rstrip(_WHITESPACE)), len(raw) - closing)


class Bodies:
    """The last bodies decoded per conversation key (the API, the client's session header
    and key fingerprint): up to ``per_key`` each (an agent's side requests, a title, a
    summary, its sub-agents share its key), ``keys`` keys, ``budget`` bytes of bodies in
    all (their values are mostly the messages the proxy's sessions hold anyway), the least
    recently used forgotten first. A key whose bodies stop extending each other (a client
    that rewrites its history each turn: moved cache breakpoints, a rebuilt prompt) is not
    looked into after ``MISSES`` misses in a row, but every ``RETRY``-th request (against
    its newest body): a miss is a body that starts as one held (half its conversation
    alike) and extends none."""

    MISSES = 3
    RETRY = 16

    def __init__(self, *, keys: int = 32, per_key: int = 8, budget: int = 32 << 20) -> None:
        self.keys = keys
        self.per_key = per_key
        self.budget = budget
        self.held = 0
        self.hits = 0
        self._seen: OrderedDict[tuple[Any, ...], tuple[list[_Seen], list[int]]] = OrderedDict()

    def loads(self, api: Api, key: tuple[Any, ...], raw: bytes) -> Any:
        """``convert.loads(raw)``: the same value (a new top-level dict), its errors."""
        field = "input" if api == "responses" else "messages"
        full = (api, *key)
        known = self._seen.get(full)
        if known is not None:
            seen, state = known
            self._seen.move_to_end(full)
            state[1] += 1
            if state[0] < self.MISSES or state[1] % self.RETRY == 0:
                kin = False
                for n, before in enumerate(seen if state[0] < self.MISSES else seen[:1]):
                    after = before if raw == before.raw else before.extended(raw)
                    if after is not None:
                        state[0] = 0
                        self.hits += after is not before
                        self.held += len(after.raw) - len(before.raw)
                        del seen[n]
                        seen.insert(0, after)
                        self._evict()
                        return after.handed()
                    kin = kin or before.kin(raw)
                state[0] += kin
        value = loads(raw)
        if isinstance(value, dict):
            held = dict(value)
            if isinstance(held.get(field), list):
                held[field] = list(held[field])  # (the reader's list is its own)
            self._remember(full, _Seen(raw, held, field))
        return value

    def _remember(self, key: tuple[Any, ...], seen: _Seen) -> None:
        known = self._seen.get(key)
        if known is None:
            known = self._seen[key] = ([], [0, 0])
        self._seen.move_to_end(key)
        known[0].insert(0, seen)
        self.held += len(seen.raw)
        while len(known[0]) > self.per_key:
            self.held -= len(known[0].pop().raw)
        self._evict()

    def _evict(self) -> None:
        while self._seen and (len(self._seen) > self.keys or self.held > self.budget):
            _, (dropped, _) = self._seen.popitem(last=False)
            self.held -= sum(len(s.raw) for s in dropped)
