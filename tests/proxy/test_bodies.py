"""Request bodies decoded from what is new in them (ctxd/proxy/bodies.py): whatever the
client appends, rewrites or spells, the value is the body's as json reads it."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from ctxd.proxy import bodies as bodies_module
from ctxd.proxy.bodies import Bodies
from ctxd.proxy.convert import InvalidUnicode, loads

WORDS = ["build", "module", "ünïcödé", "日本語", "tab\there", "quote\"d", "line\nbreak", "back\\slash", "😀"]


def _message(rng: random.Random, n: int) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) + f" {n}"
    kind = rng.random()
    if kind < 0.5:
        return {"role": rng.choice(["user", "assistant"]), "content": text}
    if kind < 0.8:
        return {"role": "user", "content": [{"type": "text", "text": text, "n": rng.random(), "big": 10 ** 20}]}
    call = {"name": "run", "arguments": json.dumps({"x": [n, None]})}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}]}


def _spell(rng: random.Random, style: int, value: dict[str, Any]) -> bytes:
    if style == 0:
        return msgspec.json.encode(value)
    if style == 1:
        return json.dumps(value, indent=2, ensure_ascii=False).encode()
    if style == 2:
        return json.dumps(value, separators=(", ", ": ")).encode()
    return json.dumps(value).encode()


def _body(field: str, messages: list[Any], order: int) -> dict[str, Any]:
    before = {"model": "m", "temperature": 0.5}
    after = {"tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}],
             "max_tokens": 100, "stream": False}
    if order == 0:
        return {**before, field: messages, **after}
    if order == 1:
        return {**before, **after, field: messages}
    return {field: messages, **before, **after}


@pytest.mark.parametrize("seed", range(40))
def test_every_body_reads_as_json_reads_it(seed: int) -> None:
    rng = random.Random(seed)
    api = rng.choice(["openai", "anthropic", "responses"])
    field = "input" if api == "responses" else "messages"
    bodies = Bodies()
    style, order = rng.randint(0, 3), rng.randint(0, 2)
    messages = [{"role": "system", "content": "You are a test."}]
    appended = 0
    for n in range(60):
        roll = rng.random()
        if roll < 0.6:
            messages = messages + [_message(rng, n) for _ in range(rng.randint(1, 3))]
            appended += 1
        elif roll < 0.7 and len(messages) > 2:
            messages = messages[:-1]  # (a message taken back)
        elif roll < 0.8 and len(messages) > 2:
            at = rng.randrange(1, len(messages))
            messages = messages[:at] + [_message(rng, n)] + messages[at + 1:]  # (one rewritten)
        elif roll < 0.85:
            style = rng.randint(0, 3)  # (another spelling)
        elif roll < 0.9:
            order = rng.randint(0, 2)
        raw = _spell(rng, style, _body(field, messages, order))
        value = bodies.loads(api, ("s", "k"), raw)
        assert value == json.loads(raw)
    assert appended == 0 or bodies.hits > 0


def test_an_appending_client_is_decoded_from_its_new_messages() -> None:
    bodies = Bodies()
    messages: list[Any] = [{"role": "system", "content": "s"}]
    for n in range(20):
        messages.append({"role": "user", "content": f"q{n}"})
        first = bodies.loads("openai", ("s", ""), msgspec.json.encode({"model": "m", "messages": messages}))
        messages.append({"role": "assistant", "content": f"a{n}"})
    assert bodies.hits == 19
    again = bodies.loads("openai", ("s", ""), msgspec.json.encode({"model": "m", "messages": messages}))
    assert bodies.hits == 20
    # The previous request's message objects, not copies: comparing them is comparing identities.
    assert all(a is b for a, b in zip(first["messages"], again["messages"]))
    assert again == {"model": "m", "messages": messages}
    again["messages"].append("changed in place by its reader")
    assert bodies.loads("openai", ("s", ""), msgspec.json.encode({"model": "m", "messages": messages})) == \
        {"model": "m", "messages": messages}


@pytest.mark.parametrize("added", [
    b',1],"model":"other","x":[2',   # closes the array early: the rest is no element
    b',{"role":"user"}],"stream":true,"x":[{"a":1}',
    b',"unterminated',
    b',',
    b', ',
    b',{"a":1},',
])
def test_bytes_that_are_not_appended_elements_are_read_whole(added: bytes) -> None:
    bodies = Bodies()
    head = b'{"messages":[{"role":"user","content":"hi"}'
    tail = b'],"model":"m"}'
    bodies.loads("openai", ("s", ""), head + tail)
    raw = head + added + tail
    try:
        expected: Any = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            bodies.loads("openai", ("s", ""), raw)
        return
    assert bodies.loads("openai", ("s", ""), raw) == expected
    assert bodies.hits == 0


def test_what_msgspec_leaves_to_json_in_new_messages() -> None:
    bodies = Bodies()
    head, tail = b'{"messages":[{"role":"user","content":"hi"}', b'],"model":"m"}'
    bodies.loads("openai", ("s", ""), head + tail)
    value = bodies.loads("openai", ("s", ""), head + b',{"role":"user","content":"x","t":NaN}' + tail)
    assert value["messages"][1]["t"] != value["messages"][1]["t"]  # (NaN, as json reads it)
    with pytest.raises(InvalidUnicode):
        bodies.loads("openai", ("s", ""), head + b',{"role":"user","content":"\\ud800"}' + tail)


def test_a_surrogate_in_the_bytes_of_a_body_held_is_refused_once_appended_to() -> None:
    # (json reads a surrogate encoded in the bytes as UTF-8 would a character; the body
    # before is refused too, so it is never held: nothing appended to it passes)
    bodies = Bodies()
    with pytest.raises(InvalidUnicode):
        bodies.loads("openai", ("s", ""), b'{"messages":["\xed\xa0\x80"]}')
    with pytest.raises(InvalidUnicode):
        bodies.loads("openai", ("s", ""), b'{"messages":["\xed\xa0\x80","\\u0041"]}')


def test_a_body_nested_near_the_limit_is_read_whole() -> None:
    """The deepest body a whole decode reads, called as ``Bodies.loads`` calls it, is read
    by ``Bodies.loads`` too: looking for its conversation (one call deeper) gives up."""

    def whole(raw: bytes) -> Any:
        return loads(raw)

    def bodies_of(depth: int) -> tuple[bytes, bytes]:
        head = b'{"messages":[{"role":"user","content":"hi","x":' + b"[" * depth + b"]" * depth + b"}"
        return head + b'],"model":"m"}', head + b',{"role":"user","content":"more"}],"model":"m"}'

    def reads(depth: int) -> bool:
        try:
            whole(bodies_of(depth)[1])
            return True
        except RecursionError:
            return False

    low, high = 1, 4000  # (the deepest that reads, by bisection)
    assert reads(low) and not reads(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if reads(mid) else (low, mid)
    before, raw = bodies_of(low)
    bodies = Bodies()
    bodies.loads("openai", ("s", ""), before)
    assert bodies.loads("openai", ("s", ""), raw) == whole(raw)


def test_a_reader_changing_its_list_changes_nothing_held() -> None:
    bodies = Bodies()
    head, tail = b'{"messages":[{"role":"user","content":"hi"}', b'],"model":"m"}'
    first = bodies.loads("openai", ("s", ""), head + tail)
    first["messages"].append("changed in place by its reader")
    raw = head + b',{"role":"user","content":"more"}' + tail
    assert bodies.loads("openai", ("s", ""), raw) == json.loads(raw) and bodies.hits == 1


def test_conversations_interleaved_on_one_key_each_extend_their_own() -> None:
    """Sub-agents with one API key and no session header: each request extends the last
    body of its own conversation, whatever came between."""
    bodies = Bodies()
    system = {"role": "system", "content": "You are an agent. " * 200}
    conversations: list[list[Any]] = [[system, {"role": "user", "content": f"task {k}"}] for k in range(6)]
    for turn in range(10):
        for k, messages in enumerate(conversations):
            messages += [{"role": "assistant", "content": f"{k}.{turn}"}, {"role": "user", "content": "go on"}]
            raw = msgspec.json.encode({"model": "m", "messages": messages})
            assert bodies.loads("openai", ("", "key"), raw) == json.loads(raw)
    assert bodies.hits == 6 * 9


def test_the_bytes_held_stay_within_the_budget_as_bodies_grow() -> None:
    bodies = Bodies(budget=200_000)
    conversations: list[list[Any]] = [[{"role": "user", "content": f"{k}"}] for k in range(8)]
    for _ in range(40):
        for k, messages in enumerate(conversations):
            messages.append({"role": "user", "content": "x" * 1000})
            bodies.loads("openai", (f"s{k}", ""), msgspec.json.encode({"messages": messages}))
            assert bodies.held == sum(len(s.raw) for seen, _ in bodies._seen.values() for s in seen) <= 200_000
    assert bodies.hits > 0


def test_a_conversation_array_spelled_twice_is_read_whole() -> None:
    bodies = Bodies()
    array = b'[{"role":"user","content":"hi"}]'
    bodies.loads("openai", ("s", ""), b'{"copy":' + array + b',"messages":' + array + b'}')
    raw = b'{"copy":' + array + b',"messages":' + array[:-1] + b',{"role":"user","content":"more"}]}'
    assert bodies.loads("openai", ("s", ""), raw) == json.loads(raw)
    assert bodies.hits == 0


def test_keys_sessions_and_bytes_held_are_bounded() -> None:
    bodies = Bodies(keys=3, per_key=2, budget=10_000)
    for n in range(10):
        for side in range(3):
            bodies.loads("openai", (f"s{n}", ""), msgspec.json.encode(
                {"model": "m", "messages": [{"role": "user", "content": f"{side} " * 100}]}))
    assert len(bodies._seen) <= 3 and all(len(seen) <= 2 for seen, _ in bodies._seen.values())
    assert bodies.held == sum(len(s.raw) for seen, _ in bodies._seen.values() for s in seen) <= 10_000
    bodies.loads("openai", ("big", ""), b'{"messages":[' + b'{"a":"' + b"x" * 20_000 + b'"}]}')
    assert bodies.held <= 10_000


def test_a_client_that_rewrites_its_history_is_not_looked_into_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = []
    real = bodies_module._top
    monkeypatch.setattr(bodies_module, "_top", lambda raw: scans.append(1) or real(raw))
    bodies = Bodies()
    for n in range(20, 84):
        # (a moving breakpoint: the previous last message changes each turn)
        messages = [{"role": "user", "content": f"m{i} " * 200, **({"cache": 1} if i == n else {})}
                    for i in range(n + 1)]
        raw = msgspec.json.encode({"messages": messages})
        assert bodies.loads("anthropic", ("s", ""), raw) == json.loads(raw)
    assert bodies.hits == 0
    assert Bodies.MISSES <= len(scans) <= Bodies.MISSES + 64 // Bodies.RETRY + 1
