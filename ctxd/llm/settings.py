"""Where the summarizer model lives and how to reach it.

The settings hold where to find an API key (an environment variable name, a file
path), never the key itself, so a settings object can be logged, printed and stored in
the daemon's status output. ``extra_headers`` may carry credentials of a proxy, so their
values are masked in ``repr``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

import msgspec

BackendKind = Literal["ollama", "openai", "anthropic"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434",
    # OpenAI-compatible servers (vLLM, llama.cpp, LM Studio) include the /v1 prefix.
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}

DEFAULT_KEY_ENVS: dict[str, str | None] = {
    "ollama": None,
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


class SettingsError(ValueError):
    """The backend settings cannot be used as given (message says how to fix them)."""


class BackendSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How to reach one LLM backend.

    ``base_url`` and ``api_key_env`` default per ``kind`` when left as None; set
    ``api_key_env`` to ``""`` to send no key even if the usual variable is set (a local
    vLLM behind the OpenAI kind, say). ``context_window`` is the summarizer model's own
    window in tokens; when None it is asked from the server.
    """

    kind: BackendKind
    """Which API the server speaks: ``ollama``, ``openai`` (any OpenAI-compatible server) or ``anthropic``."""
    model: str
    """The summarizer model's name as the server knows it (``llama3.2:3b``, ``gpt-4o-mini``...)."""
    base_url: str | None = None
    """Server address; None: ``http://127.0.0.1:11434``, ``https://api.openai.com/v1`` (``/v1``
    included, as for vLLM, llama.cpp and LM Studio) or ``https://api.anthropic.com``."""
    api_key_env: str | None = None
    """Environment variable holding the key; None: ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` /
    none for Ollama; ``""``: send no key."""
    api_key_file: str | None = None
    """File holding the key, read at startup when the variable is unset; refused if others can read it."""
    timeout_seconds: float = 60.0
    """How long one request may take before it counts as a timeout."""
    connect_timeout_seconds: float = 5.0
    """How long connecting may take."""
    max_retries: int = 2
    """Retries after a connection error, timeout, 408, 429 or 5xx (never after another 4xx)."""
    backoff_seconds: float = 0.5
    """First wait between retries; doubles each retry, with jitter."""
    backoff_max_seconds: float = 8.0
    """Cap on one wait between retries."""
    retry_after_max_seconds: float = 20.0
    """A ``Retry-After`` up to this is waited for; a longer one ends the attempts."""
    context_window: int | None = None
    """The summarizer model's window in tokens; None: asked from the server (capped at 32768), else 8192."""
    extra_headers: dict[str, str] = {}
    """Headers added to every request (a proxy's token, say); their values are never logged."""
    max_response_bytes: int = 4 * 1024 * 1024
    """Largest answer body read (after decompression); reading stops past it and the call fails
    with ``bad_response``, so one runaway answer never fills the daemon's memory."""

    def __post_init__(self) -> None:
        if self.base_url is None:
            self.base_url = DEFAULT_BASE_URLS[self.kind]
        self.base_url = self.base_url.rstrip("/")
        if self.api_key_env is None:
            self.api_key_env = DEFAULT_KEY_ENVS[self.kind]
        if self.timeout_seconds <= 0 or self.connect_timeout_seconds <= 0:
            raise SettingsError("timeout_seconds and connect_timeout_seconds must be positive")
        if self.max_retries < 0:
            raise SettingsError("max_retries must be 0 or more")
        if self.context_window is not None and self.context_window < 256:
            raise SettingsError("context_window must be at least 256 tokens")
        if self.max_response_bytes < 1024:
            raise SettingsError("max_response_bytes must be at least 1024")

    @property
    def url(self) -> str:
        """The base URL with defaults applied (never None after construction)."""
        assert self.base_url is not None
        return self.base_url

    def __repr__(self) -> str:
        headers = {name: "***" for name in self.extra_headers}
        return (f"BackendSettings(kind={self.kind!r}, model={self.model!r}, "
                f"base_url={self.base_url!r}, api_key_env={self.api_key_env!r}, "
                f"api_key_file={self.api_key_file!r}, timeout_seconds={self.timeout_seconds!r}, "
                f"max_retries={self.max_retries!r}, context_window={self.context_window!r}, "
                f"extra_headers={headers!r})")

    __str__ = __repr__


def resolve_api_key(settings: BackendSettings) -> str | None:
    """The API key: the environment variable first, then the key file; None when neither.

    A key file others can read is refused rather than used, because a key that leaked
    once has to be revoked: better to stop at startup with the fix in the message.
    """
    if settings.api_key_env:
        value = os.environ.get(settings.api_key_env, "").strip()
        if value:
            return value
    if not settings.api_key_file:
        return None
    path = Path(settings.api_key_file).expanduser()
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SettingsError(f"api_key_file {str(path)!r} cannot be read: {exc.strerror}") from None
    if mode & stat.S_IROTH:
        raise SettingsError(
            f"api_key_file {str(path)!r} is readable by every user of this machine; "
            f"restrict it first (chmod 600 {path}) or use {settings.api_key_env or 'an environment variable'}")
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"api_key_file {str(path)!r} cannot be read: {type(exc).__name__}") from None
    if not value:
        raise SettingsError(f"api_key_file {str(path)!r} is empty")
    return value
