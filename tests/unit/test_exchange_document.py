"""ctxd's JSON export read in slices (``outline_json`` with ``between``): the outline is the
one a whole decode gives, or the same error, and no single decode sees the whole document
(a 30 MB document of 200,000 messages, refused by the import cap, was one msgspec call
holding the interpreter lock 30-250 ms while other clients waited)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from ctxd.exchange import DocumentError, document
from ctxd.exchange.document import import_outline, outline_json


def export(entries: list[Any], *, indent: int | None = None, head: dict[str, Any] | None = None,
           tail: str = "") -> str:
    body = {"format": "ctxd.session", "version": 1, "exportedAt": "2025-01-01T00:00:00Z",
            "session": {"sessionId": "s", "createdAt": "2025-01-01T00:00:00Z", "model": "gpt-4", **(head or {})},
            "messages": entries, "checkpoints": [], "compressions": [{"id": 1}], "events": [{"kind": "x"}]}
    text = json.dumps(body, indent=indent)
    return text[:-1] + tail + "}" if tail else text


def entry(i: int, content: Any) -> dict[str, Any]:
    return {"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
            "message": {"role": "user" if i % 2 == 0 else "assistant", "content": content}}


TRICKY = ['}, {"seq": 3, "message": {}', '"}, {"seq": 1}', "}]}, {", "\\", '\\"}, {"seq"', "é日本😀",
          "\u2028", '"messages": [', "ctxd", "x" * 50]


def tricky_content(rng: random.Random) -> Any:
    """Text and content blocks holding what a cut could be mistaken for: an entry's end
    inside strings, nested objects whose first key is an entry's."""
    text = "".join(rng.choice(TRICKY) for _ in range(rng.randrange(1, 8)))
    pick = rng.randrange(3)
    if pick == 0:
        return text
    if pick == 1:
        return [{"type": "text", "text": text}, {"type": "text", "text": rng.choice(TRICKY)}]
    return [{"type": "tool_use", "id": "t", "name": "n", "input": {"seq": 1, "message": {"seq": [{"seq": 2}]}}},
            {"type": "text", "text": text}]


def outcome(text: str, between: Any = None) -> Any:
    try:
        outline = outline_json(text, between)
    except (DocumentError, UnicodeError) as exc:
        return ("error", type(exc), str(exc))
    return ("outline", [bytes(m) for m in outline.messages],
            {f: getattr(outline, f) for f in ("format", "version", "session", "checkpoints", "compressions",
                                              "events")})


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(document, "SLICE_CHARS", 300)


@pytest.mark.parametrize("seed", range(30))
def test_slices_give_the_whole_decodes_outline_or_error(seed: int, small_slices: None) -> None:
    rng = random.Random(seed)
    entries = [entry(i, tricky_content(rng)) for i in range(rng.randrange(0, 60))]
    text = export(entries, indent=rng.choice([None, 1, 2]))
    steps: list[int] = []
    assert outcome(text, lambda: steps.append(1)) == outcome(text)
    if len(text) > 3000:
        assert steps, "read in one piece"
    for _ in range(15):  # damaged: a character changed, or the document cut short
        at = rng.randrange(len(text))
        damaged = text[:at] + rng.choice('"\\[]{},: x') + text[at + 1:] if rng.random() < 0.7 else text[:at]
        assert outcome(damaged, lambda: None) == outcome(damaged), (seed, at)


@pytest.mark.parametrize("case", [
    "duplicate key", "nested messages key first", "nested messages key last", "no entries", "entries not objects",
    "not an object", "other key order", "newer version", "messages not a list", "lone surrogate",
])
def test_documents_a_slice_could_misread(case: str, small_slices: None) -> None:
    entries = [entry(i, f"message {i} " + "words " * 20) for i in range(40)]
    text = {
        "duplicate key": export(entries, tail=', "messages": [{"seq": 1, "message": {"role": "user"}}]'),
        "nested messages key first": export(entries, head={"metadata": {"messages": [{"seq": 1}, {"seq": 2}]}}),
        "nested messages key last": export(entries, tail=', "extra": {"messages": [{"seq": 9}]}'),
        "no entries": export([], head={"systemPrompt": '}, {"seq": 1} ' * 200}),
        "entries not objects": export([1, "two", None, *entries, [3]]),
        "not an object": json.dumps([entries]),
        "other key order": export([{"message": e["message"], "seq": e["seq"]} for e in entries]),
        "newer version": export(entries).replace('"version": 1', '"version": 99'),
        "messages not a list": export(entries).replace('"messages": [', '"messages": {"a": [', 1)[:-1] + "}}",
        "lone surrogate": export(entries[:20]) [:-300] + "\ud800" + export(entries[:20])[-300:],
    }[case]
    assert outcome(text, lambda: None) == outcome(text)


def test_a_large_export_is_read_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """No decode sees more than about two slices, ``between`` runs between them, and the
    messages decode as before."""
    monkeypatch.setattr(document, "SLICE_CHARS", 2000)
    sizes: list[int] = []
    for name in ("_outline_decoder", "_raw_list_decoder"):
        real = getattr(document, name).decode
        monkeypatch.setattr(document, name, type("D", (), {"decode": staticmethod(
            lambda text, real=real: sizes.append(len(text)) or real(text))}))
    entries = [entry(i, f"message {i} about the cache layer") for i in range(2000)]
    text = export(entries, indent=1)
    events: list[str] = []
    outline = outline_json(text, lambda: events.append("aside"))
    assert len(outline.messages) == 2000 and len(events) >= len(text) // 4000
    assert max(sizes) < 3 * 2000
    doc = import_outline(outline)
    assert doc == import_outline(outline_json(text))
    assert [m.message.content for m in doc.messages] == [e["message"]["content"] for e in entries]


def test_the_messages_decode_steps_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(document, "STEP_SECONDS", 0.0)
    text = export([entry(i, f"message {i}") for i in range(50)])
    calls: list[int] = []
    doc = import_outline(outline_json(text), lambda: calls.append(1))
    assert len(doc.messages) == 50 and len(calls) >= 49
    assert doc == import_outline(outline_json(text))


def test_raw_entries_are_the_documents_bytes(small_slices: None) -> None:
    entries = [entry(i, "é" * 30 + str(i)) for i in range(100)]
    text = export(entries, indent=1)
    sliced = outline_json(text, lambda: None)
    assert [msgspec.json.decode(m) for m in sliced.messages] == entries


@pytest.mark.parametrize("fmt", ["json", "auto"])
def test_an_import_over_the_cap_is_refused_from_slices(fmt: str, small_slices: None) -> None:
    """``session/import``'s parse (in a thread) reads a ctxd export in slices, stepping aside
    between them, and refuses it over ``limits.max_batch_messages`` with the figures."""
    from ctxd.protocol.errors import CtxdError
    from ctxd.protocol.history import ImportParams
    from ctxd.service.transfer import _parse

    text = export([entry(i, f"message {i}") for i in range(300)])
    calls: list[int] = []
    with pytest.raises(CtxdError) as refused:
        _parse(ImportParams(document=text, format=fmt), 100, lambda: calls.append(1))
    assert refused.value.data == {"field": "document", "count": 300, "limit": 100}
    assert "300 messages; the limit is 100 (limits.max_batch_messages" in refused.value.message
    assert len(calls) >= len(text) // 600
    calls.clear()
    docs, parsed, _ = _parse(ImportParams(document=text, format=fmt), 300, lambda: calls.append(1))
    assert parsed == "json" and [m.seq for m in docs[0].messages] == list(range(1, 301)) and calls


def test_an_imports_messages_are_prepared_stepping_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """``session/import`` validates, encodes and counts the messages in a thread that steps
    aside between pieces (before: on the event loop, in 10 ms slices), and refuses a
    message over ``limits.max_message_bytes`` with its figures."""
    from ctxd.protocol.errors import CtxdError
    from ctxd.service import transfer
    from ctxd.tokens import TokenCounter

    monkeypatch.setattr(transfer, "STEP_SECONDS", 0.0)
    doc = import_outline(outline_json(export([entry(i, f"message {i}") for i in range(40)])))
    calls: list[int] = []
    rows, stats, used, system = transfer._prepare(doc, TokenCounter.for_model("gpt-4"), 4096, "now",
                                                  lambda: calls.append(1))
    assert len(rows) == 40 and len(calls) >= 39 and used == sum(r.tokens.context for _, r in rows)
    assert [seq for seq, _ in rows] == list(range(1, 41))
    assert [r.message.content for _, r in rows] == [f"message {i}" for i in range(40)]
    assert all(r.body == msgspec.json.encode(r.message) and r.created_at == "2025-01-01T00:00:00Z" and r.key is None
               for _, r in rows)
    with pytest.raises(CtxdError) as refused:
        transfer._prepare(doc, TokenCounter.for_model("gpt-4"), 20, "now", lambda: None)
    assert refused.value.data == {"field": "messages[0]", "size": len(rows[0][1].body), "limit": 20}
