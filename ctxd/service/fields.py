"""Sizes of the fields a request stores beside messages (``protocol.common``'s ``MAX_*``):
checked before anything is stored, counted or rendered, so a 20 MB goal or title costs one
decode and a clear -32602 naming the field, never a stalled daemon or a session whose
system part no longer fits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ctxd.protocol.common import MAX_METADATA_BYTES, MAX_NAME_CHARS, MAX_TAGS
from ctxd.protocol.errors import invalid_params


def text(value: str | None, field: str, limit: int) -> None:
    """At most ``limit`` characters."""
    if value is not None and len(value) > limit:
        raise invalid_params(f"{field} is {len(value):,} characters; at most {limit:,} are accepted", field)


def items(values: Sequence[Any] | None, field: str, limit: int) -> None:
    """At most ``limit`` entries."""
    if values is not None and len(values) > limit:
        raise invalid_params(f"{field} has {len(values):,} entries; at most {limit:,} are accepted", field)


def tags(values: list[str] | None) -> None:
    items(values, "tags", MAX_TAGS)
    for i, tag in enumerate(values or ()):
        text(tag, f"tags[{i}]", MAX_NAME_CHARS)


def metadata(value: dict[str, Any] | None) -> None:
    """At most ``MAX_METADATA_BYTES`` once encoded (what is stored)."""
    if value is None:
        return
    size = len(msgspec.json.encode(value))
    if size > MAX_METADATA_BYTES:
        raise invalid_params(f"metadata is {size:,} bytes as JSON; at most {MAX_METADATA_BYTES:,} are accepted",
                             "metadata")


def system_prompt(value: str | None, limit: int) -> None:
    """As large as a message may be (``limits.max_message_bytes``, UTF-8)."""
    if value is None or len(value) * 4 <= limit:
        return
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise invalid_params(f"systemPrompt is {size:,} bytes; at most {limit:,} are accepted "
                             "(limits.max_message_bytes)", "systemPrompt")
