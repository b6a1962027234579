"""A prompt's messages kept as their JSON between prompts, for the wire.

Encoding a ~200k-token prompt (~1 MB of JSON) is most of what ``context/prompt`` costs a
socket client, yet between two turns the prompt only grows at its end: the renderer hands
out the same message objects for the part it reused (``engine.render.IncrementalRenderer``),
and nothing changes a message once rendered (changes are made on copies:
``formats.anthropic.finish``, ``cache_breakpoints``). So each message's JSON is kept beside
it (``msgspec.Raw``) and a prompt is written from those fragments; only the messages
that are not the same objects as last time (the newest, what a compression, a pin or an
edit renders anew) are encoded. msgspec writes a ``Raw`` verbatim, so the bytes on the
wire are those of a plain encode.

Memory: a session's fragments are as large as its prompt's JSON, so they are kept from
its second prompt of a format on (a session asked once, by a listing or an export, keeps
none) and dropped with its loaded context (``SessionState.drop_context``, the context
cache's eviction).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Fragments:
    """The messages of the last prompt of one format, and their JSON once kept."""

    messages: list[Any]
    raws: list[msgspec.Raw] | None = None


def same_prefix(before: list[Any], now: list[Any]) -> int:
    """How many leading messages of ``now`` are the very objects ``before`` starts with
    (compared by identity, in C: no Python call per message)."""
    same = list(map(operator.is_, before, now))
    try:
        return same.index(False)
    except ValueError:
        return len(same)


def pre_encoded(kept: dict[str, Fragments], key: str, messages: list[Any]) -> list[Any]:
    """``messages`` for the encoder: the first time under ``key``, themselves (noted for
    next time); then each as its JSON, reusing the JSON of the leading messages that are
    the same objects as in the previous prompt under ``key`` and encoding the rest."""
    before = kept.get(key)
    if before is None:
        kept[key] = Fragments(messages)
        return messages
    k = same_prefix(before.messages, messages) if before.raws is not None else 0
    raws = before.raws[:k] if before.raws is not None and k else []
    raw = msgspec.Raw
    raws += [raw(_encode(m)) for m in messages[k:]]
    kept[key] = Fragments(messages, raws)
    return raws
