"""Layer 3's six stages: identify (safe cut), prepare, checkpoint, update,
validation; truncation; with the trigger (``engine/trigger.py``: decide) and folding
the user's words on overflow (``engine/folding.py``)."""

from __future__ import annotations

import copy
import math

import msgspec
import pytest

from ctxd.engine.checkpoints import render_checkpoint, render_section
from ctxd.engine.context import JOIN_TOKENS, ActiveContext, CompressionState, PruneEvent
from ctxd.engine.folding import _folded_lines, fold, plan_fold, plan_fold_users, user_tokens
from ctxd.engine.pipeline import (
    Selection,
    _safe_cut,
    apply_selection,
    fits,
    identify,
    make_checkpoint,
    prepare,
    summary_rejection,
    truncation_checkpoint,
)
from ctxd.engine.policy import CompressionPolicy, initial_level, target_tokens
from ctxd.engine.prune import apply_prune, plan_prune
from ctxd.engine.render import render_anthropic, render_ollama, render_openai
from ctxd.engine.trigger import decide
from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
from ctxd.protocol.message import Message, TextBlock
from ctxd.tokens import MESSAGE_OVERHEAD

from ._engine_helpers import (
    COUNTER,
    NOW,
    WORDS,
    a_call,
    a_result,
    assistant,
    budget_of,
    count,
    entries,
    make_ctx,
    o_call,
    o_result,
    refresh,
    seqs,
    simple_budget,
    system,
    user,
    words,
)

POLICY = CompressionPolicy()
BIG = simple_budget(1_000_000)  # a budget whose recent-share cap never applies


def primes():
    """The six-stage design's worked conversation: 11 messages, the assistant ones ~1000 tokens."""
    out = [user("Write about prime numbers 2-1000")]
    for i in range(5):
        out.append(assistant(words(1000, WORDS[i])))
        out.append(user("continue"))
    return out


def by_seq(ctx, seq):
    return next(e for e in ctx.entries() if e.seq == seq)


def summarized(ctx, selection, text="Summary of the earlier turns.", now=NOW):
    prepare(selection, simple_budget(1_000_000))
    cp = make_checkpoint(selection, text, "test", now=now, number=ctx.state.compression_count + 1, count=count)
    apply_selection(ctx, selection, cp)
    refresh(ctx)
    return cp


def render_all_valid(ctx):
    plan = ctx.prompt_plan()
    r = render_openai(plan, count)
    assert validate_openai(r.messages) == []
    r = render_anthropic(plan, count)
    assert validate_anthropic(r.system, r.messages) == []
    r = render_ollama(plan, count)
    assert validate_ollama(r.messages) == []


# --- decide ---------------------------------------------------------------------------


def test_decide_below_the_trigger():
    b = simple_budget(10_000, used=8000)  # trigger 8000
    d = decide(CompressionState(), b, POLICY)
    assert not d.compress and d.skip_kind is None and "below" in d.reason


def test_decide_over_the_trigger():
    d = decide(CompressionState(), simple_budget(10_000, used=8001), POLICY)
    assert d.compress and d.reason == "over the trigger"


def test_decide_auto_off():
    d = decide(CompressionState(), simple_budget(10_000, used=9000), CompressionPolicy(auto=False))
    assert not d.compress and d.skip_kind == "auto-off"


def test_decide_loop_guard_waits_for_growth():
    b = simple_budget(10_000, used=8500)
    needed = 8000 + math.ceil(0.10 * b.available)  # 9000
    state = CompressionState(last_after_used=8000)
    d = decide(state, b, POLICY)
    assert not d.compress and d.skip_kind == "growth" and str(needed) in d.reason
    assert decide(state, simple_budget(10_000, used=needed - 1), POLICY).skip_kind == "growth"
    assert decide(state, simple_budget(10_000, used=needed), POLICY).compress
    assert decide(state, simple_budget(10_000, used=8500), CompressionPolicy(min_growth_fraction=0.0)).compress


def test_decide_prompt_not_fitting_forces_compression():
    # used is over max prompt: past the loop guard, and even below the trigger fraction
    b = simple_budget(10_000, used=10_001)
    assert b.prompt_tokens > b.max_prompt_tokens
    d = decide(CompressionState(last_after_used=10_000), b, POLICY)
    assert d.compress and d.reason == "the prompt no longer fits"
    # A huge system part: the conversation is small, the prompt still does not fit.
    b = simple_budget(10_000, used=4, system_tokens=9_995)
    assert b.used <= b.trigger_at
    assert decide(CompressionState(), b, POLICY).compress
    # but never when automatic compression is off
    assert decide(CompressionState(), b, CompressionPolicy(auto=False)).skip_kind == "auto-off"


# --- identification -------------------------------------------------------------------


def test_identify_keeps_the_newest_five():
    ctx = make_ctx(primes())
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2, 3, 4, 5, 6]
    assert sel.cut == 6 and sel.cut_seq == 6 and sel.seq_from == 1
    assert seqs(ctx.recent[sel.cut:]) == [7, 8, 9, 10, 11]
    # the user messages stay verbatim (user messages are never compressed)
    assert seqs(sel.keep) == [1, 3, 5]
    assistants = sum(by_seq(ctx, s).view_tokens for s in (2, 4, 6))
    assert sel.freed_tokens == assistants
    assert sel.message_seqs == [1, 2, 3, 4, 5, 6]
    assert sel.summary_input() == [e.message for e in sel.removed]


def test_identify_keep_recent_override():
    ctx = make_ctx(primes())
    assert seqs(identify(ctx, BIG, POLICY, keep_recent=1).removed) == list(range(1, 11))
    assert seqs(identify(ctx, BIG, CompressionPolicy(keep_recent=9)).removed) == [1, 2]


def test_identify_caps_the_recent_share():
    ctx = make_ctx(primes())
    # available 2500: at most 1250 tokens may stay as "recent": one assistant message, not two
    b = simple_budget(2500, used=ctx.used)
    sel = identify(ctx, b, POLICY)
    tail = ctx.recent[sel.cut:]
    assert sum(e.view_tokens for e in tail) <= 1250
    assert seqs(tail) == [9, 10, 11]


def test_identify_always_keeps_the_newest_message():
    ctx = make_ctx(primes())
    sel = identify(ctx, simple_budget(10), POLICY)
    assert seqs(ctx.recent[sel.cut:]) == [11]


def test_identify_nothing_to_compress():
    assert identify(make_ctx([]), BIG, POLICY) is None
    assert identify(make_ctx(primes()[:5]), BIG, POLICY) is None  # all within keep_recent
    # only user messages before the cut: nothing is freed
    ctx = make_ctx([user("a"), user("b"), user("c"), assistant("d")])
    assert identify(ctx, BIG, POLICY, keep_recent=1) is None


def test_identify_never_separates_a_call_from_its_result():
    messages = [
        user("Fix the bug."),                                          # 1
        assistant(words(300)),                                          # 2
        a_call(("c1", "read_file")),                                     # 3
        a_result(("c1", words(300))),                                    # 4
        a_call(("c2", "read_file")),                                     # 5  <- the naive cut is after this
        a_result(("c2", words(300))),                                    # 6
        assistant("It is in parse()."),                                  # 7
        user("Go on."),                                                  # 8
        assistant("Done."),                                              # 9
        user("Thanks."),                                                 # 10
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2, 3, 4]
    assert summarized(ctx, sel)
    render_all_valid(ctx)


def test_identify_parallel_calls_openai_style():
    messages = [
        user("Look around."),                                            # 1
        assistant(words(300)),                                            # 2
        o_call(("p1", "ls"), ("p2", "cat"), ("p3", "grep")),              # 3
        o_result("p1", words(100)),                                       # 4
        o_result("p2", words(100)),                                       # 5
        o_result("p3", words(100)),                                       # 6  <- naive cut before this
        assistant("Found it."),                                           # 7
        user("Next?"),                                                    # 8
        assistant("Nothing."),                                            # 9
        user("OK."),                                                      # 10
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2]
    summarized(ctx, sel)
    render_all_valid(ctx)


def test_identify_parallel_calls_anthropic_style():
    messages = [
        user("Look around."),                                             # 1
        assistant(words(300)),                                             # 2
        a_call(("p1", "ls"), ("p2", "cat")),                               # 3
        a_result(("p1", words(100))),                                      # 4 (results split over two messages)
        a_result(("p2", words(100))),                                      # 5 <- naive cut before this
        assistant("Found it."),                                            # 6
        user("Next?"),                                                     # 7
        assistant("Nothing."),                                             # 8
        user("OK."),                                                       # 9
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY, keep_recent=5)
    assert seqs(sel.removed) == [1, 2]


def test_identify_result_far_after_its_call():
    messages = [
        user("Start the build."),                                         # 1
        assistant(words(200)),                                             # 2
        o_call(("build", "run_build")),                                    # 3
        user("While that runs: what's the plan?"),                         # 4 (an interrupting user message)
        assistant(words(200)),                                             # 5
        user("ok"),                                                        # 6
        assistant(words(200)),                                             # 7 <- naive cut after this
        o_result("build", "build ok"),                                     # 8
        assistant("The build passed."),                                    # 9
        user("Great."),                                                    # 10
        assistant("Anything else?"),                                       # 11
        user("No."),                                                       # 12
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2]
    summarized(ctx, sel)
    render_all_valid(ctx)


def test_identify_chained_pairs_move_the_cut_repeatedly():
    # The cut moves to a call, and then again to an older call whose result lies after it.
    messages = [
        user("go"),                                                     # 1
        assistant(words(200)),                                           # 2
        a_call(("a", "t")),                                              # 3
        a_call(("b", "t")),                                              # 4
        a_result(("a", "ra")),                                           # 5
        a_result(("b", "rb")),                                           # 6 <- naive cut before this
        assistant("x"), user("y"), assistant("z"), user("w"),          # 7-10
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2]


def test_safe_cut_with_reused_call_ids():
    # Some clients number their calls per turn ("call_0" again and again): a result must
    # pair with the nearest call before it, not with the first call that ever had its id.
    messages = [
        user("go"),                                                     # 0
        o_call(("call_0", "ls")),                                        # 1
        o_result("call_0", words(100)),                                  # 2
        assistant(words(300)),                                           # 3
        user("more"),                                                    # 4
        assistant(words(300)),                                           # 5
        o_call(("call_0", "ls")),                                        # 6
        o_result("call_0", words(100)),                                  # 7
        assistant("done"),                                               # 8
    ]
    es = entries(messages)
    assert _safe_cut(es, 5) == 5
    assert _safe_cut(es, 7) == 6
    assert _safe_cut(es, 2) == 1


def test_identify_moves_user_messages_with_their_text_only():
    messages = [
        user("Start."),                                                          # 1
        a_call(("c1", "read_file"), text="Reading."),                           # 2
        a_result(("c1", words(400)), text="Also: keep the API unchanged."),     # 3
        assistant(words(300)),                                                   # 4
        user("next"), assistant("a"), user("b"), assistant("c"), user("d"),     # 5-9
    ]
    ctx = make_ctx(messages)
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2, 3, 4]
    assert seqs(sel.keep) == [1, 3]
    e3 = by_seq(ctx, 3)
    stays = by_seq(ctx, 1).view_tokens + e3.tokens.overhead + e3.tokens.text
    assert sel.freed_tokens == sum(e.view_tokens for e in sel.removed) - stays
    before = ctx.used
    summarized(ctx, sel)
    # Its text alone goes out as plain text, so it joins the kept user message before it
    # (one message's framing less, a blank line more).
    assert ctx.used == before - sel.freed_tokens - (e3.tokens.overhead - JOIN_TOKENS)
    view = by_seq(ctx, 3).view
    assert view.content == "Also: keep the API unchanged."
    assert by_seq(ctx, 3).view_tokens == COUNTER.count_message(view).context - e3.tokens.overhead + JOIN_TOKENS
    assert ctx.conversation()[0].content == "Start.\n\nAlso: keep the API unchanged."
    render_all_valid(ctx)


def test_identify_moves_pinned_messages_whole():
    messages = [
        user("Start."),                                       # 1
        assistant("The plan: " + words(300)),                 # 2 pinned
        assistant(words(300)),                                 # 3
        user("a"), assistant("b"), user("c"), assistant("d"), user("e"),  # 4-8
    ]
    ctx = make_ctx(messages, pinned=[2])
    assert ctx.pinned_tokens == by_seq(ctx, 2).tokens.context
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.removed) == [1, 2, 3]
    assert seqs(sel.keep) == [1, 2]
    assert sel.freed_tokens == by_seq(ctx, 3).view_tokens
    assert sel.message_seqs == [1, 3]  # the pinned message is not summarized
    assert [m.content for m in sel.summary_input()] == ["Start.", words(300)]
    summarized(ctx, sel)
    assert by_seq(ctx, 2).view is by_seq(ctx, 2).message
    assert seqs(ctx.kept) == [1, 2] and ctx.state.kept_seqs == [1, 2]


def test_identify_counts_pruned_views():
    messages = [
        user("Start."),
        a_call(("c1", "read_file")), a_result(("c1", words(2000))),
        a_call(("c2", "read_file")), a_result(("c2", words(2000))),
        a_call(("c3", "read_file")), a_result(("c3", words(20))),  # the newest: never pruned
        assistant("x"), user("y"), assistant("z"), user("w"), assistant("v"),
    ]
    ctx = make_ctx(messages)
    apply_prune(ctx, plan_prune(ctx, minimum=0, protect=1000), NOW)
    assert ctx.state.prune_horizon() == 5
    refresh(ctx)
    sel = identify(ctx, BIG, POLICY)
    assert sel.freed_tokens == sum(e.view_tokens for e in sel.removed) - by_seq(ctx, 1).view_tokens
    assert sel.freed_tokens < 1000  # the outputs were already cleared


# --- preparation ----------------------------------------------------------------------


@pytest.mark.parametrize("freed, level", [(3001, "compact"), (2001, "moderate"), (1500, "detailed")])
def test_prepare_level_by_size(freed, level):
    # the preparation stage's 2000/3000 bounds for an 8K prompt (a third and a half of ~6000)
    assert initial_level(freed, 6000) == level
    sel = Selection(cut=1, cut_seq=1, removed=[], keep=[], freed_tokens=freed)
    prepare(sel, simple_budget(6000))
    assert sel.level == level
    assert sel.target_tokens == min(target_tokens(level, freed, 6000), freed - 1)
    assert 0 < sel.target_tokens < freed


def test_prepare_target_is_below_what_is_freed():
    sel = prepare(Selection(cut=1, cut_seq=1, removed=[], keep=[], freed_tokens=20), simple_budget(6000))
    assert sel.target_tokens == 19  # MIN_TARGET (48) would be larger than the input


# --- checkpoint creation and validation -----------------------------------------------


def test_make_checkpoint():
    messages = [
        user("Implement login."),
        assistant("We decided to use JWT for authentication.\n[ARTIFACT] Created src/auth/login.ts"),
        user("ok"), assistant("a"), user("b"), assistant("c"), user("d"),
    ]
    ctx = make_ctx(messages)
    sel = prepare(identify(ctx, BIG, POLICY), BIG)
    cp = make_checkpoint(sel, "User asked for login; JWT chosen.", "extractive", now=NOW, number=1, count=count)
    assert cp.kind == "summary" and cp.level == sel.level == "detailed"
    assert (cp.seq_from, cp.seq_to, cp.message_seqs) == (1, 2, [1, 2])
    assert cp.original_tokens == sel.freed_tokens
    assert cp.tokens == count(render_checkpoint(cp)) + 2
    assert cp.created_at == NOW and cp.compression_number == 1 and cp.summarizer == "extractive"
    assert "src/auth/login.ts" in cp.files_modified
    assert any("JWT" in d for d in cp.key_decisions)
    assert cp.id.startswith("ckpt_")


def test_summary_rejection_when_not_smaller():
    ctx = make_ctx(primes())
    sel = prepare(identify(ctx, BIG, POLICY), BIG)
    small = make_checkpoint(sel, "Primes 2-30 done.", "llm", now=NOW, number=1, count=count)
    assert summary_rejection(small) is None
    big = make_checkpoint(sel, words(sel.freed_tokens), "llm", now=NOW, number=1, count=count)
    reason = summary_rejection(big)
    assert reason is not None and str(big.tokens) in reason and str(big.original_tokens) in reason


def test_truncation_checkpoint():
    messages = [
        user("Edit the config."),
        a_call(("w1", "write_file", {"path": "conf/app.toml", "content": "x = 1"})),
        a_result(("w1", "File written: conf/app.toml")),
        assistant(words(500)),
        user("a"), assistant("b"), user("c"), assistant("d"), user("e"),
    ]
    ctx = make_ctx(messages)
    sel = prepare(identify(ctx, BIG, POLICY), BIG)
    cp = truncation_checkpoint(sel, now=NOW, number=3, count=count)
    assert cp.kind == "truncated" and cp.level == "compact" and cp.summarizer == "truncation"
    # The user's "Edit the config." stays in the prompt: not counted, not covered.
    assert f"3 earlier messages ({sel.freed_tokens} tokens)" in cp.summary
    assert cp.message_ranges == [(2, 4)]
    assert "conf/app.toml" in cp.summary
    assert summary_rejection(cp) is None
    assert render_checkpoint(cp).startswith("### Messages 1-4 (omitted)")


# --- update ---------------------------------------------------------------------------


def test_apply_selection_moves_the_boundary():
    ctx = make_ctx(primes(), system_prompt="You are helpful.")
    before_used, before_prompt = ctx.used, ctx.prompt_tokens
    sel = identify(ctx, BIG, POLICY)
    cp = summarized(ctx, sel, "User requested primes 2-1000. Completed 2-30. Next: 31 onwards.")
    st = ctx.state
    assert st.boundary == 6 and st.compression_count == 1
    assert seqs(ctx.kept) == [1, 3, 5] and st.kept_seqs == [1, 3, 5]
    assert seqs(ctx.recent) == [7, 8, 9, 10, 11]
    assert ctx.checkpoints == [cp]
    # Kept user messages 1, 3 and 5 now go out as one user message: two messages' framing
    # less a blank line each is saved beside what the selection frees.
    joined = sum(e.tokens.overhead - JOIN_TOKENS for e in ctx.kept[1:])
    assert ctx.used == before_used - sel.freed_tokens - joined
    section = render_section([cp])
    assert ctx.checkpoint_tokens == count(section) + MESSAGE_OVERHEAD  # (its own message)
    assert ctx.prompt_tokens == before_prompt - sel.freed_tokens - joined + ctx.checkpoint_tokens
    assert ctx.prompt_tokens < before_prompt
    # what is sent: the user's words first (kept, as one message), the checkpoint, then the
    # recent messages; the system part stays the client's
    sent = ctx.conversation()
    assert sent[0].content == "Write about prime numbers 2-1000\n\ncontinue\n\ncontinue"
    assert sent[1].role == "user" and "User requested primes" in sent[1].content
    assert sent[2:] == [e.message for e in ctx.recent]
    assert ctx.system_text == "You are helpful."


def test_apply_selection_twice_keeps_kept_sorted_and_counts():
    ctx = make_ctx(primes())
    summarized(ctx, identify(ctx, BIG, POLICY))
    ctx.append(entries([assistant(words(1000, "tree")), user("continue")] * 3, start=12))
    summarized(ctx, identify(ctx, BIG, POLICY))
    assert ctx.state.compression_count == 2
    assert seqs(ctx.kept) == sorted(seqs(ctx.kept))
    assert all(e.role == "user" for e in ctx.kept)
    assert len(ctx.checkpoints) == 2
    assert ctx.checkpoints[0].seq_to < ctx.checkpoints[1].seq_from
    assert ctx.state.boundary == ctx.checkpoints[1].seq_to


def test_apply_selection_drops_stale_prune_events():
    ctx = make_ctx(primes(), state=CompressionState(prunes=[PruneEvent(3, "t1"), PruneEvent(6, "t2"),
                                                             PruneEvent(9, "t3")]))
    summarized(ctx, identify(ctx, BIG, POLICY))  # boundary 6
    assert ctx.state.prunes == [PruneEvent(9, "t3")]
    assert ctx.state.prune_horizon() == 9


def test_fits():
    ctx = make_ctx(primes())
    assert fits(ctx, simple_budget(ctx.prompt_tokens))
    assert not fits(ctx, simple_budget(ctx.prompt_tokens - 1))


# --- overflow: folding ----------------------------------------------------------------


def folded_ctx(texts, recent=()):
    """A context whose kept part is the given user messages (seqs 1..n), then ``recent``."""
    n = len(texts)
    ctx = ActiveContext(system_prompt="sys", state=CompressionState(boundary=n, kept_seqs=list(range(1, n + 1))),
                        kept=entries([user(t) for t in texts]), recent=entries(list(recent), start=n + 1))
    return refresh(ctx)


def unfold(summary):
    """The folded user messages back: {seq: text}."""
    out = {}
    for line in _folded_lines(summary):
        head, _, rest = line.partition("] ")
        seq = int(head[len("[message "):])
        out[seq] = rest.replace("\n    ", "\n")
    return out


def test_plan_fold_oldest_first_never_the_newest():
    texts = [words(100, WORDS[i]) for i in range(5)]
    ctx = folded_ctx(texts)  # no user message after the boundary
    goal = ctx.prompt_tokens - 150
    # (the session's first user message, an agent's task, goes last)
    assert seqs(plan_fold(ctx, goal)) == [2, 3]
    # even asked for everything, the newest user message stays
    assert seqs(plan_fold(ctx, 0)) == [1, 2, 3, 4]
    # with a user message in the recent part, every kept one may fold
    ctx = folded_ctx(texts, recent=[assistant("ok"), user("latest")])
    assert seqs(plan_fold(ctx, 0)) == [1, 2, 3, 4, 5]
    assert plan_fold(ctx, ctx.prompt_tokens) == []


def test_plan_fold_skips_pinned():
    ctx = folded_ctx([words(100)] * 4)
    ctx.state.pinned = [1]
    refresh(ctx)
    assert seqs(plan_fold(ctx, 0)) == [2, 3]


def test_fold_keeps_words_verbatim():
    texts = ["first question", "second question", "third question"]
    ctx = folded_ctx(texts)
    chosen = plan_fold(ctx, 0)
    cp = fold(ctx, chosen, allowance=1000, now=NOW, number=1, count=count)
    assert cp.kind == "folded" and cp.summarizer == "fold" and cp.level == "compact"
    assert (cp.seq_from, cp.seq_to, cp.message_seqs) == (1, 2, [1, 2])
    assert unfold(cp.summary) == {1: "first question", 2: "second question"}
    assert "are folded out" not in cp.summary
    # What it keeps and what it cut, said first; no "verbatim" above what is not.
    assert cp.summary.splitlines()[0] == "[User messages quoted exactly below: 2]"
    assert "verbatim" not in render_checkpoint(cp)
    assert seqs(ctx.kept) == [3] and ctx.state.kept_seqs == [3]
    assert ctx.checkpoints[0] is cp
    assert ctx.state.lossy
    assert cp.tokens == count(render_checkpoint(cp)) + 2
    assert render_checkpoint(cp).startswith("### Earlier user messages 1-2 (folded")
    assert cp.original_tokens == sum(e.tokens.context for e in chosen)  # (as pushed, not as joined)


def test_fold_drops_the_oldest_beyond_the_allowance_with_a_marker():
    texts = [words(50, WORDS[i]) for i in range(6)]
    ctx = folded_ctx(texts)
    chosen = plan_fold(ctx, 0)
    line_cost = count(f"[message 5] {texts[4]}") + 1
    cp = fold(ctx, chosen, allowance=2 * line_cost + 1, now=NOW, number=1, count=count)
    # The session's first user message (the task) first, then the newest folded ones.
    assert unfold(cp.summary) == {1: texts[0], 5: texts[4]}
    assert cp.summary.startswith("[User messages quoted exactly below: 2; 3 more (messages 2-4) are folded out of the "
                                 "prompt")
    assert f"checkpoint/expand {cp.id}" in cp.summary.splitlines()[0]
    assert cp.message_seqs == [1, 2, 3, 4, 5]  # it still stands for all of them


def test_a_folded_task_too_big_for_its_room_is_named_as_an_excerpt():
    """The folded checkpoint says which message it quotes only in part: the header above
    the folded lines said "verbatim" while the task under it was an excerpt."""
    from ctxd.engine.folding import folded_summary

    texts = [words(600, WORDS[0])] + [words(20, WORDS[i]) for i in range(1, 4)]
    ctx = folded_ctx(texts)
    cp = fold(ctx, plan_fold(ctx, 0), allowance=400, now=NOW, number=1, count=count)
    first = cp.summary.splitlines()[0]
    assert first == "[User messages quoted exactly below: 2; message 1 as an excerpt (its beginning and end)]", first
    assert "tokens of this message left out by ctxd" in cp.summary and "whole message is in history" in cp.summary
    assert folded_summary(cp) == "2 quoted exactly; message 1 as an excerpt (its beginning and end)"
    assert "verbatim" not in render_checkpoint(cp)


def test_fold_reduces_the_prompt_when_it_drops_words():
    ctx = folded_ctx([words(300, WORDS[i]) for i in range(6)], recent=[assistant("ok"), user("now")])
    before = ctx.prompt_tokens
    chosen = plan_fold(ctx, 0)
    fold(ctx, chosen, allowance=700, now=NOW, number=1, count=count)
    refresh(ctx)
    assert ctx.prompt_tokens < before - 1000
    assert ctx.checkpoint_tokens <= 700 + 60  # the allowance, plus section header and title


def test_fold_without_dropping_saves_nothing():
    # Folded words stay in the prompt up to the allowance: folding two messages that fit
    # in it does not make the prompt smaller. This is why plan_fold must know the allowance.
    ctx = folded_ctx([words(300, WORDS[i]) for i in range(6)], recent=[assistant("ok"), user("now")])
    before = ctx.prompt_tokens
    chosen = plan_fold(ctx, before - 600)
    assert seqs(chosen) == [2, 3]
    fold(ctx, chosen, allowance=1000, now=NOW, number=1, count=count)
    refresh(ctx)
    assert ctx.prompt_tokens >= before - 20


@pytest.mark.parametrize("allowance", [0, 200, 700, 1000, 5000])
def test_plan_fold_with_the_allowance_reaches_the_goal(allowance):
    ctx = folded_ctx([words(300, WORDS[i]) for i in range(6)], recent=[assistant("ok"), user("now")])
    goal = ctx.prompt_tokens - 600
    chosen = plan_fold(ctx, goal, allowance=allowance)
    fold(ctx, chosen, allowance=allowance, now=NOW, number=1, count=count)
    refresh(ctx)
    if allowance <= 1000:
        # 6 x ~305 tokens of words: anything the allowance cannot hold is freed
        # (the plan does not count the checkpoint's own framing: section header, title, the
        # marker naming the folded messages and how to expand them)
        assert ctx.prompt_tokens <= goal + 120
        # oldest first, the task (1) last
        assert seqs(chosen) == (list(range(2, len(chosen) + 2)) if len(chosen) < 6 else [1, 2, 3, 4, 5, 6])
    else:
        # an allowance larger than all the words: folding cannot help, and everything is tried
        assert seqs(chosen) == [1, 2, 3, 4, 5, 6]


def test_plan_fold_with_the_allowance_counts_the_existing_folded_checkpoint():
    ctx = folded_ctx([words(300, WORDS[i]) for i in range(8)], recent=[assistant("ok"), user("now")])
    fold(ctx, plan_fold(ctx, 0, allowance=500)[:3], allowance=500, now=NOW, number=1, count=count)
    refresh(ctx)
    goal = ctx.prompt_tokens - 250
    chosen = plan_fold(ctx, goal, allowance=500)
    assert seqs(chosen) in ([4], [4, 5])  # line granularity: the estimate may fold one more
    fold(ctx, chosen, allowance=500, now=NOW, number=2, count=count)
    refresh(ctx)
    assert ctx.prompt_tokens <= goal
    assert [cp.kind for cp in ctx.checkpoints] == ["folded"]


def test_repeated_folds_grow_one_checkpoint():
    texts = [f"question {i}" for i in range(1, 7)]
    ctx = folded_ctx(texts)
    first = fold(ctx, [ctx.kept[0], ctx.kept[1]], allowance=1000, now=NOW, number=1, count=count)
    refresh(ctx)
    second = fold(ctx, [ctx.kept[0], ctx.kept[1]], allowance=1000, now="2026-01-27T12:00:00Z", number=2,
                  count=count)
    refresh(ctx)
    assert [cp.kind for cp in ctx.checkpoints] == ["folded"]
    assert second.id == first.id and second.created_at == NOW and second.compressed_at == "2026-01-27T12:00:00Z"
    assert second.compression_count == 2
    assert second.message_seqs == [1, 2, 3, 4] and (second.seq_from, second.seq_to) == (1, 4)
    assert unfold(second.summary) == {i: f"question {i}" for i in range(1, 5)}
    assert second.original_tokens == first.original_tokens + sum(
        COUNTER.count_message(user(f"question {i}")).context for i in (3, 4))
    assert seqs(ctx.kept) == [5, 6]


def test_folded_checkpoint_goes_first_other_checkpoints_stay():
    ctx = make_ctx(primes())
    summarized(ctx, identify(ctx, BIG, POLICY))
    summary_cp = ctx.checkpoints[0]
    cp = fold(ctx, plan_fold(ctx, 0), allowance=1000, now=NOW, number=2, count=count)
    assert ctx.checkpoints == [cp, summary_cp]


def test_multi_line_user_messages_survive_fold_then_unfold():
    texts = [
        "line one\nline two\n\n    indented code\n[message 99] not a real entry",
        "second\r\nwith windows newline",
        "trailing newline\n",
        "plain",
    ]
    ctx = folded_ctx(texts)
    fold(ctx, [ctx.kept[0]], allowance=10_000, now=NOW, number=1, count=count)
    cp = fold(ctx, [ctx.kept[0], ctx.kept[1]], allowance=10_000, now=NOW, number=2, count=count)
    assert unfold(cp.summary) == {1: texts[0], 2: texts[1], 3: texts[2]}
    cp = fold(ctx, [ctx.kept[0]], allowance=10_000, now=NOW, number=3, count=count)
    assert unfold(cp.summary) == dict(enumerate(texts, start=1))


def test_fold_keeps_the_prompt_renderable():
    ctx = folded_ctx([words(100, WORDS[i]) for i in range(4)], recent=[assistant("ok"), user("now")])
    fold(ctx, plan_fold(ctx, 0), allowance=150, now=NOW, number=1, count=count)
    refresh(ctx)
    render_all_valid(ctx)
    assert ctx.conversation()[-1].content == "now"


def test_history_is_never_touched_by_a_compression():
    messages = primes()
    pristine = copy.deepcopy(messages)
    ctx = make_ctx(messages)
    summarized(ctx, identify(ctx, BIG, POLICY))
    fold(ctx, plan_fold(ctx, 0), allowance=50, now=NOW, number=2, count=count)
    assert messages == pristine


def test_large_selections_are_linear():
    import time

    messages = []
    for i in range(3000):
        messages += [user(f"question {i}"), assistant(f"answer {i}")]
    ctx = make_ctx(messages)
    started = time.perf_counter()
    sel = prepare(identify(ctx, BIG, POLICY), BIG)
    assert len(sel.summary_input()) == 5995
    cp = truncation_checkpoint(sel, now=NOW, number=1, count=count)
    apply_selection(ctx, sel, cp)
    refresh(ctx)
    assert time.perf_counter() - started < 2.0  # was quadratic: ~8 s for summary_input + truncation
    assert len(ctx.kept) == 2998


def test_pinned_tool_call_keeps_a_valid_prompt_when_its_result_is_summarized():
    messages = [
        user("go"),
        a_call(("t1", "read_file")),           # 2, pinned
        a_result(("t1", words(300))),          # 3, summarized
        assistant(words(300)),
        user("a"), assistant("b"), user("c"), assistant("d"), user("e"),
    ]
    ctx = make_ctx(messages, pinned=[2])
    summarized(ctx, identify(ctx, BIG, POLICY))
    assert seqs(ctx.kept) == [1, 2]
    render_all_valid(ctx)


def test_pinned_tool_result_is_sent_whole_not_summarized():
    messages = [
        user("go"),                                  # 1
        a_call(("t1", "read_file")),                 # 2
        a_result(("t1", words(300))),                # 3, pinned (a user-role message, but no user words)
        assistant(words(300)),                       # 4
        user("a"), assistant("b"), user("c"), assistant("d"), user("e"),
    ]
    ctx = make_ctx(messages, pinned=[3])
    sel = identify(ctx, BIG, POLICY)
    assert seqs(sel.keep) == [1, 3]
    assert sel.message_seqs == [1, 2, 4]
    assert [m for m in sel.summary_input()] == [messages[0], messages[1], messages[3]]
    summarized(ctx, sel)
    assert by_seq(ctx, 3).view is by_seq(ctx, 3).message
    render_all_valid(ctx)  # its call is summarized: the result is kept as text


def test_system_messages_stay_and_observations_are_compressed():
    """System messages are instructions: kept verbatim like the user's words. A user-role
    message marked as an observation is tool output an agent sent as a user message."""
    observation = msgspec.structs.replace(user(words(300, "output")), metadata={"observation": True})
    messages = [system("Always answer in French."), user("fix the bug"), assistant(words(200)),
                observation, assistant(words(200)), user("now the tests"), assistant("ok"),
                user("thanks"), assistant("done"), user("bye"), assistant("ciao")]
    ctx = make_ctx(messages)
    sel = identify(ctx, budget_of(ctx), CompressionPolicy(keep_recent=5))
    assert sel is not None
    kept = {e.seq for e in sel.keep}
    assert 1 in kept and 2 in kept           # the system message and the user's words stay
    assert 4 not in kept                     # the observation goes into the checkpoint
    assert 4 in sel.message_seqs and 1 not in sel.message_seqs


def test_the_first_user_message_is_never_folded_for_the_share():
    """Folding aims below the share (the loop guard's step); the session's first user
    message, an agent's task, is not folded for it, even when it alone exceeds the share:
    only the overflow policy folds it, when the prompt cannot fit otherwise."""
    ctx = folded_ctx([words(200, WORDS[0]), words(20, WORDS[1]), words(20, WORDS[2])],
                     recent=[assistant("ok"), user("now")])
    total = user_tokens(ctx)
    chosen = plan_fold_users(ctx, max_user_tokens=total - 250)
    assert [e.seq for e in chosen] == [2, 3]  # over the share even without the others: it stays
    assert 1 in seqs(plan_fold(ctx, 0))  # the overflow policy may fold it


def test_past_the_share_the_words_worth_least_per_token_fold_first():
    """With a worth per message (salience), the messages that say least per token fold
    first: the verbatim words left say the most, and one long thin message folds rather
    than several short telling ones (the oldest went first, whatever they said)."""
    telling = ["I adopted a puppy called Oscar in Lisbon last week", "My sister Ana moved to Oslo in 2021",
               "We ran the charity race on 3 May"]
    thin = "yes " * 120
    ctx = folded_ctx([words(20, WORDS[0])] + telling + [thin, "ok then"], recent=[assistant("ok"), user("now")])
    worth = {t: 3.0 for t in telling} | {thin.strip(): 0.5, "ok then": 0.2}

    def rank(texts: list[str]) -> list[float]:
        return [worth.get(t.strip(), 1.0) for t in texts]

    goal = user_tokens(ctx) - 100
    assert seqs(plan_fold_users(ctx, goal, rank=rank)) == [5]  # the long thin one alone frees enough
    assert seqs(plan_fold_users(ctx, goal)) == [2, 3, 4, 5]  # oldest first without a rank
    # Per token: of two with equal worth, the longer folds first.
    assert seqs(plan_fold_users(ctx, user_tokens(ctx) - 1, rank=lambda texts: [1.0] * len(texts))) == [5]


def test_fold_with_a_rank_keeps_the_best_lines_in_their_order():
    texts = [words(50, WORDS[i]) for i in range(6)]
    ctx = folded_ctx(texts)
    chosen = plan_fold(ctx, 0)
    line_cost = count(f"[message 5] {texts[4]}") + 1
    worth = {texts[1]: 9.0, texts[3]: 5.0}  # the rest rank 0; the task is kept anyway

    def rank(lines: list[str]) -> list[float]:
        return [worth.get(line, 0.0) for line in lines]

    cp = fold(ctx, chosen, allowance=3 * line_cost + 1, now=NOW, number=1, count=count, rank=rank)
    assert unfold(cp.summary) == {1: texts[0], 2: texts[1], 4: texts[3]}
    assert [int(line[len("[message "):line.index("]")]) for line in _folded_lines(cp.summary)] == [1, 2, 4]
    assert cp.summary.startswith("[User messages quoted exactly below: 3; 2 more (messages 3, 5) are folded out of the "
                                 "prompt")
    assert cp.message_seqs == [1, 2, 3, 4, 5]


# --- session markers ---------------------------------------------------------------------

def marker(n: int) -> Message:
    """A session-opening system message, as the LoCoMo importer writes it."""
    return Message(role="system", content=f"[Session {n}: 1:56 pm on {n} May, 2023]",
                   metadata={"session": n, "sessionDateTime": f"1:56 pm on {n} May, 2023", "sessionStart": True})


def sessions_chat() -> list[Message]:
    return [
        marker(1), user("I adopted a puppy called Oscar"), assistant(words(400, "tree")),
        marker(2), assistant(words(400, "bird")), assistant(words(400, "road")),
        system("Answer in French from now on."), assistant(words(400, "page")),
        marker(3), user("We moved to Lisbon"), assistant(words(400, "note")),
        user("continue"), assistant(words(400, "item")), user("continue"), assistant(words(400, "plan")),
    ]


def test_a_session_marker_with_nothing_verbatim_after_it_leaves_the_prompt():
    ctx = make_ctx(sessions_chat())
    summarized(ctx, identify(ctx, BIG, POLICY))
    assert ctx.state.boundary == 10
    # session 1 still dates the user's words after it; session 2's turns are all summarized
    # (the summary dates them); an instruction is never dropped; session 3 has its user turn.
    assert seqs(ctx.kept) == [1, 2, 7, 9, 10]
    assert ctx.state.kept_seqs == [1, 2, 7, 9, 10]
    sent = [m.content for m in ctx.conversation()]
    assert "[Session 2: 1:56 pm on 2 May, 2023]" not in sent
    assert "Answer in French from now on." in sent
    render_all_valid(ctx)


def test_a_session_marker_leaves_when_its_user_words_are_folded():
    ctx = make_ctx(sessions_chat())
    summarized(ctx, identify(ctx, BIG, POLICY))
    fold(ctx, [by_seq(ctx, 2)], allowance=1000, now=NOW, number=2, count=count)
    refresh(ctx)
    assert seqs(ctx.kept) == [7, 9, 10]
    assert "I adopted a puppy called Oscar" in ctx.section_text  # the folded words, verbatim


def test_a_marker_before_the_recent_messages_stays():
    chat = [marker(1), user("first"), assistant(words(400, "tree")), assistant(words(400, "bird")),
            marker(2)] + [assistant(words(50, "data")), user("more")] * 3
    ctx = make_ctx(chat)
    sel = identify(ctx, BIG, POLICY)
    summarized(ctx, sel)
    assert 5 in seqs(ctx.kept) or 5 in seqs(ctx.recent)


def test_a_second_selection_of_the_same_pass_is_not_counted_again():
    ctx = make_ctx(primes())
    sel = identify(ctx, BIG, POLICY)
    prepare(sel, BIG)
    cp = make_checkpoint(sel, "first", "test", now=NOW, number=1, count=count)
    apply_selection(ctx, sel, cp)
    ctx.append(entries([assistant(words(1000, "tree")), user("continue")] * 3, start=12))
    refresh(ctx)
    sel = identify(ctx, BIG, POLICY)
    prepare(sel, BIG)
    apply_selection(ctx, sel, make_checkpoint(sel, "second", "test", now=NOW, number=1, count=count), new_pass=False)
    assert ctx.state.compression_count == 1 and len(ctx.checkpoints) == 2


def test_a_pinned_session_marker_stays():
    ctx = make_ctx(sessions_chat())
    ctx.state.pinned = [4]
    refresh(ctx)
    summarized(ctx, identify(ctx, BIG, POLICY))
    assert 4 in seqs(ctx.kept)  # pinned: sent whole whatever else happens


def dated_sessions_chat() -> list[Message]:
    """sessions_chat() with every turn dated by its session, as the LoCoMo importer writes them."""
    out, day = [], None
    for message in sessions_chat():
        if message.metadata and message.metadata.get("sessionStart"):
            day = message.metadata["sessionDateTime"]
        elif message.role != "system":
            message = Message(role=message.role, content=message.content, metadata={"sessionDateTime": day})
        out.append(message)
    return out


def test_folded_user_words_keep_their_session_date():
    from ctxd.summarize.chat import session_date_of

    ctx = make_ctx(dated_sessions_chat())
    summarized(ctx, identify(ctx, BIG, POLICY))
    fold(ctx, [by_seq(ctx, 2)], allowance=1000, now=NOW, number=2, count=count, date=session_date_of)
    refresh(ctx)
    assert 1 not in seqs(ctx.kept)  # the marker left with the session's last verbatim words...
    # ...its date did not: shown once above that day's folded messages
    assert "[1 May 2023]\n[message 2] I adopted a puppy called Oscar" in ctx.section_text
    # a dated folded line is still found by its number (pinning takes it back out)
    assert _folded_lines(ctx.checkpoints[0].summary) == ["[message 2, 1 May 2023] I adopted a puppy called Oscar"]
    from ctxd.engine.folding import unfold
    assert unfold(ctx, 2, count) and not any(c.kind == "folded" for c in ctx.checkpoints)


def test_a_retired_marker_is_covered_by_the_checkpoint_over_its_span():
    ctx = make_ctx(sessions_chat())
    cp = summarized(ctx, identify(ctx, BIG, POLICY))
    assert 4 not in seqs(ctx.kept) and cp.covers(4)  # checkpoint/expand returns it; history says compressed


def test_a_long_system_message_marked_as_a_session_start_stays():
    chat = sessions_chat()
    chat[3] = Message(role="system", content="Answer in French from now on, and keep answers short.",
                      metadata={"session": 2, "sessionStart": True})
    ctx = make_ctx(chat)
    summarized(ctx, identify(ctx, BIG, POLICY))
    assert 4 in seqs(ctx.kept)  # not a "[Session N: ...]" line: possibly an instruction, never dropped


def test_folded_lines_date_each_day_once_and_leave_out_attached_images():
    from ctxd.engine.folding import unfold
    from ctxd.protocol.message import ImageBlock
    from ctxd.summarize.chat import session_date_of

    messages = dated_sessions_chat()
    index = next(i for i, m in enumerate(messages) if m.content == "I adopted a puppy called Oscar")
    messages[index] = Message(role="user", content=[TextBlock(text=messages[index].content),
                                                    ImageBlock(description="a photo of a puppy on a red blanket")],
                              metadata=messages[index].metadata)
    typed = next(i for i, m in enumerate(messages) if i > index and m.role == "user")
    messages[typed] = Message(role="user", content=f"{messages[typed].content} [shares a photo: a lake]",
                              metadata=messages[typed].metadata)
    ctx = make_ctx(messages)
    summarized(ctx, identify(ctx, BIG, POLICY))
    fold(ctx, [by_seq(ctx, 2), by_seq(ctx, typed + 1)], allowance=1000, now=NOW, number=2, count=count,
         date=session_date_of)
    summary = ctx.checkpoints[0].summary
    assert "[1 May 2023]\n[message 2] I adopted a puppy called Oscar" in summary
    assert "puppy on a red blanket" not in summary  # not the user's words: history keeps it
    assert f"{messages[typed].content}" in summary  # what the user typed, byte for byte
    assert unfold(ctx, 2, count)


def test_a_demonstration_is_neither_the_users_words_nor_the_task():
    """SWE-agent opens with a worked example of another task (``metadata.demonstration``,
    4-5k tokens) before the real one: kept as the user's words it counted as the task and,
    past the user's share, the real task was folded first."""
    from ctxd.engine.context import never_compressed

    demo = Message(role="user", content=words(200, WORDS[0]), metadata={"demonstration": True})
    kept = [demo] + [user(words(n, WORDS[i])) for i, n in ((1, 40), (2, 20), (3, 20))]
    ctx = refresh(ActiveContext(system_prompt="sys", state=CompressionState(boundary=4, kept_seqs=[1, 2, 3, 4]),
                                kept=entries(kept), recent=entries([assistant("ok"), user("now")], start=5)))
    assert not ctx.kept[0].has_user_text and not never_compressed(ctx.kept[0])
    chosen = plan_fold_users(ctx, max_user_tokens=user_tokens(ctx) - 30)
    assert [e.seq for e in chosen] == [3, 4]  # the task is message 2, the first that is not a demonstration
