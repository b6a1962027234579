"""``context/prompt`` as a transport sends it (``prompt.prompt_for_wire``): each message's
JSON kept from the previous prompt and only what changed encoded again
(``service/encoded.py``). The bytes must be those of a plain encode of a full render,
after every kind of change a session goes through."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.engine.render import RENDERERS
from ctxd.formats.anthropic import cache_breakpoints
from ctxd.service import controls, goals, ingest, prompt, sessions, snapshots
from ctxd.service.core import Service
from ctxd.service.encoded import Fragments, pre_encoded, same_prefix
from ctxd.service.state import SessionState

from .service_helpers import params, settle

SID = "wire"
VARIANTS = (("openai", False), ("anthropic", True), ("anthropic", False), ("ollama", False))
encode = msgspec.json.encode


async def _push(svc: Service, messages: list[dict[str, Any]]) -> Any:
    return await ingest.push(svc, params("session/push", sessionId=SID, messages=messages))


def _tool_turn(i: int, words: int = 40) -> list[dict[str, Any]]:
    call = f"call{i}"
    return [{"role": "user", "content": f"check module {i}", "idempotencyKey": f"ask{i}"},
            {"role": "assistant", "content": f"checking {i}",
             "toolCalls": [{"id": call, "function": {"name": "check", "arguments": f'{{"m": {i}}}'}}]},
            {"role": "tool", "toolCallId": call, "content": f"module {i}: " + " ".join(["ok"] * words)},
            {"role": "assistant", "content": f"module {i} is fine"}]


async def _check(svc: Service, state: SessionState) -> dict[tuple[str, bool], Any]:
    """Each format's answer as the wire gets it is, byte for byte, the plain encode of the
    same answer holding a full render of the context as it is now."""
    answers = {}
    for fmt, cache in VARIANTS:
        got = await prompt.prompt_for_wire(svc, params("context/prompt", sessionId=SID, format=fmt,
                                                       cacheControl=cache))
        ctx = await svc.cache.context(state)
        want = RENDERERS[fmt](ctx.prompt_plan(), state.counter.count)
        plain: Any = msgspec.structs.replace(got, messages=want.messages)
        if fmt == "anthropic":
            system, messages = cache_breakpoints(want.system, want.messages, want.system_head) if cache \
                else (want.system, want.messages)
            plain = msgspec.structs.replace(got, system=system, messages=messages)
        assert encode(got) == encode(plain), (fmt, cache)
        assert state.billing.pieces_tokens == sum(t for _, t in state.billing.pieces)
        answers[(fmt, cache)] = got
    return answers


async def test_the_wire_bytes_are_a_plain_encode_after_every_change(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=4096, systemPrompt="You check modules."))
    state = await service.cache.get(SID)
    for i in range(10):
        await _push(service, _tool_turn(i)[:2])  # a call still open
        await _check(service, state)
        await _push(service, _tool_turn(i)[2:])
        await _check(service, state)
    assert all(m.__class__ is msgspec.Raw for m in (await _check(service, state))[("openai", False)].messages)
    snapshot = await snapshots.create(service, params("snapshot/create", sessionId=SID, label="before"))
    result = await controls.compress(service, params("context/compress", sessionId=SID), None)
    assert result.compressed
    await _check(service, state)
    await _push(service, _tool_turn(10))
    await _check(service, state)
    ctx = await service.cache.context(state)
    seq = ctx.recent[1].seq
    await controls.pin(service, params("message/pin", sessionId=SID, seq=seq))
    await _check(service, state)
    await controls.pin(service, params("message/pin", sessionId=SID, seq=seq, pinned=False))
    await _check(service, state)
    assert await controls.supersede(service, SID, ["ask10"])
    await _check(service, state)
    await goals.set_goal(service, params("goal/set", sessionId=SID, description="Check every module."))
    await _check(service, state)
    await sessions.update_session(service, params("session/update", sessionId=SID,
                                                  systemPrompt="You check modules, carefully."))
    await _check(service, state)
    await snapshots.restore(service, params("snapshot/restore", sessionId=SID, snapshotId=snapshot.snapshot_id))
    await _check(service, state)
    for i in range(11, 36):  # on to the automatic passes
        await _push(service, _tool_turn(i, words=200))
        await settle(service)
        await _check(service, state)
    assert (await service.cache.context(state)).state.compression_count > 1
    state.drop_context()  # (evicted from the context cache: the fragments go with it)
    assert state.encoded == {}
    await _check(service, state)


async def test_a_turn_encodes_only_what_it_added(service: Service) -> None:
    await sessions.create_session(service, params("session/create", sessionId=SID, model="gpt-4o",
                                                  contextWindow=1_000_000))
    state = await service.cache.get(SID)
    await _push(service, [m for i in range(30) for m in _tool_turn(i)])
    first = await _check(service, state)
    assert isinstance(first[("openai", False)].messages[0], msgspec.Struct)  # asked once: nothing kept
    before = (await _check(service, state))[("openai", False)].messages
    await _push(service, [{"role": "user", "content": "and the last one?"}])
    after = (await _check(service, state))[("openai", False)].messages
    assert len(after) == len(before) + 1
    reused = same_prefix(before, after)
    # The renderer re-emits only its open tail (``IncrementalRenderer.MIN_STEP``); the rest
    # are the very fragments of the previous answer.
    assert reused >= len(before) - 8


def test_pre_encoded_reuses_fragments_by_identity_only() -> None:
    a, b, c = ({"n": 1}, {"n": True}, {"n": 1.0})  # equal to each other, not the same JSON
    kept: dict[str, Fragments] = {}
    assert pre_encoded(kept, "f", [a, b]) == [a, b]  # the first time: the objects themselves
    raws = pre_encoded(kept, "f", [a, b])
    assert b"[" + b",".join(r for r in raws) + b"]" == encode([a, b])
    again = pre_encoded(kept, "f", [a, c, b])
    assert again[0] is raws[0] and encode(again) == b'[{"n":1},{"n":1.0},{"n":true}]'
