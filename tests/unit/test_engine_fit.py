"""The final prompt within the budget whenever the newest message fits: the folded
checkpoint cut to the room a newest message that nearly fills the window leaves
(``folding.refit``), and the summaries made one notice (``checkpoints.collapse``)."""

from __future__ import annotations

from ctxd.engine.checkpoints import collapse
from ctxd.engine.context import ActiveContext, ClipEvent, CompressionState
from ctxd.engine.folding import _folded_lines, fold, folded_summary, plan_fold, refit
from ctxd.engine.pipeline import identify, irreducible
from ctxd.engine.policy import CompressionPolicy
from ctxd.protocol.compression import Checkpoint
from ctxd.tokens import PROMPT_PRIMING

from ._engine_helpers import NOW, WORDS, assistant, count, entries, make_ctx, refresh, simple_budget, user, words

MAX_PROMPT = 4000
FOLD_ALLOWANCE = int(0.12 * MAX_PROMPT)
"""``compression.fold_share`` of the largest prompt: what ``fold`` gets."""


def task_ctx(newest: int) -> ActiveContext:
    """A task of 900 tokens and three later questions kept verbatim behind the boundary,
    folded with the usual allowance (the task as an excerpt of half of it), then the
    newest user message of ``newest`` tokens."""
    texts = [words(900, WORDS[0])] + [words(60, WORDS[i]) for i in range(1, 4)]
    ctx = ActiveContext(system_prompt=None, state=CompressionState(boundary=4, kept_seqs=[1, 2, 3, 4]),
                        kept=entries([user(t) for t in texts]),
                        recent=entries([assistant("ok"), user(words(newest, "tree"))], start=5))
    refresh(ctx)
    fold(ctx, plan_fold(ctx, 0), allowance=FOLD_ALLOWANCE, now=NOW, number=1, count=count)
    return refresh(ctx)


def test_a_newest_message_that_nearly_fills_the_window_leaves_the_folded_task_too_little_room():
    """The review's case: the folded excerpt of the task (half of ``fold_share``) is larger
    than the room the newest message leaves, so the prompt was over the budget though the
    newest message fits. Cut to the room, the task stays, as a smaller excerpt."""
    ctx = task_ctx(newest=3600)
    assert irreducible(ctx) <= MAX_PROMPT < ctx.prompt_tokens  # the bug: over, though the newest fits
    over = ctx.prompt_tokens - MAX_PROMPT
    before = ctx.checkpoints[0]
    cp = refit(ctx, over, count)
    refresh(ctx)
    assert cp is not None and cp.id == before.id and cp.message_seqs == before.message_seqs
    assert ctx.prompt_tokens <= MAX_PROMPT, (ctx.prompt_tokens, MAX_PROMPT)
    lines = _folded_lines(cp.summary)
    assert lines and lines[0].startswith("[message 1] data data")  # the task, first, as an excerpt
    assert "message 1 as an excerpt" in folded_summary(cp)
    assert count(lines[0]) < count(_folded_lines(before.summary)[0])


def test_with_no_room_for_an_excerpt_the_task_is_counted_as_folded_out():
    ctx = task_ctx(newest=3850)
    assert irreducible(ctx) <= MAX_PROMPT < ctx.prompt_tokens
    over = ctx.prompt_tokens - MAX_PROMPT
    cp = refit(ctx, over, count)
    refresh(ctx)
    assert cp is not None
    assert _folded_lines(cp.summary) == []  # no words quoted: the notice alone...
    assert "4 more (messages 1-4) are folded out of the prompt" in cp.summary  # ...counts every one
    assert f"checkpoint/expand {cp.id}" in cp.summary
    # What the notice alone costs may still be over: the caller makes the summaries a notice,
    # then takes checkpoints out of the prompt (tests/unit/test_prompt_within_budget.py).
    assert refit(ctx, max(1, ctx.prompt_tokens - MAX_PROMPT), count) is None  # nothing more to cut


def test_refit_leaves_a_folded_checkpoint_within_its_room_alone_when_nothing_is_over():
    ctx = task_ctx(newest=100)
    assert ctx.prompt_tokens <= MAX_PROMPT
    assert refit(ctx, 0, count) is None


def _summary(i: int, seq_from: int, seq_to: int, tokens: int) -> Checkpoint:
    cp = Checkpoint(id=f"ckpt_{i:015d}", kind="summary", level="compact", seq_from=seq_from, seq_to=seq_to,
                    message_ranges=[(seq_from, seq_to)], summary=words(tokens, WORDS[i]), tokens=0,
                    original_tokens=10 * tokens, created_at=NOW, compression_number=1, summarizer="extractive",
                    files_modified=[f"/src/f{i}.py"])
    cp.tokens = count(cp.summary) + 8
    return cp


def test_summaries_collapse_into_one_notice_of_what_was_left_out():
    cps = [_summary(1, 1, 6, 120), _summary(2, 7, 12, 200)]
    notice = collapse(cps, count, NOW, 3)
    assert notice is not None and notice.kind == "truncated"
    assert notice.message_ranges == [(1, 12)] and notice.merged_from == [c.id for c in cps]
    assert notice.original_tokens == 3200 and notice.files_modified == ["/src/f1.py", "/src/f2.py"]
    assert "12 earlier messages (3200 tokens) were left out" in notice.summary
    assert notice.tokens < sum(c.tokens for c in cps)
    assert collapse([], count, NOW, 1) is None


def test_a_prompt_of_the_newest_message_alone_is_what_irreducible_counts():
    """(The invariant's premise: ``irreducible`` is the newest message with the priming.)"""
    ctx = refresh(ActiveContext(system_prompt=None, state=CompressionState(), recent=entries([user(words(50))])))
    assert irreducible(ctx) == ctx.prompt_tokens == PROMPT_PRIMING + ctx.recent[0].view_tokens


def test_a_user_message_sent_as_an_excerpt_still_moves_behind_the_boundary():
    """The user's words already sent as an excerpt (``plan_word_excerpts``) counted as
    freeing less than nothing when they moved behind the boundary (their excerpt is
    smaller than their words), so no selection was made, nothing was folded, and a
    prompt whose newest message fits was refused. Found by the property test."""
    ctx = make_ctx([user(words(3000, WORDS[1])), assistant(words(50, WORDS[2])), user(words(2000, WORDS[3])),
                    assistant(words(50, WORDS[4])), user(words(4000, "tree"))],
                   state=CompressionState(clips=[ClipEvent(1, 1000, NOW, words=True)]))
    assert ctx.recent[0].view_tokens < ctx.recent[0].tokens.text  # sent as an excerpt
    budget = simple_budget(6000, used=ctx.used)
    selection = identify(ctx, budget, CompressionPolicy(), keep_recent=1, goal_used=1000)
    assert selection is not None and [e.seq for e in selection.removed] == [1, 2, 3, 4]
    assert selection.freed_tokens == 2 * ctx.recent[1].view_tokens  # the answers; the words stay
