"""Transcript importers: every format from its fixture, detection, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from ctxd.importers import (
    FORMATS,
    Transcript,
    TranscriptError,
    detect_format,
    load_transcripts,
    load_transcripts_from_bytes,
)
from ctxd.protocol.message import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"


def fixture(name: str) -> Path:
    return FIXTURES / name


def load_one(name: str, **kwargs) -> Transcript:
    transcripts = load_transcripts(fixture(name), **kwargs)
    assert len(transcripts) == 1
    return transcripts[0]


def assert_valid(transcript: Transcript) -> None:
    """Every message round-trips through Message, and every tool result has an earlier call."""
    seen: set[str] = set()
    for message in transcript.messages:
        assert msgspec.convert(msgspec.to_builtins(message), Message) == message
        for call in message.tool_calls or ():
            seen.add(call.id)
        if isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolUseBlock):
                    seen.add(block.id)
                if isinstance(block, ToolResultBlock):
                    assert block.tool_use_id in seen
        if message.role == "tool":
            assert message.tool_call_id in seen
    msgspec.json.encode(transcript)  # the whole transcript serialises


def roles(transcript: Transcript) -> list[str]:
    return [m.role for m in transcript.messages]


# ------------------------------------------------------------------ formats from fixtures


def test_formats_listed() -> None:
    assert set(FORMATS) == {"openai_chat", "claude_code", "aider", "mini_swe_agent", "swe_agent",
                            "openhands", "openhands_events", "locomo"}
    assert all(isinstance(d, str) and d and "\n" not in d for d in FORMATS.values())


def test_claude_code_fixture() -> None:
    t = load_one("claude_code_session.jsonl")
    assert_valid(t)
    assert t.source_format == "claude_code"
    assert t.model == "claude-opus-4-5-20251101"
    assert t.provider == "anthropic"
    # 24 user/assistant records; assistant replies spread over several records are merged
    assert len(t.messages) == 18
    assert roles(t)[:4] == ["user", "assistant", "user", "assistant"]
    assert t.warnings == ["skipped 1 queue-operation record (line 1)"]

    first_reply = t.messages[1]
    assert first_reply.metadata["messageId"] == "msg_01FPWXTwsfd3wKFT1cfSakiA"
    assert len(first_reply.metadata["uuids"]) == 2
    assert [type(b) for b in first_reply.content] == [TextBlock, ToolUseBlock]
    assert first_reply.content[1].name == "Glob"
    assert first_reply.usage is not None
    assert first_reply.usage.cache_read_tokens == 15289
    assert first_reply.usage.cache_write_tokens == 3257
    assert first_reply.timestamp == "2026-01-21T06:19:40.612Z"

    # two parallel Read calls in one reply, each result in its own user record
    parallel = t.messages[3]
    assert [b.name for b in parallel.content] == ["Read", "Read"]
    assert all(isinstance(m.content[0], ToolResultBlock) for m in t.messages[4:6])

    user = t.messages[0]
    assert isinstance(user.content, str) and "multiply_numbers" in user.content
    assert user.metadata["uuid"] == "1b4951f2-dc07-4bb4-9740-777baa85b06e"
    assert user.metadata["sessionId"] == "c64cc478-3430-40fe-8e9c-4ee9986e9754"
    assert user.metadata["gitBranch"] == "master"
    assert user.metadata["isSidechain"] is False
    assert any(m.metadata.get("isMeta") for m in t.messages)
    errors = [b for m in t.messages if isinstance(m.content, list)
              for b in m.content if isinstance(b, ToolResultBlock) and b.is_error]
    assert errors == []  # the excerpt ends before the failing commit
    assert all(m.usage is not None for m in t.messages if m.role == "assistant")


def test_mini_swe_agent_fixture() -> None:
    t = load_one("mini_swe_agent.traj.json")
    assert_valid(t)
    assert t.source_format == "mini_swe_agent"
    assert t.title == "pydicom__pydicom-1256"
    assert t.model == "deepseek/deepseek-chat"
    assert t.provider == "deepseek"
    assert roles(t) == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant"] * 2
    call = t.messages[2].tool_calls[0]
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments)["command"].startswith("find .")
    assert t.messages[3].tool_call_id == call.id
    assert t.messages[3].content.startswith("<returncode>0</returncode>")
    assert t.messages[2].usage is not None and t.messages[2].usage.input_tokens > 0
    assert t.messages[2].timestamp.endswith("Z")
    exit_message = t.messages[-1]
    assert exit_message.role == "assistant"
    assert exit_message.metadata["originalRole"] == "exit"
    assert exit_message.metadata["exit_status"] == "Submitted"
    assert exit_message.content.startswith("diff --git")
    assert t.metadata["info"]["exit_status"] == "Submitted"
    assert "config" not in t.metadata["info"]
    # the raw API responses are not copied into metadata
    assert all("extra" not in (m.metadata or {}) for m in t.messages)


def test_mini_swe_agent_reasoning_becomes_thinking() -> None:
    t = load_one("mini_swe_agent_reasoner.traj.json")
    assert_valid(t)
    assert t.model == "deepseek/deepseek-reasoner"
    reply = t.messages[2]
    assert isinstance(reply.content[0], ThinkingBlock)
    assert reply.metadata["thinkingSource"] == "reasoning_content"
    assert reply.usage.reasoning_tokens == 29
    assert reply.tool_calls and t.messages[3].tool_call_id == reply.tool_calls[0].id
    assert t.messages[-1].metadata == {"originalRole": "exit",
                                       "exit_status": "InternalServerError"}


def test_mini_swe_agent_legacy_list_is_openai_chat() -> None:
    t = load_one("mini_swe_agent_legacy.traj.json")
    assert_valid(t)
    assert t.source_format == "openai_chat"
    assert len(t.messages) == 22
    assert roles(t)[:4] == ["system", "user", "assistant", "user"]
    assert t.title == "mini_swe_agent_legacy"  # falls back to the file name


def test_swe_agent_legacy_observations() -> None:
    t = load_one("swe_agent_legacy.traj")
    assert_valid(t)
    assert t.source_format == "swe_agent"
    assert roles(t) == ["system", "user", "user", "assistant", "user", "assistant", "user",
                        "assistant", "user"]
    demo, task = t.messages[1], t.messages[2]
    assert demo.metadata["is_demo"] is True
    assert demo.metadata["demonstration"] is True  # not the user's words, nor the task (engine/context.py)
    assert not task.metadata.get("observation") and not task.metadata.get("demonstration")
    assistant = t.messages[3]
    assert assistant.metadata["action"] == "create reproduce_bug.py\n"
    assert assistant.metadata["thought"].startswith("First, I'll create")
    observations = [m for m in t.messages if (m.metadata or {}).get("observation")]
    assert len(observations) == 3
    assert all(m.role == "user" for m in observations)
    assert t.metadata["info"]["exit_status"] == "submitted"


def test_swe_agent_function_calling() -> None:
    t = load_one("swe_agent_function_calling.traj")
    assert_valid(t)
    assert roles(t) == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    call = t.messages[2].tool_calls[0]
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls -F"}
    tool = t.messages[3]
    assert tool.tool_call_id == call.id
    assert tool.metadata["tool_call_ids"] == [call.id]
    assert tool.metadata["message_type"] == "observation"
    assert t.model is None  # a replay, not a real model
    assert t.metadata["model_name"] == "replay"


def test_openhands_completion_log() -> None:
    t = load_one("openhands_completion.json")
    assert_valid(t)
    assert t.source_format == "openhands"
    assert len(t.messages) == 21  # 20 logged messages + the response
    assert t.model == "litellm_proxy/claude-3-5-sonnet-20241022"
    assert t.provider == "anthropic"
    final = t.messages[-1]
    assert final.role == "assistant"
    assert final.metadata["fromResponse"] is True
    assert final.tool_calls[0].function.name == "finish"
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    assert final.timestamp.endswith("Z")
    assert all(m.usage is None for m in t.messages[:-1])
    system = t.messages[0]
    assert isinstance(system.content, list) and isinstance(system.content[0], TextBlock)
    tool = t.messages[3]
    assert tool.role == "tool" and tool.name == "execute_bash"
    assert tool.tool_call_id == t.messages[2].tool_calls[0].id
    assert [tool["function"]["name"] for tool in t.metadata["tools"]][:1] == ["execute_bash"]
    assert any((m.metadata or {}).get("cache_control") for m in t.messages)


def test_openhands_event_stream() -> None:
    t = load_one("openhands_events.json")
    assert_valid(t)
    assert t.source_format == "openhands_events"
    assert roles(t) == ["user", "assistant"] * 3
    assert t.messages[0].content == "what's 1+1?"
    assert t.messages[0].timestamp == "2025-02-01T00:14:10.787622"
    finish = t.messages[-1]
    assert finish.content == "All done! What's next on the agenda?"
    assert finish.tool_calls[0].id == "call_IpyczPgEAwtpRWFZ2RNokTdH"
    assert finish.tool_calls[0].function.name == "finish"
    assert finish.tool_calls[0].function.arguments == "{}"
    assert finish.usage.input_tokens == 2473
    assert finish.metadata["action"] == "finish"
    assert t.model == "gpt-4o-2024-08-06"


def test_openhands_events_actions_and_observations() -> None:
    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "list files"},
         "message": "list files", "timestamp": "2025-01-01T00:00:00"},
        {"id": 1, "source": "agent", "action": "run",
         "args": {"command": "ls", "thought": "Let me look."}, "message": "Running command: ls"},
        {"id": 2, "source": "agent", "observation": "run", "cause": 1, "content": "a.txt",
         "extras": {"exit_code": 0}, "message": "Command `ls` executed"},
        {"id": 3, "source": "environment", "observation": "agent_state_changed",
         "content": "", "extras": {"agent_state": "running"}},
        {"id": 4, "source": "environment", "observation": "recall", "content": "repo notes"},
    ]
    [t] = load_transcripts_from_bytes(json.dumps(events).encode())
    assert_valid(t)
    assert roles(t) == ["user", "assistant", "tool", "user"]
    run = t.messages[1]
    assert run.content == "Let me look."
    assert run.tool_calls[0].id == "openhands-1"
    assert run.tool_calls[0].function.name == "run"
    assert json.loads(run.tool_calls[0].function.arguments) == {"command": "ls"}
    result = t.messages[2]
    assert result.tool_call_id == "openhands-1" and result.content == "a.txt"
    assert result.metadata["extras"] == {"exit_code": 0}
    assert t.messages[3].metadata["observation"] is True
    assert t.messages[3].metadata["observationType"] == "recall"
    assert any("agent_state_changed" in w for w in t.warnings)


def test_locomo_synthetic() -> None:
    transcripts = load_transcripts(fixture("locomo_synthetic.json"))
    assert [t.title for t in transcripts] == ["synthetic-1", "synthetic-2"]
    t = transcripts[0]
    assert_valid(t)
    assert t.source_format == "locomo"
    # each dated session opens with one short system message; the turns follow it
    assert roles(t) == ["system", "user", "assistant", "user", "system", "assistant", "user", "system", "assistant"]
    turns = [m for m in t.messages if m.role != "system"]
    photo = turns[2]
    # the image that came with the turn is typed content beside the words, not appended to them
    assert photo.content == [TextBlock(text="Her name is Pixel. Look at her!"),
                             ImageBlock(description="a photo of a grey cat on a sofa",
                                        url="https://example.invalid/pixel.jpg")]
    assert photo.name == "Ada"  # OpenAI's name field: the speaker
    assert photo.metadata["dia_id"] == "D1:3"
    assert photo.metadata["speaker"] == "Ada"
    assert photo.metadata["session"] == 1
    assert photo.metadata["sessionDateTime"] == "9:05 am on 3 March, 2024"
    assert "img_url" not in photo.metadata and "blip_caption" not in photo.metadata  # (in the block)
    assert photo.timestamp == "2024-03-03T09:05:00"
    assert [m.name for m in turns] == ["Ada", "Ben", "Ada", "Ben", "Ada", "Ben"]
    # the speakers' words are the source's text, untouched
    assert turns[0].content == "Hi Ben! I finally adopted a cat last weekend."
    # sessions in numeric order: 1, 2, 10
    assert [m.metadata["session"] for m in turns] == [1, 1, 1, 2, 2, 10]
    markers = [m for m in t.messages if m.role == "system"]
    assert [m.content for m in markers] == ["[Session 1: 9:05 am on 3 March, 2024]",
                                            "[Session 2: 6:40 pm on 10 March, 2024]",
                                            "[Session 10: 8:00 am on 1 April, 2024]"]
    assert markers[1].metadata == {"session": 2, "sessionDateTime": "6:40 pm on 10 March, 2024",
                                   "sessionStart": True}
    assert markers[1].timestamp == "2024-03-10T18:40:00" and markers[1].name is None
    assert t.messages[-1].metadata["dia_id"] == "D10:1"
    assert len(t.metadata["qa"]) == 3
    assert t.metadata["qa"][0]["evidence"] == ["D1:3"]
    assert t.metadata["speaker_a"] == "Ada" and t.metadata["speaker_b"] == "Ben"
    assert "session_summary" in t.metadata
    dia_ids = {m.metadata["dia_id"] for m in turns}
    assert all(e in dia_ids for qa in t.metadata["qa"] for e in qa["evidence"])
    assert not any("dia_id" in (m.metadata or {}) for m in markers)


def test_locomo_speaker_names_fit_openai_name_field() -> None:
    from ctxd.importers.locomo import openai_name

    assert openai_name("Caroline") == "Caroline"
    assert openai_name("Mary Ann O'Neil") == "Mary_Ann_O_Neil"
    assert openai_name("Zoë-Jane") == "Zoe-Jane"
    assert openai_name("  Dr. Who?  ") == "Dr_Who"
    assert openai_name("李明") is None and openai_name(None) is None and openai_name("") is None
    long = openai_name("x" * 100)
    assert long == "x" * 64
    sample = {"sample_id": "s", "conversation": {
        "speaker_a": "Mary Ann", "speaker_b": "李明",
        "session_1": [{"speaker": "Mary Ann", "dia_id": "D1:1", "text": "Hi  there!\n"},
                      {"speaker": "李明", "dia_id": "D1:2", "text": "Hello."}]}}
    [t] = load_transcripts_from_bytes(json.dumps([sample]).encode(), format="locomo")
    assert [(m.role, m.name) for m in t.messages] == [("user", "Mary_Ann"), ("assistant", None)]
    assert t.messages[0].content == "Hi  there!\n"  # verbatim; no date, so no session message
    assert t.messages[1].metadata["speaker"] == "李明"


# ------------------------------------------------------------------ OpenAI chat shapes


def test_openai_chat_shapes_and_image_placeholder() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:..."}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "look", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
        {"role": "assistant", "content": "A cat.", "refusal": None},
    ]
    [bare] = load_transcripts_from_bytes(json.dumps(messages).encode())
    [wrapped] = load_transcripts_from_bytes(
        json.dumps({"messages": messages, "model": "gpt-4o", "title": "cats"}).encode())
    jsonl = "\n".join(json.dumps(m) for m in messages).encode()
    [lines] = load_transcripts_from_bytes(jsonl)
    for t in (bare, wrapped, lines):
        assert_valid(t)
        assert t.source_format == "openai_chat"
        assert roles(t) == ["system", "user", "assistant", "tool", "assistant"]
        assert t.messages[1].content == [TextBlock(text="what is this?"),
                                         TextBlock(text="[image omitted]")]
        assert t.messages[2].content is None
        assert t.messages[2].tool_calls[0].function.arguments == "{\"x\": 1}"
        assert any("image_url" in w for w in t.warnings)
    assert wrapped.title == "cats" and wrapped.model == "gpt-4o" and wrapped.provider == "openai"
    assert "line 2" in lines.warnings[0]


def test_openai_chat_jsonl_of_conversations() -> None:
    data = b"\n".join(json.dumps({"messages": [{"role": "user", "content": f"hi {n}"}],
                                  "id": n}).encode() for n in range(3))
    transcripts = load_transcripts_from_bytes(data, name="convs.jsonl")
    assert [t.messages[0].content for t in transcripts] == ["hi 0", "hi 1", "hi 2"]
    assert [t.metadata["id"] for t in transcripts] == [0, 1, 2]
    assert all(t.title is None for t in transcripts)


def test_orphan_tool_result_kept_with_warning() -> None:
    messages = [{"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "nope", "content": "result"}]
    [t] = load_transcripts_from_bytes(json.dumps(messages).encode())
    assert roles(t) == ["user", "tool"]
    assert any("'nope'" in w and "no earlier tool call" in w for w in t.warnings)


def test_unknown_role_and_invalid_message() -> None:
    messages = [{"role": "developer", "content": "rules"},
                {"role": "critic", "content": "hmm"},
                {"role": "user", "content": "fine", "timestamp": "2024-01-01T00:00:00Z"}]
    [t] = load_transcripts_from_bytes(json.dumps(messages).encode())
    assert roles(t) == ["system", "user", "user"]
    assert t.messages[0].metadata == {"originalRole": "developer"}
    assert t.messages[1].metadata == {"originalRole": "critic"}
    assert t.messages[2].timestamp == "2024-01-01T00:00:00Z"
    assert any("critic" in w for w in t.warnings)


# ------------------------------------------------------------------ Claude Code details


def _cc(uuid, parent, kind, message, ts, **extra):
    return json.dumps({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s",
                       "timestamp": ts, "message": message, **extra})


def test_claude_code_ordering_merging_and_blocks() -> None:
    reply = {"id": "msg_1", "role": "assistant", "model": "claude-x",
             "usage": {"input_tokens": 5, "output_tokens": 1}}
    lines = [
        json.dumps({"type": "summary", "summary": "Fix the tests", "leafUuid": "d"}),
        json.dumps({"type": "file-history-snapshot", "messageId": "a", "snapshot": {}}),
        _cc("a", None, "user", {"role": "user", "content": "please fix"}, "2025-01-01T00:00:00Z"),
        # written out of order: the tool result before the reply that called it
        _cc("d", "c", "user", {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": [
                {"type": "text", "text": "ok"}, {"type": "image", "source": {}}]}]},
            "2025-01-01T00:00:03Z"),
        _cc("b", "a", "assistant", {**reply, "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"}]},
            "2025-01-01T00:00:01Z"),
        _cc("c", "b", "assistant", {**reply, "content": [
            {"type": "text", "text": "running"},
            {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}}],
            "usage": {"input_tokens": 5, "output_tokens": 9}, "stop_reason": "tool_use"},
            "2025-01-01T00:00:02Z"),
    ]
    [t] = load_transcripts_from_bytes("\n".join(lines).encode())
    assert_valid(t)
    assert t.title == "Fix the tests"
    assert roles(t) == ["user", "assistant", "user"]
    merged = t.messages[1]
    assert [type(b) for b in merged.content] == [ThinkingBlock, TextBlock, ToolUseBlock]
    assert merged.content[0].signature == "sig"
    assert merged.usage.output_tokens == 9
    assert merged.metadata["uuids"] == ["b", "c"]
    assert merged.metadata["stop_reason"] == "tool_use"
    assert merged.timestamp == "2025-01-01T00:00:01Z"
    result = t.messages[2].content[0]
    assert result.content == [TextBlock(text="ok"), TextBlock(text="[image omitted]")]
    assert any("skipped 1 summary record" in w for w in t.warnings)
    assert any("skipped 1 file-history-snapshot record" in w for w in t.warnings)
    assert any("image" in w for w in t.warnings)


def test_claude_code_duplicate_uuid_and_orphan_result() -> None:
    lines = [
        _cc("a", None, "user", {"role": "user", "content": "hi"}, "2025-01-01T00:00:00Z"),
        _cc("a", None, "user", {"role": "user", "content": "hi"}, "2025-01-01T00:00:00Z"),
        _cc("b", "a", "user", {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "ghost", "content": "?"}]},
            "2025-01-01T00:00:01Z"),
    ]
    [t] = load_transcripts_from_bytes("\n".join(lines).encode())
    assert roles(t) == ["user", "user"]
    assert any("repeating an earlier uuid (line 2)" in w for w in t.warnings)
    assert any("'ghost'" in w and "no earlier tool_use" in w for w in t.warnings)


def test_non_iso_timestamp_moves_to_metadata() -> None:
    messages = [{"role": "user", "content": "hi", "timestamp": "yesterday"},
                {"role": "user", "content": "hi", "timestamp": 1700000000}]
    [t] = load_transcripts_from_bytes(json.dumps(messages).encode())
    assert t.messages[0].timestamp is None
    assert t.messages[0].metadata == {"timestamp": "yesterday"}
    assert t.messages[1].timestamp == "2023-11-14T22:13:20Z"
    assert any("not ISO 8601" in w for w in t.warnings)


# ------------------------------------------------------------------ detection


@pytest.mark.parametrize("name, expected", [
    ("claude_code_session.jsonl", "claude_code"),
    ("mini_swe_agent.traj.json", "mini_swe_agent"),
    ("mini_swe_agent_reasoner.traj.json", "mini_swe_agent"),
    ("mini_swe_agent_legacy.traj.json", "openai_chat"),
    ("swe_agent_legacy.traj", "swe_agent"),
    ("swe_agent_function_calling.traj", "swe_agent"),
    ("openhands_completion.json", "openhands"),
    ("openhands_events.json", "openhands_events"),
    ("locomo_synthetic.json", "locomo"),
])
def test_detect_format(name: str, expected: str, tmp_path: Path) -> None:
    path = fixture(name)
    assert detect_format(path) == expected
    assert detect_format(str(path)) == expected
    assert detect_format(path.read_bytes()) == expected
    # the decision comes from the content, not the file name
    renamed = tmp_path / "transcript.txt"
    renamed.write_bytes(path.read_bytes())
    assert detect_format(renamed) == expected
    assert load_transcripts(renamed)[0].source_format == expected


def test_detect_format_of_decoded_json() -> None:
    assert detect_format([{"role": "user", "content": "hi"}]) == "openai_chat"
    assert detect_format('{"messages": [{"role": "user", "content": "hi"}]}') == "openai_chat"


def test_explicit_format() -> None:
    t = load_one("mini_swe_agent_legacy.traj.json", format="openai_chat")
    assert len(t.messages) == 22
    with pytest.raises(TranscriptError, match="does not look like locomo"):
        load_transcripts(fixture("mini_swe_agent_legacy.traj.json"), format="locomo")
    with pytest.raises(TranscriptError, match="unknown format 'nope'"):
        load_transcripts(fixture("mini_swe_agent_legacy.traj.json"), format="nope")


# ------------------------------------------------------------------ bad files


def _error_for(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TranscriptError) as info:
        load_transcripts(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    with pytest.raises(TranscriptError):
        detect_format(path)
    return message


def test_empty_file(tmp_path: Path) -> None:
    assert "empty" in _error_for(tmp_path, "empty.json", b"")
    assert "empty" in _error_for(tmp_path, "blank.jsonl", b"  \n\n")


def test_not_json(tmp_path: Path) -> None:
    message = _error_for(tmp_path, "notes.json", b"hello, this is not JSON\n")
    assert "not JSON" in message


def test_broken_json(tmp_path: Path) -> None:
    message = _error_for(tmp_path, "broken.json", b'{\n  "messages": [\n    {"role": "user",,}\n]}')
    assert "not valid JSON" in message and "line 3" in message


def test_jsonl_with_one_broken_line(tmp_path: Path) -> None:
    good = json.dumps({"role": "user", "content": "hi"}).encode()
    message = _error_for(tmp_path, "chat.jsonl", b"\n".join([good, good, b'{"role": "us', good]))
    assert "line 3" in message and "not valid JSON" in message


def test_unknown_shape(tmp_path: Path) -> None:
    message = _error_for(tmp_path, "config.json", b'{"agent_class": "x", "max_iterations": 3}')
    assert "not a recognised transcript" in message
    assert "agent_class" in message
    assert "expected one of" in message
    assert "not a recognised transcript" in _error_for(tmp_path, "nums.json", b"[1, 2, 3]")
    assert "not a recognised transcript" in _error_for(tmp_path, "list.json", b"[]")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TranscriptError, match="no such file"):
        load_transcripts(tmp_path / "missing.json")
    with pytest.raises(TranscriptError, match="is a directory"):
        load_transcripts(tmp_path)


def test_transcript_error_is_value_error() -> None:
    assert issubclass(TranscriptError, ValueError)


# ------------------------------------------------------------------ speed


def test_a_large_file_loads_whole() -> None:
    """~3 MB of OpenAI chat (the size of the biggest real trajectories): every message.
    (Its time is a benchmark's to measure, not a test's: a loaded machine took over 1 s.)"""
    message = {"role": "tool", "tool_call_id": "c", "content": "x" * 2000}
    call = {"role": "assistant", "content": "step", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    data = json.dumps([call, message] * 1500).encode()
    assert len(data) > 3_000_000
    [t] = load_transcripts_from_bytes(data)
    assert len(t.messages) == 3000
    assert t.messages[-1].content == "x" * 2000
