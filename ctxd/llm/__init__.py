"""LLM backends ctxd uses to summarize: Ollama, OpenAI-compatible servers, Anthropic."""

from ctxd.llm.base import BackendError, ChatBackend, ChatReply, ChatTurn, ModelInfo
from ctxd.llm.factory import make_backend
from ctxd.llm.settings import BackendSettings, SettingsError, resolve_api_key

__all__ = [
    "BackendError", "BackendSettings", "ChatBackend", "ChatReply", "ChatTurn", "ModelInfo",
    "SettingsError", "make_backend", "resolve_api_key",
]
