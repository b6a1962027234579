"""The pygls internals ctxd relies on (server/connection.py; docs/decisions.md,
"Foundations") are still there and still behave as ctxd expects. When one of these
fails, pygls changed under ctxd: read the message before loosening the pin."""

from __future__ import annotations

import asyncio
from importlib import metadata
from typing import Any

import pytest
from pygls.protocol import JsonRPCProtocol, JsonRPCRequestMessage, default_converter
from pygls.server import JsonRPCServer

from ctxd.server.connection import PYGLS_TESTED, check_pygls

PIN = "pygls>=2.1,<2.2 (pyproject.toml)"


def test_the_installed_pygls_is_the_tested_minor_version() -> None:
    version = metadata.version("pygls")
    assert version.split(".")[:2] == PYGLS_TESTED.split("."), (
        f"pygls {version} is installed, but ctxd's use of pygls internals was tested with {PYGLS_TESTED}.x "
        f"({PIN}); run this file against it and update PYGLS_TESTED and the pin together")


def test_the_pin_in_pyproject_matches() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"pygls>={PYGLS_TESTED},<2.2"' in text, f"pyproject.toml must pin {PIN}"


def test_check_pygls_accepts_the_installed_pygls() -> None:
    check_pygls()  # raises ImportError naming what is missing


def test_check_pygls_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(JsonRPCProtocol, "_send_handler_result")
    with pytest.raises(ImportError, match=r"_send_handler_result.*tested with pygls"):
        check_pygls()


class _Probe(JsonRPCProtocol):
    """What CtxdProtocol does with pygls, minus ctxd: enter by the public
    ``handle_message``, route by the public ``feature`` registry, and rely on the two
    internals (``_request_futures``, ``_send_handler_result``)."""

    def __init__(self, server: JsonRPCServer, converter: Any) -> None:
        super().__init__(server, converter)
        self.answered: list[tuple[Any, Any, bool]] = []

    def _send_handler_result(self, future: Any, *, msg_id: Any) -> None:  # type: ignore[override]
        self.answered.append((msg_id, future, msg_id in self._request_futures))
        self._request_futures.pop(msg_id, None)


async def test_requests_run_as_tasks_kept_by_id_and_answered_through_send_handler_result() -> None:
    server = JsonRPCServer(_Probe, default_converter)
    probe: _Probe = server.protocol  # type: ignore[assignment]
    release = asyncio.Event()
    seen: list[Any] = []

    async def handler(params: Any) -> str:
        seen.append(params)
        await release.wait()
        return "done"

    server.feature("x/wait")(handler)
    assert "x/wait" in probe.fm.features, "pygls' public feature registry moved"
    raw = {"a": [1, 2]}
    probe.handle_message(JsonRPCRequestMessage(id=7, method="x/wait", jsonrpc="2.0", params=raw))

    # The request's task is kept by id, at once (before it ran): ctxd cancels through it.
    future = probe._request_futures.get(7)
    assert isinstance(future, asyncio.Future), \
        "pygls no longer keeps a request's task in JsonRPCProtocol._request_futures (ctxd's cancel/close/drain)"
    await asyncio.sleep(0)
    assert seen == [raw] and seen[0] is raw, "pygls no longer passes params through untouched"
    release.set()
    assert await future == "done"
    await asyncio.sleep(0)
    assert probe.answered == [(7, future, True)], \
        "pygls no longer answers a request through _send_handler_result(future, msg_id=...)"


async def test_a_request_cancelled_through_its_future_is_answered_through_send_handler_result() -> None:
    server = JsonRPCServer(_Probe, default_converter)
    probe: _Probe = server.protocol  # type: ignore[assignment]

    async def handler(params: Any) -> None:
        await asyncio.sleep(3600)

    server.feature("x/slow")(handler)
    probe.handle_message(JsonRPCRequestMessage(id="c", method="x/slow", jsonrpc="2.0", params=None))
    future = probe._request_futures["c"]
    future.cancel(msg="why")
    with pytest.raises(asyncio.CancelledError):
        await future
    await asyncio.sleep(0)
    assert [(msg_id, f.cancelled()) for msg_id, f, _ in probe.answered] == [("c", True)]
