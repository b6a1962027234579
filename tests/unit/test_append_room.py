"""``appendRoom``: while the conversation grows by no more than it, no pass can start and
the prompt still fits (``ctxd proxy`` sends a request before its turn on that promise)."""

from __future__ import annotations

import random

from ctxd.engine.billing import CacheRules
from ctxd.engine.budget import compute_budget
from ctxd.engine.context import CompressionState
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.trigger import Economy, append_room, decide

CACHES = CacheRules(provider="anthropic", cache="breakpoints", read=0.1, write=1.25)


def _budget(rng_args: dict[str, int | float], *, used: int, pinned: int = 0):  # type: ignore[no-untyped-def]
    return compute_budget(used=used, pinned_tokens=pinned, **rng_args)  # type: ignore[arg-type]


def test_no_pass_and_a_fitting_prompt_within_the_room_and_not_past_it() -> None:
    rng = random.Random(7)
    bound_hit = 0
    for _ in range(3000):
        window = rng.choice([2048, 4096, 8192, 16384, 32768, 200000])
        args: dict[str, int | float] = dict(
            context_window=window, usable_fraction=rng.choice([0.9, 1.0]),
            reserved_output=rng.randint(256, window // 4), safety_margin=rng.randint(0, window // 20),
            trigger_fraction=rng.choice([0.6, 0.8, 0.95, 1.0]), system_tokens=rng.randint(0, window // 8),
            checkpoint_tokens=rng.randint(0, window // 8))
        used = rng.randint(0, window)
        policy = CompressionPolicy(auto=rng.random() < 0.9, room_fraction=rng.choice([0.5, 0.7, 0.9]))
        caches = rng.random() < 0.5
        # The provider's cache expired: an early pass runs as soon as the rules let it.
        economy = Economy(rules=CACHES, growth=200.0, cold=True) if caches else None
        state = CompressionState()
        before = _budget(args, used=used)
        room = append_room(before, policy, caches=caches)
        assert room >= 0
        if room == 0:
            continue
        for grown in {1, room // 2, room}:
            for after in (_budget(args, used=used + grown), _budget(args, used=used, pinned=grown)):
                assert not decide(state, after, policy, economy).compress, (args, used, grown)
                assert after.prompt_tokens <= after.max_prompt_tokens
        past = _budget(args, used=used + room + 1)
        if decide(state, past, policy, economy).compress or past.prompt_tokens > past.max_prompt_tokens:
            bound_hit += 1
    assert bound_hit > 500  # (the room is the edge, not a margin short of it, in most cases)
