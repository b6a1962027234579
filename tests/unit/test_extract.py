"""Structured extraction on small realistic transcripts of the agent formats ctxd meets."""

from __future__ import annotations

import json
import time

import msgspec

from ctxd.engine.extract import Extraction, extract
from ctxd.protocol.message import FunctionCall, Message, ToolCall


def msg(data: dict) -> Message:
    return msgspec.convert(data, Message)


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=json.dumps(arguments)))


# A Claude Code session (Anthropic blocks): Read, Edit, Write, Bash.
CLAUDE_CODE = [
    msg({"role": "user", "content": "The discount is wrong for VIP customers. Fix it and keep the API unchanged."}),
    msg({"role": "assistant", "content": [
        {"type": "text", "text": "I'll look at the pricing module first."},
        {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/repo/shop/pricing.py"}},
    ]}),
    msg({"role": "user", "content": [{"type": "tool_result", "toolUseId": "toolu_01", "content": (
        "     1→def discount(customer):\n     2→    if customer.vip:\n     3→        raise ValueError('vip')\n")}]}),
    msg({"role": "assistant", "content": [
        {"type": "text", "text": "I decided to use a lookup table instead of the if-chain, because tiers will grow."},
        {"type": "tool_use", "id": "toolu_02", "name": "Edit", "input": {
            "file_path": "/repo/shop/pricing.py", "old_string": "if customer.vip:", "new_string": "rate = RATES"}},
        {"type": "tool_use", "id": "toolu_03", "name": "Write", "input": {
            "file_path": "/repo/tests/test_pricing.py", "content": "def test_vip():\n    assert True\n"}},
    ]}),
    msg({"role": "user", "content": [
        {"type": "tool_result", "toolUseId": "toolu_02", "content": "The file /repo/shop/pricing.py has been updated."},
        {"type": "tool_result", "toolUseId": "toolu_03",
         "content": "File created successfully at: /repo/tests/test_pricing.py"},
    ]}),
    msg({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_04", "name": "Bash", "input": {
            "command": "cd /repo && python -m pytest tests/test_pricing.py -q 2>&1 | tail -5",
            "description": "Run the pricing tests"}},
    ]}),
    msg({"role": "user", "content": [{"type": "tool_result", "toolUseId": "toolu_04", "isError": True, "content": (
        "Exit code 1\nF\n=================================== FAILURES ===================================\n"
        "E       AssertionError: assert 0.9 == 0.8\n"
        "FAILED tests/test_pricing.py::test_vip - AssertionError: assert 0.9 == 0.8\n"
        "1 failed in 0.03s")}]}),
    msg({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_05", "name": "Bash", "input": {
            "command": "sed -i 's/0.9/0.8/' shop/rates.py && grep -n VIP shop/rates.py > /tmp/vip.txt"}},
    ]}),
    msg({"role": "user", "content": [{"type": "tool_result", "toolUseId": "toolu_05", "content": ""}]}),
    msg({"role": "assistant", "content": (
        "The VIP rate is now 0.8 and the tests pass.\n\n## Next steps\n- Add a test for the GOLD tier\n"
        "- Update CHANGELOG.md\n\n[NEXT] Run the linter on shop/")}),
]

# An OpenHands session (OpenAI tool_calls, str_replace_editor, execute_bash).
OPENHANDS = [
    msg({"role": "user", "content": [{"type": "text", "text": "<uploaded_files>\n/workspace/proj\n</uploaded_files>\n"
                                                            "Fix the timezone bug in the MySQL backend."}]}),
    msg({"role": "assistant", "content": "Let me reproduce it first.", "toolCalls": [
        msgspec.to_builtins(call("t1", "str_replace_editor", command="create", path="/workspace/reproduce.py",
                                 file_text="import django\nprint(1 > 0)\n"))]}),
    msg({"role": "tool", "toolCallId": "t1", "content": "File created successfully at: /workspace/reproduce.py"}),
    msg({"role": "assistant", "toolCalls": [
        msgspec.to_builtins(call("t2", "execute_bash", command="python3 /workspace/reproduce.py"))]}),
    msg({"role": "tool", "toolCallId": "t2", "content": (
        "Traceback (most recent call last):\n  File \"/workspace/reproduce.py\", line 1, in <module>\n"
        "    import MySQLdb\nModuleNotFoundError: No module named 'MySQLdb'\n"
        "[Python Interpreter: /opt/miniconda3/envs/testbed/bin/python]\n[Command finished with exit code 1]")}),
    msg({"role": "assistant", "toolCalls": [
        msgspec.to_builtins(call("t3", "str_replace_editor", command="view",
                                 path="/workspace/proj/django/db/backends/mysql/operations.py"))]}),
    msg({"role": "tool", "toolCallId": "t3", "content": (
        "   70\t    def _convert_field_to_tz(self, field_name, tzname):\n"
        "   71\t        if settings.USE_TZ:\n   72\t            raise NotImplementedError('x')\n")}),
    msg({"role": "assistant", "content": "The fix: use the database TIME_ZONE instead of 'UTC'.", "toolCalls": [
        msgspec.to_builtins(call("t4", "str_replace_editor", command="str_replace",
                                 path="/workspace/proj/django/db/backends/mysql/operations.py",
                                 old_str="'UTC'", new_str="self.connection.timezone_name"))]}),
    msg({"role": "tool", "toolCallId": "t4", "content": "The file /workspace/proj/django/db/backends/mysql/"
                                                         "operations.py has been edited."}),
    msg({"role": "assistant", "toolCalls": [
        msgspec.to_builtins(call("t5", "execute_bash",
                                 command="cd /workspace/proj && grep -rn 'UTC' tests/"))]}),
    msg({"role": "tool", "toolCallId": "t5", "content": "[Command finished with exit code 1]"}),
]

# mini-swe-agent's text protocol: one ```bash block per assistant turn, results as user turns.
MINI_SWE = [
    msg({"role": "system", "content": "You are a helpful assistant that can interact with a computer."}),
    msg({"role": "user", "content": "Please solve this issue: sqlfluff L003 indents WITH wrong."}),
    msg({"role": "assistant", "content": "THOUGHT: I need to create a test file.\n\n```bash\n"
                                         "cat <<'EOF' > test_with.sql\nSELECT a > b FROM t\nEOF\n```"}),
    msg({"role": "user", "content": "<returncode>0</returncode>\n<output>\n</output>"}),
    msg({"role": "assistant",
         "content": "THOUGHT: Run the linter on it.\n\n```bash\nsqlfluff lint test_with.sql\n```"}),
    msg({"role": "user", "content": "<returncode>65</returncode>\n<output>\nL:   2 | P:   5 | L003 | Indent expected\n"
                                    "</output>"}),
]

# A plain chat with goal markers and decision phrasing.
MARKERS = [
    msg({"role": "user", "content": "Let's go with Postgres for the session store. Don't use Redis."}),
    msg({"role": "assistant", "content": (
        "[GOAL] Implement user authentication system\n"
        "[DECISION] Use JWT for authentication - LOCKED\n"
        "[ARTIFACT] Created src/auth/login.ts\n"
        "[ARTIFACT] Modified src/routes/api.ts\n"
        "We settled on bcrypt with cost 12 for password hashing. Updated `src/auth/hash.ts` accordingly.\n"
        "TODO: rotate the signing key weekly\n"
        "[NEXT] Complete JWT token generation, then move to user registration")}),
]


def test_claude_code_transcript() -> None:
    ex = extract(CLAUDE_CODE)
    assert ex.files_modified == ["/repo/shop/pricing.py", "/repo/tests/test_pricing.py", "shop/rates.py",
                                 "/tmp/vip.txt"]
    tools = {t.name: t for t in ex.tools_used}
    assert tools["Bash"].count == 2 and tools["Read"].count == 1 and tools["Edit"].count == 1
    assert ex.tools_used[0].name == "Bash"  # most used first
    assert tools["Edit"].notable_uses == ["Edited /repo/shop/pricing.py"]
    assert tools["Write"].notable_uses == ["Wrote /repo/tests/test_pricing.py"]
    assert tools["Read"].notable_uses == ["file_path=/repo/shop/pricing.py"]
    assert ex.key_decisions == [
        "I decided to use a lookup table instead of the if-chain, because tiers will grow."]
    assert ex.commands == ["cd /repo && python -m pytest tests/test_pricing.py -q 2>&1 | tail -5",
                           "sed -i 's/0.9/0.8/' shop/rates.py && grep -n VIP shop/rates.py > /tmp/vip.txt"]
    assert "`cd /repo && python -m pytest tests/test_pricing.py -q 2>&1 | tail -5` exited with code 1" in ex.errors
    assert "FAILED tests/test_pricing.py::test_vip - AssertionError: assert 0.9 == 0.8" in ex.errors
    assert "E       AssertionError: assert 0.9 == 0.8" in ex.errors
    assert not any("raise ValueError" in e for e in ex.errors)  # code in a file listing is not an error
    assert ex.next_steps == ["Run the linter on shop/", "Add a test for the GOLD tier", "Update CHANGELOG.md"]


def test_openhands_transcript() -> None:
    ex = extract(OPENHANDS)
    assert ex.files_modified == ["/workspace/reproduce.py",
                                 "/workspace/proj/django/db/backends/mysql/operations.py"]
    editor = next(t for t in ex.tools_used if t.name == "str_replace_editor")
    assert editor.count == 3
    assert editor.notable_uses == ["Created /workspace/reproduce.py",
                                   "Viewed /workspace/proj/django/db/backends/mysql/operations.py",
                                   "Edited /workspace/proj/django/db/backends/mysql/operations.py"]
    assert "ModuleNotFoundError: No module named 'MySQLdb'" in ex.errors  # interpreter note stripped
    assert "`python3 /workspace/reproduce.py` exited with code 1" in ex.errors
    assert not any("grep" in e for e in ex.errors)  # grep's status 1 means "no match"
    assert not any("NotImplementedError" in e for e in ex.errors)
    assert ex.commands == ["python3 /workspace/reproduce.py", "cd /workspace/proj && grep -rn 'UTC' tests/"]


def test_mini_swe_text_protocol() -> None:
    ex = extract(MINI_SWE)
    assert ex.commands == ["cat <<'EOF' > test_with.sql\nSELECT a > b FROM t\nEOF", "sqlfluff lint test_with.sql"]
    assert ex.files_modified == ["test_with.sql"]  # the heredoc body's ">" is data, not a redirection
    assert ex.errors == ["`sqlfluff lint test_with.sql` exited with code 65"]


def test_markers_and_decision_phrases() -> None:
    ex = extract(MARKERS)
    assert ex.key_decisions == [
        "Let's go with Postgres for the session store.",
        "Use JWT for authentication - LOCKED",
        "We settled on bcrypt with cost 12 for password hashing.",
    ]
    assert ex.files_modified == ["src/auth/login.ts", "src/routes/api.ts", "src/auth/hash.ts"]
    assert ex.next_steps == ["Complete JWT token generation, then move to user registration",
                             "TODO: rotate the signing key weekly"]
    assert ex.tools_used == [] and ex.commands == [] and ex.errors == []


def test_patches_and_shell_writes() -> None:
    patch = ("*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n*** Add File: docs/notes.md\n+hi\n"
             "*** End Patch")
    messages = [
        msg({"role": "assistant", "toolCalls": [
            msgspec.to_builtins(call("p1", "apply_patch", input=patch)),
            msgspec.to_builtins(call("p2", "shell", command=["bash", "-lc", "echo x | tee -a out/log.txt"])),
            msgspec.to_builtins(call("p3", "run_terminal_cmd", command="make 2>&1 >build.txt; touch .stamp")),
            msgspec.to_builtins(call("p4", "bash", command="ls > /dev/null 2>&1 && echo '>' not-a-file")),
            msgspec.to_builtins(call("p5", "bash", command="git diff -U0 >> patch.diff")),
        ]}),
        msg({"role": "assistant", "content": [{"type": "tool_use", "id": "p6", "name": "MultiEdit", "input": {
            "file_path": "lib/util.ts", "edits": [{"old_string": "a", "new_string": "b"}]}}]}),
        msg({"role": "assistant", "content": [{"type": "tool_use", "id": "p7", "name": "str_replace_based_edit_tool",
                                               "input": {"command": "view", "path": "README.md"}}]}),
    ]
    ex = extract(messages)
    assert ex.files_modified == ["src/app.py", "docs/notes.md", "out/log.txt", "build.txt", ".stamp",
                                 "patch.diff", "lib/util.ts"]
    assert "echo x | tee -a out/log.txt" in ex.commands


def test_extractive_checkpoint_sections_are_read_back() -> None:
    checkpoint = msg({"role": "assistant", "content": (
        "Task:\n- Fix the VIP discount\n\nDecisions:\n- Use a lookup table for rates\n\n"
        "Files:\n- shop/pricing.py\n- tests/test_pricing.py\n\nCommands:\n- `pytest -q`\n\n"
        "Errors:\n- AssertionError: assert 0.9 == 0.8\n\nNext:\n- Add the GOLD tier")})
    ultra = msg({"role": "assistant", "content": (
        "Task: Fix the VIP discount\nDecisions: Use a lookup table; Keep the API\n"
        "Files: shop/pricing.py, shop/rates.py\nNext: Add the GOLD tier")})
    ex = extract([checkpoint, ultra])
    assert ex.key_decisions == ["Use a lookup table for rates", "Use a lookup table", "Keep the API"]
    assert ex.files_modified == ["shop/pricing.py", "tests/test_pricing.py", "shop/rates.py"]
    assert ex.next_steps == ["Add the GOLD tier"]
    assert ex.commands == ["pytest -q"]
    assert ex.errors == ["AssertionError: assert 0.9 == 0.8"]


def test_llm_continuation_headings_are_read() -> None:
    summary = msg({"role": "assistant", "content": (
        "## Accomplished\nAdded retries.\n## Files\n[ARTIFACT] Modified src/client.py - retry loop\n"
        "## Decisions\n[DECISION] Never retry 4xx except 408 and 429\n## Next steps\n[NEXT] Document backoff\n")})
    ex = extract([summary])
    assert ex.files_modified == ["src/client.py"]
    assert ex.key_decisions == ["Never retry 4xx except 408 and 429"]
    assert ex.next_steps == ["Document backoff"]


def test_prose_next_is_not_a_heading() -> None:
    ex = extract([msg({"role": "assistant", "content": "Next, I will run the migrations. Files are in place."})])
    assert ex.next_steps == ["Next, I will run the migrations."]
    assert ex.files_modified == []


def test_empty_and_odd_messages() -> None:
    assert extract([]) == Extraction()
    assert extract([]).is_empty()
    odd = [
        msg({"role": "assistant", "toolCalls": [{"id": "x", "function": {"name": "bash", "arguments": "{not json"}}]}),
        msg({"role": "tool", "toolCallId": "unknown",
             "content": [{"type": "text", "text": "fatal: not a git repository"}]}),
        msg({"role": "assistant", "content": [{"type": "thinking", "thinking": "We decided nothing here."}]}),
        msg({"role": "user", "content": None}),
    ]
    ex = extract(odd)
    assert ex.errors == ["fatal: not a git repository"]
    assert ex.key_decisions == []  # thinking is not a record of decisions
    assert ex.tools_used[0].name == "bash" and ex.tools_used[0].count == 1


def test_lists_are_capped() -> None:
    many = [msg({"role": "assistant",
                 "toolCalls": [msgspec.to_builtins(call(f"c{i}", "bash", command=f"echo {i} > f{i}.txt"))]})
            for i in range(200)]
    ex = extract(many, max_items=20)
    assert len(ex.files_modified) == 40 and ex.files_modified[0] == "f0.txt"
    assert len(ex.commands) == 20 and ex.commands[-1] == "echo 199 > f199.txt"  # most recent kept


def test_large_transcript_is_linear_and_fast() -> None:
    """200k tokens' worth of tool output and prose: far under a second (the target is ~20 ms)."""
    listing = "".join(f"    {i}\tdef handler_{i}(request):  # raise ValueError on bad input\n" for i in range(400))
    messages: list[Message] = []
    for i in range(60):
        messages.append(msg({"role": "assistant", "content": f"Now I will inspect module {i}. It looks fine.",
                             "toolCalls": [msgspec.to_builtins(call(f"c{i}", "bash", command=f"cat src/m{i}.py"))]}))
        messages.append(msg({"role": "tool", "toolCallId": f"c{i}", "content": listing}))
    total_chars = sum(len(listing) for _ in range(60))
    assert total_chars > 800_000
    started = time.perf_counter()
    ex = extract(messages)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5
    assert ex.errors == [] and len(ex.commands) == 50
