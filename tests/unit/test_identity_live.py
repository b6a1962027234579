"""A session's live entries kept column by column from request to request
(``identity.Live``): :func:`match` and :func:`stored_sides` give what a full reading of the
session gives, whatever happened to it between two requests, and a plain extension reads
no entry it read before."""

from __future__ import annotations

import random
from collections import defaultdict, deque
from typing import Any

from ctxd.proxy.identity import Ident, Live, Plan, Prefix, Stored, match, stored_sides

POOL = [f"id{k}" for k in range(8)]


def full_match(stored: list[Stored], client: list[Ident]) -> Plan | None:
    """:func:`match` as the definition: every entry read, the usual request included."""
    live = [i for i, s in enumerate(stored) if s.live]
    k = len(live)
    if len(client) >= k and [stored[i].ident for i in live] == [c.key for c in client[:k]]:
        return Plan(new=list(range(k, len(client))), matched=dict(enumerate(live)), extends=True)
    queues: dict[str, deque[int]] = defaultdict(deque)
    for i in live:
        queues[stored[i].ident].append(i)
    plan = Plan(new=[])
    matched: dict[int, int] = {}
    last_stored = last_client = -1
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
    plan.matched = matched
    for i in live:
        if i not in matched.values():
            if stored[i].anchor:
                return None
            plan.superseded.append(i)
    if any(client[j].ids and j < last_client for j in plan.new):
        return None
    return plan


def full_sides(stored: list[Stored], plan: Plan, client: list[Ident]) -> tuple[list[Any], list[bool]]:
    m = plan.matched
    return ([stored[m[j]].shape if j in m else c.shape for j, c in enumerate(client)],
            [stored[m[j]].anchor if j in m else c.ids or c.key in plan.anchors for j, c in enumerate(client)])


def _ident(rng: random.Random) -> Ident:
    return Ident(rng.choice(POOL), rng.random() < 0.2, f"s{rng.randrange(3)}")


def _entry(rng: random.Random, n: int, ident: Ident | None = None, *, anchor: bool | None = None) -> Stored:
    ident = ident or _ident(rng)
    return Stored(f"h{n}-{rng.random()}", ident.key, ident.ids if anchor is None else anchor, ident.shape)


def _request(rng: random.Random, stored: list[Stored]) -> list[Ident]:
    """A client's request over the session: mostly its live messages then new ones; else
    its own ones moved or dropped, an anchor dropped (a fork), or anything."""
    live = [s for s in stored if s.live]
    client = [Ident(s.ident, s.anchor and rng.random() < 0.5, s.shape if rng.random() < 0.8 else "other")
              for s in live]
    kind = rng.random()
    if kind < 0.15 and client:  # the client's own context replaced or moved
        own = [j for j, s in enumerate(live) if not s.anchor]
        for j in sorted(rng.sample(own, min(len(own), rng.randrange(3))), reverse=True):
            moved = client.pop(j)
            if rng.random() < 0.5:
                client.insert(rng.randrange(len(client) + 1), moved)
    elif kind < 0.2 and client:  # a message dropped, whatever it is (an anchor: a fork)
        del client[rng.randrange(len(client))]
    elif kind < 0.25:
        client = [_ident(rng) for _ in range(rng.randrange(len(live) + 2))]
    elif kind < 0.3 and client:  # cut short (a request older than the session)
        client = client[:rng.randrange(len(client))]
    return client + [_ident(rng) for _ in range(rng.randrange(4))]


def test_kept_columns_plan_what_a_full_reading_plans_over_random_sessions() -> None:
    """Extensions, supersedes, forks, replies pushed, a failed reply push's entries cut
    (a new list, or the same list cut and grown again), the session read again from
    history: every request's plan and sides equal a full reading's."""
    rng = random.Random(11)
    counts: dict[str, int] = defaultdict(int)
    for _ in range(60):
        stored: list[Stored] = []
        live = Live()
        n = 0
        for _ in range(rng.randrange(10, 60)):
            event = rng.random()
            if event < 0.15 and stored:  # a reply pushed (appended in place), or its push failed (cut)
                before = len(stored)
                stored += [_entry(rng, n + m, anchor=True) for m in range(rng.randrange(1, 3))]
                n += 3
                if rng.random() < 0.3:
                    if rng.random() < 0.5:
                        stored = stored[:before]  # (Sessions._settle: a new list)
                    else:
                        del stored[before - rng.randrange(before + 1):]
                        stored += [_entry(rng, n + m) for m in range(rng.randrange(3))]
                        n += 3
                    counts["cut"] += 1
                continue
            if event < 0.2:  # read again from history: other objects, equal values
                stored = [Stored(s.key, s.ident, s.anchor, s.shape, s.live) for s in stored]
                counts["reloaded"] += 1
                continue
            client = _request(rng, stored)
            keys = [c.key for c in client]
            plan = match(stored, client, live, keys)
            expected = full_match(stored, client)
            assert (plan is None) == (expected is None)
            if plan is None or expected is None:
                counts["diverged"] += 1
                continue
            assert (plan.new, plan.superseded, dict(plan.matched), plan.extends) == \
                (expected.new, expected.superseded, expected.matched, expected.extends)
            assert plan == expected
            counts["extends" if plan.extends else "superseding" if plan.superseded else "moved"] += 1
            plan.anchors = expected.anchors = {c.key for c in client if rng.random() < 0.2}
            assert stored_sides(stored, plan, client) == full_sides(stored, expected, client)
            cut = rng.randrange(len(stored) + 1)
            assert plan.matched_since(cut) == [j for j, i in expected.matched.items() if i >= cut]
            # The turn: the superseded leave the context, the new are appended (in place).
            live.retire(stored, plan.superseded)
            stored += [_entry(rng, n + m, client[j], anchor=client[j].ids or client[j].key in plan.anchors)
                       for m, j in enumerate(plan.new)]
            n += len(plan.new)
    assert min(counts.values()) >= 20, counts


class Watched(list[Any]):
    """A session's entries that record which of them are read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: list[int] = []

    def __getitem__(self, i: Any) -> Any:
        self.read += range(len(self))[i] if isinstance(i, slice) else [i % len(self)]
        return super().__getitem__(i)

    def __iter__(self) -> Any:
        self.read += range(len(self))
        return super().__iter__()


def test_a_plain_extension_reads_only_what_is_new() -> None:
    """Once a session's columns are read, a request that extends it reads the entries
    appended since and the last one read (that the list was not cut), no other: its work
    is what it adds, not the thousands of messages before."""
    rng = random.Random(5)
    stored = Watched(_entry(rng, n, anchor=n % 3 == 0) for n in range(3000))
    stored[10].live = False  # (superseded long ago: kept out of the columns)
    live = Live()
    client = [Ident(s.ident, s.anchor, s.shape) for s in stored if s.live]
    plan = match(stored, client + [_ident(rng)], live)
    assert plan is not None and plan.extends
    for turn in range(3):
        new = [_entry(rng, 4000 + 10 * turn + m) for m in range(2)]
        size = len(stored)
        stored += new  # (the turn's push, and the reply's)
        client += [Ident(s.ident, s.anchor, s.shape) for s in new]
        asked = client + [_ident(rng), _ident(rng)]
        keys = [c.key for c in asked]
        stored.read.clear()
        plan = match(stored, asked, live, keys)
        assert plan is not None and plan.extends and plan.new == [len(client), len(client) + 1]
        assert isinstance(plan.matched, Prefix) and plan.matched[len(client) - 1] == size + 1
        shapes, anchors = stored_sides(stored, plan, asked)
        assert set(stored.read) <= {size - 1, size, size + 1}, sorted(set(stored.read))[:10]
        assert (shapes, anchors) == full_sides(stored, plan, asked)
        assert plan == full_match(list(stored), asked)
