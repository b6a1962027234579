"""Ollama's native API (``/api/chat``, ``/api/show``).

Ollama serves every request with a context window of ``num_ctx`` tokens and silently
drops the start of a longer prompt, so this backend always says which window it wants:
the configured ``context_window``, else the one the caller sized its prompt for.
"""

from __future__ import annotations

from typing import Any

from ctxd import formats
from ctxd.llm.base import BackendError, ChatReply, ChatTurn, ModelInfo
from ctxd.llm.http import HTTPBackend, as_dict, as_int


class OllamaBackend(HTTPBackend):
    """A local or remote Ollama server."""

    kind = "ollama"

    def _auth_headers(self) -> dict[str, str]:
        # Plain Ollama has no auth; a key is sent only when configured (reverse proxies).
        key = self._api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    async def chat(self, messages: list[ChatTurn], *, model: str | None = None,
                   max_tokens: int | None = None, temperature: float = 0.2,
                   context_window: int | None = None) -> ChatReply:
        options: dict[str, Any] = {"temperature": temperature}
        if max_tokens is not None:
            options["num_predict"] = max_tokens
        num_ctx = self.settings.context_window or context_window
        if num_ctx:
            options["num_ctx"] = num_ctx
        body = {
            "model": model or self.settings.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "stream": False,
            "options": options,
        }
        path = "/api/chat"
        data = await self._request_json("POST", self.settings.url + path, path, body)
        if not isinstance(data, dict):
            raise self._bad(path, "answer is not a JSON object")
        message = data.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise self._bad(path, "answer has no message.content")
        counts = formats.ollama.usage(data)
        return ChatReply(
            text=content,
            model=str(data.get("model") or body["model"]),
            input_tokens=counts.get("inputTokens"),
            output_tokens=counts.get("outputTokens"),
            raw_finish_reason=data.get("done_reason") if isinstance(data.get("done_reason"), str) else None,
        )

    async def model_info(self, model: str) -> ModelInfo:
        """Window, size and family from ``/api/show``.

        ``context_length`` is the ``num_ctx`` the model's Modelfile sets when it sets one
        (that is the window Ollama serves), else the architecture's trained length.
        """
        path = "/api/show"
        data = await self._request_json("POST", self.settings.url + path, path, {"model": model})
        if not isinstance(data, dict):
            raise self._bad(path, "answer is not a JSON object")
        info = as_dict(data.get("model_info"))
        details = as_dict(data.get("details"))
        arch = info.get("general.architecture")
        trained = as_int(info.get(f"{arch}.context_length")) if isinstance(arch, str) else None
        num_ctx = _parameter(data.get("parameters"), "num_ctx")
        num_predict = _parameter(data.get("parameters"), "num_predict")
        size = details.get("parameter_size")
        family = details.get("family")
        return ModelInfo(
            context_length=num_ctx or trained,
            parameter_size=size if isinstance(size, str) and size else None,
            family=family if isinstance(family, str) and family else (arch if isinstance(arch, str) else None),
            output_limit=num_predict if num_predict and num_predict > 0 else None,
        )


def _parameter(parameters: Any, name: str) -> int | None:
    """An integer from Ollama's ``parameters`` text (``"num_ctx 4096\\nstop ..."``)."""
    if not isinstance(parameters, str):
        return None
    for line in parameters.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == name:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


__all__ = ["OllamaBackend", "BackendError"]
