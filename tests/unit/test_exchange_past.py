"""An exported session's past (its context state, checkpoints, snapshots, calibration) on
import, in process on both backends: a large import on SQLite, written in stages, keeps
it too; a document whose state names messages it does not hold is refused, naming the
field, and stores nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service import controls, goals, history, ingest, prompt, sessions, snapshots, transfer
from ctxd.service.core import Service

from .service_helpers import chat, params, settle


async def lived(svc: Service, sid: str = "orig") -> None:
    await sessions.create_session(svc, params("session/create", sessionId=sid, model="gpt-4o", contextWindow=4096))
    await ingest.push(svc, params("session/push", sessionId=sid, messages=chat(0, 10, answer_words=60)))
    await settle(svc)
    await controls.pin(svc, params("message/pin", sessionId=sid, seq=1))
    await goals.set_goal(svc, params("goal/set", sessionId=sid, description="explain the sky",
                                     decisions=[{"description": "Rayleigh only", "locked": True}]))
    snap = await snapshots.create(svc, params("snapshot/create", sessionId=sid))
    await ingest.push(svc, params("session/push", sessionId=sid, messages=chat(10, 6, answer_words=60)))
    await settle(svc)
    await snapshots.restore(svc, params("snapshot/restore", sessionId=sid, snapshotId=snap.snapshot_id))
    await ingest.push(svc, params("session/push", sessionId=sid, messages=chat(16, 3, answer_words=60)))
    await settle(svc)


async def seen(svc: Service, sid: str) -> dict[str, Any]:
    page = await history.history(svc, params("session/history", sessionId=sid, limit=1000))
    got = await prompt.prompt(svc, params("context/prompt", sessionId=sid, format="openai"))
    return {"statuses": [(e.seq, e.status) for e in page.messages],
            "checkpoints": (await controls.checkpoints(svc, sid)).checkpoints,
            "prompt": (got.messages, got.tokens, got.budget)}


async def test_a_staged_import_keeps_the_past(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    await lived(service)
    original = await seen(service, "orig")
    assert {status for _, status in original["statuses"]} >= {"compressed", "kept", "rolled_back", "context"}
    document = (await transfer.export(service, params("session/export", sessionId="orig", format="json"))).document
    monkeypatch.setattr(ingest, "STAGE_CHUNK_ROWS", 7)  # (SQLite: several transactions; PostgreSQL: one)
    await transfer.import_session(service, params("session/import", document=document, sessionId="copy"))
    assert await seen(service, "copy") == original


@pytest.mark.parametrize("where, change", [
    ("context.state.pinned", lambda doc: doc["session"]["context"]["state"].update(pinned=[999])),
    ("context.state.keptSeqs", lambda doc: doc["session"]["context"]["state"].update(keptSeqs=[0])),
    ("messages[2].seq", lambda doc: doc["messages"][2].update(seq=40)),
    ("context.state.superseded", lambda doc: doc["session"]["context"]["state"].update(superseded=[999])),
    ("context.state.superseded", lambda doc: doc["session"]["context"]["state"].update(superseded=[3, 2])),
    ("context.state.current", lambda doc: doc["session"]["context"]["state"].update(current=[0])),
    ("context.snapshots[0]", lambda doc: doc["session"]["context"]["snapshots"][0].update(info={"x": 1})),
])
async def test_a_past_that_does_not_fit_its_history_is_refused(service: Service, where: str, change: Any) -> None:
    await lived(service)
    doc = json.loads((await transfer.export(service, params("session/export", sessionId="orig",
                                                            format="json"))).document)
    change(doc)
    with pytest.raises(CtxdError) as info:
        await transfer.import_session(service, params("session/import", document=json.dumps(doc),
                                                      sessionId="bad"))
    assert info.value.code == ErrorCode.ImportFailed and where in info.value.message, info.value.message
    assert "bad" not in {s.session_id for s in await sessions.list_sessions(service, params("session/list"))}


async def test_a_clients_superseded_and_current_context_comes_back(service: Service) -> None:
    """What a client said it no longer sends (``supersede``) and what it named its current
    working context (``current``) are part of the past: the copy sends the same prompt."""
    def copy_of(n: int) -> dict[str, Any]:
        return {"role": "user", "content": f"file a.py, version {n}: " + "x = 1\n" * 20,
                "idempotencyKey": f"file-{n}"}

    await sessions.create_session(service, params("session/create", sessionId="orig", model="gpt-4o",
                                                  contextWindow=8192))
    await ingest.push(service, params("session/push", sessionId="orig", messages=[copy_of(1), *chat(0, 2)]))
    await prompt.prompt(service, params("context/prompt", sessionId="orig", supersede=["file-1"],
                                        push=[copy_of(2)], current=["file-2"]))
    original = await seen(service, "orig")
    assert (1, "superseded") in original["statuses"]
    document = (await transfer.export(service, params("session/export", sessionId="orig", format="json"))).document
    assert json.loads(document)["session"]["context"]["state"]["superseded"] == [1]
    await transfer.import_session(service, params("session/import", document=document, sessionId="copy"))
    assert await seen(service, "copy") == original


async def test_a_document_without_a_past_starts_afresh(service: Service) -> None:
    """An export from before the past was kept (or a transcript): the session's history,
    and the context built from it."""
    await lived(service)
    doc = json.loads((await transfer.export(service, params("session/export", sessionId="orig",
                                                            format="json"))).document)
    del doc["session"]["context"]
    doc["checkpoints"] = doc["compressions"] = doc["events"] = []
    await transfer.import_session(service, params("session/import", document=json.dumps(doc), sessionId="old"))
    page = await history.history(service, params("session/history", sessionId="old", limit=1000))
    assert {e.status for e in page.messages} <= {"context", "compressed", "kept"}
    await settle(service)
