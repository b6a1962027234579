"""LLM backends ctxd uses to summarize: Ollama, OpenAI-compatible servers, Anthropic.

The HTTP stack (httpx) loads only when a backend is made (``make_backend``), so a
daemon on the embedded extractive summarizer starts without it.
"""

from typing import Any

from ctxd.llm.base import BackendError, ChatBackend, ChatReply, ChatTurn, ModelInfo
from ctxd.llm.settings import BackendSettings, SettingsError, resolve_api_key

__all__ = [
    "BackendError", "BackendSettings", "ChatBackend", "ChatReply", "ChatTurn", "ModelInfo",
    "SettingsError", "make_backend", "resolve_api_key",
]


def __getattr__(name: str) -> Any:
    if name == "make_backend":
        from ctxd.llm.factory import make_backend

        return make_backend
    raise AttributeError(f"module 'ctxd.llm' has no attribute {name!r}")
