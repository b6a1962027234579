"""A large ctxd export read in slices (``outline_json`` with ``between``) gives what a whole
decode gives, or the same error, for documents crafted to slice differently than they
decode: a later "messages" key spelled with an escape, a key that only ends in messages,
a character JSON does not call whitespace where a slice is cut; and through
``session/import``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxd.exchange import DocumentError
from ctxd.exchange.document import SLICE_CHARS, outline_json
from ctxd.service import transfer
from ctxd.service.core import Service

from .service_helpers import params

HEAD = '{"format": "ctxd.session", "version": 1, "session": {"sessionId": "s"}, '


def entry(i: int) -> dict[str, Any]:
    return {"seq": i + 1, "createdAt": "2025-01-01T00:00:00Z",
            "message": {"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 1000}}


ENTRIES = [entry(i) for i in range(2500)]  # ~2.7 M characters: sliced


def outcome(text: str, between: Any = None) -> Any:
    try:
        return len(outline_json(text, between).messages)
    except DocumentError as exc:
        return ("error", str(exc))


def test_a_second_messages_key_written_with_an_escape() -> None:
    # JSON's last "messages" wins; the slices only look for the key spelled plainly.
    text = HEAD + '"messages": ' + json.dumps(ENTRIES) + ', "\\u006dessages": [' + json.dumps(entry(0)) + "]}"
    assert len(text) > 2 * SLICE_CHARS
    assert outcome(text) == 1
    assert outcome(text, lambda: None) == 1  # (not the first array's entries + 1)


def test_a_key_ending_in_messages_after_an_escaped_quote() -> None:
    # The key is '"messages' (an escaped quote, then messages): not the outline's field.
    text = HEAD + '"\\"messages": ' + json.dumps(ENTRIES) + "}"
    assert outcome(text) == 0
    assert outcome(text, lambda: None) == 0  # (its entries are not messages)


def test_what_json_does_not_call_whitespace_at_a_cut() -> None:
    # \f (or U+00A0, U+2028...) between two entries, where a slice is cut: invalid JSON,
    # refused whole; the slices drop it with the separator (re's \s is not JSON's).
    parts = [json.dumps(e) for e in ENTRIES]
    prefix = HEAD + '"messages": ['
    pos, look, bad = len(prefix), len(prefix) + SLICE_CHARS, set()
    for i, p in enumerate(parts[:-1]):
        if pos + len(p) - 1 >= look:  # the first entry end from where the next cut is looked for
            bad.add(i)
            look = pos + len(p) + 2 + SLICE_CHARS
        pos += len(p) + 2
    text = prefix + "".join(p + (",\f" if i in bad else ", ") for i, p in enumerate(parts[:-1])) + parts[-1] + "]}"
    whole = outcome(text)
    assert whole[0] == "error" and "not valid JSON" in whole[1]
    assert outcome(text, lambda: None) == whole


@pytest.fixture
def storage_url() -> str:
    return ""


async def test_a_key_that_is_not_messages_is_not_imported(service: Service) -> None:
    entries = [{"seq": i + 1, "message": {"role": "user", "content": "x" * 1000}} for i in range(2500)]
    doc = ('{"format": "ctxd.session", "version": 1, "session": {"sessionId": "s"}, "\\"messages": '
           + json.dumps(entries) + "}")
    assert len(outline_json(doc).messages) == 0  # what the document holds, decoded whole
    result = await transfer.import_session(service, params("session/import", document=doc, format="json"))
    assert result.message_count == 0  # (none from the key '"messages')
