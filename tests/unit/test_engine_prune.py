"""Layer 1, tool-output pruning: thresholds, protection, placeholders, views."""

from __future__ import annotations

import copy

import msgspec
import pytest

from ctxd.engine.context import PRUNED_TEXT, CompressionState, PruneEvent
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.prune import apply_prune, plan_prune
from ctxd.protocol.message import ToolResultBlock

from ._engine_helpers import a_call, a_result, assistant, count, make_ctx, o_call, o_result, refresh, user, words

T1 = "2026-01-27T10:00:00Z"
T2 = "2026-01-27T11:30:00Z"
PER = count(PRUNED_TEXT.format(at=T1))


def conversation(size: int = 1000):
    """Four tool results of ``size`` tokens, two per style (seqs 3, 5: Anthropic; 7, 9: OpenAI)."""
    return [
        user("Read the four modules and tell me what they do."),           # 1
        a_call(("c1", "read_file")),                                         # 2
        a_result(("c1", words(size))),                                       # 3
        a_call(("c2", "read_file")),                                         # 4
        a_result(("c2", words(size))),                                       # 5
        o_call(("c3", "grep")),                                              # 6
        o_result("c3", words(size)),                                         # 7
        o_call(("c4", "grep")),                                              # 8
        o_result("c4", words(size)),                                         # 9
        assistant("They parse, validate, store and render."),               # 10
    ]


def by_seq(ctx, seq):
    return next(e for e in ctx.entries() if e.seq == seq)


def test_tool_result_tokens_of_both_styles():
    ctx = make_ctx(conversation())
    assert by_seq(ctx, 3).tokens.tool_result == 1003  # block framing + output
    assert by_seq(ctx, 7).tokens.tool_result == 1000  # an OpenAI tool message is all output
    assert by_seq(ctx, 3).result_ids == ("c1",)
    assert by_seq(ctx, 7).result_ids == ("c3",)


def test_nothing_below_the_minimum():
    ctx = make_ctx(conversation())
    # The newest output (9) is never cleared: 3, 5 and 7 hold 3006 tokens.
    assert plan_prune(ctx, minimum=3007, protect=100) is None
    assert plan_prune(ctx, minimum=3006, protect=100) is not None


def test_the_newest_output_is_never_cleared_however_big():
    ctx = make_ctx(conversation())
    plan = plan_prune(ctx, minimum=0, protect=0)
    assert plan is not None and plan.through_seq == 7 and plan.results == 3
    ctx = make_ctx(conversation()[:3])  # one output, bigger than the protection
    assert plan_prune(ctx, minimum=0, protect=10) is None


def test_nothing_when_all_output_is_within_protection():
    ctx = make_ctx(conversation())
    assert plan_prune(ctx, minimum=0, protect=4006) is None


def test_newest_protect_tokens_are_protected():
    ctx = make_ctx(conversation())
    # Walking back: 9 (1000), 7 (2000 > 1500): 7 and everything older is cleared.
    plan = plan_prune(ctx, minimum=1000, protect=1500)
    assert plan is not None
    assert plan.through_seq == 7
    assert plan.results == 3
    assert plan.tokens == 1003 + 1003 + 1000
    # A wider protection keeps 7 too.
    plan = plan_prune(ctx, minimum=1000, protect=2000)
    assert plan.through_seq == 5 and plan.results == 2


def test_apply_prune_replaces_old_results_with_a_timed_placeholder():
    messages = conversation()
    pristine = copy.deepcopy(messages)
    ctx = make_ctx(messages)
    before = ctx.used
    plan = plan_prune(ctx, minimum=1000, protect=1500)
    apply_prune(ctx, plan, T1)
    assert ctx.state.prunes == [PruneEvent(7, T1)]
    assert ctx.state.prune_horizon() == 7
    refresh(ctx)

    placeholder = PRUNED_TEXT.format(at=T1)
    assert T1 in placeholder
    for seq in (3, 5):
        view = by_seq(ctx, seq).view
        assert view.role == "user"
        [block] = view.content
        assert isinstance(block, ToolResultBlock)
        assert block.content == placeholder
        assert block.tool_use_id == ("c1" if seq == 3 else "c2")
    assert by_seq(ctx, 7).view.content == placeholder
    assert by_seq(ctx, 7).view.tool_call_id == "c3"
    assert by_seq(ctx, 9).view is by_seq(ctx, 9).message  # protected: sent as it is
    # the calls and the conversation are untouched
    for seq in (1, 2, 4, 6, 8, 10):
        assert by_seq(ctx, seq).view is by_seq(ctx, seq).message

    # The view went down by exactly what the outputs cost, less the placeholders.
    assert before - ctx.used == 3 * (1000 - PER)
    for seq in (3, 5, 7):
        e = by_seq(ctx, seq)
        assert e.view_tokens == e.tokens.context - e.tokens.tool_result + (3 if seq != 7 else 0) + PER
        assert e.view_tokens == count_view(e.view)

    # History is untouched.
    assert [e.message for e in ctx.entries()] == pristine
    assert all(e.message == m for e, m in zip(ctx.entries(), pristine))


def count_view(message):
    from ._engine_helpers import COUNTER
    return COUNTER.count_message(message).context


def test_view_tokens_match_a_recount_of_the_view():
    ctx = make_ctx(conversation(size=777))
    apply_prune(ctx, plan_prune(ctx, minimum=0, protect=10), T1)
    refresh(ctx)
    for e in ctx.entries():
        assert e.view_tokens == count_view(e.view), e.seq
    assert ctx.used == sum(count_view(m) for m in ctx.conversation())


def test_protected_tools_are_never_pruned():
    ctx = make_ctx(conversation(), protected=("read_file",))
    plan = plan_prune(ctx, minimum=1000, protect=1500, protected=("read_file",))
    assert plan.through_seq == 7
    assert plan.results == 1 and plan.tokens == 1000  # only 7 (grep)
    apply_prune(ctx, plan, T1)
    refresh(ctx, protected=("read_file",))
    assert by_seq(ctx, 3).view is by_seq(ctx, 3).message
    assert by_seq(ctx, 5).view is by_seq(ctx, 5).message
    assert by_seq(ctx, 7).view.content == PRUNED_TEXT.format(at=T1)


def test_protected_tools_only_protected_plan_is_none():
    ctx = make_ctx(conversation(), protected=("read_file", "grep"))
    assert plan_prune(ctx, minimum=0, protect=10, protected=("read_file", "grep")) is None


def test_pinned_messages_are_never_pruned():
    ctx = make_ctx(conversation(), pinned=[3])
    plan = plan_prune(ctx, minimum=1000, protect=1500)
    assert plan.results == 2 and plan.tokens == 1003 + 1000
    apply_prune(ctx, plan, T1)
    refresh(ctx)
    assert by_seq(ctx, 3).view is by_seq(ctx, 3).message
    assert ctx.pinned_tokens == by_seq(ctx, 3).tokens.context
    assert by_seq(ctx, 5).view.content[0].content == PRUNED_TEXT.format(at=T1)


def test_results_before_the_watermark_are_not_counted():
    ctx = make_ctx(conversation(), state=CompressionState(watermark_seq=6))
    plan = plan_prune(ctx, minimum=1000, protect=1500)
    assert plan.through_seq == 7
    assert plan.results == 1  # 3 and 5 are already filtered out by the watermark


def test_mixed_user_message_keeps_its_text_when_pruned():
    messages = [
        a_call(("c1", "read_file")),
        a_result(("c1", words(2000)), text="Also, please keep the API stable."),
        a_call(("c2", "read_file")),
        a_result(("c2", words(2000))),
    ]
    ctx = make_ctx(messages)
    apply_prune(ctx, plan_prune(ctx, minimum=0, protect=1000), T1)
    refresh(ctx)
    view = by_seq(ctx, 2).view
    assert view.content[0].content == PRUNED_TEXT.format(at=T1)
    assert view.content[1].text == "Also, please keep the API stable."
    assert by_seq(ctx, 2).view_tokens == count_view(view)


def test_parallel_results_in_one_message():
    messages = [
        a_call(("p1", "read_file"), ("p2", "read_file")),
        a_result(("p1", words(1500)), ("p2", words(1500))),
        a_call(("c3", "read_file")),
        a_result(("c3", words(1500))),
    ]
    ctx = make_ctx(messages)
    plan = plan_prune(ctx, minimum=0, protect=1600)
    assert plan.through_seq == 2 and plan.results == 2 and plan.tokens == 2 * 1503
    before = ctx.used
    apply_prune(ctx, plan, T1)
    refresh(ctx)
    assert before - ctx.used == 2 * (1500 - PER)
    assert [b.content for b in by_seq(ctx, 2).view.content] == [PRUNED_TEXT.format(at=T1)] * 2


def test_a_second_prune_moves_the_horizon_and_keeps_earlier_times():
    messages = conversation() + [
        o_call(("c5", "grep")), o_result("c5", words(1000)),       # 11, 12
        o_call(("c6", "grep")), o_result("c6", words(1000)),       # 13, 14
    ]
    ctx = make_ctx(messages[:10])
    apply_prune(ctx, plan_prune(ctx, minimum=1000, protect=1500), T1)
    refresh(ctx)
    from ._engine_helpers import entries
    ctx.append(entries(messages[10:], start=11))
    # The minimum is what the prune would free: outputs 9 and 12 (14 is protected).
    plan = plan_prune(ctx, minimum=0, protect=1500)
    assert plan.through_seq == 12 and plan.results == 2  # 9 and 12
    assert plan_prune(ctx, minimum=plan.tokens + 1, protect=1500) is None
    assert plan_prune(ctx, minimum=plan.tokens, protect=1500) == plan
    apply_prune(ctx, plan, T2)
    refresh(ctx)
    assert ctx.state.prune_horizon() == 12
    assert by_seq(ctx, 3).view.content[0].content == PRUNED_TEXT.format(at=T1)
    assert by_seq(ctx, 7).view.content == PRUNED_TEXT.format(at=T1)
    assert by_seq(ctx, 9).view.content == PRUNED_TEXT.format(at=T2)
    assert by_seq(ctx, 12).view.content == PRUNED_TEXT.format(at=T2)
    assert by_seq(ctx, 14).view is by_seq(ctx, 14).message


def test_no_new_prune_when_the_horizon_would_not_move():
    ctx = make_ctx(conversation())
    apply_prune(ctx, plan_prune(ctx, minimum=0, protect=1500), T1)
    refresh(ctx)
    assert plan_prune(ctx, minimum=0, protect=1500) is None


def test_compression_state_round_trips_prune_events():
    state = CompressionState(prunes=[PruneEvent(7, T1), PruneEvent(12, T2)])
    decoded = msgspec.json.decode(msgspec.json.encode(state), type=CompressionState)
    assert decoded.prunes == state.prunes
    assert decoded.pruned_at(3) == T1 and decoded.pruned_at(9) == T2 and decoded.pruned_at(13) is None


@pytest.mark.parametrize("available, expected", [
    (1_000_000, (20_000, 40_000)),   # three-layer compaction's absolute figures
    (8_000, (2_000, 4_000)),         # scaled down for a small window
    (0, (0, 0)),
])
def test_prune_thresholds(available, expected):
    assert CompressionPolicy().prune_thresholds(available) == expected


def test_a_pass_needing_part_of_a_large_output_keeps_an_excerpt_of_it():
    """Clearing a 5,000-token output when 1,500 are left to free would leave the prompt
    3,500 tokens under its goal: the output is sent as an excerpt of what may stay."""
    ctx = make_ctx([
        user("Read the modules, then the big log."),                         # 1
        a_call(("c1", "read_file")),                                         # 2
        a_result(("c1", words(1000))),                                       # 3
        a_call(("c2", "read_file")),                                         # 4
        a_result(("c2", words(5000))),                                       # 5
        a_call(("c3", "read_file")),                                         # 6
        a_result(("c3", words(1000))),                                       # 7
        assistant("Done."),                                                  # 8
    ])
    before = ctx.used
    plan = plan_prune(ctx, minimum=100, protect=500, need=2500)
    assert plan is not None and plan.through_seq == 3 and plan.results == 1
    assert plan.clip is not None and plan.clip[0] == 5
    apply_prune(ctx, plan, T1)
    refresh(ctx)
    freed = before - ctx.used
    assert 2500 - 100 <= freed <= 2500 + 300, freed  # about what was needed, not 6,000
    entry = by_seq(ctx, 5)
    text = entry.view.content[0].content if not isinstance(entry.view.content, str) else entry.view.content
    assert "left out by ctxd" in str(text)
    # Needing all but a sliver of it (less than an excerpt worth keeping) clears it whole.
    ctx2 = make_ctx([
        user("x"), a_call(("c2", "read_file")), a_result(("c2", words(5000))),
        a_call(("c3", "read_file")), a_result(("c3", words(1000))), assistant("Done.")])
    plan2 = plan_prune(ctx2, minimum=100, protect=500, need=4900)
    assert plan2 is not None and plan2.clip is None and plan2.through_seq == 3
    plan3 = plan_prune(ctx2, minimum=100, protect=500, need=4000)
    assert plan3 is not None and plan3.clip is not None and plan3.results == 0
