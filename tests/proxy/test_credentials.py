"""A session is continued only under the API key that created it (the key hashed, never
stored), and ``X-Ctxd-Session`` naming the short form ``ctxd-cli sessions list`` shows
means that session, never a new one of that id."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from ctxd.ids import short_ids
from tests.proxy.conftest import ctxd_client, history, sessions
from tests.proxy.upstream import MODEL

KEY_A = "sk-ant-api03-owner-key-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
KEY_B = "sk-ant-api03-other-key-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


async def ask(proxy, messages: list[dict], key: str, **headers: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 200, "system": "Agent.", "messages": messages}
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        return await client.post("/v1/messages", content=json.dumps(body).encode(),
                                 headers={"x-api-key": key, "anthropic-version": "2023-06-01", **headers})


def answer(reply: httpx.Response) -> dict:
    assert reply.status_code == 200, reply.text
    return {"role": "assistant", "content": reply.json()["content"]}


async def test_another_key_replaying_the_opening_gets_its_own_session(proxy, upstream, ctxd_daemon) -> None:
    opening = [{"role": "user", "content": "Open the project."}]
    first = answer(await ask(proxy, opening, KEY_A))
    [owner] = await sessions(ctxd_daemon)
    # Something the owner pushed beside the proxy (ctxd-cli, an editor).
    client = await ctxd_client(ctxd_daemon)
    try:
        await client.request("session/push", {"sessionId": owner["sessionId"], "messages": [
            {"role": "user", "content": "PRIVATE NOTE from ctxd-cli"}]})
    finally:
        await client.close()
    # Another key replays the opening exchange and goes on.
    replay = opening + [first, {"role": "user", "content": "And then?"}]
    answer(await ask(proxy, replay, KEY_B))
    assert "PRIVATE NOTE" not in upstream.received[-1].body.decode()
    infos = {s["sessionId"]: s for s in await sessions(ctxd_daemon)}
    assert len(infos) == 2
    other = next(sid for sid in infos if sid != owner["sessionId"])
    assert "forkedFrom" not in infos[other]["metadata"]["ctxdProxy"]  # not a fork: another conversation
    assert len(await history(ctxd_daemon, owner["sessionId"])) == 3
    assert len(await history(ctxd_daemon, other)) == 4
    # The owner's key still continues the owner's session, private note and all.
    answer(await ask(proxy, replay, KEY_A))
    assert "PRIVATE NOTE" in upstream.received[-1].body.decode()


async def test_a_named_session_refuses_another_key(proxy, upstream, ctxd_daemon, base_dir: Path) -> None:
    named = {"X-Ctxd-Session": "my-task"}
    messages = [{"role": "user", "content": "Start."}]
    messages += [answer(await ask(proxy, messages, KEY_A, **named)), {"role": "user", "content": "Go on."}]
    sent = len(upstream.received)
    refused = await ask(proxy, messages, KEY_B, **named)
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert "another API key" in refused.json()["error"]["message"]
    assert len(upstream.received) == sent  # nothing forwarded
    assert len(await history(ctxd_daemon, "my-task")) == 2  # nothing pushed
    answer(await ask(proxy, messages, KEY_A, **named))
    assert len(await history(ctxd_daemon, "my-task")) == 4
    # The key is kept as a fingerprint only: nowhere in the data directory.
    [info] = await sessions(ctxd_daemon)
    fingerprint = info["metadata"]["ctxdProxy"]["credential"]
    assert len(fingerprint) == 32 and KEY_A not in json.dumps(info)
    for path in Path(ctxd_daemon.data_dir).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY_A.encode() not in data and b"owner-key" not in data, path


async def test_a_session_made_by_ctxd_cli_is_claimed_by_the_first_key(proxy, ctxd_daemon) -> None:
    client = await ctxd_client(ctxd_daemon)
    try:
        await client.request("session/create", {"sessionId": "from-cli"})
    finally:
        await client.close()
    named = {"X-Ctxd-Session": "from-cli"}
    messages = [{"role": "user", "content": "Hello."}]
    messages += [answer(await ask(proxy, messages, KEY_A, **named)), {"role": "user", "content": "More."}]
    assert (await ask(proxy, messages, KEY_B, **named)).status_code == 403
    answer(await ask(proxy, messages, KEY_A, **named))
    assert len(await history(ctxd_daemon, "from-cli")) == 4


async def test_the_short_form_shown_names_the_session(proxy, ctxd_daemon) -> None:
    messages = [{"role": "user", "content": "Derived id."}]
    messages += [answer(await ask(proxy, messages, KEY_A)), {"role": "user", "content": "Next."}]
    [info] = await sessions(ctxd_daemon)
    full = info["sessionId"]
    short = short_ids([full])[full]
    assert short != full and full.startswith(short)
    answer(await ask(proxy, messages, KEY_A, **{"X-Ctxd-Session": short}))
    assert [s["sessionId"] for s in await sessions(ctxd_daemon)] == [full]  # no session "proxy-anthropic-..."
    assert len(await history(ctxd_daemon, full)) == 4
    missing = await ask(proxy, messages, KEY_A, **{"X-Ctxd-Session": short + "~7"})
    assert missing.status_code == 404 and "no fork ~7" in missing.json()["error"]["message"]
    assert [s["sessionId"] for s in await sessions(ctxd_daemon)] == [full]
