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
from ctxd.service import controls, goals, history, ingest, prompt, sessions, snapshots
from ctxd.service.core import Service
from ctxd.service.events import CollectingEvents
from ctxd.service.stats import stats as stats_of
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


async def _contents(svc: Service, session_id: str) -> list[Any]:
    """The contents of the session's prompt (OpenAI shape), message by message."""
    result = await prompt.prompt(svc, params("context/prompt", sessionId=session_id, format="openai"))
    return [m["content"] if isinstance(m, dict) else m.content for m in result.messages]


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
        for svc in (service, other):  # each answers from what is stored, whoever pushed last
            info = await sessions.get_session(svc, "shared")
            assert info.message_count == total and info.last_seq == total
        await _push(service, "shared", [{"role": "user", "content": "catch up"}])
        total += 1
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


async def test_a_push_that_finds_the_session_moved_on_waits_instead_of_racing(
        service: Service, service_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push through a daemon whose memory of the session is behind (another daemon pushed,
    pinned, set a goal) is computed from the stored session, read again in its own
    transaction with the row locked: it succeeds the first time, whatever the other daemons
    do meanwhile (it used to reload outside the transaction and try again, and under steady
    pushes through two daemons ran out of tries: -33005 "kept changing through other
    daemons"). Every daemon then answers session/get, context/stats and sessions/list
    from what is stored."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    monkeypatch.setattr(ingest, "STALE_RETRIES", 1)  # one transaction: no second try to hide a race in
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())
    try:
        await _create(service, "m")
        await _push(service, "m", [{"role": "user", "content": "one"}])
        assert (await sessions.get_session(other, "m")).message_count == 1  # other now holds it in memory
        await _push(service, "m", [{"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}])
        await controls.pin(service, params("message/pin", sessionId="m", seq=1))
        # other's memory says 1 message and no pin; what is stored says 3 and a pin.
        pushed = await _push(other, "m", [{"role": "assistant", "content": "four"}])
        assert [m.seq for m in pushed.messages] == [4] and pushed.message_count == 4
        for svc in (service, other):
            info = await sessions.get_session(svc, "m")
            stats = await stats_of(svc, "m")
            listed = {i.session_id: i for i in await sessions.list_sessions(svc, params("session/list"))}
            assert info.message_count == stats.message_count == listed["m"].message_count == 4
            assert info.context_tokens == stats.budget.prompt_tokens == listed["m"].context_tokens
            assert stats.pinned == [1]
        assert await _contents(service, "m") == ["one", "two", "three", "four"]
    finally:
        await other.close()


async def test_a_prompt_through_another_daemon_is_never_stale(service: Service, service_config: Config,
                                                              tmp_path: Path) -> None:
    """A daemon whose active context is loaded hands out a prompt with what another daemon
    pushed meanwhile (its cache is reloaded when the stored session moved on)."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())

    try:
        await _create(service, "p")
        await _push(service, "p", [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
        assert await _contents(other, "p") == ["one", "two"]
        await _push(service, "p", [{"role": "user", "content": "three"}])
        assert await _contents(other, "p") == ["one", "two", "three"]
        await _push(other, "p", [{"role": "assistant", "content": "four"}])
        assert await _contents(service, "p") == ["one", "two", "three", "four"]
        assert (await sessions.get_session(service, "p")).message_count == 4
    finally:
        await other.close()


async def test_a_session_deleted_and_created_again_by_another_daemon_is_not_served_stale(
        service: Service, service_config: Config, tmp_path: Path) -> None:
    """Another daemon deletes a loaded session and creates it again under the same id with
    fewer messages: its seqs and revision start over, below what this daemon holds, and the
    old conversation was handed out until this daemon's next push."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())

    try:
        await _create(service, "r")
        await _push(service, "r", [{"role": "user", "content": f"old {i}"} for i in range(6)])
        assert len(await _contents(service, "r")) == 6
        await sessions.delete_session(other, "r")
        await _create(other, "r")
        await _push(other, "r", [{"role": "user", "content": "new"}])
        assert await _contents(service, "r") == ["new"]
        assert (await sessions.get_session(service, "r")).message_count == 1
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


async def test_another_daemons_pin_goal_and_decision_reach_a_loaded_context(service: Service, service_config: Config,
                                                                            tmp_path: Path) -> None:
    """Both daemons have the session's active context loaded and have each changed it; a
    pin, a goal and a locked decision set through one are in the next prompt of the other
    (their own change counts can be equal: what is compared is what the prompt is made of)."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())

    async def anthropic(svc: Service) -> Any:
        return await prompt.prompt(svc, params("context/prompt", sessionId="g", format="anthropic"))

    try:
        await _create(service, "g")
        await _push(service, "g", [{"role": "user", "content": f"question {i} " + "words " * 40} for i in range(6)])
        await anthropic(service)
        await anthropic(other)
        # Each daemon changes the context once (each bumps its own count to the same number).
        await controls.pin(service, params("message/pin", sessionId="g", seq=2))
        await goals.set_goal(other, params("goal/set", sessionId="g", description="ship the parser",
                                           decisions=[{"description": "use msgspec", "locked": True}]))
        first = await anthropic(service)
        assert "ship the parser" in str(first.system) and "use msgspec" in str(first.system)
        assert first.budget.pinned_tokens > 0
        # The other daemon's memory holds its own goal; the pin came from the first daemon.
        await controls.pin(service, params("message/pin", sessionId="g", seq=4))
        seen = await anthropic(other)
        assert seen.budget.pinned_tokens == first.budget.pinned_tokens * 2 or seen.budget.pinned_tokens > \
            first.budget.pinned_tokens
        # A goal update through the first daemon (which starts from the stored goal, not a stale one).
        await goals.update_goal(service, params("goal/update", sessionId="g", decisions=[
            {"description": "no global state", "locked": True}]))
        system = str((await anthropic(other)).system)
        assert "use msgspec" in system and "no global state" in system and "ship the parser" in system
        await controls.pin(other, params("message/pin", sessionId="g", seq=2, pinned=False))
        assert (await anthropic(service)).budget.pinned_tokens == seen.budget.pinned_tokens - \
            first.budget.pinned_tokens
    finally:
        await other.close()


def test_messages_larger_than_a_notify_go_in_parts_and_come_back_whole() -> None:
    """NOTIFY takes at most 8000 bytes: a larger message is cut into parts between UTF-8
    characters and joined again; a part that went missing drops the message, never
    delivers half of it."""
    pytest.importorskip("psycopg")
    from ctxd.store.postgres import MAX_NOTIFY_BYTES, Reassembly, split_message

    small = '{"d": "x"}'
    assert split_message(small) == [small]
    big = '{"label": "' + "é✓ snapshot " * 3000 + '"}'
    parts = split_message(big)
    assert len(parts) > 3 and all(len(p.encode()) <= MAX_NOTIFY_BYTES for p in parts)
    joined = Reassembly()
    out = [joined.add(p) for p in parts]
    assert out[:-1] == [None] * (len(parts) - 1) and out[-1] == big
    assert joined.add(small) == small
    broken = Reassembly()
    assert [broken.add(p) for p in parts[:1] + parts[2:]] == [None] * (len(parts) - 1)
    assert [joined.add(p) for p in parts][-1] == big  # the next message arrives whole again
    assert joined.add("~x/y~garbage") is None and joined.add(small) == small  # unreadable: dropped, not fatal


async def test_a_notification_larger_than_notify_allows_reaches_the_other_daemon(
        service: Service, service_config: Config, events: CollectingEvents, tmp_path: Path) -> None:
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    heard = CollectingEvents()
    other = await Service.open(_twin(service_config, tmp_path), events=heard)
    try:
        await _create(service, "big")
        await _push(service, "big", [{"role": "user", "content": "hello"}])
        label = "a long label, ünïcode ✓ " * 1000  # ~25 KB of JSON: four NOTIFY payloads
        await snapshots.create(service, params("snapshot/create", sessionId="big", label=label))
        for _ in range(1000):  # until the other daemon heard it (no time limit asserted)
            if heard.of(SnapshotCreated, "big"):
                break
            await asyncio.sleep(0.01)
        assert heard.of(SnapshotCreated, "big")[0].snapshot.label == label
        assert heard.methods("big") == events.methods("big")
    finally:
        await other.close()


async def test_what_was_missed_while_not_listening_is_caught_up(service: Service, service_config: Config,
                                                                events: CollectingEvents, pg_server: Any,
                                                                tmp_path: Path) -> None:
    """The LISTEN connections are cut (as a network failure or a server restart would) and
    another daemon pushes meanwhile: its notification never reaches this daemon, which,
    once listening again, reloads the session (no stale prompt) and tells its subscribers
    with a ``session/updated`` carrying the stored figures."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    import psycopg

    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())
    url = service_config.storage.url
    listening = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'"
    try:
        await _create(service, "gap")
        await _push(service, "gap", [{"role": "user", "content": "one"}])
        await prompt.prompt(service, params("context/prompt", sessionId="gap", format="openai"))  # loaded
        with psycopg.connect(url, autocommit=True) as admin:
            assert admin.execute(listening).fetchone()[0] == 2
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND query LIKE 'LISTEN%'")
            for _ in range(1000):
                if admin.execute(listening).fetchone()[0] == 0:
                    break
                await asyncio.sleep(0.005)
            assert admin.execute(listening).fetchone()[0] == 0, "the LISTEN connections did not go"
            before = len(events.of(SessionUpdated, "gap"))
            await _push(other, "gap", [{"role": "assistant", "content": "two"}])  # nobody hears this
            for _ in range(2000):
                if admin.execute(listening).fetchone()[0] == 2 and len(events.of(SessionUpdated, "gap")) > before:
                    break
                await asyncio.sleep(0.01)
        caught = events.of(SessionUpdated, "gap")[before:]
        assert [(u.reason, u.message_count, u.last_seq) for u in caught] == [("updated", 2, 2)]
        result = await prompt.prompt(service, params("context/prompt", sessionId="gap", format="openai"))
        assert [m["content"] if isinstance(m, dict) else m.content for m in result.messages] == ["one", "two"]
    finally:
        await other.close()


def test_fts5_queries_become_tsqueries_or_clear_errors() -> None:
    """``syntax: "fts"`` means FTS5's syntax on PostgreSQL too: translated, never guessed."""
    pytest.importorskip("psycopg")
    from ctxd.store.search import QueryError
    from ctxd.store.search_pg import tsquery

    assert tsquery('"zebra" "Road"') == "('zebra' & 'Road')"  # words mode (to_tsquery lower-cases)
    assert tsquery("zebra OR giraffe") == "('zebra' | 'giraffe')"
    assert tsquery('"zebra has" stripes*') == "(('zebra' <-> 'has') & 'stripes':*)"
    assert tsquery("a NOT b OR (c AND d)") == "(('a' & !'b') | ('c' & 'd'))"
    assert tsquery("a + b") == "('a' <-> 'b')"
    assert tsquery("NEAR(a b, 1)") == "('a' <1> 'b' | 'b' <1> 'a' | 'a' <2> 'b' | 'b' <2> 'a')"
    assert tsquery("NEAR(a b, 500)") == "('a' & 'b')"
    for bad in ("", "NEAR(", "a AND", "(a", "OR", "col:a", "a)", "NOT a", ".", "x'y", '"open', "^a", "*",
                "NEAR(a b, x)", "NEAR(a b, -1)", '"..."'):
        with pytest.raises(QueryError, match="invalid search syntax"):
            tsquery(bad, QueryError)


async def test_a_postgresql_database_of_an_older_schema_is_migrated_with_its_data(pg_server: Any,
                                                                                  tmp_path: Path) -> None:
    """A database a daemon of schema 1 wrote (its search index without session and role) is
    brought to the newest schema by the next daemon, the index rows filled in: a search in
    one session finds what was indexed before."""
    import psycopg

    from ctxd.store.postgres import migrations

    url = pg_server.create_database()
    config = Config(daemon=DaemonConfig(data_dir=str(tmp_path / "d")), storage=StorageConfig(url=url))
    svc = await Service.open(config)
    try:
        await _create(svc, "old")
        await _push(svc, "old", [{"role": "user", "content": "a walrus on the ice"}])
        await history.search(svc, params("session/search", query="walrus"))  # indexed now
    finally:
        await svc.close()
    with psycopg.connect(url, autocommit=True) as conn:  # back to schema 1, as a daemon of then left it
        conn.execute("ALTER TABLE messages_fts DROP COLUMN session_id, DROP COLUMN role")
        conn.execute("DELETE FROM ctxd_schema WHERE version > 1")
    svc = await Service.open(config)
    try:
        found = await history.search(svc, params("session/search", query="walrus", sessionId="old"))
        assert [(h.session_id, h.seq) for h in found.hits] == [("old", 1)]
        users = await history.search(svc, params("session/search", query="walrus", role="user"))
        assert len(users.hits) == 1
    finally:
        await svc.close()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM ctxd_schema").fetchone()[0] == migrations()[-1][0] == 2


async def test_a_compression_pass_of_one_session_runs_on_one_daemon_at_a_time(
        service: Service, service_config: Config, tmp_path: Path) -> None:
    """The lock a compression pass holds (``compress:<session>``, compression.py) keeps the
    other daemon's pass of that session waiting, not that of another session, and is
    released with its holder."""
    if service.db.dialect != "postgresql":
        pytest.skip("two daemons on one database is PostgreSQL's case")
    other = await Service.open(_twin(service_config, tmp_path), events=CollectingEvents())
    waiting = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
               "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    entered: list[str] = []

    async def second_pass() -> None:
        async with other.db.exclusive("compress:s"):
            entered.append("other")

    try:
        async with service.db.exclusive("compress:s"):
            task = asyncio.create_task(second_pass())
            for _ in range(2000):  # until the other daemon waits on the lock (no time limit asserted)
                if (await service.db.read(lambda conn: conn.execute(waiting).fetchone()))[0] == 1:
                    break
                await asyncio.sleep(0.005)
            assert (await service.db.read(lambda conn: conn.execute(waiting).fetchone()))[0] == 1
            async with other.db.exclusive("compress:t"):  # another session's pass is not held up
                entered.append("other t")
            assert entered == ["other t"]
        await asyncio.wait_for(task, 30)
        assert entered == ["other t", "other"]
    finally:
        await other.close()
