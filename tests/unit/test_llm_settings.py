"""Backend settings, API key resolution, and keeping the key out of logs, reprs and errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest

from ctxd.llm import BackendError, BackendSettings, ChatTurn, SettingsError, make_backend, resolve_api_key
from tests.llm_servers import FakeLLMServer

SECRET = "sk-live-THIS-MUST-NEVER-LEAK-4242"


def test_defaults_per_kind() -> None:
    ollama = BackendSettings(kind="ollama", model="llama3.2:3b")
    openai = BackendSettings(kind="openai", model="gpt-4o-mini")
    anthropic = BackendSettings(kind="anthropic", model="claude-haiku-4-5")
    assert ollama.base_url == "http://127.0.0.1:11434" and ollama.api_key_env is None
    assert openai.base_url == "https://api.openai.com/v1" and openai.api_key_env == "OPENAI_API_KEY"
    assert anthropic.base_url == "https://api.anthropic.com" and anthropic.api_key_env == "ANTHROPIC_API_KEY"
    assert openai.timeout_seconds == 60 and openai.connect_timeout_seconds == 5
    assert openai.max_retries == 2 and openai.backoff_seconds == 0.5
    assert openai.context_window is None and openai.extra_headers == {}


def test_settings_decode_from_config_and_reject_typos() -> None:
    settings = msgspec.convert({"kind": "openai", "model": "qwen", "base_url": "http://gpu:8000/v1/"},
                               BackendSettings)
    assert settings.base_url == "http://gpu:8000/v1"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": "openai", "model": "m", "api_kee_env": "X"}, BackendSettings)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": "openai", "model": "m", "timeout_seconds": 0}, BackendSettings)


def test_env_key_first_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(" from-file-key \n")
    key_file.chmod(0o600)
    settings = BackendSettings(kind="openai", model="m", api_key_env="CTXD_TEST_KEY", api_key_file=str(key_file))
    monkeypatch.delenv("CTXD_TEST_KEY", raising=False)
    assert resolve_api_key(settings) == "from-file-key"
    monkeypatch.setenv("CTXD_TEST_KEY", "from-env-key")
    assert resolve_api_key(settings) == "from-env-key"


def test_no_key_configured() -> None:
    assert resolve_api_key(BackendSettings(kind="ollama", model="m")) is None
    assert resolve_api_key(BackendSettings(kind="openai", model="m", api_key_env="")) is None


def test_world_readable_key_file_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    key_file.chmod(0o644)
    settings = BackendSettings(kind="anthropic", model="m", api_key_env="", api_key_file=str(key_file))
    with pytest.raises(SettingsError) as caught:
        resolve_api_key(settings)
    assert "chmod 600" in str(caught.value)
    assert SECRET not in str(caught.value)
    with pytest.raises(SettingsError):
        make_backend(settings)


def test_missing_key_file_is_a_clear_error(tmp_path: Path) -> None:
    settings = BackendSettings(kind="openai", model="m", api_key_env="", api_key_file=str(tmp_path / "absent"))
    with pytest.raises(SettingsError, match="cannot be read"):
        resolve_api_key(settings)


def test_settings_repr_masks_header_values() -> None:
    settings = BackendSettings(kind="openai", model="m", extra_headers={"X-Proxy-Token": SECRET})
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert "X-Proxy-Token" in repr(settings)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "ollama"])
async def test_key_never_in_logs_repr_or_errors(kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    os.chmod(key_file, 0o600)
    caplog.set_level(logging.DEBUG)
    # The server expects another key and quotes the one it got in its 401 answer.
    with FakeLLMServer(api_key="the-right-key", echo_key_in_errors=True) as server:
        settings = server.settings(kind, api_key_file=str(key_file), max_retries=1)  # type: ignore[arg-type]
        backend = make_backend(settings)
        with pytest.raises(BackendError) as caught:
            await backend.chat([ChatTurn("user", "hello")])
        # the key was sent
        sent = server.chat_requests()[0].headers
        assert SECRET in (sent.get("authorization", "") + sent.get("x-api-key", ""))
        server.fail_then_ok(1, "500")
        server.api_key = None
        await backend.chat([ChatTurn("user", "hello")])  # a retry logs at info level
        await backend.aclose()
    assert caught.value.status == 401
    assert "***" in caught.value.message
    for text in (str(caught.value), repr(caught.value), caught.value.message, repr(backend), repr(settings),
                 caplog.text):
        assert SECRET not in text
