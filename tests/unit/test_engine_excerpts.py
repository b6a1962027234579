"""Excerpts instead of summaries for large newest messages that only part of must go
(``engine/pipeline.excerpts_instead``, ``plan_excerpts``)."""

from __future__ import annotations

from ctxd.engine.pipeline import EXCERPT_KEEP, Selection, apply_clips, clippable, excerpts_instead, plan_excerpts

from ._engine_helpers import NOW, a_call, a_result, assistant, make_ctx, refresh, user, words


def _ctx():
    return make_ctx([
        user("Fix the parser."),                                 # 1
        a_call(("c1", "read_file")),                             # 2
        a_result(("c1", words(400))),                            # 3
        assistant("Now the big rewrite."),                       # 4
        a_call(("c2", "write_file", {"content": words(3000)})),  # 5
        a_result(("c2", words(2000))),                           # 6
        assistant("Done."),                                      # 7
    ])


def _selection(ctx, n: int) -> Selection:
    removed = ctx.recent[:n]
    keep = [e for e in removed if e.has_user_text]
    freed = sum(e.view_tokens for e in removed if not e.has_user_text)
    return Selection(n, removed[-1].seq, removed, keep, freed)


def test_the_big_tail_is_excerpted_and_the_head_summarized():
    ctx = _ctx()
    selection = _selection(ctx, 6)  # through the big call (5) and its output (6)
    head, limits = excerpts_instead(ctx, selection, excess=1500, max_prompt=8000)
    assert head is not None and [e.seq for e in head.removed] == [1, 2, 3, 4] and head.cut_seq == 4
    assert set(limits) == {5, 6}
    before = ctx.used
    for seq, limit in limits.items():
        apply_clips(ctx, [seq], limit, NOW)
    refresh(ctx)
    head_freed = head.freed_tokens
    # The excerpts free about what the summary of the head does not.
    assert 0 < before - ctx.used <= 1500
    assert all(ctx.state.clip_for(seq) == limit for seq, limit in limits.items())
    assert head_freed < 1500


def test_nothing_instead_when_most_of_the_tail_must_go():
    ctx = _ctx()
    selection = _selection(ctx, 6)
    total = sum(e.view_tokens for e in ctx.recent[4:6])
    assert excerpts_instead(ctx, selection, excess=total - 100, max_prompt=8000) is None


def test_nothing_instead_when_the_tail_is_small_or_the_users_words():
    ctx = _ctx()
    assert excerpts_instead(ctx, _selection(ctx, 4), excess=100, max_prompt=8000) is None  # ends in small text
    assert excerpts_instead(ctx, _selection(ctx, 1), excess=100, max_prompt=8000) is None  # the user's words


def test_plan_excerpts_cuts_in_proportion_and_refuses_slivers():
    ctx = _ctx()
    big = clippable(ctx)
    assert [e.seq for e in big] == [5, 6]  # not the user's words, not small messages
    limits = plan_excerpts(big, 1000)
    assert limits is not None
    cuts = {e.seq: e.view_tokens - limits[e.seq] for e in big}
    assert cuts[5] > cuts[6] and sum(cuts.values()) >= 1000
    assert plan_excerpts(big, sum(e.view_tokens for e in big) - EXCERPT_KEEP) is None
    assert plan_excerpts(big, 0) is None
