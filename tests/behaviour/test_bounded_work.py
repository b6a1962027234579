"""Bounded work per request, against real daemons (and the real HTTP servers of
``tests/llm_servers.py`` where an LLM backend is involved):

* ``session/create`` with a model-info backend that hangs answers after one short
  timeout, with the window from the configuration, and does not ask that backend again
  during the cool-down;
* ``session/import`` is capped like a push (``limits.max_batch_messages``,
  ``limits.max_message_bytes``): a refused import names the limit and the figure and
  stores nothing;
* an LLM summary answer larger than ``summarizer.max_response_bytes`` is not read to its
  end: the compression falls back to the extractive summarizer and says why.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.history_helpers import read_db, rpc_error, running
from tests.llm_servers import FakeLLMServer

pytestmark = pytest.mark.usefixtures("storage_backend")

MODEL = "slow-info:3b"


def summarizer_sets(server: FakeLLMServer, *extra: str) -> list[str]:
    return ["summarizer.backend=ollama", f"summarizer.base_url={server.url}", f"summarizer.model={MODEL}",
            "summarizer.api_key_env=none", *extra]


async def test_create_answers_while_the_model_info_backend_hangs():
    with FakeLLMServer(model=MODEL, context_length=32768) as server:
        server.hold_lookups()
        # The backend's own timeout (60 s, 3 attempts) would hold a create for minutes; the
        # look-up's own bound (summarizer.model_info_timeout_seconds, 5 s) is left as it is.
        sets = summarizer_sets(server, "models.context_windows={\"slow-info\": 12288}")
        async with running(*sets) as d:
            conn = await d.connect()
            first = await conn.call("session/create", {"sessionId": "a", "model": MODEL})
            assert len(server.lookups()) == 1
            assert first["contextWindow"] == 12288 and first.get("modelInfo", {}) == {}
            # The look-up is still unanswered, and within the cool-down nobody asks again.
            for sid in ("b", "c"):
                created = await conn.call("session/create", {"sessionId": sid, "model": MODEL})
                assert created["contextWindow"] == 12288
            assert len(server.lookups()) == 1
            server.release_lookups()
            assert "model info for slow-info:3b unavailable" in d.proc.stderr_text()


async def test_a_backend_that_answers_still_gives_the_window():
    with FakeLLMServer(model=MODEL, context_length=32768) as server:
        async with running(*summarizer_sets(server)) as d:
            conn = await d.connect()
            created = await conn.call("session/create", {"sessionId": "a", "model": MODEL})
            assert created["contextWindow"] == 32768 and created["modelInfo"]["contextLength"] == 32768


def document(n: int, session_id: str = "big", size: int = 20) -> str:
    messages = [{"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
                 "message": {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "x" * size}}
                for i in range(n)]
    return json.dumps({"format": "ctxd.session", "version": 1, "exportedAt": "2025-01-01T00:00:00Z",
                       "session": {"sessionId": session_id, "createdAt": "2025-01-01T00:00:00Z", "model": "gpt-4"},
                       "messages": messages, "checkpoints": [], "compressions": [], "events": []})


async def test_import_is_capped_like_a_push():
    async with running("limits.max_batch_messages=50", "limits.max_message_bytes=2048") as d:
        conn = await d.connect()
        error = await rpc_error(conn, "session/import", {"document": document(51)}, -33004)
        assert "51 messages" in error.message and "50" in error.message
        assert "limits.max_batch_messages" in error.message
        assert error.data == {"field": "document", "count": 51, "limit": 50}
        await conn.call("session/import", {"document": document(50, "exact")})  # at the limit: fine
        error = await rpc_error(conn, "session/import", {"document": document(2, "wide", size=4096)}, -33003)
        assert "2048" in error.message and "limits.max_message_bytes" in error.message
        listed = [s["sessionId"] for s in (await conn.call("session/list", {}))["sessions"]]
        assert listed == ["exact"]
        await d.stop()
        assert read_db(d.db_path, "SELECT count(*) FROM messages") == [(50,)]


async def test_a_runaway_llm_answer_falls_back_without_reading_it_all():
    with FakeLLMServer(model=MODEL, huge_bytes=6_000_000) as server:  # over the 4 MiB default limit
        server.garbage("huge")
        sets = summarizer_sets(server, "summarizer.max_retries=0", "compression.auto=false")
        async with running(*sets) as d:
            conn = await d.connect()
            await conn.call("session/create", {"sessionId": "s", "model": MODEL, "contextWindow": 4096})
            await conn.call("session/subscribe", {"sessionId": "s"})
            for i in range(12):
                await conn.call("session/push", {"sessionId": "s", "messages": [
                    {"role": "user", "content": f"step {i}: please refactor module {i} and keep the tests green."},
                    {"role": "assistant", "content": f"Refactored module {i}; " + "the tests pass again. " * 30}]})
            result = await conn.call("context/compress", {"sessionId": "s"})
            assert result["compressed"] and result["summarizer"] == "extractive"
            _, failed = await conn.wait_note(lambda m, p: m == "context/compressionFailed")
            assert "max_response_bytes" in failed["reason"] and str(4 * 1024 * 1024) in failed["reason"]
            assert server.chat_requests()
