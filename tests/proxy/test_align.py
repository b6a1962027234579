"""The alignment of ctxd's prompt with the client's messages (apis._align) compares runs
of messages at once; it must give what the message-by-message rule gives."""

from __future__ import annotations

import random
from typing import Any

from ctxd import formats
from ctxd.proxy import apis


def one_by_one(api: apis.Api, rendered: list[dict[str, Any]], client: list[dict[str, Any]]) -> list[Any]:
    """The rule: from the end, each message of ctxd's prompt equal to the client's (as JSON,
    else as ctxd models it) is the client's own, up to the first that differs."""
    out: list[Any] = list(rendered)
    j = 1
    while j <= len(rendered) and j <= len(client):
        if rendered[-j] != client[-j] and formats.projection(api, rendered[-j]) != formats.projection(api, client[-j]):
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


def _anthropic(message: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A client's Anthropic message: blocks, now and then a cache breakpoint or a thinking block."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}]
    if message["role"] == "assistant" and rng.random() < 0.3:
        blocks.insert(0, {"type": "thinking", "thinking": "hm", "signature": "sig"})
    if rng.random() < 0.2:
        blocks[-1] = dict(blocks[-1], cache_control={"type": "ephemeral"})
    return {"role": message["role"], "content": blocks if rng.random() < 0.7 else message["content"]}


def test_the_previous_alignment_reused_gives_the_same_body() -> None:
    """Each turn's upstream body built on the previous request's alignment (``AlignMemo``)
    equals the one built from nothing, whatever happens between turns: ctxd's prompt
    growing, changing before its end (a compression, a cleared output), the client
    editing or dropping messages, breakpoints moving."""
    from ctxd.proxy.sessions import conversation

    rng = random.Random(11)
    for api in ("openai", "anthropic", "ollama"):
        for _ in range(40):
            ours: list[dict[str, Any]] = []  # what ctxd would render (as JSON)
            client: list[dict[str, Any]] = []
            previous = None
            for turn in range(rng.randint(1, 60)):
                for role in ("user", "assistant")[:rng.randint(1, 2)]:
                    text = f"{role} {turn}"
                    ours.append({"role": role, "content": [{"type": "text", "text": text}] if api == "anthropic"
                                 else text})
                    client.append(_anthropic({"role": role, "content": text}, rng) if api == "anthropic"
                                  else {"role": role, "content": text})
                event = rng.random()
                if event < 0.1 and len(ours) > 4:  # a compression: a summary in place of the older part
                    cut = rng.randrange(1, len(ours) - 2)
                    ours = [{"role": "user", "content": f"[summary up to {cut}]"}] + ours[cut:]
                elif event < 0.15 and ours:  # ctxd's copy of one message differs (an output cleared)
                    i = rng.randrange(len(ours))
                    ours[i] = dict(ours[i], content=f"[cleared {i}]")
                elif event < 0.2 and client:  # the client edits a message, or moves its breakpoint
                    i = rng.randrange(len(client))
                    client[i] = _anthropic({"role": client[i]["role"], "content": f"edited {i}"}, rng) \
                        if api == "anthropic" else dict(client[i], content=f"edited {i}")
                elif event < 0.23 and len(client) > 2:  # the client drops its oldest messages
                    client = client[2:]
                body = {"model": "m", "messages": [dict(m) for m in client]}
                if api == "anthropic":
                    body["system"] = [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
                parts = apis.split(api, body)
                conv = conversation(api, body, parts, session="s", window=None, previous=previous)
                prompt = {"messages": [dict(m) for m in ours], "system": "sys"}
                got = apis.upstream_body(api, dict(body), parts, prompt, conv.align)
                conv.align.previous = None
                want = apis.upstream_body(api, dict(body), parts, prompt)
                assert got == want
                if api != "anthropic":  # (there, a breakpoint added or dropped is a new message)
                    assert all(a is b for a, b in zip(got["messages"], want["messages"]))
                previous = conv


def test_the_step_answered_last_is_the_clients_own_past_an_excerpt() -> None:
    """Anthropic: ctxd sends the newest output as an excerpt (the walk stops there); the
    assistant message it answers is still the client's own (its ``redacted_thinking``,
    which ctxd does not keep, included), and only when it is the same message."""
    thinking = {"type": "thinking", "thinking": "", "signature": "SIG"}
    call = {"type": "tool_use", "id": "t2", "name": "bash", "input": {"cmd": "ls"}}
    client = [{"role": "user", "content": "Do it."},
              {"role": "assistant", "content": [thinking, {"type": "redacted_thinking", "data": "R"}, call]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "x " * 500}]}]
    ours = [{"role": "user", "content": [{"type": "text", "text": "Do it."}]},
            {"role": "assistant", "content": [thinking, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "x x [...] x"}]}]
    out = apis._align("anthropic", ours, client)
    assert out[1] is client[1] and out[2] is ours[2]
    # Another message in its place (ctxd changed the call: an excerpt of its input) stays ctxd's.
    other = dict(ours[1], content=[thinking, dict(call, input={"ctxd_excerpt": "l"})])
    assert apis._align("anthropic", [ours[0], other, ours[2]], client)[1] is other
    # Not a loop in progress (the client's last message is the user's words): nothing to do.
    words = client[:2] + [{"role": "user", "content": "Thanks."}]
    assert apis._align("anthropic", ours[:2] + [{"role": "user", "content": "Thanks!"}], words)[1] is ours[1]
