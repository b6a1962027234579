"""Anthropic's Messages API (``/v1/messages``).

System turns go into the top-level ``system`` field and consecutive turns of one role
are joined, because the API takes only user/assistant turns.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ctxd import formats
from ctxd.llm.base import ChatReply, ChatTurn, ModelInfo
from ctxd.llm.http import HTTPBackend, as_int

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024


class AnthropicBackend(HTTPBackend):
    """Anthropic's API (or a server speaking it)."""

    kind = "anthropic"

    def _auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        key = self._api_key
        if key:
            headers["x-api-key"] = key
        return headers

    async def chat(self, messages: list[ChatTurn], *, model: str | None = None,
                   max_tokens: int | None = None, temperature: float = 0.2,
                   context_window: int | None = None) -> ChatReply:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        turns: list[dict[str, str]] = []
        for m in messages:
            if m.role == "system":
                continue
            if turns and turns[-1]["role"] == m.role:
                turns[-1]["content"] += "\n\n" + m.content
            else:
                turns.append({"role": m.role, "content": m.content})
        if not turns or turns[0]["role"] != "user":
            turns.insert(0, {"role": "user", "content": "(conversation follows)"})
        body: dict[str, Any] = {
            "model": model or self.settings.model,
            "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
            "messages": turns,
            "temperature": temperature,
        }
        if system:
            body["system"] = system
        path = "/v1/messages"
        data = await self._request_json("POST", self.settings.url + path, path, body)
        if not isinstance(data, dict):
            raise self._bad(path, "answer is not a JSON object")
        content = data.get("content")
        if not isinstance(content, list):
            raise self._bad(path, "answer has no content list")
        text = "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
        counts = formats.anthropic.usage(data.get("usage"))
        stop = data.get("stop_reason")
        return ChatReply(
            text=text,
            model=str(data.get("model") or body["model"]),
            input_tokens=counts.get("inputTokens"),
            output_tokens=counts.get("outputTokens"),
            raw_finish_reason=stop if isinstance(stop, str) else None,
        )

    async def model_info(self, model: str) -> ModelInfo:
        """``GET /v1/models/{id}``; window fields are read only if the API sends them."""
        path = f"/v1/models/{quote(model, safe='')}"
        data = await self._request_json("GET", self.settings.url + path, path)
        if not isinstance(data, dict):
            raise self._bad(path, "answer is not a JSON object")
        window = as_int(data.get("context_window")) or as_int(data.get("max_input_tokens"))
        output = as_int(data.get("max_output_tokens")) or as_int(data.get("max_tokens"))
        return ModelInfo(context_length=window or None, output_limit=output or None)
