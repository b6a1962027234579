"""Provider wire shapes, each in one module: how a provider's message is read into ctxd's
Message, how its usage becomes ctxd's Usage, how ctxd's messages are written in its
shape, and (Anthropic) where cache breakpoints go.

* ``openai.py``: Chat Completions (and the chat-shaped reading Ollama and Responses share).
* ``anthropic.py``: Messages, ``system``, prompt-cache breakpoints.
* ``responses.py``: Responses API items, as the chat messages they stand for and back.
* ``ollama.py``: /api/chat.
* ``native.py``: provider spellings accepted on ``session/push``.
* ``common.py``: what they share (JSON spellings, usage tables, ctxd's side of rendering).

A provider field is added in its module, once: the proxy, the engine's renderer, the
importers, the JSONL exchange and ``session/push`` all read and write through these.
This package imports only ``ctxd.protocol`` and ``ctxd.tokens``.

The functions below pick the module by ``api`` for the proxy, which reads raw (JSON-
decoded) client messages as dicts: no Struct is built on its path.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ctxd.formats import anthropic, ollama, openai, responses
from ctxd.formats.common import Api, Ref

MODULES: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic, "ollama": ollama,
                                  "responses": responses}


def to_ctxd(api: Api, message: dict[str, Any], *, call_ids: dict[int, list[str]] | None = None,
            position: int = 0) -> dict[str, Any] | None:
    """The ctxd Message (as JSON) for one raw client message; None when it holds nothing
    ctxd can store. ``call_ids``/``position``: see ``openai.to_ctxd`` (Ollama's calls)."""
    return MODULES[api].to_ctxd(message, call_ids=call_ids, position=position)


def projection(api: Api, message: dict[str, Any]) -> list[Any]:
    """The message as ctxd models it: equal projections, same message to ctxd."""
    return MODULES[api].projection(message)


def chain_part(api: Api, message: dict[str, Any]) -> list[Any] | None:
    """What the proxy's hash chain is built from for this message (None: not part of it)."""
    return MODULES[api].chain_part(message)


def ids_of(api: Api, message: Any) -> list[Ref]:
    """The provider ids a raw client message carries, in order: the tool calls it makes
    (``("call", id)``), the calls it answers (``("result", id)``), its own id
    (``("item", id)``, Responses API items)."""
    return MODULES[api].ids_of(message)


def usage(api: Api, raw: Any) -> dict[str, int]:
    """A provider's usage object (for Ollama: the reply itself) as ctxd's Usage (JSON)."""
    return MODULES[api].usage(raw)


__all__ = ["Api", "MODULES", "Ref", "chain_part", "ids_of", "projection", "to_ctxd", "usage"]
