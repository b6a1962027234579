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


def _pins_in_full(conv: Any, plan: Any, entries: list[Stored]) -> list[str]:
    """``context/prompt`` ``current`` of a turn as a full reading makes it: every client
    message's key (the stored copy's, else the one pushed), ordered, filtered."""
    base = len(entries) - len(plan.new)
    keys = {j: entries[i].key for j, i in plan.matched.items()}
    keys.update((j, entries[base + m].key) for m, j in enumerate(plan.new))
    anchored = [j for j, a in enumerate(conv.anchors) if a]
    spoken = [] if anchored else [j for j, (m, _, _) in enumerate(conv.items) if m.get("role") == "assistant"]
    first = anchored[0] if anchored else spoken[0] if spoken else len(conv.items)
    newest = anchored[-1] if anchored else spoken[-1] if spoken else -1
    order = list(reversed(keys)) if plan.extends else sorted(keys, reverse=True)
    tail = [] if plan.extends else [j for j in order if j >= max(newest, 0) and (j == newest or not conv.anchors[j])]
    head = [j for j in order if j < first and not conv.anchors[j] and j not in tail]
    return [f"ctxd-proxy:{keys[j]}" for j in tail + head]


async def test_turns_over_random_conversations_do_what_a_full_reading_does(tmp_path) -> None:
    """Through ``Sessions`` on an in-process daemon, random agent conversations (plain
    turns, tool calls, a prefix replaced, a trailing reminder dropped, a reply dropped: a
    fork, a reply whose push fails): each turn's plan, its messages' sides and the pins it
    names, and each plan made before the turn (``Sessions.early``), are a full reading's
    of the session as it was (the kept columns, ``identity.Live``, change nothing)."""
    import random

    from ctxd.config import load_config
    from ctxd.embed import open_here
    from ctxd.proxy import apis
    from ctxd.proxy.app import order_of
    from ctxd.proxy.inproc import PortLink
    from ctxd.proxy.sessions import Sessions
    from tests.proxy.upstream import MODEL
    from tests.unit.test_identity_live import full_match, full_sides

    config = load_config(None, overrides={"daemon": {"data_dir": str(tmp_path / "data"),
                                                     "socket": str(tmp_path / "run" / "ctxd.sock")}})
    link = PortLink(await open_here(config))
    failing = [False]
    request = link.request

    async def flaky(session_id: str, method: str, params: Any) -> Any:
        if failing[0] and method == "session/push":
            raise OSError("the reply's push is refused")
        return await request(session_id, method, params)

    link.request = flaky  # type: ignore[method-assign]
    sessions = Sessions(link)
    rng = random.Random(19)
    seen: dict[str, int] = {}
    try:
        for conversation in range(4):
            name = f"random-{conversation}"
            messages: list[dict[str, Any]] = [{"role": "system", "content": "Agent."},
                                              {"role": "user", "content": "Files: v0"}]
            for turn in range(40):
                event = rng.random()
                if event < 0.1:
                    messages[1] = {"role": "user", "content": f"Files: v{turn}"}  # (the prefix replaced)
                    seen["replaced"] = seen.get("replaced", 0) + 1
                elif event < 0.15 and any(m["role"] == "assistant" for m in messages):
                    drop = max(j for j, m in enumerate(messages) if m["role"] == "assistant")
                    del messages[drop]  # (a reply regenerated: a fork)
                    seen["dropped"] = seen.get("dropped", 0) + 1
                if str(messages[-1].get("content") or "").startswith("Reminder") and rng.random() < 0.7:
                    messages.pop()
                messages.append({"role": "user", "content": f"Request {turn} of {name}."})
                if rng.random() < 0.2:
                    messages.append({"role": "user", "content": f"Reminder {turn}."})
                body = {"model": MODEL, "messages": messages}
                parts = apis.split("openai", body)
                conv = sessions.read("openai", body, parts, session=name, window=200000)
                known = sessions._tracked.get(sessions._aliases.get(name, name))
                if known is not None:
                    await sessions._settle(known)  # (a failed reply push: its entries cut, as the turn would)
                before = [Stored(s.key, s.ident, s.anchor, s.shape, s.live) for s in known.entries] if known else []
                verbatim = known.verbatim if known else None
                if sessions.early(conv, "openai", body):
                    assert known is not None and verbatim is not None and conv.early is not None
                    ahead = conv.early[2]
                    assert ahead == full_match(before, conv.idents)
                    assert ahead.matched_since(verbatim.entries) == \
                        [j for j, i in ahead.matched.items() if i >= verbatim.entries]
                    seen["ahead"] = seen.get("ahead", 0) + 1
                tracked, chain, prompt = await sessions.turn(conv, "openai")
                plan = conv.plan
                assert plan is not None
                if tracked is known:
                    assert plan == full_match(before, conv.idents)
                    assert (conv.shapes, conv.anchors) == full_sides(before, plan, conv.idents)
                    seen["extends" if plan.extends else "other"] = seen.get("extends" if plan.extends else "other",
                                                                           0) + 1
                assert tracked.current == _pins_in_full(conv, plan, tracked.entries)
                out = apis.upstream_body("openai", body, parts, prompt, conv.align, order_of(conv))
                conv.align.previous = None
                sessions.verbatim(tracked, conv, "openai", prompt, as_sent=apis.unchanged("openai", body, out))
                if rng.random() < 0.3:
                    reply = {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"call_{conversation}_{turn}", "type": "function",
                         "function": {"name": "read", "arguments": "{}"}}]}
                    more = [{"role": "tool", "tool_call_id": f"call_{conversation}_{turn}", "content": "text"}]
                else:
                    reply, more = {"role": "assistant", "content": f"Answer {turn}."}, []
                failing[0] = rng.random() < 0.15
                seen["failed"] = seen.get("failed", 0) + failing[0]
                await sessions.push_reply(tracked, chain, conv, [reply], {"inputTokens": 10, "outputTokens": 5})
                await sessions.drain()
                failing[0] = False
                messages += [reply, *more]
        assert min(seen.get(k, 0) for k in ("replaced", "dropped", "ahead", "extends", "other", "failed")) >= 3, seen
    finally:
        await sessions.drain()
        await link.close()
