"""OpenAI-compatible chat completions: OpenAI itself, vLLM, llama.cpp server, LM Studio.

``base_url`` includes the ``/v1`` prefix. OpenAI's own API wants
``max_completion_tokens`` (its reasoning models reject ``max_tokens``); the local servers
want ``max_tokens``, so the field is picked by host.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ctxd import formats
from ctxd.llm.base import ChatReply, ChatTurn, ModelInfo
from ctxd.llm.http import HTTPBackend, as_dict, as_int, format_param_count

# Fields servers use for a model's window in /v1/models, in the order they are trusted.
_WINDOW_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length")


class OpenAIBackend(HTTPBackend):
    """Any server speaking ``POST /v1/chat/completions``."""

    kind = "openai"

    def _auth_headers(self) -> dict[str, str]:
        key = self._api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    @property
    def _is_openai_cloud(self) -> bool:
        return (urlsplit(self.settings.url).hostname or "").endswith("api.openai.com")

    async def chat(self, messages: list[ChatTurn], *, model: str | None = None,
                   max_tokens: int | None = None, temperature: float = 0.2,
                   context_window: int | None = None) -> ChatReply:
        body: dict[str, Any] = {
            "model": model or self.settings.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": temperature,
            "stream": False,
        }
        if max_tokens is not None:
            body["max_completion_tokens" if self._is_openai_cloud else "max_tokens"] = max_tokens
        path = "/chat/completions"
        data = await self._request_json("POST", self.settings.url + path, path, body)
        if not isinstance(data, dict):
            raise self._bad(path, "answer is not a JSON object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._bad(path, "answer has no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self._bad(path, "answer has no choices[0].message")
        content = message.get("content")
        if content is None:
            content = ""  # a refusal or a tool call: no text, which the caller judges
        if isinstance(content, list):  # some servers return content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise self._bad(path, "choices[0].message.content is not text")
        counts = formats.openai.usage(data.get("usage"))
        finish = choice.get("finish_reason")
        return ChatReply(
            text=content,
            model=str(data.get("model") or body["model"]),
            input_tokens=counts.get("inputTokens"),
            output_tokens=counts.get("outputTokens"),
            raw_finish_reason=finish if isinstance(finish, str) else None,
        )

    async def model_info(self, model: str) -> ModelInfo:
        """Window from ``GET /models``: vLLM's ``max_model_len``, llama.cpp's ``meta``.

        OpenAI itself reports no window; then every field is None.
        """
        path = "/models"
        data = await self._request_json("GET", self.settings.url + path, path)
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise self._bad(path, "answer has no data list")
        entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == model), None)
        if entry is None:
            return ModelInfo()
        window = None
        for field in _WINDOW_FIELDS:
            window = as_int(entry.get(field))
            if window:
                break
        meta = as_dict(entry.get("meta"))
        if not window:
            window = as_int(meta.get("n_ctx")) or as_int(meta.get("n_ctx_train"))
        top = as_dict(entry.get("top_provider"))
        output = as_int(top.get("max_completion_tokens")) or as_int(entry.get("max_output_tokens"))
        return ModelInfo(
            context_length=window or None,
            parameter_size=format_param_count(as_int(meta.get("n_params"))),
            family=None,
            output_limit=output or None,
        )
