"""What every LLM backend speaks: chat turns in, one reply out.

ctxd talks to a model only to summarize, so the interface is deliberately small: a
non-streaming chat call, a model look-up (so the summarizer can size its chunks to the
model's window) and a close. Every failure a caller should react to is one
``BackendError`` whose ``kind`` says what went wrong; its message never carries a
secret, so it can be logged and returned to clients as is.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

ErrorKind = Literal["unreachable", "timeout", "http_status", "bad_response", "cancelled"]


class ChatTurn(msgspec.Struct, frozen=True):
    """One message of a backend call (the summarizer only needs plain text)."""

    role: Literal["system", "user", "assistant"]
    content: str


class ChatReply(msgspec.Struct, frozen=True):
    """The model's answer and what the server reported about it (None when not reported)."""

    text: str
    model: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    raw_finish_reason: str | None = None


class ModelInfo(msgspec.Struct, frozen=True):
    """What a server says about a model; None where it does not say (numbers are never guessed)."""

    context_length: int | None = None
    parameter_size: str | None = None
    family: str | None = None
    output_limit: int | None = None


class BackendError(Exception):
    """A backend call failed; ``kind`` tells retryable transport trouble from bad answers.

    ``status`` is the HTTP status for ``http_status`` errors; ``attempts`` counts the
    requests made before giving up.
    """

    def __init__(self, kind: ErrorKind, message: str, *, status: int | None = None,
                 attempts: int = 1) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.status = status
        self.attempts = attempts

    def __repr__(self) -> str:
        return f"BackendError(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"


@runtime_checkable
class ChatBackend(Protocol):
    """A chat-completion backend (Ollama, OpenAI-compatible, Anthropic)."""

    async def chat(self, messages: list[ChatTurn], *, model: str | None = None,
                   max_tokens: int | None = None, temperature: float = 0.2,
                   context_window: int | None = None) -> ChatReply:
        """One non-streaming completion.

        ``model`` overrides the configured model. ``context_window`` is the window the
        caller sized the prompt for; backends whose servers pick a window per request
        (Ollama's ``num_ctx``) pass it on so the prompt is not silently cut, the others
        ignore it.
        """
        ...

    async def model_info(self, model: str) -> ModelInfo:
        """What the server reports about ``model``."""
        ...

    async def aclose(self) -> None:
        """Release connections; later calls fail with ``BackendError(kind="cancelled")``."""
        ...
