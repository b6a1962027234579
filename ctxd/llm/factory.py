"""Build the backend a ``BackendSettings`` describes."""

from __future__ import annotations

import httpx

from ctxd.llm.anthropic import AnthropicBackend
from ctxd.llm.base import ChatBackend
from ctxd.llm.http import HTTPBackend
from ctxd.llm.ollama import OllamaBackend
from ctxd.llm.openai import OpenAIBackend
from ctxd.llm.settings import BackendSettings, resolve_api_key

_KINDS: dict[str, type[HTTPBackend]] = {
    "ollama": OllamaBackend,
    "openai": OpenAIBackend,
    "anthropic": AnthropicBackend,
}


def make_backend(settings: BackendSettings, *, client: httpx.AsyncClient | None = None) -> ChatBackend:
    """The backend for ``settings``, its key read now (``SettingsError`` if the key file is unsafe)."""
    backend_type = _KINDS[settings.kind]
    backend: ChatBackend = backend_type(settings, api_key=resolve_api_key(settings), client=client)  # type: ignore[assignment]
    return backend
