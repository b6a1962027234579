"""Heavy work steps aside while other clients' small requests run (``service/turns.py``):
the bookkeeping, a large push's threads waiting for a running request, and the
connection telling it which requests run (a daemon in this process, a real socket)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxd.config import Config, DaemonConfig
from ctxd.daemon import Daemon
from ctxd.server import connection, jsonrpc
from ctxd.service import ingest, sessions, turns
from ctxd.service.core import Service
from ctxd.service.turns import Turns

from .service_helpers import params


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_nothing_running_nothing_waited() -> None:
    t = Turns()
    assert t.step_aside() == 0.0 and t.waits == 0


def test_a_thread_waits_for_a_running_request_until_it_ends() -> None:
    t = Turns(young_seconds=30)
    t.begin("light")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (t.step_aside(), done.set()))
    worker.start()
    try:
        while t.waits == 0:  # it found the request running and waits
            worker.join(0.01)
        assert not done.is_set()
        t.end("light")
        worker.join(10)
        assert done.is_set()
    finally:
        t.end("light")
        worker.join(10)


def test_a_request_running_longer_than_young_seconds_holds_nothing_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(turns, "time", clock)
    t = Turns(young_seconds=0.05)
    t.begin("waiting-for-an-llm")
    clock.now += 0.06
    assert t.running() == 0
    assert t.step_aside() == 0.0 and t.waits == 0
    t.begin("new")
    assert t.running() == 1


def test_requests_back_to_back_do_not_hold_heavy_work_up_for_ever() -> None:
    """Small requests arriving one after another, each young when the last ends: one
    step aside waits at most ``max_wait_seconds``, then the heavy work goes on."""
    t = Turns(young_seconds=30, max_wait_seconds=0.2)
    stop = threading.Event()

    def stream() -> None:
        i = 0
        t.begin(i)
        while not stop.is_set():
            t.begin(i + 1)  # the next one starts before the last ends
            t.end(i)
            i += 1
            stop.wait(0.005)
        t.end(i)

    feeder = threading.Thread(target=stream)
    feeder.start()
    try:
        while t.running() == 0:
            stop.wait(0.001)
        waited = t.step_aside()
        assert t.waits == 1 and 0.15 <= waited < 5, waited
    finally:
        stop.set()
        feeder.join(10)


class FakeTime(FakeClock):
    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_heavy_work_rests_as_long_as_it_worked_while_others_are_active(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the pieces of a large body's decode and validation: half the CPU while
    other clients' requests keep coming (at most MAX_REST_SECONDS a time), none when none
    came lately."""
    clock = FakeTime()
    monkeypatch.setattr(turns, "time", clock)
    t = Turns()
    t.begin("light")
    t.end("light")
    assert t.step_aside_and_rest() == 0.0  # (the first piece: nothing to rest for yet)
    clock.now += 0.005  # a piece took 5 ms
    assert t.step_aside_and_rest() == pytest.approx(0.005)
    clock.now += 0.5  # a long piece
    t.begin("light 2")
    t.end("light 2")
    assert t.step_aside_and_rest() == pytest.approx(turns.MAX_REST_SECONDS)
    clock.now += turns.ACTIVE_SECONDS + 0.01  # nobody came since
    assert t.step_aside_and_rest() == 0.0
    assert clock.slept == [0.005, turns.MAX_REST_SECONDS] and t.rests == 2


async def test_the_request_that_starts_heavy_work_is_not_waited_for() -> None:
    t = Turns(young_seconds=30)
    context = t.begin(("conn", 1))  # (on the loop, as the connection does, before the handler's task)
    t.begin(("conn", 2))

    async def handler() -> int:
        t.mark_heavy()
        return t.running()

    loop = asyncio.get_running_loop()
    assert await context.run(loop.create_task, handler()) == 1  # (2 still runs)
    assert t.running() == 1
    assert await loop.create_task(handler()) == 1  # another task is no request: nothing changes


@pytest.fixture
def storage_url() -> str:
    return ""


async def test_a_large_push_waits_between_messages_while_a_small_request_runs(
        service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validating and encoding a large push in its thread stops between messages while
    another client's request runs, and carries on once it is answered."""
    t = Turns(young_seconds=30)
    monkeypatch.setattr(turns, "TURNS", t)
    monkeypatch.setattr(ingest, "THREAD_COUNT_BYTES", 10_000)
    monkeypatch.setattr(ingest, "STEP_ASIDE_BYTES", 10_000)
    await sessions.create_session(service, params("session/create", sessionId="s", model="gpt-4o"))
    messages = [{"role": "user", "content": f"part {i} " + "lorem ipsum " * 2000} for i in range(6)]
    t.begin("another client's push")
    push = asyncio.create_task(ingest.push(service, params("session/push", sessionId="s", messages=messages)))
    while t.waits == 0:
        await asyncio.sleep(0.01)
        assert not push.done(), push
    assert not push.done()
    t.end("another client's push")
    result = await asyncio.wait_for(push, 30)
    assert [m.seq for m in result.messages] == [1, 2, 3, 4, 5, 6]


class RecordingTurns(Turns):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Hashable]] = []

    def begin(self, key: Hashable) -> contextvars.Context:
        self.log.append(("begin", key))
        return super().begin(key)

    def mark_heavy(self) -> None:
        self.log.append(("heavy", turns._current.get()))
        super().mark_heavy()

    def end(self, key: Hashable) -> None:
        if key in self._light:
            self.log.append(("end", key))
        super().end(key)


async def test_the_connection_tells_turns_which_requests_run(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request is counted from when it is routed to when it is answered, under its
    connection and id; a large push says it is heavy before it is answered."""
    t = RecordingTurns()
    monkeypatch.setattr(turns, "TURNS", t)
    monkeypatch.setattr(connection, "TURNS", t)
    monkeypatch.setattr(jsonrpc, "TURNS", t)  # (the JSON-RPC core begins and ends requests)
    config = Config(daemon=DaemonConfig(data_dir=str(tmp_path / "data"), socket=str(tmp_path / "run" / "s.sock")))
    daemon = Daemon(config, unix=True)
    runner = asyncio.create_task(daemon.run())
    try:
        while "unix" not in daemon.bound:
            await asyncio.sleep(0.01)
            assert not runner.done()
        reader, writer = await asyncio.open_unix_connection(daemon.bound["unix"], limit=1 << 24)

        async def call(msg_id: int, method: str, p: Any) -> dict[str, Any]:
            body = msgspec.json.encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": p})
            writer.write(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            header = await reader.readuntil(b"\r\n\r\n")
            answer = msgspec.json.decode(await reader.readexactly(int(header.split(b":")[1].split(b"\r")[0])))
            assert answer.get("id") == msg_id and "error" not in answer, answer
            return answer

        await call(1, "initialize", {"processId": None})
        await call(2, "session/create", {"sessionId": "s", "model": "gpt-4o"})
        await call(3, "session/push", {"sessionId": "s", "messages": [
            {"role": "user", "content": "x" * 400_000}]})
        writer.close()
    finally:
        daemon.stop()
        await asyncio.wait_for(runner, 30)
    (conn_id,) = {key[0] for _, key in t.log}
    assert t.log == [("begin", (conn_id, 1)), ("end", (conn_id, 1)), ("begin", (conn_id, 2)), ("end", (conn_id, 2)),
                     ("begin", (conn_id, 3)), ("heavy", (conn_id, 3)), ("end", (conn_id, 3)),
                     ("heavy", (conn_id, 3))]  # (validating, then counting)
    assert t.running() == 0
