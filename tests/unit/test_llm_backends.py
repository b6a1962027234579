"""Each backend against a real HTTP server speaking its API: request shape, auth, parsing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ctxd.llm import BackendError, ChatTurn, ModelInfo, make_backend
from ctxd.llm.anthropic import AnthropicBackend
from ctxd.llm.ollama import OllamaBackend
from ctxd.llm.openai import OpenAIBackend
from tests.llm_servers import FakeLLMServer

TURNS = [
    ChatTurn("system", "You summarize conversations."),
    ChatTurn("user", "USER: Please add retries to src/client.py. Keep the public API.\n"
                     "ASSISTANT: I read src/client.py and wrapped send() in a retry loop with exponential "
                     "backoff; connect errors and 5xx answers are retried, 4xx are not.\n"
                     "ASSISTANT: Done. Next, I will write tests for the backoff."),
]


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(model="llama3.2:3b", num_ctx=4096, context_length=131072) as s:
        yield s


async def test_ollama_chat_request_and_reply(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("ollama"))
    assert isinstance(backend, OllamaBackend)
    try:
        reply = await backend.chat(TURNS, max_tokens=128, temperature=0.1, context_window=4096)
    finally:
        await backend.aclose()
    (request,) = server.chat_requests("ollama")
    assert request.path == "/api/chat"
    assert request.json == {
        "model": "llama3.2:3b",
        "messages": [{"role": "system", "content": TURNS[0].content}, {"role": "user", "content": TURNS[1].content}],
        "stream": False,
        "options": {"temperature": 0.1, "num_predict": 128, "num_ctx": 4096},
    }
    assert "authorization" not in request.headers
    assert reply.text.startswith("Summary: Please add retries to src/client.py.")
    assert "write tests for the backoff" in reply.text
    assert reply.model == "llama3.2:3b"
    assert reply.input_tokens is not None and reply.input_tokens > 0
    assert reply.output_tokens is not None and reply.output_tokens > 0
    assert reply.raw_finish_reason == "stop"


async def test_ollama_configured_window_wins_over_callers(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("ollama", context_window=16384))
    await backend.chat(TURNS, context_window=4096)
    await backend.aclose()
    assert server.chat_requests()[0].json["options"]["num_ctx"] == 16384


async def test_ollama_model_info_prefers_modelfile_num_ctx(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("ollama"))
    info = await backend.model_info("llama3.2:3b")
    await backend.aclose()
    assert info == ModelInfo(context_length=4096, parameter_size="3.2B", family="llama", output_limit=None)
    assert server.requests[-1].path == "/api/show"
    assert server.requests[-1].json == {"model": "llama3.2:3b"}


async def test_ollama_model_info_without_num_ctx_reads_architecture_length() -> None:
    with FakeLLMServer(model="qwen2.5:7b", family="qwen2", context_length=32768, parameter_size="7.6B") as s:
        backend = make_backend(s.settings("ollama"))
        info = await backend.model_info("qwen2.5:7b")
        await backend.aclose()
    assert info.context_length == 32768
    assert info.parameter_size == "7.6B"
    assert info.family == "qwen2"


async def test_ollama_unknown_model_is_http_404_without_retry(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("ollama", model="nope:1b"))
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "http_status"
    assert caught.value.status == 404
    assert "not found" in caught.value.message
    assert len(server.chat_requests()) == 1


async def test_openai_chat_request_and_reply(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.api_key = "sk-test-0123456789abcdef"
    monkeypatch.setenv("CTXD_TEST_OPENAI_KEY", "sk-test-0123456789abcdef")
    backend = make_backend(server.settings("openai", api_key_env="CTXD_TEST_OPENAI_KEY"))
    assert isinstance(backend, OpenAIBackend)
    reply = await backend.chat(TURNS, max_tokens=200)
    await backend.aclose()
    (request,) = server.chat_requests("openai")
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test-0123456789abcdef"
    assert request.json["model"] == "llama3.2:3b"
    assert request.json["max_tokens"] == 200  # a local server: max_tokens, not max_completion_tokens
    assert request.json["stream"] is False
    assert [m["role"] for m in request.json["messages"]] == ["system", "user"]
    assert reply.text.startswith("Summary: Please add retries")
    assert reply.raw_finish_reason == "stop"
    assert reply.input_tokens and reply.output_tokens


async def test_openai_wrong_key_is_401(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.api_key = "right-key-123456"
    monkeypatch.setenv("CTXD_TEST_OPENAI_KEY", "wrong-key-654321")
    backend = make_backend(server.settings("openai", api_key_env="CTXD_TEST_OPENAI_KEY"))
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "http_status" and caught.value.status == 401
    assert "Incorrect API key" in caught.value.message


@pytest.mark.parametrize("style, window, size", [
    ("vllm", 131072, None),
    ("llamacpp", 131072, "3.2B"),
    ("openai", None, None),
])
async def test_openai_model_info_styles(style: str, window: int | None, size: str | None) -> None:
    with FakeLLMServer(model="m1", context_length=131072, openai_models_style=style) as s:  # type: ignore[arg-type]
        backend = make_backend(s.settings("openai"))
        info = await backend.model_info("m1")
        missing = await backend.model_info("not-served")
        await backend.aclose()
        assert s.requests[-1].path == "/v1/models"
    assert info.context_length == window
    assert info.parameter_size == size
    assert missing == ModelInfo()


async def test_anthropic_chat_request_and_reply(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.api_key = "sk-ant-test-abcdef123456"
    monkeypatch.setenv("CTXD_TEST_ANTHROPIC_KEY", "sk-ant-test-abcdef123456")
    backend = make_backend(server.settings("anthropic", api_key_env="CTXD_TEST_ANTHROPIC_KEY"))
    assert isinstance(backend, AnthropicBackend)
    turns = [TURNS[0], TURNS[1], ChatTurn("user", "Be brief.")]
    reply = await backend.chat(turns)
    await backend.aclose()
    (request,) = server.chat_requests("anthropic")
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test-abcdef123456"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.json["system"] == "You summarize conversations."
    assert request.json["max_tokens"] == 1024  # required by the API: defaulted
    # consecutive user turns are joined: the API takes alternating turns
    assert request.json["messages"] == [{"role": "user", "content": TURNS[1].content + "\n\nBe brief."}]
    assert reply.raw_finish_reason == "end_turn"
    assert reply.text.startswith("Summary:")
    assert reply.input_tokens and reply.output_tokens


async def test_anthropic_model_info_reads_only_what_is_sent() -> None:
    with FakeLLMServer(model="claude-haiku-4-5", context_length=200000) as s:
        backend = make_backend(s.settings("anthropic"))
        plain = await backend.model_info("claude-haiku-4-5")
        s.anthropic_window = True
        rich = await backend.model_info("claude-haiku-4-5")
        await backend.aclose()
        assert s.requests[-1].path == "/v1/models/claude-haiku-4-5"
        assert s.requests[-1].headers["anthropic-version"] == "2023-06-01"
    assert plain == ModelInfo()  # the API sent no window: nothing is invented
    assert rich.context_length == 200000 and rich.output_limit == 8192


async def test_max_tokens_reached_is_reported_as_length(server: FakeLLMServer) -> None:
    backend = make_backend(server.settings("openai"))
    long_turn = ChatTurn("user", "\n".join(f"USER: Point number {i} is about the cache layer." for i in range(60)))
    reply = await backend.chat([long_turn], max_tokens=10)
    await backend.aclose()
    assert reply.raw_finish_reason == "length"


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_invalid_json_is_bad_response(server: FakeLLMServer, kind: str) -> None:
    server.garbage("invalid_json")
    backend = make_backend(server.settings(kind))  # type: ignore[arg-type]
    with pytest.raises(BackendError) as caught:
        await backend.chat(TURNS)
    await backend.aclose()
    assert caught.value.kind == "bad_response"
    assert len(server.chat_requests()) == 1  # a bad answer is not retried


@pytest.mark.parametrize("kind", ["ollama", "openai", "anthropic"])
async def test_empty_answer_is_returned_as_empty_text(server: FakeLLMServer, kind: str) -> None:
    server.garbage("empty")
    backend = make_backend(server.settings(kind))  # type: ignore[arg-type]
    reply = await backend.chat(TURNS)
    await backend.aclose()
    assert reply.text.strip() == ""  # judging it is the summarizer chain's job


def test_fake_server_is_usable_from_sync_code() -> None:
    import httpx

    with FakeLLMServer() as s:
        response = httpx.get(s.url + "/api/tags")
        assert response.status_code == 200
        assert response.json()["models"][0]["name"] == s.model
        assert s.wait_for(lambda srv: len(srv.requests) == 1)
