"""Rendering the active context in OpenAI, Anthropic and Ollama shapes, with tool-pairing
repair, checked against the providers' structural rules (validate.py)."""

from __future__ import annotations

import json
import random

import pytest

from ctxd.engine.render import (
    MISSING_RESULT,
    RENDERERS,
    PromptPlan,
    render_anthropic,
    render_ollama,
    render_openai,
)
from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
from ctxd.formats.anthropic import OPENER as ANTHROPIC_OPENER
from ctxd.protocol.message import FunctionCall, Message, TextBlock, ThinkingBlock, ToolCall, ToolResultBlock
from ctxd.protocol.providers import (
    AnthropicMessage,
    AnthropicText,
    AnthropicThinking,
    AnthropicToolResult,
    AnthropicToolUse,
    OllamaFunction,
    OllamaMessage,
    OllamaToolCall,
    OpenAIMessage,
)
from ctxd.tokens import MESSAGE_OVERHEAD, TOOL_BLOCK_OVERHEAD

from ._engine_helpers import a_call, a_result, assistant, count, o_call, o_result, signed, system, thinking, user

SYSTEM = "You are a careful assistant."


def render(messages, fmt, system_parts=(SYSTEM,)):
    return RENDERERS[fmt](PromptPlan(system_parts=list(system_parts), messages=list(messages)), count)


def problems(messages, system_parts=(SYSTEM,)):
    """Render in all three shapes; every validation problem, by format."""
    plan = PromptPlan(system_parts=list(system_parts), messages=list(messages))
    out = {}
    r = render_openai(plan, count)
    out["openai"] = validate_openai(r.messages)
    r = render_anthropic(plan, count)
    out["anthropic"] = validate_anthropic(r.system, r.messages, history=messages)
    r = render_ollama(plan, count)
    out["ollama"] = validate_ollama(r.messages)
    return {k: v for k, v in out.items() if v}


def roles(rendered):
    return [m.role for m in rendered.messages]


# --- plain chat -----------------------------------------------------------------------


PLAIN = [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")]


def test_plain_chat_openai():
    r = render(PLAIN, "openai")
    assert r.messages == [OpenAIMessage(role="system", content=SYSTEM), OpenAIMessage(role="user", content="Hi"),
                          OpenAIMessage(role="assistant", content="Hello! How can I help?"),
                          OpenAIMessage(role="user", content="Tell me a joke.")]
    assert r.system is None and r.extra_tokens == 0 and r.repairs == []
    assert validate_openai(r.messages) == []


def test_plain_chat_anthropic():
    r = render(PLAIN, "anthropic")
    assert r.system == SYSTEM
    assert r.messages == [AnthropicMessage("user", [AnthropicText("Hi")]),
                          AnthropicMessage("assistant", [AnthropicText("Hello! How can I help?")]),
                          AnthropicMessage("user", [AnthropicText("Tell me a joke.")])]
    assert r.extra_tokens == 0 and r.repairs == []
    assert validate_anthropic(r.system, r.messages) == []


def test_plain_chat_ollama():
    r = render(PLAIN, "ollama")
    assert r.messages == [OllamaMessage(role="system", content=SYSTEM), OllamaMessage(role="user", content="Hi"),
                          OllamaMessage(role="assistant", content="Hello! How can I help?"),
                          OllamaMessage(role="user", content="Tell me a joke.")]
    assert validate_ollama(r.messages) == []


def test_no_system_parts():
    r = render(PLAIN, "openai", system_parts=())
    assert roles(r) == ["user", "assistant", "user"]
    r = render(PLAIN, "anthropic", system_parts=())
    assert r.system is None
    r = render(PLAIN, "ollama", system_parts=())
    assert roles(r) == ["user", "assistant", "user"]


def test_several_system_parts_are_joined():
    r = render(PLAIN, "openai", system_parts=("a", "b"))
    assert r.messages[0].content == "a\n\nb"
    assert render(PLAIN, "anthropic", system_parts=("a", "b")).system == "a\n\nb"


# --- tools ----------------------------------------------------------------------------


OPENAI_TOOLS = [
    user("What's in config.toml?"),
    o_call(("call_1", "read_file", {"path": "config.toml"}), text="Let me look."),
    o_result("call_1", "debug = true"),
    assistant("Debug mode is on."),
]

ANTHROPIC_TOOLS = [
    user("What's in config.toml?"),
    a_call(("toolu_1", "read_file", {"path": "config.toml"}), text="Let me look."),
    a_result(("toolu_1", "debug = true")),
    assistant("Debug mode is on."),
]


def test_openai_style_tools_in_every_shape():
    r = render(OPENAI_TOOLS, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "assistant"]
    call = r.messages[2]
    assert call.content == "Let me look."
    assert call.tool_calls[0].id == "call_1" and call.tool_calls[0].function.name == "read_file"
    assert json.loads(call.tool_calls[0].function.arguments) == {"path": "config.toml"}
    assert r.messages[3] == OpenAIMessage(role="tool", content="debug = true", tool_call_id="call_1")

    r = render(OPENAI_TOOLS, "anthropic")
    assert [m.role for m in r.messages] == ["user", "assistant", "user", "assistant"]
    assert r.messages[1].content == [AnthropicText("Let me look."),
                                     AnthropicToolUse("call_1", "read_file", {"path": "config.toml"})]
    assert r.messages[2].content == [AnthropicToolResult("call_1", "debug = true")]

    r = render(OPENAI_TOOLS, "ollama")
    assert roles(r) == ["system", "user", "assistant", "tool", "assistant"]
    assert r.messages[2].tool_calls == [OllamaToolCall(OllamaFunction("read_file", {"path": "config.toml"}))]
    assert r.messages[3] == OllamaMessage(role="tool", content="debug = true", tool_name="read_file")
    assert problems(OPENAI_TOOLS) == {}


def test_anthropic_style_tools_in_every_shape():
    r = render(ANTHROPIC_TOOLS, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(r.messages[2].tool_calls[0].function.arguments) == {"path": "config.toml"}
    assert r.messages[3].tool_call_id == "toolu_1"

    r = render(ANTHROPIC_TOOLS, "anthropic")
    assert r.messages[2].content == [AnthropicToolResult("toolu_1", "debug = true")]

    r = render(ANTHROPIC_TOOLS, "ollama")
    assert r.messages[3].tool_name == "read_file"
    assert problems(ANTHROPIC_TOOLS) == {}


def test_anthropic_result_with_user_text_keeps_results_first():
    messages = [user("go"), a_call(("t1", "ls")), a_result(("t1", "a b c"), text="And hurry.")]
    r = render(messages, "anthropic")
    assert r.messages[-1].content == [AnthropicToolResult("t1", "a b c"), AnthropicText("And hurry.")]
    r = render(messages, "openai")
    assert roles(r)[-2:] == ["tool", "user"] and r.messages[-1].content == "And hurry."
    assert problems(messages) == {}


def test_error_results_and_list_content():
    messages = [user("go"), a_call(("t1", "ls")),
                Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content=[TextBlock(text="no such"),
                                                                                          TextBlock(text="dir")],
                                                              is_error=True)])]
    r = render(messages, "anthropic")
    assert r.messages[-1].content == [AnthropicToolResult("t1", "no such\ndir", is_error=True)]
    assert render(messages, "openai").messages[-1].content == "no such\ndir"
    assert problems(messages) == {}


@pytest.mark.parametrize("style", ["openai", "anthropic", "anthropic-split"])
def test_parallel_calls(style):
    if style == "openai":
        messages = [user("go"), o_call(("p1", "ls"), ("p2", "cat"), ("p3", "grep")),
                    o_result("p1", "1"), o_result("p2", "2"), o_result("p3", "3"), assistant("done")]
    elif style == "anthropic":
        messages = [user("go"), a_call(("p1", "ls"), ("p2", "cat"), ("p3", "grep")),
                    a_result(("p1", "1"), ("p2", "2"), ("p3", "3")), assistant("done")]
    else:
        messages = [user("go"), a_call(("p1", "ls"), ("p2", "cat"), ("p3", "grep")),
                    a_result(("p3", "3")), a_result(("p1", "1")), a_result(("p2", "2")), assistant("done")]
    r = render(messages, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [m.tool_call_id for m in r.messages[3:6]] == ["p1", "p2", "p3"]  # in call order
    assert [m.content for m in r.messages[3:6]] == ["1", "2", "3"]
    r = render(messages, "anthropic")
    assert roles(r) == ["user", "assistant", "user", "assistant"]
    assert [b.tool_use_id for b in r.messages[2].content] == ["p1", "p2", "p3"]
    r = render(messages, "ollama")
    assert [m.tool_name for m in r.messages[3:6]] == ["ls", "cat", "grep"]
    assert problems(messages) == {}


def test_result_after_an_interrupting_user_message_is_moved_up():
    messages = [
        user("Run the tests."),
        o_call(("c1", "run_tests")),
        user("Actually, also check lint."),        # the client pushed this before the result
        o_result("c1", "12 passed"),
        assistant("Tests pass; checking lint."),
    ]
    r = render(messages, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert r.messages[3].content == "12 passed"
    assert r.messages[4].content == "Actually, also check lint."
    r = render(messages, "anthropic")
    assert r.messages[2].content == [AnthropicToolResult("c1", "12 passed"),
                                     AnthropicText("Actually, also check lint.")]
    assert r.extra_tokens == 0
    assert problems(messages) == {}


def test_result_interrupted_by_an_assistant_message_anthropic_style():
    messages = [user("go"), a_call(("t1", "slow")), assistant("While waiting..."), a_result(("t1", "done")),
                user("ok")]
    r = render(messages, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert problems(messages) == {}


def test_call_without_result_gets_a_synthesised_result():
    messages = [user("go"), a_call(("lost", "ls")), user("hello?")]
    r = render(messages, "openai")
    assert roles(r) == ["system", "user", "assistant", "tool", "user"]
    assert r.messages[3] == OpenAIMessage(role="tool", content=MISSING_RESULT, tool_call_id="lost")
    assert r.extra_tokens == TOOL_BLOCK_OVERHEAD + count(MISSING_RESULT)
    assert r.repairs == ["synthesised a result for call lost"]
    r = render(messages, "anthropic")
    assert r.messages[2].content[0] == AnthropicToolResult("lost", MISSING_RESULT, is_error=True)
    r = render(messages, "ollama")
    assert r.messages[3] == OllamaMessage(role="tool", content=MISSING_RESULT, tool_name="ls")
    assert problems(messages) == {}


def test_call_at_the_end_without_result():
    messages = [user("go"), o_call(("c1", "ls"))]
    r = render(messages, "anthropic")
    assert roles(r) == ["user", "assistant", "user"]
    assert problems(messages) == {}


def test_orphan_result_is_kept_as_text():
    for orphan in (o_result("gone", "the output"), a_result(("gone", "the output"))):
        messages = [user("go"), orphan, assistant("ok")]
        r = render(messages, "openai")
        assert roles(r) == ["system", "user", "user", "assistant"]
        assert r.messages[2].content == "[tool result gone]\nthe output"
        assert r.repairs == ["orphan result gone kept as text"]
        expected = count("[tool result gone]") + 1
        if orphan.role == "tool":
            expected += MESSAGE_OVERHEAD
        assert r.extra_tokens == expected
        r = render(messages, "anthropic")
        assert r.messages[0].content == [AnthropicText("go"), AnthropicText("[tool result gone]\nthe output")]
        assert problems(messages) == {}


def test_orphan_result_without_id():
    messages = [user("go"), Message(role="tool", content="stray"), assistant("ok")]
    r = render(messages, "openai")
    assert r.messages[2].content == "[tool result]\nstray"
    assert problems(messages) == {}


def test_result_before_its_call_is_an_orphan_and_the_call_gets_a_synthesised_result():
    messages = [user("go"), o_result("c1", "early"), o_call(("c1", "ls")), user("?")]
    r = render(messages, "openai")
    assert r.messages[2].content == "[tool result c1]\nearly"
    assert r.messages[4].content == MISSING_RESULT
    assert problems(messages) == {}


def test_reused_call_ids_pair_in_order():
    messages = [user("go"), o_call(("call_0", "ls")), o_result("call_0", "first"),
                o_call(("call_0", "ls")), o_result("call_0", "second"), assistant("done")]
    r = render(messages, "openai")
    assert [m.content for m in r.messages if m.role == "tool"] == ["first", "second"]
    assert problems(messages) == {}


# --- system messages, first and last turns ----------------------------------------------


def test_system_messages_mid_conversation():
    messages = [user("Hi"), assistant("Hello"), system("The user is in a hurry."), user("Quick: 2+2?")]
    r = render(messages, "openai")
    assert roles(r) == ["system", "user", "assistant", "system", "user"]
    r = render(messages, "ollama")
    assert roles(r) == ["system", "user", "assistant", "system", "user"]
    r = render(messages, "anthropic")
    assert r.system == SYSTEM + "\n\nThe user is in a hurry."
    assert roles(r) == ["user", "assistant", "user"]
    assert problems(messages) == {}


def test_system_message_between_assistant_turns_anthropic_merges_them():
    messages = [user("Hi"), assistant("one"), system("note"), assistant("two")]
    r = render(messages, "anthropic")
    assert r.messages[-1] == AnthropicMessage("assistant", [AnthropicText("one"), AnthropicText("two")])
    assert problems(messages) == {}


def test_empty_system_message_is_dropped():
    messages = [user("Hi"), system(""), assistant("Hello")]
    assert roles(render(messages, "openai")) == ["system", "user", "assistant"]
    assert render(messages, "anthropic").system == SYSTEM
    assert problems(messages) == {}


def test_assistant_first_conversation_anthropic():
    messages = [assistant("Welcome back! Where were we?"), user("At the parser.")]
    r = render(messages, "anthropic")
    assert r.messages[0] == AnthropicMessage("user", [AnthropicText(ANTHROPIC_OPENER)])
    assert roles(r) == ["user", "assistant", "user"]
    assert (r.extra_tokens, r.format_tokens) == (0, MESSAGE_OVERHEAD + count(ANTHROPIC_OPENER))
    assert r.repairs == ["opened with a user turn"]
    assert roles(render(messages, "openai")) == ["system", "assistant", "user"]  # fine for OpenAI
    assert problems(messages) == {}


def test_trailing_whitespace_of_a_final_assistant_turn_anthropic():
    messages = [user("Start the answer with 'Sure'."), assistant("Sure,  \n")]
    r = render(messages, "anthropic")
    assert r.messages[-1].content == [AnthropicText("Sure,")]
    assert validate_anthropic(r.system, r.messages) == []
    # not a prefill: whitespace elsewhere is kept
    r = render([user("a"), assistant("b  "), user("c")], "anthropic")
    assert r.messages[1].content == [AnthropicText("b  ")]
    # OpenAI keeps the text as it is
    assert render(messages, "openai").messages[-1].content == "Sure,  \n"


def test_whitespace_only_final_assistant_turn_anthropic():
    messages = [user("Go on."), assistant("  \n ")]
    r = render(messages, "anthropic")
    assert roles(r) == ["user"]
    assert validate_anthropic(r.system, r.messages) == []


def test_final_assistant_with_several_text_blocks_anthropic():
    messages = [user("Go on."), Message(role="assistant", content=[TextBlock(text="Partial answer  "),
                                                                    TextBlock(text=" \n")])]
    r = render(messages, "anthropic")
    assert r.messages[-1].content == [AnthropicText("Partial answer")]
    assert problems(messages) == {}


def test_whitespace_only_text_is_not_sent_to_anthropic():
    messages = [user("Hi"), assistant("\n"), user("   "), assistant("Yes?"), user("Go.")]
    r = render(messages, "anthropic")
    assert all(b.text.strip() for m in r.messages for b in m.content if isinstance(b, AnthropicText))
    assert problems(messages) == {}


def test_unsigned_thinking_is_never_rendered():
    """Reasoning without Anthropic's signature (other providers', imported) is history only:
    Anthropic would refuse it, the other shapes have no place for it."""
    messages = [user("Hi"), thinking("Hello", thought="the user greets me"),
                Message(role="assistant", content=[ThinkingBlock(thinking="only thoughts")]), user("Bye")]
    for fmt in ("openai", "anthropic", "ollama"):
        r = render(messages, fmt)
        assert "the user greets me" not in repr(r.messages) and "only thoughts" not in repr(r.messages)
    assert roles(render(messages, "openai")) == ["system", "user", "assistant", "user"]
    assert problems(messages) == {}


def test_signed_thinking_goes_back_to_anthropic_first_in_its_message():
    """With extended thinking on, Anthropic refuses a tool-use loop whose last assistant
    message does not start with its thinking block as the model wrote it: the Anthropic
    shape sends an assistant message's signed thinking, first; the others never do."""
    step = signed(a_call(("t1", "bash", {"cmd": "ls"}), text="Listing."), "I should list", "SIG1")
    answer = signed(assistant("Two files."), "", "SIG2")
    only = Message(role="assistant", content=[ThinkingBlock(thinking="alone", signature="SIG3")])
    messages = [user("What is here?"), step, a_result(("t1", "a b")), answer, only, user("Thanks.")]
    r = render(messages, "anthropic")
    assert r.messages[1].content == [AnthropicThinking("I should list", "SIG1"), AnthropicText("Listing."),
                                     AnthropicToolUse("t1", "bash", {"cmd": "ls"})]
    assert r.messages[3].content[0] == AnthropicThinking("", "SIG2")
    assert "alone" not in repr(r.messages)  # (thinking with nothing it led to is not sent)
    assert validate_anthropic(r.system, r.messages, history=messages) == []
    for fmt in ("openai", "ollama"):
        assert "SIG1" not in repr(render(messages, fmt).messages)
    assert problems(messages) == {}


def test_thinking_stays_first_when_assistant_messages_merge():
    """Two assistant messages in a row go out as one Anthropic message (its text, a
    watermark that left only the text of the one before): the thinking of both first."""
    messages = [user("Go."), signed(assistant("First I look."), "a", "SIGA"),
                signed(a_call(("t1", "read")), "b", "SIGB"), a_result(("t1", "text"))]
    r = render(messages, "anthropic")
    assert [type(b) for b in r.messages[1].content] == [AnthropicThinking, AnthropicThinking, AnthropicText,
                                                        AnthropicToolUse]
    assert validate_anthropic(r.system, r.messages) == []


def test_the_turn_in_progress_is_validated_against_history():
    """``validate_anthropic(..., history=)`` fails a prompt whose turn in progress lost,
    moved or altered a thinking block, or whose step answered last is not sent."""
    step1 = signed(a_call(("t1", "bash")), "one", "S1")
    step2 = signed(a_call(("t2", "bash"), text="Again."), "two", "S2")
    history = [user("Task."), step1, a_result(("t1", "x")), step2, a_result(("t2", "y"))]
    good = render(history, "anthropic").messages
    assert validate_anthropic(None, good, history=history) == []
    text, call = AnthropicText("Again."), AnthropicToolUse("t2", "bash", {"path": "/src/t2.py"})
    result = good[-1]
    for bad in ([AnthropicMessage("assistant", [text, call])],  # dropped
                [AnthropicMessage("assistant", [text, AnthropicThinking("two", "S2"), call])],  # not first
                [AnthropicMessage("assistant", [AnthropicThinking("two!", "S2"), text, call])],  # altered
                [AnthropicMessage("assistant", [AnthropicThinking("two", ""), text, call])]):  # unsigned
        assert validate_anthropic(None, good[:-2] + bad + [result], history=history), bad
    # An earlier step of the loop too.
    assert validate_anthropic(None, [good[0], AnthropicMessage("assistant", good[1].content[1:]), *good[2:]],
                              history=history)
    # The step answered last must be sent (an earlier one in its place is not the loop in progress).
    assert validate_anthropic(None, good[:3], history=history)
    # Thinking in a user message is refused whatever the history.
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicThinking("x", "S"), AnthropicText("hi")])])


def test_empty_assistant_message_is_skipped():
    messages = [user("a"), assistant(""), user("b")]
    assert roles(render(messages, "openai")) == ["system", "user", "user"]
    assert roles(render(messages, "anthropic")) == ["user"]
    assert problems(messages) == {}


def test_names_are_kept_for_openai():
    messages = [Message(role="user", content="hi", name="alice"), Message(role="assistant", content="yo", name="bot")]
    r = render(messages, "openai")
    assert (r.messages[1].name, r.messages[2].name) == ("alice", "bot")


# --- Ollama arguments -----------------------------------------------------------------


@pytest.mark.parametrize("arguments, expected", [
    ('{"path": "a.py"}', {"path": "a.py"}),
    ("", {}),
    ("   ", {}),
    ("{not json", {"arguments": "{not json"}),
    ('{"path": "a.py"', {"arguments": '{"path": "a.py"'}),
    ("[1, 2]", {"arguments": [1, 2]}),
    ('"just a string"', {"arguments": "just a string"}),
    ("42", {"arguments": 42}),
])
def test_ollama_arguments_are_always_an_object(arguments, expected):
    messages = [user("go"), Message(role="assistant", tool_calls=[
        ToolCall(id="c1", function=FunctionCall(name="f", arguments=arguments))]), o_result("c1", "ok")]
    r = render(messages, "ollama")
    assert r.messages[2].tool_calls[0].function.arguments == expected
    assert validate_ollama(r.messages) == []
    # OpenAI gets the arguments verbatim; Anthropic the same object as Ollama
    assert render(messages, "openai").messages[2].tool_calls[0].function.arguments == arguments
    assert render(messages, "anthropic").messages[1].content[0].input == expected
    assert problems(messages) == {}


# --- the validators themselves ----------------------------------------------------------


def test_validators_catch_what_providers_reject():
    assert validate_openai([OpenAIMessage(role="tool", content="x", tool_call_id="nope")])
    assert validate_openai([OpenAIMessage(role="assistant")])
    assert validate_openai([OpenAIMessage(role="user", content="")])
    from ctxd.protocol.providers import OpenAIFunction, OpenAIToolCall
    call = OpenAIToolCall(id="a", function=OpenAIFunction("f", "{}"))
    assert validate_openai([OpenAIMessage(role="assistant", tool_calls=[call]),
                            OpenAIMessage(role="user", content="x")])
    assert validate_openai([OpenAIMessage(role="assistant", tool_calls=[call, call])])
    assert validate_anthropic(None, [AnthropicMessage("assistant", [AnthropicText("x")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicText("x")]),
                                     AnthropicMessage("user", [AnthropicText("y")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicText("")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicText("  ")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicText("x")]),
                                     AnthropicMessage("assistant", [AnthropicText("y ")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicToolResult("t", "x")])])
    assert validate_anthropic(None, [AnthropicMessage("user", [AnthropicText("x")]),
                                     AnthropicMessage("assistant", [AnthropicToolUse("t", "f", {})]),
                                     AnthropicMessage("user", [AnthropicText("y"), AnthropicToolResult("t", "r")])])
    assert validate_ollama([OllamaMessage(role="tool", content="x")])
    assert validate_ollama([OllamaMessage(role="assistant", content="",
                                          tool_calls=[OllamaToolCall(OllamaFunction("f", {}))])])


# --- property: random conversations ----------------------------------------------------


def random_conversation(rng: random.Random) -> list[Message]:
    """Mixed styles, parallel calls, late/missing/orphan/duplicate results, system and
    thinking messages, empty and whitespace text, then random deletions (what compression,
    watermarks and clients do)."""
    out: list[Message] = []
    pending: list[tuple[str, str]] = []  # (id, style) of calls without a result yet
    n_ids = 0

    def text() -> str:
        return rng.choice(["hello", "ok", "", " ", "\n", "trailing  ", "multi\nline", "x" * rng.randint(1, 40)])

    for _ in range(rng.randint(0, 24)):
        kind = rng.random()
        if kind < 0.2:
            out.append(user(text()))
        elif kind < 0.35:
            out.append(assistant(text()))
        elif kind < 0.4:
            out.append(system(text()))
        elif kind < 0.43:
            out.append(thinking(text()) if rng.random() < 0.5 else signed(assistant(text()), text()))
        elif kind < 0.65:
            calls = []
            reuse = n_ids if n_ids and rng.random() < 0.1 else None  # ids repeat across messages
            for index in range(rng.choice([1, 1, 2, 3])):
                n_ids += 1
                call_id = f"id{reuse}" if reuse is not None and index == 0 else f"id{n_ids}"
                calls.append((call_id, rng.choice(["ls", "cat", "grep"]),
                              rng.choice([{"a": 1}, {}, {"path": "x"}])))
            style = rng.choice(["openai", "anthropic"])
            maybe_text = text() if rng.random() < 0.4 else None
            if style == "openai":
                out.append(o_call(*[(i, n, json.dumps(a) if rng.random() > 0.1 else "{bad") for i, n, a in calls],
                                  text=maybe_text))
            else:
                out.append(a_call(*calls, text=maybe_text))
            if rng.random() < 0.3:
                out[-1] = signed(out[-1], text())
            pending += [(i, style) for i, _, _ in calls]
        else:
            if not pending or rng.random() < 0.1:
                # an orphan (or a result for an id that never existed)
                out.append(rng.choice([o_result(f"ghost{rng.randint(0, 9)}", text()),
                                       a_result((f"ghost{rng.randint(0, 9)}", text()))]))
                continue
            rng.shuffle(pending)
            take, pending = pending[:rng.randint(1, len(pending))], pending
            pending = [p for p in pending if p not in take]
            if rng.random() < 0.5:
                for call_id, _ in take:
                    out.append(o_result(call_id, text()))
            else:
                out.append(a_result(*[(i, text()) for i, _ in take],
                                    text=text() if rng.random() < 0.3 else None, error=rng.random() < 0.1))
            if rng.random() < 0.05:
                out.append(o_result(take[0][0], "duplicate"))
    # deletions: what compression, pruning and watermarks may have removed
    return [m for m in out if rng.random() > 0.15]


def test_random_conversations_render_validly_in_every_shape():
    rng = random.Random(20260127)
    failures = []
    for case in range(1500):
        messages = random_conversation(rng)
        system_parts = [SYSTEM] if rng.random() < 0.7 else []
        found = problems(messages, system_parts)
        if found:
            failures.append((case, found, messages))
    assert not failures, [(case, found) for case, found, _ in failures[:5]]


def test_the_repairs_are_counted_without_rendering():
    """``Pairing`` (what the active context keeps, message by message, so every figure is
    the rendered prompt's count) says what the renderers add for stand-in results and
    orphan labels, exactly, on random conversations: also for each prefix (appended one
    message at a time) and for a tool message without a call id."""
    from ctxd.engine.render import Pairing

    rng = random.Random(20260424)
    for case in range(800):
        messages = random_conversation(rng)
        if rng.random() < 0.1:
            messages.append(Message(role="tool", content="no id"))
        pairing = Pairing()
        for k, message in enumerate(messages):
            pairing.add(message, count)
            if rng.random() < 0.3 or k == len(messages) - 1:
                want = render_openai(PromptPlan(system_parts=[], messages=messages[:k + 1]), count).extra_tokens
                assert pairing.tokens == want, (case, k, messages[:k + 1])


# --- the system part: the client's instructions first, ctxd's checkpoints after -----------


def test_opening_system_messages_come_before_ctxds_section():
    """Agents push their system prompt as the first message: it must open the prompt,
    ahead of the goal block and checkpoint section ctxd adds, in one system message."""
    plan = PromptPlan(system_parts=["CLIENT"], messages=[system("AGENT"), user("hi"), system("MIDWAY"),
                                                         assistant("hello")],
                      context_parts=["GOAL", "CHECKPOINTS"])
    for fmt in ("openai", "ollama"):
        r = RENDERERS[fmt](plan, count)
        assert [(m.role, m.content) for m in r.messages] == [
            ("system", "CLIENT\n\nAGENT\n\nGOAL\n\nCHECKPOINTS"), ("user", "hi"), ("system", "MIDWAY"),
            ("assistant", "hello")]
    r = render_anthropic(plan, count)
    assert r.system == "CLIENT\n\nAGENT\n\nGOAL\n\nCHECKPOINTS\n\nMIDWAY"
    assert roles(r) == ["user", "assistant"]
    # Without a client system prompt or checkpoints, the agent's system message alone.
    r = render_openai(PromptPlan(system_parts=[], messages=[system("AGENT"), user("hi")]), count)
    assert [(m.role, m.content) for m in r.messages] == [("system", "AGENT"), ("user", "hi")]


def test_a_final_assistant_turn_goes_without_its_thinking():
    """A prompt that ends with the assistant's turn (a prefill, as a client that asks after
    the reply gets it): Anthropic continues its text, never its thinking."""
    messages = [user("Hi"), signed(assistant("Hello  "), "greeting", "SIG")]
    r = render(messages, "anthropic")
    assert r.messages[-1].content == [AnthropicText("Hello")]
    only = [user("Hi"), Message(role="assistant", content=[ThinkingBlock(thinking="x", signature="S"),
                                                           TextBlock(text="  ")])]
    assert roles(render(only, "anthropic")) == ["user"]
    assert problems(messages) == {} and problems(only) == {}
