"""LLM summarizer backends, end to end: a real daemon summarizing through the fake
Ollama / OpenAI-compatible / Anthropic servers of ``tests/llm_servers.py``.

* Each backend writes the checkpoints of automatic compressions, in its own wire
  format, with the API key taken from an environment variable: the server sees it,
  the daemon's log (at debug level) and notifications never do, not even when the
  server echoes it back in an error.
* When the model fails (server down, slower than ``chain_timeout_seconds``, 500s,
  invalid JSON, an empty answer, an answer longer than its input) compression still
  succeeds with the extractive summarizer, the result says why, and history is intact.
* A session with a model and no ``contextWindow`` takes its window from Ollama's
  ``/api/show``, and reliability its model size from ``parameter_size``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.compression_helpers import (
    Conn,
    CtxdProc,
    Driver,
    agent_session,
    check_prompt,
    remove_root,
    short_root,
)
from tests.llm_servers import FakeLLMServer

pytestmark = pytest.mark.usefixtures("module_backend")

MODEL = "acme-chat"
KEY = "sk-e2e-Zq81Lm3vTtW9cYpQ0aNDSECRET"
KEY_ENV = "CX_E2E_SUMMARIZER_KEY"
WINDOW = 4096


def daemon_for(root, server: FakeLLMServer, kind: str, *extra: str, base_url: str | None = None) -> CtxdProc:
    sets = [f"summarizer.backend={kind}", f"summarizer.base_url={base_url or server.base_url(kind)}",
            f"summarizer.model={MODEL}", "daemon.log_level=debug",
            f"summarizer.api_key_env={'none' if kind == 'ollama' else KEY_ENV}", *extra]
    return CtxdProc(root, sets=sets, name=kind).start()


@pytest.fixture(scope="module", autouse=True)
def _summarizer_key() -> Iterator[None]:
    """The key, where ``summarizer.api_key_env`` says the daemon (in this process) finds it
    (module-wide: a module's daemon reads it when it starts)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        yield


async def new_session(conn: Conn, session_id: str, **extra: Any) -> Driver:
    params = {"sessionId": session_id, "model": MODEL, "contextWindow": WINDOW, **extra}
    await conn.call("session/create", params)
    await conn.call("session/subscribe", {"sessionId": session_id})
    return Driver(conn, session_id)


def summarizing(driver: Driver) -> bool:
    return any("summarize" in r.note["layers"] for r in driver.runs)


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_backend_writes_checkpoints_in_its_wire_format(kind):
    root = short_root()
    with FakeLLMServer(model=MODEL, api_key=None if kind == "ollama" else KEY, echo_key_in_errors=True) as server:
        daemon = daemon_for(root, server, kind)
        try:
            conn = await daemon.connect()
            status = await conn.call("daemon/status")
            assert status["summarizer"].startswith(f"{kind}:{MODEL}")
            drive = await new_session(conn, "s")
            turns = agent_session(seed=11, messages=400, markers=False)
            used = await drive.push_until(turns, summarizing)
            run = next(r for r in drive.runs if "summarize" in r.note["layers"])
            assert run.note["summarizer"] == f"{kind}:{MODEL}"
            created = [n["checkpoint"] for n in conn.of("checkpoint/created")]
            cp = next(c for c in created if c["id"] in run.note["checkpointIds"])
            assert cp["summarizer"] == f"{kind}:{MODEL}" and cp["kind"] == "summary"
            assert cp["summary"].startswith("Summary:"), cp["summary"][:200]  # the fake model's answer
            assert not conn.of("context/compressionFailed")
            for fmt in ("openai", "anthropic", "ollama"):
                assert not check_prompt(await drive.prompt(fmt), WINDOW)

            # The request reached the server in the backend's wire format.
            chats = server.chat_requests()
            assert chats and {r.flavor for r in chats} == {kind}
            request = chats[0]
            body = request.json
            assert body["model"] == MODEL and isinstance(body["messages"], list)
            first_instruction = next(t.instruction for t in turns if t.instruction)
            assert first_instruction in request.text(), "the summarizer was not shown the user's words"
            if kind == "ollama":
                assert request.path == "/api/chat" and body["stream"] is False
                assert isinstance(body["options"]["num_predict"], int)
                assert "authorization" not in request.headers  # api_key_env=none
            elif kind == "openai":
                assert request.path == "/v1/chat/completions"
                assert request.headers["authorization"] == f"Bearer {KEY}"
                assert isinstance(body["max_tokens"], int) and body["messages"][0]["role"] == "system"
            else:
                assert request.path == "/v1/messages"
                assert request.headers["x-api-key"] == KEY and request.headers["anthropic-version"]
                assert "authorization" not in request.headers
                assert isinstance(body["max_tokens"], int) and isinstance(body["system"], str)
                assert {m["role"] for m in body["messages"]} <= {"user", "assistant"}

            # context/compress's focus reaches the model.
            for turn in turns[used:used + 12]:
                await drive.push(turn)
            used += 12
            asked = len(server.chat_requests())
            result = await conn.call("context/compress", {"sessionId": "s", "focus": "the quarterly invoices"})
            assert result["compressed"] and result["summarizer"] == f"{kind}:{MODEL}", result
            assert any("the quarterly invoices" in r.text() for r in server.chat_requests()[asked:])

            if kind != "ollama":
                # The server now refuses the key and quotes it back: the fallback's reason
                # reaches the client, the key does not.
                server.api_key = "sk-some-other-key"
                # (pruning may pay for a pass; push on until one summarizes)
                result = {}
                while "summarizer" not in result and used < len(turns):
                    for turn in turns[used:used + 12]:
                        await drive.push(turn)
                    used += 12
                    result = await conn.call("context/compress", {"sessionId": "s"})
                assert result["compressed"] and result["summarizer"] == "extractive", result
                assert "401" in result["reason"] and KEY not in result["reason"]
            notes = json.dumps(conn.notes)
            assert KEY not in notes
            await conn.close()
        finally:
            daemon.stop()
            log = daemon.stderr_text()
            remove_root(root)
    assert "DEBUG" in log  # the log level took: a key would have had every chance to show
    assert KEY not in log


# mode: (how to set the server, what the fallback reason must say)
FAILURES = {
    "slow": (lambda s: s.slow(5.0), "timeout"),
    "500": (lambda s: s.fail("500"), "500"),
    "invalid_json": (lambda s: s.garbage("invalid_json"), "backend_error"),
    "empty": (lambda s: s.garbage("empty"), "garbage"),
    "long": (lambda s: s.garbage("long"), "garbage"),
}


def dead_url() -> str:
    """An address where nothing listens (connection refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


async def check_fallback(conn: Conn, session_id: str, why: str, seed: int, server: FakeLLMServer | None) -> str:
    """A session below its trigger, then context/compress: the extractive summarizer
    writes the checkpoint, the result says why the model was not used, history is intact."""
    # A large window keeps the session below the trigger: only context/compress compresses.
    drive = await new_session(conn, session_id, contextWindow=32768)
    for turn in agent_session(seed=seed, messages=40, markers=False, large_every=10_000):
        await drive.push(turn)
    assert not drive.runs
    asked = len(server.chat_requests()) if server else 0
    mark = conn.mark()
    result = await conn.call("context/compress", {"sessionId": session_id})
    assert result["compressed"] and "summarize" in result["layers"], result
    assert result["summarizer"] == "extractive", result
    assert why in result["reason"] and "openai" in result["reason"], result["reason"]
    assert result["afterTokens"] < result["beforeTokens"]
    [cp] = [n["checkpoint"] for n in conn.of("checkpoint/created", mark)]
    assert cp["summarizer"] == "extractive" and cp["kind"] == "summary" and cp["tokens"] < cp["originalTokens"]
    if server is not None:
        assert len(server.chat_requests()) > asked  # the model was asked first
    # History untouched: every message still there, byte-equal.
    info = await conn.call("session/get", {"sessionId": session_id})
    assert info["messageCount"] == len(drive.pushed)
    await drive.expand_all()
    assert not check_prompt(await drive.prompt(), 32768)
    return result["reason"]


@pytest.fixture(scope="module")
def failing_openai(module_backend):
    """One OpenAI-backend daemon and its server for the failure modes (each test sets
    the server's mode and uses its own session). A large summarizer window puts a whole
    input in one call, so a long answer is "longer than its input" (not chunk merges
    that never converge)."""
    root = short_root()
    with FakeLLMServer(model=MODEL, api_key=KEY, context_length=32768) as server:
        # (cool-down off: each test sets its own failure mode on the same daemon)
        daemon = daemon_for(root, server, "openai", "summarizer.chain_timeout_seconds=0.5",
                            "summarizer.max_retries=0", "summarizer.cooldown_seconds=0")
        try:
            yield server, daemon
        finally:
            daemon.stop()
            log = daemon.stderr_text()
            remove_root(root)
    assert KEY not in log


@pytest.mark.parametrize("mode", ["slow", "500", "invalid_json", "empty", "long"])
async def test_summarizer_failure_falls_back_to_extractive(failing_openai, mode):
    server, daemon = failing_openai
    set_mode, why = FAILURES[mode]
    set_mode(server)
    conn = await daemon.connect()
    try:
        await check_fallback(conn, f"fail-{mode}", why, 7, server)
        if mode == "slow":
            assert server.wait_for(lambda s: s.disconnects >= 1)  # abandoned, not waited for
    finally:
        server.ok()
        await conn.close()
    assert KEY not in daemon.stderr_text()


async def test_summarizer_server_down_falls_back_to_extractive():
    root = short_root()
    daemon = CtxdProc(root, sets=["summarizer.backend=openai", f"summarizer.base_url={dead_url()}",
                                  f"summarizer.model={MODEL}", f"summarizer.api_key_env={KEY_ENV}",
                                  "summarizer.max_retries=0"]).start()
    try:
        conn = await daemon.connect()
        reason = await check_fallback(conn, "s", "backend_error", 9, None)
        assert "connect" in reason
        await conn.close()
    finally:
        daemon.stop()
        remove_root(root)


async def test_automatic_fallback_is_announced(failing_openai):
    server, daemon = failing_openai
    server.fail("500")
    conn = await daemon.connect()
    try:
        drive = await new_session(conn, "auto-fallback")
        await drive.push_until(agent_session(seed=5, messages=400, markers=False), summarizing)
        run = next(r for r in drive.runs if "summarize" in r.note["layers"])
        assert run.note["summarizer"] == "extractive"
        failed = conn.of("context/compressionFailed")
        assert failed and "500" in failed[0]["reason"] and failed[0]["fallback"]
    finally:
        server.ok()
        await conn.close()


async def test_a_slow_backend_is_waited_for_once_not_per_summary():
    """One pass writes a checkpoint, ages older ones and merges: with the model timing out,
    only the first summary waits for it; the rest of that pass and the next passes go
    straight to the extractive summarizer until the cool-down ends, and clients hear of
    the fallback once per pass."""
    root = short_root()
    with FakeLLMServer(model=MODEL, api_key=KEY, context_length=32768) as server:
        daemon = daemon_for(root, server, "openai", "summarizer.chain_timeout_seconds=0.5",
                            "summarizer.max_retries=0", "summarizer.cooldown_seconds=600")
        server.slow(10)
        try:
            conn = await daemon.connect()
            drive = await new_session(conn, "slow")
            await drive.push_until(agent_session(seed=8, messages=900, markers=False),
                                   lambda d: sum("summarize" in r.note["layers"] for r in d.runs) >= 4
                                   and conn.of("checkpoint/aged"))
            assert len(server.chat_requests()) == 1  # the one that timed out
            failed = conn.of("context/compressionFailed")
            summarized = [r for r in drive.runs if "summarize" in r.note["layers"]]
            assert len(failed) == len(summarized)  # once per pass, ageing and merging included
            assert failed[0]["reason"].startswith("timeout")
            assert all(f["reason"].startswith("skipped: openai:") for f in failed[1:])
            assert all(r.note["summarizer"] == "extractive" for r in summarized)
            await conn.close()
        finally:
            daemon.stop()
            remove_root(root)


async def test_session_window_and_model_size_come_from_ollama():
    root = short_root()
    with FakeLLMServer(model=MODEL, context_length=32768, num_ctx=6144, parameter_size="34B",
                       family="qwen2") as server:
        daemon = daemon_for(root, server, "ollama")
        try:
            conn = await daemon.connect()
            info = await conn.call("session/create", {"sessionId": "s", "model": MODEL})
            # Ollama serves num_ctx when the Modelfile sets it, not the trained length.
            assert info["contextWindow"] == 6144
            assert info["modelInfo"]["parameterSize"] == "34B"
            assert [r.path for r in server.requests if r.path == "/api/show"]
            stats = await conn.call("context/stats", {"sessionId": "s"})
            assert stats["budget"]["contextWindow"] == 6144
            reliability = stats["reliability"]
            assert reliability["modelSizeBillions"] == 34.0
            assert reliability["modelFactor"] == 0.85  # 30B+ (the name alone would say 0.70)
            # A window given at creation wins, and the backend is not asked.
            server.clear()
            info = await conn.call("session/create", {"sessionId": "t", "model": MODEL, "contextWindow": 4096})
            assert info["contextWindow"] == 4096
            assert not [r for r in server.requests if r.path == "/api/show"]
            await conn.close()
        finally:
            daemon.stop()
            remove_root(root)
