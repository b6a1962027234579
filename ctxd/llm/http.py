"""Plumbing the three HTTP backends share: one client, the API key, retries, JSON.

The key is held in a private attribute and sent only as a request header; every error
message is passed through ``_redact`` before it leaves, because servers sometimes echo
the key they refused.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import msgspec

from ctxd.llm.base import BackendError
from ctxd.llm.retry import RetryPolicy, send_with_retry
from ctxd.llm.settings import BackendSettings

log = logging.getLogger("ctxd.llm")

_json_decoder = msgspec.json.Decoder()
ERROR_BODY_BYTES = 64 * 1024
"""Of an error answer only this much is read: enough for the server's message."""
_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class HTTPBackend:
    """Base of the HTTP backends; subclasses set ``kind`` and build requests."""

    kind = "http"

    def __init__(self, settings: BackendSettings, *, api_key: str | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.__api_key = api_key or None
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_seconds, connect=settings.connect_timeout_seconds),
            follow_redirects=False,
        )
        self._closed = False
        self._policy = RetryPolicy(
            max_retries=settings.max_retries,
            backoff_seconds=settings.backoff_seconds,
            backoff_max_seconds=settings.backoff_max_seconds,
            retry_after_max_seconds=settings.retry_after_max_seconds,
            attempt_timeout_seconds=settings.timeout_seconds + settings.connect_timeout_seconds,
        )

    @property
    def _api_key(self) -> str | None:
        return self.__api_key

    @property
    def has_api_key(self) -> bool:
        return self.__api_key is not None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(base_url={self.settings.url!r}, model={self.settings.model!r}, "
                f"api_key={'set' if self.__api_key else 'none'})")

    def _auth_headers(self) -> dict[str, str]:
        """Headers carrying the key; overridden per provider."""
        return {}

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json", "user-agent": "ctxd"}
        headers.update(self.settings.extra_headers)
        headers.update(self._auth_headers())
        return headers

    def _redact(self, text: str) -> str:
        key = self.__api_key
        if key and key in text:
            text = text.replace(key, "***")
        for value in self.settings.extra_headers.values():
            if len(value) >= 8 and value in text:
                text = text.replace(value, "***")
        return text

    def _describe(self, method: str, path: str) -> str:
        return f"{self.kind} {method} {path}"

    @staticmethod
    def _error_detail(response: httpx.Response) -> str:
        """The server's own error text (OpenAI, Anthropic and Ollama shapes), shortened."""
        body = response.content[:4096]
        try:
            data = _json_decoder.decode(body)
        except msgspec.DecodeError:
            text = body.decode("utf-8", "replace").strip()
        else:
            text = ""
            if isinstance(data, dict):
                err = data.get("error")
                if isinstance(err, dict):
                    text = str(err.get("message") or err.get("type") or "")
                elif isinstance(err, str):
                    text = err
                elif isinstance(data.get("message"), str):
                    text = data["message"]
            if not text:
                text = body.decode("utf-8", "replace").strip()
        text = " ".join(text.split())
        return text if len(text) <= 300 else text[:300] + "…"

    async def _request_json(self, method: str, url: str, path: str,
                            body: dict[str, Any] | None = None) -> Any:
        """Send with retries and decode the JSON answer (``bad_response`` if it is not JSON)."""
        if self._closed:
            raise BackendError("cancelled", f"{self._describe(method, path)}: backend was closed")
        describe = self._describe(method, path)
        content = msgspec.json.encode(body) if body is not None else None
        headers = self._headers()
        if content is not None:
            headers["content-type"] = "application/json"

        async def send() -> httpx.Response:
            request = self._client.build_request(method, url, content=content, headers=headers)
            response = await self._client.send(request, stream=True)
            try:
                body = await self._read_body(response, describe)
            finally:
                await response.aclose()
            kept = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _BODY_HEADERS]
            return httpx.Response(response.status_code, headers=kept, content=body, request=request)

        response = await send_with_retry(send, self._policy, describe=describe,
                                         error_detail=self._error_detail, redact=self._redact)
        try:
            return _json_decoder.decode(response.content)
        except msgspec.DecodeError:
            snippet = response.content[:120].decode("utf-8", "replace")
            raise BackendError("bad_response", self._redact(
                f"{describe}: answer is not JSON (starts with {snippet!r})"), status=response.status_code) from None

    async def _read_body(self, response: httpx.Response, describe: str) -> bytes:
        """The answer's body, read as it arrives and never beyond ``max_response_bytes``
        (decompressed): a runaway answer fails with ``bad_response`` instead of filling
        memory. Of an error answer only the first ``ERROR_BODY_BYTES`` are kept."""
        limit = self.settings.max_response_bytes
        success = response.is_success
        declared = response.headers.get("content-length", "")
        if success and declared.isdigit() and int(declared) > limit and "content-encoding" not in response.headers:
            raise BackendError("bad_response", self._redact(
                f"{describe}: the answer is {int(declared)} bytes, over the limit of {limit} "
                "(summarizer.max_response_bytes); not read"), status=response.status_code)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if not success and size >= ERROR_BODY_BYTES:
                break
            if size > limit:
                raise BackendError("bad_response", self._redact(
                    f"{describe}: the answer is larger than the limit of {limit} bytes "
                    "(summarizer.max_response_bytes); stopped reading it"), status=response.status_code)
        return b"".join(chunks)

    def _bad(self, path: str, what: str) -> BackendError:
        return BackendError("bad_response", self._redact(f"{self._describe('POST', path)}: {what}"))

    async def aclose(self) -> None:
        self._closed = True
        if self._own_client:
            await self._client.aclose()


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON object field, or an empty dict when absent or of another type."""
    return value if isinstance(value, dict) else {}


def as_int(value: Any) -> int | None:
    """An integer field of a JSON answer, or None when absent or not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def format_param_count(n: int | None) -> str | None:
    """``3212749888`` -> ``"3.2B"`` (the way Ollama spells parameter sizes)."""
    if not n or n <= 0:
        return None
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)
