"""``session/import`` is all or nothing: a document of several conversations whose second
fails stores none; and an import whose clean-up failed too (a full disk) does not hold its
session id once the disk has room again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.service import ingest, sessions, transfer
from ctxd.service.core import Service

from .service_helpers import params
from .staged_helpers import failing_stages
from .test_staged_import import document


@pytest.fixture
def storage_url() -> str:
    return ""


TWO = "\n".join(json.dumps({"messages": m}) for m in (
    [{"role": "user", "content": "first conversation"}, {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "second"}, {"role": "assistant", "content": "y" * 5000}]))


async def test_a_refused_second_conversation_leaves_nothing(service: Service) -> None:
    service.config.limits.max_message_bytes = 2000
    with pytest.raises(CtxdError):
        await transfer.import_session(service, params("session/import", document=TWO))
    assert await sessions.list_sessions(service, params("session/list")) == []


async def test_a_second_conversation_that_cannot_be_written_takes_the_first_back(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    real = service.db.write
    writes = {"n": 0}

    async def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is transfer._import_job:
            writes["n"] += 1
            if writes["n"] == 2:
                raise CtxdError(-32000, "disk full (simulated)")
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(service.db, "write", write)
    with pytest.raises(CtxdError, match="disk full"):
        await transfer.import_session(service, params("session/import", document=TWO))
    assert writes["n"] == 2
    assert await sessions.list_sessions(service, params("session/list")) == []
    result = await transfer.import_session(service, params("session/import", document=TWO))
    assert len(result.session_ids) == 2
    assert len(await sessions.list_sessions(service, params("session/list"))) == 2


async def test_the_id_of_an_import_whose_clean_up_failed_can_be_taken_again(service: Service,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "STAGE_CHUNK_ROWS", 2)
    calls = failing_stages(service, monkeypatch, 2, cleanup_failures=1)
    with pytest.raises(CtxdError, match="disk full"):
        await transfer.import_session(service, params("session/import", document=document(8, "s"), format="json"))
    calls.update(n=-100)  # the disk has room again
    with pytest.raises(CtxdError) as missing:
        await sessions.delete_session(service, "s")  # (hidden: not a session of anyone's)
    assert missing.value.code == ErrorCode.SessionNotFound
    await sessions.create_session(service, params("session/create", sessionId="s"))
    await sessions.delete_session(service, "s")
    calls.update(n=-100, cleanup_failures=0)
    with pytest.raises(CtxdError, match="disk full"):  # (the 2nd staged transaction fails again)
        calls.update(n=0, cleanup_failures=1)
        await transfer.import_session(service, params("session/import", document=document(8, "s"), format="json"))
    calls.update(n=-100)
    result = await transfer.import_session(service, params("session/import", document=document(8, "s"),
                                                           format="json"))
    assert result.session_ids == ["s"] and result.message_count == 8
