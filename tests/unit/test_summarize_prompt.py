"""The summarization prompt: goal, level, focus, continuation framing, message rendering."""

from __future__ import annotations

import msgspec

from ctxd.protocol.message import Message
from ctxd.summarize.base import SummaryRequest
from ctxd.summarize.prompt import build_prompt, cut_middle, render_message, render_messages

GOAL = ("ACTIVE GOAL: Implement user authentication system\nPriority: high\nStatus: active\n\n"
        "LOCKED DECISIONS:\n🔒 Use JWT for authentication")

MESSAGES = [
    msgspec.convert({"role": "user", "content": "Add login to src/auth/login.ts. Never store passwords in plain text."},
                    Message),
    msgspec.convert({"role": "assistant", "content": "I will hash with bcrypt.", "toolCalls": [
        {"id": "c1", "function": {"name": "bash", "arguments": "{\"command\": \"npm test\"}"}}]}, Message),
    msgspec.convert({"role": "tool", "toolCallId": "c1", "content": "2 passing"}, Message),
    msgspec.convert({"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The token needs an expiry."},
        {"type": "text", "text": "Now the JWT part."},
        {"type": "tool_use", "id": "t2", "name": "Write", "input": {"file_path": "src/auth/jwt.ts", "content": "x"}},
    ]}, Message),
    msgspec.convert({"role": "user", "content": [
        {"type": "tool_result", "toolUseId": "t2", "content": "permission denied", "isError": True}]}, Message),
]


def request(**overrides: object) -> SummaryRequest:
    values: dict[str, object] = {"messages": MESSAGES, "level": "moderate", "target_tokens": 300}
    values.update(overrides)
    return SummaryRequest(**values)  # type: ignore[arg-type]


def test_prompt_is_deterministic() -> None:
    assert build_prompt(request(goal=GOAL, focus="the JWT expiry")) == build_prompt(request(goal=GOAL,
                                                                                            focus="the JWT expiry"))


def test_system_turn_has_level_target_format_and_rules() -> None:
    system, user = build_prompt(request())
    assert system.role == "system" and user.role == "user"
    assert "MODERATE summary" in system.content
    assert "at most 300 tokens" in system.content
    for heading in ("## Accomplished", "## Current work", "## Files", "## Decisions", "## Next steps"):
        assert heading in system.content  # three-layer compaction's continuation prompt
    assert "[DECISION]" in system.content and "[NEXT]" in system.content and "[ARTIFACT]" in system.content
    assert "verbatim" in system.content and "LOCKED" in system.content
    assert "WITHOUT the history" in system.content


def test_each_level_has_its_instruction() -> None:
    texts = {level: build_prompt(request(level=level))[0].content for level in
             ("detailed", "moderate", "compact", "ultra")}
    assert "DETAILED" in texts["detailed"] and "code that matters" in texts["detailed"]
    assert "COMPACT" in texts["compact"] and "No code" in texts["compact"]
    assert "ULTRA-COMPACT" in texts["ultra"] and "## Accomplished" not in texts["ultra"]
    assert len(set(texts.values())) == 4


def test_goal_and_focus_come_before_the_conversation() -> None:
    _, user = build_prompt(request(goal=GOAL, focus="the JWT expiry"))
    text = user.content
    assert text.index("ACTIVE GOAL") < text.index("PRESERVE:") < text.index("CONVERSATION TO SUMMARIZE:")
    assert "SUMMARIZE AGGRESSIVELY" in text
    assert "focus on: the JWT expiry" in text
    assert text.rstrip().endswith("that keeps what is needed to continue the work.")
    _, plain = build_prompt(request())
    assert "ACTIVE GOAL" not in plain.content and "PRESERVE" not in plain.content


def test_rendering_of_both_tool_styles() -> None:
    rendered = render_messages(request())
    assert rendered[0] == "USER: Add login to src/auth/login.ts. Never store passwords in plain text."
    assert rendered[1] == 'ASSISTANT: I will hash with bcrypt.\n→ tool bash({"command": "npm test"})'
    assert rendered[2] == "TOOL RESULT (bash): 2 passing"
    assert rendered[3] == ("ASSISTANT (thinking): The token needs an expiry.\nASSISTANT: Now the JWT part.\n"
                           '→ tool Write({"file_path":"src/auth/jwt.ts","content":"x"})')
    assert rendered[4] == "TOOL ERROR (Write): permission denied"


def test_checkpoint_merge_labels_old_summaries() -> None:
    old = [Message(role="assistant", content="Did A."), Message(role="assistant", content="Did B.")]
    req = SummaryRequest(messages=old, level="compact", target_tokens=100, kind="checkpoint_merge")
    system, user = build_prompt(req)
    assert "merge earlier summaries" in system.content and "later one wins" in system.content
    assert "CHECKPOINTS TO MERGE (oldest first):\nCHECKPOINT 1: Did A.\n\nCHECKPOINT 2: Did B." in user.content


def test_chunk_part_framing() -> None:
    system, user = build_prompt(request(), rendered=["USER: hi there"], part=(2, 3))
    assert "part 2 of 3" in system.content and "part 2 of 3" in user.content
    assert "USER: hi there" in user.content and "Add login" not in user.content


def test_long_results_keep_head_tail_and_errors() -> None:
    output = ("collecting ...\n" + "".join(f"test_{i} PASSED\n" for i in range(400))
              + "Traceback (most recent call last):\n  File \"x.py\", line 3\nKeyError: 'user_id'\n"
              + "".join(f"test_b{i} PASSED\n" for i in range(400)) + "=== 1 failed, 800 passed ===")
    tool = Message(role="tool", tool_call_id="c1", content=output)
    text = render_message(tool, tool_names={"c1": "bash"}, result_chars=600)
    assert text.startswith("TOOL RESULT (bash): collecting ...")
    assert text.endswith("=== 1 failed, 800 passed ===")
    assert "KeyError: 'user_id'" in text
    assert "characters omitted" in text
    assert len(text) < 800


def test_cut_middle_leaves_short_text_alone() -> None:
    assert cut_middle("short", 100) == "short"
    long = "a" * 1000
    cut = cut_middle(long, 100)
    assert cut.startswith("a" * 60) and "omitted" in cut and len(cut) < 160


def test_long_tool_arguments_are_cut() -> None:
    message = msgspec.convert({"role": "assistant", "toolCalls": [{"id": "c", "function": {
        "name": "str_replace_editor",
        "arguments": "{\"command\": \"create\", \"path\": \"a.py\", \"file_text\": \"" + "x = 1\\n" * 500 + "\"}"}}]},
        Message)
    text = render_message(message, args_chars=200)
    assert text.startswith('→ tool str_replace_editor({"command": "create", "path": "a.py"')
    assert len(text) < 320
