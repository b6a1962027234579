"""The agent's working set (engine/workset.py): which file reads stay verbatim, from tool
calls alone, and how the pins follow it."""

from __future__ import annotations

from ctxd.engine.pipeline import identify, irreducible
from ctxd.engine.policy import CompressionPolicy
from ctxd.engine.workset import (
    EDIT,
    READ,
    apply_working_set,
    call_touches,
    index_reads,
    plan_working_set,
    plan_yield,
    working_set,
)
from ctxd.protocol.message import CustomCall, Message, ToolCall
from tests.unit._engine_helpers import (
    a_call,
    a_result,
    budget_of,
    entries,
    make_ctx,
    o_call,
    o_result,
    refresh,
    user,
    words,
)

PATCH = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-a = 1\n+a = 2\n*** End Patch\n"


def sent(e):  # type: ignore[no-untyped-def]
    return e.sent_tokens


def chosen(es, room):  # type: ignore[no-untyped-def]
    return working_set(index_reads(es, sent), room)


def shell(call_id: str, cmd: str) -> Message:
    return o_call((call_id, "exec_command", {"cmd": cmd, "yield_time_ms": 10000}))


def patch(call_id: str, text: str = PATCH) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, type="custom",
                                                          custom=CustomCall(name="apply_patch", input=text))])


def test_paths_come_from_documented_call_shapes() -> None:
    def kinds(*args, **kw):  # type: ignore[no-untyped-def]
        return [(t.path, t.kind) for t in call_touches("c", *args, **kw)]

    assert kinds({"cmd": "sed -n '1,400p' src/app.py"}) == [("src/app.py", READ)]
    assert kinds('{"command": "cat ./README.md"}') == [("README.md", READ)]
    assert kinds({"command": ["bash", "-lc", "head -n 50 docs/design.md"]}) == [("docs/design.md", READ)]
    assert kinds({"cmd": "sed -i 's/a/b/' src/app.py"}) == [("src/app.py", EDIT)]
    assert kinds({"file_path": "/repo/x.py"}) == [("/repo/x.py", READ)]
    assert kinds({"filePath": "x.py", "oldString": "a", "newString": "b"}) == [("x.py", EDIT)]
    assert kinds(None, PATCH) == [("src/app.py", EDIT)]
    assert kinds({"input": "--- a/lib/y.py\n+++ b/lib/y.py\n@@\n-x\n+y\n"}) == [("lib/y.py", EDIT)]
    # What prints something other than the file: not a read of it.
    assert kinds({"cmd": "git log -p -- src/app.py"}) == []
    assert kinds({"cmd": "cat src/app.py | grep def"}) == []
    assert kinds({"cmd": "python3 -m unittest tests/test_app.py"}) == []
    assert kinds({"cmd": "sed -n '1,400p' src/app.py && rm -rf /"}) == []


def test_the_newest_read_of_each_file_with_its_call() -> None:
    es = entries([
        user("fix it"),
        shell("r1", "sed -n '1,400p' src/app.py"), o_result("r1", "old copy " + words(50)),   # 2, 3
        shell("r2", "cat README.md"), o_result("r2", "readme " + words(30)),                  # 4, 5
        shell("r3", "sed -n '1,400p' src/app.py"), o_result("r3", "new copy " + words(50)),   # 6, 7
        shell("t", "python3 -m unittest"), o_result("t", words(80)),                         # 8, 9
    ])
    assert chosen(es, 10_000) == [4, 5, 6, 7]


def test_files_worked_on_come_first_then_the_most_files_that_fit() -> None:
    es = entries([
        user("fix it"),
        shell("a", "cat src/app.py"), o_result("a", words(200)),      # 2, 3: read, then patched
        shell("b", "cat big.csv"), o_result("b", words(600)),          # 4, 5: read once, big
        shell("c", "cat small.md"), o_result("c", words(100)),         # 6, 7: read once
        patch("p"), o_result("p", "Success."),                         # 8, 9
    ])
    pair = {e.seq: e.sent_tokens for e in es}
    app = pair[2] + pair[3]
    assert chosen(es, app + pair[6] + pair[7]) == [2, 3, 6, 7]
    # Too small for the file being patched: the others still go in where they fit.
    assert chosen(es, app - 1) == [6, 7]
    assert chosen(es, 10_000) == [2, 3, 4, 5, 6, 7]


def test_anthropic_reads_and_structured_read_tools() -> None:
    es = entries([
        user("fix it"),
        a_call(("t1", "Read", {"file_path": "/repo/a.py"})), a_result(("t1", "code " + words(40))),
        a_call(("t2", "Edit", {"file_path": "/repo/a.py", "old_string": "x", "new_string": "y"})),
        a_result(("t2", "ok")),
    ])
    assert chosen(es, 10_000) == [2, 3]


def test_a_pass_keeps_the_working_set_and_summarizes_the_rest() -> None:
    """Before, the read of the file being patched went into the checkpoint with the rest and
    left the prompt; pinned as the working set it stays whole behind the boundary, and an
    older copy leaves."""
    ctx = make_ctx([
        user("fix the bug in src/app.py"),
        shell("r1", "sed -n '1,400p' src/app.py"), o_result("r1", "first copy " + words(300)),   # 2, 3
        shell("g", "git log -p"), o_result("g", words(900, "code")),                           # 4, 5
        shell("r2", "sed -n '1,400p' src/app.py"), o_result("r2", "second copy " + words(300)),  # 6, 7
        shell("t", "python3 -m unittest"), o_result("t", words(900, "test")),                  # 8, 9
        patch("p"), o_result("p", "Success."),                                                 # 10, 11
        user("and now?"),
    ])
    budget = budget_of(ctx, window=8192)
    seqs, reads = plan_working_set(ctx, budget.max_prompt_tokens, CompressionPolicy().working_share)
    assert seqs == [6, 7]
    assert apply_working_set(ctx, seqs, reads)
    refresh(ctx)
    assert ctx.state.working == [6, 7] and set(ctx.state.pinned) == {6, 7}
    selection = identify(ctx, budget_of(ctx, window=8192), CompressionPolicy(), keep_recent=1)
    assert selection is not None
    assert {e.seq for e in selection.keep} >= {6, 7}
    # Sent whole and summarized too (as the user's words are): when the set moves on, the
    # checkpoint stands for them.
    assert {6, 7} <= set(selection.message_seqs)
    assert any(m.content == "second copy " + words(300) for m in selection.summary_input())
    # A newer read of the file replaces the older copy, which leaves the prompt.
    ctx.kept = [e for e in ctx.recent if e.seq in (1, 6, 7)]
    ctx.recent = [e for e in ctx.recent if e.seq > 11]
    ctx.state.boundary = 11
    ctx.state.kept_seqs = [1, 6, 7]
    ctx.recent += entries([shell("r3", "cat src/app.py"), o_result("r3", "third copy " + words(300))], start=13)
    refresh(ctx)
    seqs, reads = plan_working_set(ctx, budget.max_prompt_tokens, CompressionPolicy().working_share)
    assert seqs == [13, 14]
    assert apply_working_set(ctx, seqs, reads)
    assert [e.seq for e in ctx.kept] == [1] and ctx.state.pinned == [13, 14]


def test_the_newest_turn_comes_before_the_working_set() -> None:
    """A newest tool result too big to fit beside the files: the files yield, it stays whole."""
    ctx = make_ctx([
        user("fix it"),
        shell("r", "cat src/app.py"), o_result("r", words(1500)),
        shell("t", "python3 -m unittest"), o_result("t", words(5200, "test")),
    ])
    budget = budget_of(ctx, window=8192)
    assert plan_working_set(ctx, budget.max_prompt_tokens, 0.5)[0] == []
    ctx.recent = ctx.recent[:3]
    refresh(ctx)
    assert plan_working_set(ctx, budget.max_prompt_tokens, 0.5)[0] == [2, 3]


def test_the_users_pins_are_left_alone() -> None:
    ctx = make_ctx([user("x"), shell("r", "cat a.py"), o_result("r", words(20))], pinned=[3])
    assert apply_working_set(ctx, [2, 3])
    assert ctx.state.working == [2] and ctx.state.pinned == [2, 3]
    assert apply_working_set(ctx, [])
    assert ctx.state.working == [] and ctx.state.pinned == [3]


def test_a_read_that_left_the_prompt_stays_known_and_comes_back() -> None:
    """A read unpinned for want of room (the newest turn came first) left the prompt; the
    index keeps it, a later edit marks it worked on, and it comes back from history."""
    es = entries([user("fix it"), shell("r", "cat src/app.py"), o_result("r", "code " + words(100))])
    prior = index_reads(es, sent)
    assert [(r.path, r.call_seq, r.result_seq, r.again) for r in prior] == [("src/app.py", 2, 3, False)]
    ctx = make_ctx([shell("t", "make"), o_result("t", words(50)), patch("p"), o_result("p", "Success.")], start=10)
    ctx.kept = [es[0]]
    ctx.state.boundary, ctx.state.kept_seqs, ctx.state.reads = 9, [1], prior
    refresh(ctx)
    seqs, reads = plan_working_set(ctx, 6000, 0.5)
    assert seqs == [2, 3] and reads[0].again
    assert apply_working_set(ctx, seqs, reads, loaded=es[1:])
    refresh(ctx)
    assert [e.seq for e in ctx.kept] == [1, 2, 3] and ctx.state.working == [2, 3]
    assert ctx.conversation()[2].content == "code " + words(100)


def _behind_the_boundary(ctx, through: int) -> None:  # type: ignore[no-untyped-def]
    """As a pass leaves it: what is pinned or the user's words up to ``through`` kept
    verbatim, the rest summarized away."""
    keep = set(ctx.state.pinned) | {1}
    ctx.kept = [e for e in ctx.recent if e.seq <= through and e.seq in keep]
    ctx.recent = [e for e in ctx.recent if e.seq > through]
    ctx.state.boundary, ctx.state.kept_seqs = through, [e.seq for e in ctx.kept]
    refresh(ctx)


def test_the_working_set_yields_to_a_prompt_that_cannot_fit_otherwise() -> None:
    """The newest user message is long: with the files pinned the prompt cannot fit, without
    some of them it does. The working set is ctxd's own pin, not the user's: it is not
    counted as what no compression can remove (a prompt was refused as "the newest user
    message alone needs N tokens with the pins"), and it yields the read wanted least (read
    once) before the one being worked on, only as much as the excess needs."""
    ctx = make_ctx([
        user("fix it"),
        shell("a", "cat src/app.py"), o_result("a", "app " + words(400)),       # 2, 3: then patched
        shell("b", "cat notes.md"), o_result("b", "notes " + words(300)),       # 4, 5: read once
        patch("p"), o_result("p", "Success."),                                  # 6, 7
    ])
    seqs, reads = plan_working_set(ctx, 100_000, 0.5)
    assert seqs == [2, 3, 4, 5]
    assert apply_working_set(ctx, seqs, reads)
    _behind_the_boundary(ctx, 7)
    ctx.recent += entries([user("now also this: " + words(1500, "note"))], start=8)
    refresh(ctx)
    notes = sum(e.view_tokens for e in ctx.kept if e.seq in (4, 5))
    limit = ctx.prompt_tokens - notes + 20           # over by less than the read of notes.md
    assert irreducible(ctx) <= limit < irreducible(ctx) + ctx.pinned_tokens
    keep = plan_yield(ctx, limit)
    assert keep == [2, 3]
    assert apply_working_set(ctx, keep)
    refresh(ctx)
    assert ctx.prompt_tokens <= limit and [e.seq for e in ctx.kept] == [1, 2, 3]
    # Over by more than the whole set: all of it goes; a prompt that fits keeps it all.
    assert plan_yield(ctx, ctx.prompt_tokens - ctx.pinned_tokens) == []
    assert plan_yield(ctx, ctx.prompt_tokens) == [2, 3]
