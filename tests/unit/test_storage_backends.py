"""Storage behind the service, on both backends (the ``service`` fixture is parametrized
over SQLite and a real PostgreSQL, tests/unit/conftest.py): search with its hits'
shape, tags, idempotency, deletion; and, on PostgreSQL, two Services on one database
(what two daemons are) pushing to the same session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxd.config import Config, DaemonConfig, StorageConfig
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.notifications import SessionUpdated
from ctxd.protocol.snapshot import SnapshotCreated
from ctxd.service import history, ingest, prompt, sessions, snapshots
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents
from ctxd.store.backend import Storage

from .service_helpers import params


async def _create(svc: Service, session_id: str, **extra: Any) -> None:
    await sessions.create_session(svc, params("session/create", sessionId=session_id, contextWindow=1_000_000,
                                              **extra))


async def _push(svc: Service, session_id: str, messages: list[dict[str, Any]]) -> Any:
    return await ingest.push(svc, params("session/push", sessionId=session_id, messages=messages))


async def test_the_service_sees_the_storage_interface(service: Service) -> None:
    assert isinstance(service.db, Storage)
    assert service.db.dialect in ("sqlite", "postgresql")
    assert service.db.shared is (service.db.dialect == "postgresql")


async def test_search_finds_ranks_filters_and_forgets_deleted_sessions(service: Service) -> None:
    await _create(service, "a", title="Alpha")
    await _create(service, "b")
    await _push(service, "a", [{"role": "user", "content": "the zebra crossed the river"},
                               {"role": "assistant", "content": "zebra zebra: stripes and a zebra foal"},
                               {"role": "user", "content": "nothing to see"}])
    await _push(service, "b", [{"role": "user", "content": "a lone zebra in session b"}])
    found = await history.search(service, params("session/search", query="zebra"))
    assert sorted((h.session_id, h.seq) for h in found.hits) == [("a", 1), ("a", 2), ("b", 1)]
    assert found.hits[0].session_id == "a" and found.hits[0].seq == 2  # three zebras rank first
    assert all("[zebra]" in h.snippet.lower() for h in found.hits), [h.snippet for h in found.hits]
    assert {h.session_id: h.title for h in found.hits}["a"] == "Alpha"
    both = await history.search(service, params("session/search", query="zebra river"))
    assert [(h.session_id, h.seq) for h in both.hits] == [("a", 1)]
    users = await history.search(service, params("session/search", query="zebra", role="assistant"))
    assert [(h.session_id, h.seq) for h in users.hits] == [("a", 2)]
    recall = await history.history_search(service, params("history/search", sessionId="b", query="zebra"))
    assert [(h.seq, h.message.content if h.message else None) for h in recall.hits] == \
        [(1, "a lone zebra in session b")]
    with pytest.raises(CtxdError) as err:
        await history.search(service, params("session/search", query="   "))
    assert err.value.code == ErrorCode.InvalidParams
    await sessions.delete_session(service, "a")
    after = await history.search(service, params("session/search", query="zebra"))
    assert [(h.session_id, h.seq) for h in after.hits] == [("b", 1)]


async def test_tags_idempotency_and_duplicate_sessions(service: Service) -> None:
    await _create(service, "t1", tags=["red", "blue"])
    await _create(service, "t2", tags=["blue"])
    listed = await sessions.list_sessions(service, params("session/list", tag="red"))
    assert [s.session_id for s in listed] == ["t1"]
    with pytest.raises(CtxdError) as err:
        await _create(service, "t1")
    assert err.value.code == ErrorCode.SessionExists
    first = await _push(service, "t1", [{"role": "user", "content": "once", "idempotencyKey": "k1"}])
    again = await _push(service, "t1", [{"role": "user", "content": "once", "idempotencyKey": "k1"},
                                        {"role": "user", "content": "twice"}])
    assert [(m.seq, m.duplicate) for m in again.messages] == [(first.messages[0].seq, True), (2, False)]
    assert again.message_count == 2


def _twin(config: Config, tmp_path: Path) -> Config:
    return Config(daemon=DaemonConfig(data_dir=str(tmp_path / "twin")), storage=StorageConfig(url=config.storage.url))


async def test_two_services_on_one_postgresql_database_keep_one_order(service: Service, service_config: Config,
                                                                      tmp_path: Path) -> None:
    """Two Services (two daemons' worth of memory) push to one session at once: every
    message stored once, seqs 1..N without a gap, each writer's messages in its order,
    and the totals and stats of the row count every message (a Service whose memory was
    behind reloaded the session instead of writing over the other's totals)."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())
    try:
        await _create(service, "shared")
        per_writer, batch = 12, 3

        async def writer(svc: Service, name: str) -> list[tuple[int, str]]:
            acked = []
            for i in range(per_writer):
                texts = [f"{name} {i}.{k}" for k in range(batch)]
                result = await _push(svc, "shared", [{"role": "user", "content": t} for t in texts])
                acked += [(m.seq, t) for m, t in zip(result.messages, texts)]
            return acked

        results = await asyncio.gather(writer(service, "one"), writer(service, "uno"),
                                       writer(other, "two"), writer(other, "dos"))
        total = 4 * per_writer * batch
        acked = sorted(pair for r in results for pair in r)
        assert [seq for seq, _ in acked] == list(range(1, total + 1))
        for r in results:
            assert [seq for seq, _ in r] == sorted(seq for seq, _ in r)
        page = await history.history(service, params("session/history", sessionId="shared", limit=total))
        assert [(e.seq, e.message.content) for e in page.messages] == acked
        for svc in (service, other):
            info = await sessions.get_session(svc, "shared")
            if info.message_count != total:  # this one's memory is behind: the next push reloads it
                await _push(svc, "shared", [{"role": "user", "content": "catch up"}])
                total += 1
                info = await sessions.get_session(svc, "shared")
            assert info.message_count == total and info.last_seq == total
        row = await other.db.read(lambda conn: conn.execute(
            "SELECT message_count, last_seq, stats FROM sessions WHERE id = ?", ("shared",)).fetchone())
        stats = msgspec.json.decode(row[2])
        assert row[0] == row[1] == total and stats["by_role"]["user"]["messages"] == total
        # The last to push reloaded the session: its prompt holds every message, in order.
        result = await prompt.prompt(other, params("context/prompt", sessionId="shared", format="openai"))
        contents = [m["content"] if isinstance(m, dict) else m.content for m in result.messages]
        assert contents == [t for _, t in acked] + ["catch up"] * (total - len(acked))
    finally:
        await other.close()


async def test_a_prompt_through_another_daemon_is_never_stale(service: Service, service_config: Config,
                                                              tmp_path: Path) -> None:
    """A daemon whose active context is loaded hands out a prompt with what another daemon
    pushed meanwhile (its cache is reloaded when the stored session moved on)."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())

    async def contents(svc: Service) -> list[Any]:
        result = await prompt.prompt(svc, params("context/prompt", sessionId="p", format="openai"))
        return [m["content"] if isinstance(m, dict) else m.content for m in result.messages]

    try:
        await _create(service, "p")
        await _push(service, "p", [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
        assert await contents(other) == ["one", "two"]
        await _push(service, "p", [{"role": "user", "content": "three"}])
        assert await contents(other) == ["one", "two", "three"]
        await _push(other, "p", [{"role": "assistant", "content": "four"}])
        assert await contents(service) == ["one", "two", "three", "four"]
        assert (await sessions.get_session(service, "p")).message_count == 4
    finally:
        await other.close()


async def test_postgresql_restarted_mid_run_errors_clearly_then_resumes(service: Service, pg_server: Any) -> None:
    """While the server is down a push fails with a StorageError (nothing half-stored);
    once it is back the same Service pushes, reads and searches again by itself."""
    if service.db.dialect != "postgresql":
        pytest.skip("a database server to restart is PostgreSQL's case")
    await _create(service, "r")
    await _push(service, "r", [{"role": "user", "content": "before the restart"}])
    pg_server.stop("fast")
    try:
        with pytest.raises(CtxdError) as err:
            await _push(service, "r", [{"role": "user", "content": "while down"}])
        assert err.value.code == ErrorCode.StorageError
        with pytest.raises(CtxdError) as err:
            await history.search(service, params("session/search", query="restart"))
        assert err.value.code == ErrorCode.StorageError
    finally:
        pg_server.start()
    result = await _push(service, "r", [{"role": "user", "content": "after the restart"}])
    assert [m.seq for m in result.messages] == [2] and result.message_count == 2
    page = await history.history(service, params("session/history", sessionId="r"))
    assert [e.message.content for e in page.messages] == ["before the restart", "after the restart"]
    found = await history.search(service, params("session/search", query="restart"))
    assert sorted(h.seq for h in found.hits) == [1, 2]


async def test_notifications_reach_the_clients_of_another_daemon(service: Service, service_config: Config,
                                                                 events: CollectingEvents, tmp_path: Path) -> None:
    """What is done through one daemon is announced to the subscribers of the other
    (LISTEN/NOTIFY), in order, and a daemon does not hear its own events twice."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    heard = CollectingEvents()
    other = await Service.open(_twin(service_config, tmp_path), events=heard)
    try:
        await _create(service, "n")
        for i in range(5):
            await _push(service, "n", [{"role": "user", "content": f"m{i}"}])
        await snapshots.create(service, params("snapshot/create", sessionId="n", label="L"))
        sent = events.methods("n")
        assert sent.count("session/updated") >= 5 and "snapshot/created" in sent
        for _ in range(1000):  # until the other daemon heard them all (no time limit asserted)
            if len(heard.methods("n")) >= len(sent):
                break
            await asyncio.sleep(0.01)
        assert heard.methods("n") == sent
        assert [p.message_count for p in heard.of(SessionUpdated, "n")] == \
            [p.message_count for p in events.of(SessionUpdated, "n")]
        assert heard.of(SnapshotCreated, "n")[0].snapshot.label == "L"
        # And the other way round: what the other daemon did, the first one's clients hear.
        before = len(heard.methods("n"))
        await _push(other, "n", [{"role": "user", "content": "from the other"}])
        own = heard.methods("n")[before:]
        assert own and own[0] == "session/updated"
        for _ in range(1000):
            if len(events.methods("n")) >= len(sent) + len(own):
                break
            await asyncio.sleep(0.01)
        assert events.methods("n")[len(sent):] == own
        assert events.of(SessionUpdated, "n")[-1].message_count == 6
    finally:
        await other.close()
