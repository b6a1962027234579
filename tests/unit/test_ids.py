"""Session ids as shown and typed (``ctxd/ids.py``): whether a name can be a short form
at all, which lets the proxy skip listing every session for a name a client chose."""

from __future__ import annotations

import random
import uuid

from ctxd.ids import may_be_short_form, short_form_of, short_ids


def _ids(rng: random.Random) -> list[str]:
    out = []
    for _ in range(rng.randrange(1, 6)):
        kind = rng.randrange(3)
        if kind == 0:
            root = str(uuid.UUID(int=rng.getrandbits(128)))
        elif kind == 1:
            root = f"proxy-{rng.choice(['openai', 'anthropic'])}-{rng.getrandbits(64):016x}"
        else:
            root = rng.choice(["my-task", "bench-ttfb-3", "abc", "from-cli~2", "deadbeef"])
        out.append(root)
        if rng.random() < 0.3:
            out.append(f"{root}~{rng.randrange(2, 5)}")
    return out


def _names(rng: random.Random, ids: list[str]) -> list[str]:
    """Names a client may send: shown short forms, prefixes of every length, with and
    without a fork suffix, and names of its own."""
    shown = list(short_ids(ids).values())
    out = shown + [s + "~7" for s in shown] + ["bench-ttfb-12", "my-task", "x~01", "p", "proxy-openai-"]
    for sid in ids:
        for length in (1, 6, 8, 12, 13, 18, 19, 20, 24, len(sid)):
            out += [sid[:length], sid[:length] + f"~{rng.randrange(1, 4)}"]
    return out


def test_no_name_that_may_not_be_a_short_form_is_one() -> None:
    """:func:`may_be_short_form` never says no where :func:`short_form_of` finds an id
    (the proxy would then make a new session of a short id)."""
    rng = random.Random(7)
    found = 0
    for _ in range(300):
        ids = _ids(rng)
        for name in _names(rng, ids):
            if short_form_of(name, ids):
                found += 1
                assert may_be_short_form(name), (name, ids)
    assert found > 1000  # (the property was checked on many short forms, not vacuously)


def test_names_a_client_chooses_are_not_short_forms() -> None:
    for name in ("bench-ttfb-12", "my-task", "from-cli", "session-7", "proxy-openai-3f2c1", "abc~2", "deadbee"):
        assert not may_be_short_form(name), name
    for name in ("proxy-openai-3f2c1a", "proxy-openai-3f2c1a~2", "3f2c1a9b", "3f2c1a9b-01", "0f1e2d3c~3"):
        assert may_be_short_form(name), name
