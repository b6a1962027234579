"""Which stored message a client's message is, what a request adds to its session, and
the upstream request in the client's order (docs/proxy.md, "Which messages are new").

A message's **identity** is the provider ids it carries (tool calls it makes, calls it
answers, server tool blocks), whatever else the client added, dropped or reordered in it
(Claude Code's copy of an Edit call carries ``"replace_all": false``, which the model's
did not); a message without ids is what ctxd models of it (its projection). A message is
an **anchor** when it carries ids or was the upstream's reply: the conversation itself,
which a client only drops or replaces when it rewrites the conversation (a fork). Any
other message is the client's own, and may be resent elsewhere or replaced by a newer
copy each turn (aider's files in the chat, repository map, reminders): the older copy
is then **superseded**, not a divergence.

Pure functions over plain data; ``sessions.py`` does the I/O.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxd.formats import ids_of, projection
from ctxd.formats.common import Api, canonical_json


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Ident:
    """One message's identity (``key``), whether it carries provider ids, and the hash of
    its projection (``shape``: equal shapes, rendered by ctxd as the client sent it)."""

    key: str
    ids: bool
    shape: str


def ident_of(api: Api, raw: dict[str, Any], part: list[Any]) -> Ident:
    """The identity of a raw message (client's or reply) whose chain part is ``part``: the
    tool calls it makes and the calls it answers (``formats.ids_of``). A Responses item's
    own ``id`` is not part of it: a client that sends its items back without them
    (``store: false``) sends the same message."""
    ids = [ref for ref in ids_of(api, raw) if ref[0] != "item"]
    key = _digest(["ids", part[0], ids] if ids else ["text", part])
    return Ident(key, bool(ids), _digest(projection(api, raw)))


@dataclass(slots=True)
class Stored:
    """A message the proxy pushed to a session: its idempotency hash (``key``), identity,
    whether it is an anchor, its shape, and whether it is still in the active context
    (turned off through :meth:`Live.retire` only, which the session's :class:`Live` must
    know of; the other fields never change)."""

    key: str
    ident: str
    anchor: bool
    shape: str
    live: bool = True


class Live:
    """A session's live entries (``Stored.live``) in order, column by column: their indexes
    in the session's list, identities, shapes and anchor flags; what :func:`match` and
    :func:`stored_sides` compare a request with. Kept per session and brought up to date
    by reading only what was appended to the list since (an agent's session grows at its
    end: a request's work is then what it adds, not the thousands of messages before);
    built again when the list is another one, was cut (its last entry read is not where
    it was), or an entry stopped being live (:meth:`retire`). The columns only grow, or
    are replaced by new lists: a :class:`Prefix` of them stays valid."""

    __slots__ = ("source", "size", "last", "index", "idents", "shapes", "anchors")

    def __init__(self) -> None:
        self.source: list[Stored] | None = None  # the list read, and how far, ending with ``last``
        self.size = 0
        self.last: Stored | None = None
        self.index: list[int] = []
        self.idents: list[str] = []
        self.shapes: list[str] = []
        self.anchors: list[bool] = []

    def of(self, stored: list[Stored]) -> Live:
        """These columns, up to date with ``stored``."""
        size = self.size
        if stored is not self.source or size > len(stored) or (size and stored[size - 1] is not self.last):
            self.source, size = stored, 0
            self.index, self.idents, self.shapes, self.anchors = [], [], [], []
        for i in range(size, len(stored)):
            entry = stored[i]
            if entry.live:
                self.index.append(i)
                self.idents.append(entry.ident)
                self.shapes.append(entry.shape)
                self.anchors.append(entry.anchor)
        self.size = len(stored)
        self.last = stored[-1] if stored else None
        return self

    def retire(self, stored: list[Stored], indexes: list[int]) -> None:
        """Take entries of ``stored`` out of the active context (superseded): the columns
        are built again when next read."""
        for i in indexes:
            stored[i].live = False
        if indexes:
            self.source = None


class Prefix(Mapping[int, int]):
    """``Plan.matched`` of a plain extension: the client's ``j``-th message is the ``j``-th
    live entry, for the first ``k`` (read from the session's :class:`Live` columns as they
    were, never copied into a dict: a long session holds thousands)."""

    __slots__ = ("index", "shapes", "anchors", "k")

    def __init__(self, live: Live, k: int) -> None:
        self.index, self.shapes, self.anchors, self.k = live.index, live.shapes, live.anchors, k

    def __getitem__(self, j: int) -> int:
        if isinstance(j, int) and 0 <= j < self.k:
            return self.index[j]
        raise KeyError(j)

    def __contains__(self, j: object) -> bool:
        return isinstance(j, int) and 0 <= j < self.k

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.k))

    def __reversed__(self) -> Iterator[int]:
        return reversed(range(self.k))

    def __len__(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Prefix({dict(self)!r})"

    def since(self, n: int) -> list[int]:
        """The client positions matched to entries ``n`` and after (the indexes increase)."""
        return list(range(bisect_left(self.index, n, 0, self.k), self.k))


@dataclass
class Plan:
    """What a request does to its session: the client's messages to push (their indexes,
    in the client's order), the stored ones it superseded (indexes into the session's
    entries), which stored message each other client message is, and whether the request
    is a plain extension (the live messages, in order, then the new ones)."""

    new: list[int]
    superseded: list[int] = field(default_factory=list)
    # client index -> entry index, in the client's order (a plain extension's: a Prefix)
    matched: Mapping[int, int] = field(default_factory=dict)
    extends: bool = False
    anchors: set[str] = field(default_factory=set)  # identities to store as anchors (a fork's replies)

    def matched_since(self, n: int) -> list[int]:
        """The client positions matched to entries ``n`` and after, in the client's order."""
        matched = self.matched
        if isinstance(matched, Prefix):
            return matched.since(n)
        return [j for j, i in matched.items() if i >= n]


def match(stored: list[Stored], client: list[Ident], live: Live | None = None,
          keys: list[str] | None = None) -> Plan | None:
    """The plan of a request over its session's messages, or None when the client's
    history diverges from the session's: a live anchor it no longer sends (a reply or
    tool exchange dropped or replaced), anchors in another order, or an anchor the
    session does not hold placed before one it does (another tool call id). ``live``:
    the session's columns (:class:`Live`), kept from request to request; ``keys``: the
    client's identities (``[c.key for c in client]``), kept so too (``Conversation.keys``)."""
    view = (live if live is not None else Live()).of(stored)
    k = len(view.idents)
    if keys is None or len(keys) != len(client):
        keys = [c.key for c in client]
    # (The usual request, the session's messages then new ones: two lists compared at
    # once, in C, most of their strings the same objects: the work is the new messages'.)
    head = keys if len(keys) == k else keys[:k]
    if len(client) >= k and head == view.idents:
        # (The client's strings from now on, equal ones: its next request's are the same
        # objects, compared by identity. A Prefix holds the other columns, never this one.)
        view.idents = head if head is not keys else list(keys)
        return Plan(new=list(range(k, len(client))), matched=Prefix(view, k), extends=True)
    queues: dict[str, deque[int]] = defaultdict(deque)
    for i in view.index:
        queues[stored[i].ident].append(i)
    plan = Plan(new=[])
    matched: dict[int, int] = {}
    plan.matched = matched
    last_stored = -1  # the newest stored anchor matched so far
    last_client = -1  # the client's position of it
    for j, c in enumerate(client):
        queue = queues.get(c.key)
        if not queue:
            plan.new.append(j)
            continue
        i = queue.popleft()
        if stored[i].anchor:
            if i < last_stored:
                return None
            last_stored, last_client = i, j
        matched[j] = i
    taken = set(matched.values())
    for i in view.index:
        if i not in taken:
            if stored[i].anchor:
                return None
            plan.superseded.append(i)
    if any(client[j].ids and j < last_client for j in plan.new):
        return None
    return plan


def stored_sides(stored: list[Stored], plan: Plan, client: list[Ident]) -> tuple[list[str | None], list[bool]]:
    """Per client message of ``plan``: the shape and whether it is an anchor, the stored
    copy's when it matched one, else its own (an anchor when it carries ids or the plan
    makes it one)."""
    matched = plan.matched
    k = len(matched)
    if isinstance(matched, Prefix):  # (a plain extension: the session's columns, no entry read)
        rest = client[k:]
        shapes_: list[str | None] = matched.shapes[:k]  # type: ignore[assignment]
        shapes_ += [c.shape for c in rest]
        return shapes_, matched.anchors[:k] + [c.ids or c.key in plan.anchors for c in rest]
    if k and next(reversed(matched)) == k - 1:
        # The client's first k messages matched (the usual request; ``matched`` is in the
        # client's order): no lookup per message (3x faster on a long conversation).
        entries = [stored[i] for i in matched.values()]
        rest = client[k:]
        shapes: list[str | None] = [e.shape for e in entries]
        shapes += [c.shape for c in rest]
        return shapes, [e.anchor for e in entries] + [c.ids or c.key in plan.anchors for c in rest]
    return ([stored[matched[j]].shape if j in matched else ident.shape for j, ident in enumerate(client)],
            [stored[matched[j]].anchor if j in matched else ident.ids or ident.key in plan.anchors
             for j, ident in enumerate(client)])


def _in_order(positions: list[int], weights: list[int]) -> set[int]:
    """Indexes of the heaviest increasing subsequence of ``positions`` (a Fenwick tree of
    prefix maxima over the positions): the messages ctxd's prompt and the client's
    request have in the same order; anchors weigh more than any number of the client's
    own, so they are always in it (they keep their order: :func:`match`)."""
    size = max(positions, default=-1) + 2
    tree: list[tuple[int, int]] = [(0, -1)] * (size + 1)  # (best weight, index ending it)
    best_at: list[int] = [0] * len(positions)
    back: list[int] = [-1] * len(positions)
    for i, p in enumerate(positions):
        k, found = p + 1, (0, -1)  # the best run ending below p (tree index p + 1 covers positions < p + 1)
        k -= 1
        while k > 0:
            if tree[k][0] > found[0]:
                found = tree[k]
            k -= k & -k
        best_at[i], back[i] = found[0] + weights[i], found[1]
        k = p + 1
        while k <= size:
            if best_at[i] > tree[k][0]:
                tree[k] = (best_at[i], i)
            k += k & -k
    out: set[int] = set()
    i = max(range(len(positions)), key=best_at.__getitem__, default=-1)
    while i >= 0:
        out.add(i)
        i = back[i]
    return out


def compose(api: Api, rendered: list[dict[str, Any]], client: list[dict[str, Any]], idents: list[Ident | None],
            shapes: list[str | None], identify: Callable[[dict[str, Any]], Ident | None],
            anchors: list[bool] | None = None) -> list[Any]:
    """ctxd's prompt in the client's order: each rendered message that is one of the
    client's (same identity) goes where the client placed it, as the client's own bytes
    when ctxd renders it as stored (its shape is the stored one's, ``shapes[j]``), else as
    ctxd rendered it (a pruned output). A rendered message of no client message (user
    messages ctxd joined behind its boundary, a clipped text, another client's message, a
    synthesised tool result) goes right after the one before it that both orders agree
    on (the heaviest run in the same order in both, anchors first: what is out of it is
    the client's working context, which moved), else first. Client messages ctxd left
    out (compressed, superseded) are left out. ``anchors[j]``: the client's ``j``-th is an
    anchor (identity.py)."""
    positions: dict[str, deque[int]] = defaultdict(deque)
    for j, ident in enumerate(idents):
        if ident is not None:  # (None: a message with nothing ctxd keeps)
            positions[ident.key].append(j)
    mapped: list[tuple[int, int]] = []  # (index in rendered, client position)
    own: dict[int, Any] = {}
    # From the end: of equal messages ("Ok."), ctxd keeps the newest when it compresses.
    for r in range(len(rendered) - 1, -1, -1):
        message = rendered[r]
        ident = identify(message)
        queue = positions.get(ident.key) if ident is not None else None
        if queue:
            j = queue.pop()
            own[j] = client[j] if ident is not None and ident.shape == shapes[j] else message
            mapped.append((r, j))
    mapped.reverse()
    weights = [len(rendered) + 1 if anchors is not None and anchors[j] else 1 for _, j in mapped]
    steady = {mapped[k][0] for k in _in_order([j for _, j in mapped], weights)}
    client_of = dict(mapped)
    after: dict[int, list[Any]] = defaultdict(list)  # client position (-1: first) -> unmapped going after it
    anchor = -1
    for r, message in enumerate(rendered):
        if r in client_of:
            if r in steady:
                anchor = client_of[r]
            continue
        after[anchor].append(message)
    out: list[Any] = list(after.get(-1, []))
    for j in sorted(own):
        out.append(own[j])
        out += after.get(j, [])
    return out
