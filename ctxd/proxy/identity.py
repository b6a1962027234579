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
from collections import defaultdict, deque
from collections.abc import Callable
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
    whether it is an anchor, its shape, and whether it is still in the active context."""

    key: str
    ident: str
    anchor: bool
    shape: str
    live: bool = True


@dataclass
class Plan:
    """What a request does to its session: the client's messages to push (their indexes,
    in the client's order), the stored ones it superseded (indexes into the session's
    entries), which stored message each other client message is, and whether the request
    is a plain extension (the live messages, in order, then the new ones)."""

    new: list[int]
    superseded: list[int] = field(default_factory=list)
    matched: dict[int, int] = field(default_factory=dict)  # client index -> entry index, in the client's order
    extends: bool = False
    anchors: set[str] = field(default_factory=set)  # identities to store as anchors (a fork's replies)


def match(stored: list[Stored], client: list[Ident]) -> Plan | None:
    """The plan of a request over its session's messages, or None when the client's
    history diverges from the session's: a live anchor it no longer sends (a reply or
    tool exchange dropped or replaced), anchors in another order, or an anchor the
    session does not hold placed before one it does (another tool call id)."""
    live = [i for i, s in enumerate(stored) if s.live]
    k = len(live)
    # (The usual request, the session's messages then new ones: two lists compared at once.)
    if len(client) >= k and [stored[i].ident for i in live] == [c.key for c in client[:k]]:
        return Plan(new=list(range(k, len(client))), matched=dict(enumerate(live)), extends=True)
    queues: dict[str, deque[int]] = defaultdict(deque)
    for i in live:
        queues[stored[i].ident].append(i)
    plan = Plan(new=[])
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
        plan.matched[j] = i
    taken = set(plan.matched.values())
    for i in live:
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
