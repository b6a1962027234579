"""The active context as a view of history: entries, accounting, and the invariants that
must hold whatever compression did (property-style, over random sessions)."""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterable

import msgspec

from ctxd.engine.checkpoints import render_section
from ctxd.engine.context import JOIN_TOKENS, ActiveContext, CompressionState
from ctxd.engine.folding import fold, plan_fold
from ctxd.engine.pipeline import (
    apply_clips,
    apply_selection,
    identify,
    make_checkpoint,
    plan_clips,
    prepare,
)
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.prune import apply_prune, plan_prune
from ctxd.engine.render import render_anthropic, render_ollama, render_openai
from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
from ctxd.engine.watermark import WatermarkMove, apply_watermark, find_checkpoint_call, plan_watermark
from ctxd.formats.anthropic import OPENER as ANTHROPIC_OPENER
from ctxd.protocol.message import ImageBlock, Message, TextBlock
from ctxd.protocol.providers import AnthropicText
from ctxd.tokens import MESSAGE_OVERHEAD, PROMPT_PRIMING

from ._engine_helpers import (
    COUNTER,
    NOW,
    WORDS,
    a_call,
    a_result,
    assistant,
    count,
    entries,
    entry,
    make_ctx,
    o_call,
    o_result,
    refresh,
    seqs,
    signed,
    simple_budget,
    system,
    thinking,
    user,
    words,
)


def test_entry_of_anthropic_and_openai_messages():
    e = entry(1, a_call(("t1", "read"), ("t2", "grep"), text="Looking."))
    assert (e.call_ids, e.call_names, e.result_ids, e.has_user_text) == (("t1", "t2"), ("read", "grep"), (), False)
    e = entry(2, a_result(("t1", "x"), ("t2", "y"), text="and?"))
    assert (e.call_ids, e.result_ids, e.has_user_text) == ((), ("t1", "t2"), True)
    e = entry(3, a_result(("t1", "x")))
    assert e.has_user_text is False
    e = entry(4, o_call(("c1", "ls"), ("c2", "cat")))
    assert (e.call_ids, e.call_names) == (("c1", "c2"), ("ls", "cat"))
    e = entry(5, o_result("c1", "out"))
    assert (e.result_ids, e.has_user_text, e.role) == (("c1",), False, "tool")
    assert entry(6, user("hi")).has_user_text and not entry(7, user("")).has_user_text
    assert not entry(8, assistant("hi")).has_user_text


def test_figures_of_a_plain_context():
    ctx = make_ctx([user("Hello there"), assistant("Hi!")], system_prompt="Be brief.", goal_text="## Goal")
    assert ctx.system_tokens == count("Be brief.\n\n## Goal") + MESSAGE_OVERHEAD
    assert ctx.checkpoint_tokens == 0 and ctx.system_text == "Be brief.\n\n## Goal"
    assert ctx.used == sum(COUNTER.count_message(m).context for m in ctx.conversation())
    assert ctx.prompt_tokens == PROMPT_PRIMING + ctx.system_tokens + ctx.used
    assert make_ctx([]).prompt_tokens == PROMPT_PRIMING


def kept_ctx(kept: list[Message], recent: list[Message], pinned: Iterable[int] = ()) -> ActiveContext:
    """A context whose first messages are kept behind the boundary (as a pass leaves them)."""
    ks = entries(kept)
    state = CompressionState(boundary=len(kept), kept_seqs=seqs(ks), pinned=sorted(pinned))
    return refresh(ActiveContext(None, state, kept=ks, recent=entries(recent, start=len(kept) + 1)))


PHOTO = ImageBlock(description="a photo of a painting of a sunset on a small easel", url="https://example.invalid/1.jpg")


def with_image(words: str) -> Message:
    """A user message whose words came with an image (an ``image`` block, as an importer
    writes what came with them)."""
    return Message(role="user", content=([TextBlock(text=words)] if words else []) + [PHOTO])


def test_a_kept_user_message_leaves_out_the_image_that_came_with_it():
    said = "I painted it after I visited the beach last week."
    ctx = kept_ctx([with_image(said), with_image("Another one.")],
                   [assistant("Where was it?"), with_image("Near Malmo.")])
    kept, other = ctx.kept
    assert kept.view.content == said and kept.message.content == [TextBlock(text=said), PHOTO]  # history keeps it
    assert kept.view_tokens == kept.tokens.overhead + count(said)
    assert other.view.content == "Another one."
    newest = ctx.recent[-1]
    assert newest.view is newest.message  # after the boundary: as pushed, the image sent as text
    assert "[image: a photo of a painting of a sunset on a small easel]" in render_openai(
        ctx.prompt_plan(), count).messages[-1].content
    pinned = kept_ctx([with_image(said)], [assistant("Lovely colours!"), user("next")], pinned=[1])
    assert pinned.kept[0].view.content == [TextBlock(text=said), PHOTO]  # a pin sends the message whole


def test_typed_text_that_looks_like_an_attachment_is_the_users_words():
    """No pattern on the user's text: what the user typed is sent byte for byte behind the
    boundary, whatever it looks like (a trailing ``[shares a photo: ...]`` was cut)."""
    typed = ["Remember the trip? [shares a photo: a lake]", "I said it [twice]",
             "[shares a photo: a photo of a painting of a sunset]"]
    ctx = kept_ctx([user(t) for t in typed], [assistant("Yes."), user("next")])
    assert [e.view.content for e in ctx.kept] == typed
    assert [e.view_tokens for e in ctx.kept][0] == ctx.kept[0].tokens.context
    sent = render_openai(ctx.prompt_plan(), count).messages
    assert all(any(t in (m.content or "") for m in sent) for t in typed)


def test_the_users_share_is_what_their_kept_words_cost_as_sent():
    """The user's half is measured on what is sent: behind the boundary, without the
    images that came with the words and with runs joined. Measured as pushed, words were
    folded while the prompt still had room for them."""
    from ctxd.engine.folding import plan_fold_users, user_tokens

    ctx = kept_ctx([with_image("I painted it."), with_image("Then I framed it.")],
                   [assistant("Where was it?"), with_image("Near Malmo.")])
    first, second = ctx.kept
    newest = ctx.recent[-1]
    assert user_tokens(ctx) == first.view_tokens + second.view_tokens + newest.tokens.overhead + newest.tokens.text
    as_pushed = sum(e.tokens.overhead + e.tokens.text for e in (first, second, newest))
    assert user_tokens(ctx) < as_pushed
    assert plan_fold_users(ctx, user_tokens(ctx)) == []  # they fit as sent: nothing folds
    assert [e.seq for e in plan_fold_users(ctx, user_tokens(ctx) - 1)] == [second.seq]


def test_kept_user_messages_in_a_row_go_out_as_one():
    bob = Message(role="user", content="fourth", name="Bob")
    marker = system("[Session 2: 9 May 2023]")
    kept = [user("first"), user("second"), marker, user("third"), bob, user("fifth"), user("sixth")]
    ctx = kept_ctx(kept, [assistant("ok"), user("now")])
    sent = ctx.conversation()
    assert [(m.role, m.content) for m in sent] == [
        ("user", "first\n\nsecond"), ("system", marker.content), ("user", "third"), ("user", "fourth"),
        ("user", "fifth\n\nsixth"), ("assistant", "ok"), ("user", "now")]
    second, sixth = ctx.kept[1], ctx.kept[6]
    assert second.view_tokens == count("second") + JOIN_TOKENS
    assert sixth.view_tokens == count("sixth") + JOIN_TOKENS
    assert ctx.used == sum(COUNTER.count_message(m).context for m in sent)
    # A pinned message is sent whole, on its own: it joins nothing.
    pinned = kept_ctx(kept, [assistant("ok"), user("now")], pinned=[2])
    assert [m.content for m in pinned.conversation()[:2]] == ["first", "second"]
    assert pinned.kept[1].view_tokens == pinned.kept[1].tokens.context


def test_thinking_is_not_counted_in_the_prompt():
    ctx = make_ctx([user("q"), thinking("answer", thought=words(500))])
    e = ctx.recent[1]
    assert e.tokens.thinking == 500 and e.view_tokens == e.tokens.context == e.tokens.total - 500


def test_signed_thinking_is_counted_wherever_it_is_sent():
    """An assistant message's signed thinking goes back in the Anthropic shape, so the
    prompt counts it: sent whole, appended, pinned, or as an excerpt (which keeps it)."""
    tool = signed(a_call(("t1", "write", {"text": words(600)})), thought=words(40, "tree"))
    ctx = make_ctx([user("q"), tool, a_result(("t1", "ok"))])
    e = ctx.recent[1]
    assert e.tokens.thinking == 40 and e.sent_thinking == 40 and e.view_tokens == e.tokens.context + 40
    assert ctx.used == sum(x.tokens.context for x in ctx.recent) + 40
    pinned = make_ctx([user("q"), tool, a_result(("t1", "ok"))], pinned=[2, 3])
    assert pinned.pinned_tokens == sum(x.tokens.context for x in pinned.recent[1:]) + 40
    appended = make_ctx([user("q")])
    appended.append(entries([tool], start=2))
    assert appended.recent[1].view_tokens == e.view_tokens
    apply_clips(ctx, [2], 200, "now")
    refresh(ctx)
    view = ctx.recent[1].view
    assert view is not None and view.content[0] == tool.content[0]  # type: ignore[index]
    assert 200 - 40 < ctx.recent[1].view_tokens <= 200 + 8  # the limit holds for the whole message
    r = render_anthropic(ctx.prompt_plan(), count)
    assert validate_anthropic(r.system, r.messages, history=[user("q"), tool, a_result(("t1", "ok"))]) == []


def test_append_counts_new_messages():
    ctx = make_ctx([user("a")])
    before = ctx.used
    new = entries([o_call(("c", "ls")), o_result("c", "x")], start=2)
    ctx.append(new)
    assert ctx.used == before + sum(e.tokens.context for e in new)
    assert ctx.call_names["c"] == "ls"


def test_a_checkpoint_is_a_message_after_the_words_of_its_span():
    """The system part stays the client's; the checkpoint is a message of ctxd's in the
    conversation, after the user's words it kept (what a later pass adds comes after it)."""
    ctx = make_ctx([user(words(50)), assistant(words(400)), user("a"), assistant("b"), user("c"),
                    assistant("d"), user("e")], system_prompt="sys")
    selection = prepare(identify(ctx, simple_budget(100_000), CompressionPolicy()), simple_budget(100_000))
    cp = make_checkpoint(selection, "short summary", "test", now=NOW, number=1, count=count)
    apply_selection(ctx, selection, cp)
    refresh(ctx)
    assert ctx.system_text == "sys" and ctx.section_text == render_section([cp])
    sent = ctx.conversation()
    kept = [e.seq for e in ctx.kept]
    assert sent[len(kept) - 1].role == "user" and sent[len(kept)].content == render_section([cp])
    assert ctx.system_tokens == count("sys") + MESSAGE_OVERHEAD
    assert ctx.checkpoint_tokens == count(render_section([cp])) + MESSAGE_OVERHEAD


def test_a_pass_appends_after_what_earlier_passes_left():
    """A second pass's checkpoint and words come after the first's: the prompt up to the end
    of what the first pass left is unchanged (a provider's cache still holds it)."""
    history = [m for i in range(12) for m in (user(f"question {i} " + words(20)), assistant(words(300)))]
    ctx = make_ctx(history, system_prompt="sys")
    budget = simple_budget(100_000)
    first = prepare(identify(ctx, budget, CompressionPolicy(), keep_recent=14), budget)
    apply_selection(ctx, first, make_checkpoint(first, "first summary", "test", now=NOW, number=1, count=count))
    refresh(ctx)
    before = ctx.conversation()
    behind = before[:len(before) - len(ctx.recent)]
    second = prepare(identify(ctx, budget, CompressionPolicy(), keep_recent=4), budget)
    apply_selection(ctx, second, make_checkpoint(second, "second summary", "test", now=NOW, number=2,
                                                 count=count), new_pass=False)
    refresh(ctx)
    after = ctx.conversation()
    assert [m.role for m in behind] == ["user", "user"] and "first summary" in behind[-1].content
    assert after[:len(behind)] == behind
    said, note = after[len(behind)], after[len(behind) + 1]
    assert said.role == "user" and said.content.startswith("question ")
    assert note.role == "user" and "second summary" in note.content and "first summary" not in note.content


def test_compression_state_round_trip():
    state = CompressionState(boundary=9, kept_seqs=[1, 3], pinned=[3], watermark_seq=5,
                             watermark_tool_use_id="t", compression_count=2, last_after_used=100, lossy=True)
    raw = msgspec.json.encode(state)
    assert b"keptSeqs" in raw and b"watermarkToolUseId" in raw
    assert msgspec.json.decode(raw, type=CompressionState) == state
    assert msgspec.json.decode(b"{}", type=CompressionState) == CompressionState()


# --- property: random sessions through every layer ---------------------------------------


def random_session(rng: random.Random, n: int) -> list[Message]:
    out: list[Message] = []
    open_calls: list[tuple[str, str]] = []
    ids = 0
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            text = words(rng.randint(1, 120), rng.choice(WORDS))
            if rng.random() < 0.1:
                text = "line one\nline two\n    code"
            out.append(user(text))
        elif r < 0.45:
            out.append(assistant(words(rng.randint(1, 300), rng.choice(WORDS))))
        elif r < 0.48:
            out.append(system("note: " + words(5)))
        elif r < 0.5:
            out.append(thinking("hmm " + words(rng.randint(1, 20)), thought=words(30)))
        elif r < 0.7:
            calls = []
            for _ in range(rng.choice([1, 1, 2])):
                ids += 1
                name = rng.choice(["read_file", "grep", "bash", "deactivate_augments", "compress_to_checkpoint"])
                calls.append((f"id{ids}", name))
            style = rng.choice(["openai", "anthropic"])
            out.append(o_call(*calls) if style == "openai" else a_call(*calls))
            open_calls += [(c[0], style) for c in calls]
        elif open_calls:
            rng.shuffle(open_calls)
            call_id, style = open_calls.pop()
            output = words(rng.randint(1, 400), rng.choice(WORDS))
            if style == "openai" or rng.random() < 0.2:
                out.append(o_result(call_id, output))
            else:
                out.append(a_result((call_id, output), text="and also this" if rng.random() < 0.2 else None))
    return out


def rebuilt(ctx: ActiveContext, history: list[Message]) -> ActiveContext:
    """The active context rebuilt from history and the stored state, as the service does."""
    state = msgspec.json.decode(msgspec.json.encode(ctx.state), type=CompressionState)
    all_entries = entries(history)
    kept = [e for e in all_entries if e.seq in set(state.kept_seqs)]
    recent = [e for e in all_entries if e.seq > state.boundary]
    again = ActiveContext(system_prompt=ctx.system_prompt, state=state, checkpoints=list(ctx.checkpoints),
                          kept=kept, recent=recent)
    return refresh(again, PROTECTED)


PROTECTED = ("bash",)
CASES = 40


def check_invariants(ctx: ActiveContext, history: list[Message], pristine: list[Message], pushed: int) -> None:
    assert history == pristine, "history was edited"
    views = [e for e in ctx.entries() if e.view is not None]
    conversation = ctx.conversation()
    checkpoint_messages = {id(m) for _, m in ctx.checkpoint_messages.values()}
    sent = [m for m in conversation if id(m) not in checkpoint_messages]
    notes = [m for m in conversation if id(m) in checkpoint_messages]
    assert len(notes) == len(ctx.checkpoints)
    joins = len(views) - len(sent)  # kept user messages sent as one (context._joins)
    real = sum(COUNTER.count_message(m).context for m in sent)
    # A join is counted as a blank line (one token), never less than it costs: the
    # tokenizer may fold the blank line into the text before it.
    # ``used`` counts what rendering adds to pair tool calls and results (``pairing``).
    repairs = ctx.pairing.tokens + ctx.opener  # (what rendering adds: pairing, the Anthropic opener)
    assert real + repairs <= ctx.used + ctx.pinned_tokens <= real + repairs + joins
    assert sum(e.view_tokens for e in ctx.entries()) + repairs == ctx.used + ctx.pinned_tokens
    assert ctx.system_tokens == (count(ctx.system_text) + MESSAGE_OVERHEAD if ctx.system_text else 0)
    assert ctx.checkpoint_tokens == sum(count(m.content) + MESSAGE_OVERHEAD for m in notes)
    seq_list = [e.seq for e in ctx.entries()]
    assert seq_list == sorted(seq_list) and len(set(seq_list)) == len(seq_list)
    assert all(e.seq <= ctx.state.boundary for e in ctx.kept)
    assert all(e.seq > ctx.state.boundary for e in ctx.recent)
    assert ctx.state.kept_seqs == [e.seq for e in ctx.kept]
    # user words are never lost: every user text is kept, in recent, or in a checkpoint
    folded = {s for cp in ctx.checkpoints if cp.kind == "folded" for s in cp.message_seqs}
    present = {e.seq for e in ctx.entries()}
    for seq, message in enumerate(history[:pushed], start=1):
        if message.role == "system" or (message.role == "user" and entry(seq, message).has_user_text):
            assert seq in present or seq in folded, seq
    # kept messages are the user's words (only) or system messages (whole)
    for e in ctx.kept:
        if e.seq not in ctx.pinned_set:
            assert e.view.role in ("user", "system")
            assert not isinstance(e.view.content, list) or all(isinstance(b, TextBlock) for b in e.view.content)
    # protected tools' outputs are never cleared (an excerpt, when too big for any prompt)
    for e in ctx.recent:
        if e.view is not None and e.result_ids and any(ctx.call_names.get(i) in PROTECTED for i in e.result_ids):
            if e.seq >= ctx.state.watermark_seq and ctx.state.clip_for(e.seq) is None:
                assert e.view is e.message
    # an excerpt is at most its limit, and says what it left out
    for e in ctx.recent:
        limit = ctx.state.clip_for(e.seq)
        if limit is not None and e.view is not None and e.view is not e.message \
                and e.seq > ctx.state.prune_horizon() and e.seq >= ctx.state.watermark_seq:
            assert e.view_tokens <= e.tokens.context
            assert "left out by ctxd" in str(e.view.content)
    # the same view comes back from history and the stored state
    again = rebuilt(ctx, history[:pushed])
    assert again.conversation() == ctx.conversation()
    assert (again.used, again.pinned_tokens, again.prompt_tokens) == (ctx.used, ctx.pinned_tokens, ctx.prompt_tokens)
    # and every provider accepts it
    plan = ctx.prompt_plan()
    r = render_openai(plan, count)
    assert validate_openai(r.messages) == []
    assert r.extra_tokens == ctx.pairing.tokens
    r = render_anthropic(plan, count)
    assert validate_anthropic(r.system, r.messages) == []
    # the context counts the Anthropic shape's opening user turn exactly when it sends one
    opened = bool(r.messages) and r.messages[0].content[0] == AnthropicText(text=ANTHROPIC_OPENER)
    assert opened == bool(ctx.opener), (opened, ctx.opener)
    r = render_ollama(plan, count)
    assert validate_ollama(r.messages) == []


def test_random_sessions_keep_every_invariant():
    rng = random.Random(7)
    policy = CompressionPolicy(keep_recent=4)
    operations = 0
    done: Counter[str] = Counter()
    for _case in range(CASES):
        history = random_session(rng, rng.randint(5, 60))
        pristine = copy.deepcopy(history)
        pinned = [s for s in range(1, len(history) + 1) if rng.random() < 0.05]
        cut = rng.randint(1, len(history))
        ctx = make_ctx(history[:cut], system_prompt="sys", pinned=pinned, protected=PROTECTED)
        pushed = cut
        number = 0
        for step in range(12):
            op = rng.choice(["push", "push", "prune", "prune", "watermark", "compress", "compress", "fold", "clip"])
            if op == "push" and pushed < len(history):
                k = rng.randint(1, 6)
                new = entries(history[pushed:pushed + k], start=pushed + 1)
                pushed += len(new)
                ctx.append(new)
                found = find_checkpoint_call(new, policy.watermark_tools, ctx.state.watermark_seq)
                if found is not None and rng.random() < 0.7:
                    move = plan_watermark(ctx, tool_use_id=found[1])
                    if isinstance(move, WatermarkMove):
                        apply_watermark(ctx, move)
                        done["checkpoint tool"] += 1
                refresh(ctx, PROTECTED)
            elif op == "prune":
                plan = plan_prune(ctx, rng.choice([0, 100]), rng.choice([0, 50, 300, 1000]), PROTECTED)
                if plan is not None:
                    apply_prune(ctx, plan, f"t{step}")
                    refresh(ctx, PROTECTED)
                    done["prune"] += 1
            elif op == "watermark" and ctx.recent:
                move = plan_watermark(ctx, seq=rng.choice(ctx.recent).seq)
                if isinstance(move, WatermarkMove):
                    apply_watermark(ctx, move)
                    refresh(ctx, PROTECTED)
                    done["watermark"] += 1
                else:
                    assert isinstance(move, str)
            elif op == "compress":
                budget = simple_budget(rng.choice([2000, 8000, 100_000]), used=ctx.used)
                selection = identify(ctx, budget, policy, keep_recent=rng.choice([None, 1]))
                if selection is not None:
                    prepare(selection, budget)
                    number += 1
                    cp = make_checkpoint(selection, "summary " + words(rng.randint(1, 30)), "test", now=NOW,
                                         number=number, count=count)
                    apply_selection(ctx, selection, cp)
                    refresh(ctx, PROTECTED)
                    done["compress"] += 1
            elif op == "fold":
                chosen = plan_fold(ctx, rng.randint(0, ctx.prompt_tokens), allowance=rng.choice([None, 50, 400]))
                if chosen:
                    number += 1
                    fold(ctx, chosen, allowance=rng.choice([50, 400, 5000]), now=NOW, number=number, count=count)
                    refresh(ctx, PROTECTED)
                    done["fold"] += 1
            elif op == "clip":
                limit = rng.choice([5, 20, 100])
                seqs = plan_clips(ctx, limit)
                if seqs:
                    apply_clips(ctx, seqs, limit, f"t{step}")
                    refresh(ctx, PROTECTED)
                    done["clip"] += 1
            operations += 1
            check_invariants(ctx, history, pristine, pushed)
    assert operations == CASES * 12
    # every layer really ran, many times
    assert all(done[k] >= 10 for k in ("checkpoint tool", "prune", "watermark", "compress", "fold", "clip")), done
