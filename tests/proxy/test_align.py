"""The alignment of ctxd's prompt with the client's messages (apis._align) compares runs
of messages at once; it must give what the message-by-message rule gives."""

from __future__ import annotations

import random
from typing import Any

from ctxd.proxy import apis


def one_by_one(api: apis.Api, rendered: list[dict[str, Any]], client: list[dict[str, Any]]) -> list[Any]:
    """The rule: from the end, each message of ctxd's prompt equal to the client's (as JSON,
    else as ctxd models it) is the client's own, up to the first that differs."""
    out: list[Any] = list(rendered)
    j = 1
    while j <= len(rendered) and j <= len(client):
        if rendered[-j] != client[-j] and apis.projection(api, rendered[-j]) != apis.projection(api, client[-j]):
            break
        out[-j] = client[-j]
        j += 1
    return out


def test_runs_compared_at_once_align_as_one_by_one() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        n = rng.randint(0, 150)
        client = [{"role": rng.choice(["user", "assistant"]), "content": f"message {i}"} for i in range(n)]
        rendered = [{"role": "user", "content": "[checkpoint]"}] * rng.randint(0, 2) + \
            [dict(m) for m in client[rng.randint(0, n):]]
        for _ in range(rng.randint(0, 3)):
            if rendered:
                i = rng.randrange(len(rendered))
                changed = dict(rendered[i], content=rendered[i]["content"] + " (summarised)") \
                    if rng.random() < 0.5 else dict(rendered[i], name=None)  # equal as ctxd models it, not as JSON
                rendered[i] = changed
        for api in ("openai", "anthropic", "ollama"):
            got, want = apis._align(api, rendered, client), one_by_one(api, rendered, client)
            assert got == want
            assert all(a is b for a, b in zip(got, want))  # the client's own objects where aligned
