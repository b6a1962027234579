"""Provider-native spellings accepted on ``session/push`` and ``context/prompt``'s
``push``: a client may push messages as they came from a provider's API (OpenAI's
``tool_calls``, Anthropic's ``tool_use_id``, any provider's usage object), and they are
renamed to ctxd's own before the Message is decoded (which refuses unknown fields), so
messages pasted from OpenAI or Anthropic need no rewriting and nothing is lost.

The names come from the provider modules (``openai.NATIVE_MESSAGE``,
``anthropic.NATIVE_BLOCK``, each module's ``USAGE``): a provider field is added there."""

from __future__ import annotations

from typing import Any

from ctxd.formats import anthropic, ollama, openai, responses
from ctxd.formats.common import UsageField, read_usage, usage_struct
from ctxd.protocol.message import Usage

MESSAGE_NAMES = {**openai.NATIVE_MESSAGE, "idempotency_key": "idempotencyKey"}
BLOCK_NAMES = anthropic.NATIVE_BLOCK

USAGE: tuple[UsageField, ...] = (*anthropic.USAGE, *responses.USAGE, *openai.USAGE, *ollama.USAGE)
"""Every provider's usage fields: a pushed usage object may come from any of them."""

_USAGE_NAMES = {key: ours for key, inner, ours in USAGE if inner is None}
_USAGE_NESTED = [(key, inner, ours) for key, inner, ours in USAGE if inner is not None]
_USAGE_FIELDS = frozenset(ours for _, _, ours in USAGE)


def _rename(obj: dict[str, Any], names: dict[str, str]) -> None:
    for native in [k for k in obj if k in names]:
        ours = names[native]
        if ours not in obj:
            obj[ours] = obj.pop(native)


def accept_native_names(messages: Any) -> None:
    """Rename provider-native fields of raw (JSON-decoded) messages in place, before they
    are decoded as a Message. OpenAI's ``refusal``, ``annotations`` and ``audio``,
    Anthropic's ``citations`` and either's extra usage details go to ``metadata`` when
    they hold something; ``cache_control`` (a caching hint for one request, not content)
    is dropped."""
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        for key in MESSAGE_NAMES:  # (a loop, not any(): this runs for every pushed message)
            if key in message:
                _rename(message, MESSAGE_NAMES)
                break
        for key in openai.NATIVE_EXTRAS:
            if key in message:
                value = message.pop(key)
                if value not in (None, [], {}, ""):
                    _metadata(message).setdefault(key, value)
        usage = message.get("usage")
        if isinstance(usage, dict) and any(k not in _USAGE_FIELDS and "_" in k for k in usage):
            _native_usage(message, usage)
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    for key in BLOCK_NAMES:
                        if key in block:
                            _rename(block, BLOCK_NAMES)
                            break
                    block.pop("cache_control", None)
                    citations = block.pop("citations", None)
                    if citations:
                        kept = _metadata(message).setdefault("citations", [])
                        if isinstance(kept, list):
                            kept.extend(citations if isinstance(citations, list) else [citations])
                        else:  # the client's own metadata.citations: keep both, never fail
                            _metadata(message).setdefault("providerCitations", citations)
                    inner = block.get("content")
                    if isinstance(inner, list):  # a tool_result's own text blocks
                        for part in inner:
                            if isinstance(part, dict):
                                part.pop("cache_control", None)


def _metadata(message: dict[str, Any]) -> dict[str, Any]:
    """The message's metadata object, created when absent (one that is not an object is
    left for validation to refuse)."""
    if message.get("metadata") is None:
        message["metadata"] = {}
    metadata = message["metadata"]
    return metadata if isinstance(metadata, dict) else {}


def _native_usage(message: dict[str, Any], usage: dict[str, Any]) -> None:
    """A provider's usage object: its counts renamed (as sent: validation refuses what is
    no count), the counts providers nest (reasoning) taken out, the rest of the
    provider's keys kept whole in ``metadata.usageDetails``."""
    _rename(usage, _USAGE_NAMES)
    for key, inner, ours in _USAGE_NESTED:
        nested = usage.get(key)
        if isinstance(nested, dict) and isinstance(nested.get(inner), int) and ours not in usage:
            usage[ours] = nested[inner]
    # Provider keys are snake_case; anything else unknown (a misspelt camelCase field)
    # is left for validation to refuse.
    extra = {k: usage.pop(k) for k in [k for k in usage if k not in _USAGE_FIELDS and "_" in k]}
    if extra:
        _metadata(message).setdefault("usageDetails", extra)


def any_usage(raw: Any) -> Usage | None:
    """A usage object from any provider (a transcript's, whose provider may be unknown) as
    :class:`Usage`: Anthropic's ``input_tokens`` and OpenAI's ``prompt_tokens`` both read as
    ``inputTokens`` exactly as reported, and only Anthropic's cache reads as
    ``cacheReadTokens``, so input + cache reads is always what the provider counted."""
    return usage_struct(read_usage(raw, USAGE))
