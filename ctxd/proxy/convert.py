"""The proxy's JSON: request and reply bodies decoded and encoded fast, and the hash
chain over a conversation.

How a client message in each API's shape is read (what ctxd stores, its projection,
its chain part, its ids) is ``ctxd.formats``'s: :func:`ctxd.formats.to_ctxd`,
:func:`~ctxd.formats.projection`, :func:`~ctxd.formats.chain_part`,
:func:`~ctxd.formats.ids_of`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from ctxd.formats.common import canonical_json

__all__ = ["chain_hash", "dumps", "loads"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class InvalidUnicode(ValueError):
    """A body whose JSON holds a lone surrogate (``"\\ud800"``): text no provider, nor
    ctxd's storage, can take."""


def loads(raw: bytes) -> Any:
    """A request or reply body: msgspec decodes a long conversation in ~60% of json's
    time; what it refuses and Python's json accepts (``NaN``) goes to json. A lone
    surrogate, which json would also accept, raises InvalidUnicode."""
    try:
        return _decode(raw)
    except msgspec.DecodeError:
        value = json.loads(raw)
    # (msgspec refuses any surrogate; json takes one escaped, and one encoded in the bytes
    # as UTF-8 would a character, which is not UTF-8)
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidUnicode(f"the JSON holds a lone surrogate ({exc.object[exc.start:exc.end]!a}): "
                             "not valid Unicode") from None
    return value


def dumps(value: Any) -> bytes:
    """The body sent upstream: msgspec encodes a long conversation ~7x faster than
    json.dumps (compact, UTF-8); json for what msgspec cannot encode (lone surrogates).
    The same encoder every time, so an unchanged prefix stays the same bytes (prompt
    caching)."""
    try:
        return _encode(value)
    except (msgspec.EncodeError, TypeError, UnicodeEncodeError, OverflowError):
        return json.dumps(value).encode()


def chain_hash(previous: str, part: Any) -> str:
    """The chain's next link: ``part`` (a ``chain_part``) hashed with the previous link."""
    return hashlib.sha256((previous + "\n" + canonical_json(part)).encode()).hexdigest()[:20]
