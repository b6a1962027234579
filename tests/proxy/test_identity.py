"""Which stored message a client's message is (``identity.py``): by provider ids where it
has them, whatever optional fields the client added; the client's own working context
(superseded, moved) against a real divergence; the upstream request in the client's order."""

from __future__ import annotations

from typing import Any

from ctxd.formats import chain_part
from ctxd.proxy.identity import Ident, Stored, compose, ident_of, match


def ident(api: str, message: dict[str, Any]) -> Ident:
    return ident_of(api, message, chain_part(api, message))  # type: ignore[arg-type]


def stored(api: str, messages: list[dict[str, Any]], replies: set[int] = frozenset()) -> list[Stored]:  # type: ignore[assignment]
    out = []
    for n, m in enumerate(messages):
        i = ident(api, m)
        out.append(Stored(f"k{n}", i.key, i.ids or n in replies, i.shape))
    return out


EDIT = {"role": "assistant", "content": [
    {"type": "text", "text": "Editing."},
    {"type": "tool_use", "id": "toolu_1", "name": "Edit", "input": {"file_path": "a.py", "old_string": "x",
                                                                    "new_string": "y"}}]}
EDIT_AS_SENT_BACK = {"role": "assistant", "content": [
    {"type": "text", "text": "Editing."},
    {"type": "tool_use", "id": "toolu_1", "name": "Edit", "input": {"file_path": "a.py", "old_string": "x",
                                                                    "new_string": "y", "replace_all": False},
     "cache_control": {"type": "ephemeral"}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}]}


def test_a_message_with_the_same_ids_is_the_same_message() -> None:
    assert ident("anthropic", EDIT).key == ident("anthropic", EDIT_AS_SENT_BACK).key
    assert ident("anthropic", EDIT).shape != ident("anthropic", EDIT_AS_SENT_BACK).shape
    other = {"role": "assistant", "content": [dict(EDIT["content"][1], id="toolu_2")]}
    assert ident("anthropic", other).key != ident("anthropic", EDIT).key
    session = stored("anthropic", [{"role": "user", "content": "Fix a.py"}, EDIT, RESULT])
    plan = match(session, [ident("anthropic", m) for m in [{"role": "user", "content": "Fix a.py"},
                                                           EDIT_AS_SENT_BACK, RESULT,
                                                           {"role": "user", "content": "Thanks"}]])
    assert plan is not None and plan.extends and plan.new == [3]
    # Another tool call id in its place: the conversation diverged.
    assert match(session, [ident("anthropic", m) for m in [{"role": "user", "content": "Fix a.py"}, other]]) is None


def _aider(turn: int, files: str, done: list[dict[str, Any]], cur: str) -> list[dict[str, Any]]:
    """aider's order: repo map pair, the done messages, the files pair, the current message,
    a trailing system reminder."""
    return [{"role": "user", "content": "Repo map:\nsrc/app.py: handler"}, {"role": "assistant", "content": "Ok."},
            *done, {"role": "user", "content": f"Files in the chat:\n{files}"},
            {"role": "assistant", "content": "Ok, any changes will be to those files."},
            {"role": "user", "content": cur}, {"role": "system", "content": "Reminder: use SEARCH/REPLACE."}]


def test_the_clients_own_context_moves_and_is_replaced_without_a_divergence() -> None:
    first = _aider(1, "def handler(): pass", [], "Rename handler.")
    session = stored("openai", first) + [Stored("r1", ident("openai", {"role": "assistant", "content": "Done."}).key,
                                                True, "")]
    done = [{"role": "user", "content": "Rename handler."}, {"role": "assistant", "content": "Done."}]
    second = _aider(2, "def renamed(): pass", done, "Now add a test.")
    plan = match(session, [ident("openai", m) for m in second])
    assert plan is not None and not plan.extends
    # The new files message and the new request are new; the old files copy is superseded;
    # the repo map, the acks, the reminder (moved to the end again) are the stored ones.
    assert [second[j]["content"][:18] for j in plan.new] == ["Files in the chat:", "Now add a test."]
    assert [session[i].key for i in plan.superseded] == ["k2"]
    assert plan.matched[0] == 0 and plan.matched[len(second) - 1] == 5
    # The reply dropped (aider summarised its history itself): a divergence.
    assert match(session, [ident("openai", m) for m in _aider(2, "x", done[:1], "Next.")]) is None


def test_anchors_in_another_order_diverge() -> None:
    a = {"role": "assistant", "content": "First answer."}
    b = {"role": "assistant", "content": "Second answer."}
    session = stored("openai", [{"role": "user", "content": "q1"}, a, {"role": "user", "content": "q2"}, b],
                     replies={1, 3})
    swapped = [{"role": "user", "content": "q1"}, b, {"role": "user", "content": "q2"}, a]
    assert match(session, [ident("openai", m) for m in swapped]) is None


def test_compose_follows_the_clients_order_and_bytes() -> None:
    api = "openai"
    client = _aider(2, "def renamed(): pass", [{"role": "user", "content": "Rename handler."},
                                                 {"role": "assistant", "content": "Done."}], "Now add a test.")
    idents = [ident(api, m) for m in client]
    # ctxd's prompt in history order: the repo map pair, the files' ack, the first request
    # and the reminder as stored on turn 1 (the first files copy superseded), the reply
    # (clipped by ctxd), a note another client pushed, then turn 2's new copies.
    rendered = [client[0], client[1], client[5], client[2], client[7],
                {"role": "assistant", "content": "Do… [clipped]"}, {"role": "user", "content": "A note from ctxd-cli."},
                client[4], client[6]]
    shapes: list[str | None] = [i.shape for i in idents]
    anchors = [False, False, False, True, False, False, False, False]
    out = compose(api, rendered, client, idents, shapes, lambda m: ident(api, m), anchors)
    assert [m["content"][:14] for m in out] == [
        "Repo map:\nsrc/", "Ok.", "Rename handler", "Do… [clipped]", "A note from ct", "Files in the c",
        "Ok, any change", "Now add a test", "Reminder: use "]
    assert out[0] is client[0] and out[2] is client[2]  # the client's own objects, byte for byte


def test_compose_sends_ctxds_version_where_it_changed_a_message() -> None:
    """A tool output ctxd pruned keeps its id (the same message) but not its shape: ctxd's
    version goes in the client's place; the untouched call goes as the client's bytes."""
    api = "anthropic"
    client = [{"role": "user", "content": "Fix a.py"}, EDIT_AS_SENT_BACK,
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x" * 500}]},
              {"role": "user", "content": "Thanks"}]
    idents = [ident(api, m) for m in client]
    shapes: list[str | None] = [idents[0].shape, ident(api, EDIT).shape, idents[2].shape, idents[3].shape]
    pruned = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[pruned]"}]}
    out = compose(api, [client[0], EDIT, pruned, client[3]], client, idents, shapes, lambda m: ident(api, m),
                  [False, True, True, False])
    assert out == [client[0], EDIT_AS_SENT_BACK, pruned, client[3]] and out[1] is client[1]
