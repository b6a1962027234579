"""Layer 2, watermark filtering of tool blocks (stateful watermarking)."""

from __future__ import annotations

import copy

import pytest

from ctxd.engine.context import CompressionState
from ctxd.engine.render import PromptPlan, render_anthropic, render_ollama, render_openai
from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
from ctxd.engine.watermark import (
    WatermarkMove,
    apply_watermark,
    find_checkpoint_call,
    is_checkpoint_tool,
    plan_watermark,
)
from ctxd.protocol.message import TextBlock, ToolResultBlock, ToolUseBlock

from ._engine_helpers import (
    COUNTER,
    a_call,
    a_result,
    assistant,
    count,
    entries,
    make_ctx,
    o_call,
    o_result,
    refresh,
    user,
    words,
)

TOOLS = ("compress_to_checkpoint", "deactivate_augments")


def augments_scenario():
    """The watermark design's scenario (augments deactivated mid-conversation), with some
    tool history before it (Anthropic blocks)."""
    return [
        user("Explore the codebase."),                                                      # 1
        a_call(("t1", "read_file"), text="Looking at the entry point."),                   # 2
        a_result(("t1", words(300))),                                                       # 3
        a_call(("t2", "grep")),                                                              # 4 (only a tool block)
        a_result(("t2", words(200)), text="Also look at the tests."),                       # 5
        assistant("The code is a small web service."),                                       # 6
        user("Can you deactivate refactoring/* augments?"),                                  # 7
        a_call(("toolu_abc123xyz", "mcp__nisaba__deactivate_augments", {"patterns": ["refactoring/*"]})),  # 8
        a_result(("toolu_abc123xyz", "unloaded 3 augments")),                               # 9
        assistant("Deactivated 3 augments..."),                                             # 10
        user("Now help me with feature X"),                                                 # 11
    ]


def by_seq(ctx, seq):
    return next(e for e in ctx.entries() if e.seq == seq)


def watermarked(messages, tool_use_id):
    ctx = make_ctx(messages)
    move = plan_watermark(ctx, tool_use_id=tool_use_id)
    assert isinstance(move, WatermarkMove)
    apply_watermark(ctx, move)
    refresh(ctx)
    return ctx, move


def test_is_checkpoint_tool_matches_mcp_prefixes():
    assert is_checkpoint_tool("deactivate_augments", TOOLS)
    assert is_checkpoint_tool("mcp__nisaba__deactivate_augments", TOOLS)
    assert is_checkpoint_tool("mcp__other__compress_to_checkpoint", TOOLS)
    assert not is_checkpoint_tool("activate_augments", TOOLS)  # activation is no task boundary
    assert not is_checkpoint_tool("mydeactivate_augments", TOOLS)
    assert not is_checkpoint_tool("deactivate_augments_later", TOOLS)
    assert not is_checkpoint_tool("deactivate_augments", ())


def test_find_checkpoint_call_in_both_styles():
    es = entries([
        a_call(("a1", "mcp__nisaba__deactivate_augments")),
        a_result(("a1", "ok")),
        o_call(("o1", "read_file"), ("o2", "compress_to_checkpoint")),
        o_result("o1", "x"), o_result("o2", "ok"),
    ])
    assert find_checkpoint_call(es, TOOLS, 0) == (3, "o2")   # the newest
    assert find_checkpoint_call(es, TOOLS, 3) is None         # only after the given seq
    assert find_checkpoint_call(es[:2], TOOLS, 0) == (1, "a1")
    assert find_checkpoint_call(es, ("nothing",), 0) is None


def test_augments_scenario_filtering():
    messages = augments_scenario()
    pristine = copy.deepcopy(messages)
    ctx, move = watermarked(messages, "toolu_abc123xyz")
    assert (ctx.state.watermark_seq, ctx.state.watermark_tool_use_id) == (8, "toolu_abc123xyz")
    assert move.blocks == 4  # t1, t1's result, t2, t2's result

    # Before the watermark: tool blocks out, text kept.
    assert by_seq(ctx, 1).view is by_seq(ctx, 1).message
    assert by_seq(ctx, 2).view.content == [TextBlock(text="Looking at the entry point.")]
    assert by_seq(ctx, 3).view is None and by_seq(ctx, 3).view_tokens == 0   # only a result: dropped
    assert by_seq(ctx, 4).view is None and by_seq(ctx, 4).view_tokens == 0   # only a call: dropped
    assert by_seq(ctx, 5).view.content == [TextBlock(text="Also look at the tests.")]
    assert by_seq(ctx, 6).view is by_seq(ctx, 6).message
    # At and after: unchanged.
    for seq in range(7, 12):
        assert by_seq(ctx, seq).view is by_seq(ctx, seq).message
    # What is sent.
    sent = ctx.conversation()
    assert len(sent) == 9
    assert not any(isinstance(b, (ToolUseBlock, ToolResultBlock))
                   for m in sent[:4] for b in (m.content if isinstance(m.content, list) else []))
    # History untouched, and the figures agree with a recount.
    assert [e.message for e in ctx.entries()] == pristine
    assert ctx.used == sum(COUNTER.count_message(m).context for m in sent)


def test_filtered_view_is_cheaper_by_the_tool_blocks():
    ctx = make_ctx(augments_scenario())
    before = ctx.used
    removed = sum(by_seq(ctx, s).tokens.tool_call + by_seq(ctx, s).tokens.tool_result for s in (2, 5))
    removed += by_seq(ctx, 3).tokens.context + by_seq(ctx, 4).tokens.context
    apply_watermark(ctx, plan_watermark(ctx, tool_use_id="toolu_abc123xyz"))
    refresh(ctx)
    assert before - ctx.used == removed


def test_openai_style_before_the_watermark():
    messages = [
        user("Find the config."),                                             # 1
        o_call(("c1", "grep"), text="Searching."),                            # 2
        o_result("c1", words(100)),                                           # 3
        o_call(("c2", "read_file")),                                          # 4 (content None)
        o_result("c2", words(100)),                                           # 5
        o_call(("cp", "compress_to_checkpoint")),                             # 6
        o_result("cp", "checkpoint set"),                                     # 7
        assistant("Done."),                                                   # 8
    ]
    ctx, _ = watermarked(messages, "cp")
    view = by_seq(ctx, 2).view
    assert view.content == "Searching." and view.tool_calls is None
    for seq in (3, 4, 5):
        assert by_seq(ctx, seq).view is None
    for seq in (6, 7, 8):
        assert by_seq(ctx, seq).view is by_seq(ctx, seq).message
    assert ctx.used == sum(COUNTER.count_message(m).context for m in ctx.conversation())


def test_watermark_by_seq():
    ctx = make_ctx(augments_scenario())
    move = plan_watermark(ctx, seq=6)
    assert move == WatermarkMove(6, None, 4)
    apply_watermark(ctx, move)
    refresh(ctx)
    assert by_seq(ctx, 3).view is None


def test_watermark_only_moves_forward():
    ctx, _ = watermarked(augments_scenario(), "toolu_abc123xyz")
    reason = plan_watermark(ctx, seq=5)
    assert isinstance(reason, str) and "only moves forward" in reason
    reason = plan_watermark(ctx, tool_use_id="toolu_abc123xyz")
    assert isinstance(reason, str) and "only moves forward" in reason
    assert ctx.state.watermark_seq == 8
    move = plan_watermark(ctx, seq=10)
    assert isinstance(move, WatermarkMove) and move.blocks == 2  # the deactivate call and its result
    apply_watermark(ctx, move)
    assert ctx.state.watermark_seq == 10


def test_watermark_not_found_changes_nothing_and_says_so():
    ctx = make_ctx(augments_scenario())
    before = [(e.seq, e.view, e.view_tokens) for e in ctx.entries()]
    reason = plan_watermark(ctx, tool_use_id="toolu_missing")
    assert isinstance(reason, str) and "not found" in reason
    reason = plan_watermark(ctx, seq=99)
    assert isinstance(reason, str) and "99" in reason
    assert isinstance(plan_watermark(ctx), str)
    assert ctx.state.watermark_seq == 0 and ctx.state.watermark_tool_use_id is None
    refresh(ctx)
    assert [(e.seq, e.view, e.view_tokens) for e in ctx.entries()] == before


def test_watermark_on_a_call_behind_the_boundary_is_refused():
    ctx = make_ctx(augments_scenario())
    # Move seq 2 (which holds call t1) into kept, as if compressed.
    ctx.kept, ctx.recent = [ctx.recent[1]], ctx.recent[2:]
    reason = plan_watermark(ctx, tool_use_id="t1")
    assert isinstance(reason, str) and "behind the compression boundary" in reason


def test_watermark_persists_through_refresh_and_new_messages():
    ctx, _ = watermarked(augments_scenario(), "toolu_abc123xyz")
    ctx.append(entries([o_call(("late", "read_file")), o_result("late", "out")], start=12))
    refresh(ctx)
    assert by_seq(ctx, 3).view is None
    assert by_seq(ctx, 12).view is by_seq(ctx, 12).message
    assert by_seq(ctx, 13).view is by_seq(ctx, 13).message


def test_a_call_before_the_watermark_with_its_result_after_renders_validly():
    messages = [
        user("Go."),                                                           # 1
        a_call(("early", "long_job")),                                          # 2
        a_call(("cp", "compress_to_checkpoint")),                               # 3
        a_result(("cp", "ok")),                                                 # 4
        a_result(("early", "the long job finished")),                           # 5
        user("And now?"),                                                       # 6
    ]
    ctx, _ = watermarked(messages, "cp")
    assert by_seq(ctx, 2).view is None
    plan = PromptPlan(system_parts=["sys"], messages=ctx.conversation())
    r = render_openai(plan, count)
    assert validate_openai(r.messages) == []
    assert any("the long job finished" in (m.content or "") for m in r.messages if m.role == "user")
    r = render_anthropic(plan, count)
    assert validate_anthropic(r.system, r.messages) == []
    r = render_ollama(plan, count)
    assert validate_ollama(r.messages) == []


@pytest.mark.parametrize("state", [CompressionState(watermark_seq=0), CompressionState(watermark_seq=1)])
def test_nothing_is_filtered_without_tool_blocks_before_the_watermark(state):
    ctx = make_ctx([user("a"), assistant("b"), user("c")], state=state)
    assert all(e.view is e.message for e in ctx.entries())
