"""A fake LLM upstream for the proxy tests: a real HTTP server (Starlette on uvicorn, in
a thread) on 127.0.0.1 that speaks OpenAI Chat Completions, Anthropic Messages and
Ollama /api/chat, whole and streamed, with tool calls, and records what it receives.

The "model" is deterministic: it answers ``Answer to: <the last user text>``; when the
last message is the user's and its text contains ``use the tool``, it calls the tool
``get_weather`` with ``{"city": "Paris"}`` instead (with extended thinking on, again
after each result until one says ``that is enough``).

Anthropic requests with extended thinking on (``thinking``) are checked as the real API
checks them (tests/agents/wire.py: the last assistant message of a tool-use loop opens
with its thinking, signatures verify, tool calls paired, 4 breakpoints at most) and
refused with its 400 when they fail; the reply then opens with a thinking block and a
``redacted_thinking`` block, signed by wire.py (``refused`` lists the refusals).

Modes (``server.mode = ...``) apply to the chat endpoints (``hang`` also to
``/v1/models`` and ``count_tokens``): ``ok``, ``500``, ``429``
(with ``retry-after: 7``), ``cut`` (a stream that stops half-way: the connection closes
without the stream's end; a whole answer is sent half and cut), ``hang`` (nothing sent
until the client goes or the server stops), ``slow`` (a stream whose events come slowly,
to let a client hang up in the middle; ``disconnects`` counts streams a client left,
``hung_up`` hanging requests a client left).

Usage reports what a caching provider caches (:class:`PromptCache`): the longest prefix
a request shares with an earlier one, in 128-token blocks from 1,024, as OpenAI reports
it (``cached_tokens``) and Anthropic (``cache_read_input_tokens``, the rest up to the
request's last cache breakpoint ``cache_creation_input_tokens``; no breakpoint, nothing
cached or written). ``caching = False``: a provider whose cache missed (nothing cached).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.agents import pricing, wire

MODEL = "fake-model"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    query: str = ""
    raw_headers: list[tuple[str, str]] = field(default_factory=list)
    """Every header as it came, in order (a repeated one each time)."""


def _calls_to_go(body: dict[str, Any]) -> bool:
    """In a tool-use loop (the last message holds tool results): call the tool again, unless
    the last result says ``that is enough``."""
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else None
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"] \
        if isinstance(content, list) else []
    return bool(results) and "that is enough" not in json.dumps(results[-1].get("content"))


def _thinking_on(api: str, body: Any) -> bool:
    return api == "anthropic" and isinstance(body, dict) and \
        (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")


def _last_user_text(api: str, body: dict[str, Any]) -> tuple[str, bool]:
    """The last message's user text, and whether it is a user message with text (not a tool result)."""
    messages = body.get("messages") or []
    while messages and messages[-1].get("role") == "system":  # (a trailing reminder: the user's is answered)
        messages = messages[:-1]
    if not messages:
        return "", False
    last = messages[-1]
    if last.get("role") != "user":
        return f"the result of {last.get('role')}", False
    content = last.get("content")
    if isinstance(content, str):
        return content, True
    texts = [b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
    results = [b for b in content or [] if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results and not texts:
        return "the tool result", False
    return " ".join(texts), True


WIRE_API = {"anthropic": "anthropic", "openai": "chat", "responses": "responses"}
"""tests/agents/wire.py's names of the APIs that cache (Ollama caches nothing)."""


class PromptCache:
    """What a caching provider reports as cached, per API: a request's longest common
    prefix (its tokens in the provider's order: tools, system, messages) with the newest
    earlier requests, in the provider's blocks (``tests/agents/pricing.py``: 1,024 tokens,
    then 128 at a time), scaled to the upstream's own count of the request. Anthropic
    caches only with a breakpoint: what follows the cached prefix up to the last
    breakpoint is written; OpenAI writes nothing (it caches every prefix itself)."""

    NEWEST = 32
    """Earlier requests compared (a provider's cache keeps them 5 minutes)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[list[int]]] = {}
        self._lock = threading.Lock()

    def report(self, api: str, body: Any, input_tokens: int) -> tuple[int, int]:
        """``(read, written)`` of a request the upstream counts ``input_tokens``, in that count."""
        name = WIRE_API.get(api)
        if name is None or not isinstance(body, dict) or input_tokens <= 0:
            return 0, 0
        pieces = [[*wire._ENCODING.encode_ordinary(p), *(0,) * wire.MESSAGE_FRAMING]
                  for p in wire.segments(name, body)]
        ids = [t for piece in pieces for t in piece]
        if not ids:
            return 0, 0
        with self._lock:
            earlier = self.seen.setdefault(name, [])
            shared = max((pricing.common_prefix(ids, e) for e in earlier), default=0)
            earlier.append(ids)
            del earlier[:-self.NEWEST]
        scale = input_tokens / len(ids)
        prices = pricing.prices_for(name)
        if name != "anthropic":
            return min(input_tokens, pricing.cached(math.floor(shared * scale), prices)), 0
        marked = _last_breakpoint(body)
        if marked is None:
            return 0, 0
        upto = math.floor(sum(len(p) for p in pieces[:marked + 1]) * scale)
        if upto < prices.minimum:
            return 0, 0
        read = min(upto, pricing.cached(math.floor(shared * scale), prices))
        return read, upto - read


def _last_breakpoint(body: dict[str, Any]) -> int | None:
    """The index (in wire.segments' order: tools, system, messages) of the last piece of an
    Anthropic request that carries a cache breakpoint, None without one."""
    marked = ["cache_control" in json.dumps(body["tools"])] if body.get("tools") else []
    system = body.get("system")
    if system:
        marked.append(isinstance(system, list) and "cache_control" in json.dumps(system))
    marked += ["cache_control" in json.dumps(m.get("content")) for m in body.get("messages") or []
               if isinstance(m, dict)]
    found = [i for i, m in enumerate(marked) if m]
    return found[-1] if found else None


class FakeUpstream:
    def __init__(self) -> None:
        self.mode = "ok"
        self.models = {MODEL}  # the models it serves (others get a 400, as a provider answers)
        self.padding = ""  # appended to every answer (a long reply)
        self.count_all = False  # input tokens: of the messages only, or (True) of everything, as providers count
        self.caching = True  # usage reports a caching provider's cached tokens (False: a cache that missed)
        self.cache = PromptCache()
        self.reports: list[tuple[int, int, int]] = []  # per chat answer: (input tokens, cache read, written)
        self.received: list[Received] = []
        self.disconnects = 0
        self.hung_up = 0  # hanging requests whose client (the proxy) closed the connection
        self.completed_streams = 0
        self.refused: list[str] = []  # what the checks of a thinking request refused
        self.window: int | None = None  # refuse input + the reply limit over it, as Anthropic and OpenAI do
        self.delay = 0.2
        self._lock = threading.Lock()
        self._stopping = False
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> FakeUpstream:
        # proto IPPROTO_TCP: asyncio then turns Nagle off on each connection (ctxd/proxy/main.py)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chats(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path in ("/v1/chat/completions", "/v1/messages", "/api/chat",
                                                           "/v1/responses")
                    and (path is None or r.path == path)]

    # --- the app ----------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/messages", self._chat, methods=["POST"]),
            Route("/api/chat", self._chat, methods=["POST"]),
            Route("/v1/responses", self._chat, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/api/tags", self._tags, methods=["GET"]),
            Route("/{path:path}", self._other, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
        ])

    async def _other(self, request: Request) -> Response:
        """Any other path: recorded, and answered 404 with a CORS header open to every page,
        as hosted APIs answer (``access-control-allow-origin: *``)."""
        await self._record(request)
        return JSONResponse({"error": {"message": f"no route {request.url.path}"}}, status_code=404,
                            headers={"access-control-allow-origin": "*"})

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        with self._lock:
            self.received.append(Received(request.url.path, {k.lower(): v for k, v in request.headers.items()},
                                          raw, data, request.url.query,
                                          [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]))
        return data

    async def _hang(self, request: Request) -> Response:
        """``hang``: nothing sent until the client goes (counted) or the server stops."""
        while not self._stopping and not await request.is_disconnected():
            await asyncio.sleep(0.05)
        if not self._stopping:
            self.hung_up += 1
        return Response(status_code=599)

    async def _models(self, request: Request) -> Response:
        await self._record(request)
        if self.mode == "hang":
            return await self._hang(request)
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1,
                                                         "owned_by": "fake"}]},
                            headers={"x-upstream": "fake", "access-control-allow-origin": "*"})

    async def _tags(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"models": [{"name": MODEL, "model": MODEL, "size": 1, "digest": "0" * 64,
                                         "modified_at": "2025-01-01T00:00:00Z", "details": {}}]})

    async def _count(self, request: Request) -> Response:
        body = await self._record(request)
        if self.mode == "hang":
            return await self._hang(request)
        return JSONResponse({"input_tokens": len(json.dumps(body)) // 4})

    async def _chat(self, request: Request) -> Response:
        body = await self._record(request)
        api = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic", "/api/chat": "ollama",
               "/v1/responses": "responses"}[request.url.path]
        wire_body = body
        mode = self.mode
        if mode == "500":
            return self._error(api, 500, "upstream exploded", "api_error")
        if mode == "429":
            return self._error(api, 429, "slow down", "rate_limit_error", {"retry-after": "7"})
        if mode == "hang":
            return await self._hang(request)
        if api == "responses" and isinstance(body, dict):
            body = _responses_as_messages(body)
            if body is None:
                return self._error(api, 400, "bad request: input items", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) \
                or body.get("model") not in self.models:
            return self._error(api, 400, "bad request", "invalid_request_error")
        if api == "anthropic" and not isinstance(body.get("max_tokens"), int):
            return self._error(api, 400, "max_tokens: Field required", "invalid_request_error")
        thinking = _thinking_on(api, body)
        if thinking:
            problem = wire.problem("anthropic", body, wire.view("anthropic", body))
            if problem is not None:
                self.refused.append(problem)
                return self._error(api, 400, problem, "invalid_request_error")
        if self.window is not None:
            asked = body.get("max_completion_tokens") or body.get("max_tokens") or 0
            counted = self.input_tokens(body)
            if counted + asked > self.window:
                message = (f"input length and `max_tokens` exceed context limit: {counted} + {asked} > "
                           f"{self.window}, decrease input length or `max_tokens` and try again")
                self.refused.append(message)
                return self._error(api, 400, message, "invalid_request_error")
        text, from_user = _last_user_text(api, body)
        tool: bool | str = (from_user and "use the tool" in text) or (thinking and _calls_to_go(body))
        if api == "responses" and from_user and "use the patch tool" in text:
            tool = FREEFORM_TOOL  # a freeform call (Codex's apply_patch)
        answer = "Answer to: " + " ".join(text.split())[:60] + self.padding
        input_tokens = self.input_tokens(body)
        cached = self.cache.report(api, wire_body, input_tokens) if self.caching else (0, 0)
        with self._lock:
            self.reports.append((input_tokens, *cached))
        stream = body.get("stream") is not False if api == "ollama" else body.get("stream") is True
        if not stream:
            payload = self._whole(api, answer, tool, input_tokens, cached)
            if thinking:
                payload["content"] = _thoughts(len(body["messages"])) + payload["content"]
            if mode == "cut":
                data = json.dumps(payload).encode()
                return _CutResponse(data[: len(data) // 2], len(data))
            return JSONResponse(payload)
        media = "application/x-ndjson" if api == "ollama" else "text/event-stream"
        return StreamingResponse(self._stream(api, answer, tool, input_tokens, body, mode, cached),
                                 media_type=media)

    def input_tokens(self, body: dict[str, Any]) -> int:
        """The request's input tokens as this upstream counts them: a quarter of the JSON
        length of its messages, or with ``count_all`` what a provider counts: the tokens
        (o200k) of the JSON of the system part, the tool definitions and the messages,
        framing included, so a little more than ctxd's count of the same."""
        if not self.count_all:
            return len(json.dumps(body.get("messages"))) // 4
        from ctxd.tokens import TokenCounter

        counted = {k: body[k] for k in ("system", "instructions", "tools", "messages") if k in body}
        return TokenCounter.for_model("gpt-4o").count(json.dumps(counted))

    @staticmethod
    def _error(api: str, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Response:
        if api == "ollama":
            payload: Any = {"error": message}
        elif api in ("openai", "responses"):
            payload = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        else:
            payload = {"type": "error", "error": {"type": kind, "message": message}}
        return JSONResponse(payload, status_code=status, headers=headers)

    @staticmethod
    def _whole(api: str, answer: str, tool: bool | str, input_tokens: int,
               cached: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        """``cached``: (read, written) of the input, as :class:`PromptCache` reports them."""
        out_tokens = max(1, len(answer) // 4)
        read, written = cached
        if api == "responses":
            return _response_object("completed", _response_output(answer, tool), input_tokens, out_tokens, read)
        if api == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": None if tool else answer, "refusal": None}
            if tool:
                message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
            return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": "tool_calls" if tool else "stop"}],
                    "usage": {"prompt_tokens": input_tokens, "completion_tokens": out_tokens,
                              "total_tokens": input_tokens + out_tokens,
                              "prompt_tokens_details": {"cached_tokens": read}}}
        if api == "anthropic":
            content: list[Any] = [{"type": "text", "text": answer}]
            if tool:
                content = [{"type": "text", "text": "Let me check."},
                           {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": "get_weather",
                            "input": {"city": "Paris"}}]
            return {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "content": content,
                    "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens - read - written, "output_tokens": out_tokens,
                              "cache_creation_input_tokens": written, "cache_read_input_tokens": read}}
        message = {"role": "assistant", "content": "" if tool else answer}
        if tool:
            message["tool_calls"] = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
        return {"model": MODEL, "created_at": "2025-01-01T00:00:00Z", "message": message, "done": True,
                "done_reason": "stop", "prompt_eval_count": input_tokens, "eval_count": out_tokens}

    async def _stream(self, api: str, answer: str, tool: bool | str, input_tokens: int, body: dict[str, Any],
                      mode: str, cached: tuple[int, int] = (0, 0)) -> AsyncIterator[bytes]:
        events = list(self._events(api, answer, tool, input_tokens, body, cached))
        finished = False
        try:
            for i, event in enumerate(events):
                if mode == "cut" and i == len(events) // 2:
                    raise ConnectionAbortedError("the fake upstream cuts the stream")
                if mode == "slow" and i > 0:
                    await asyncio.sleep(self.delay)
                yield event
            finished = True
            self.completed_streams += 1
        finally:
            if not finished and mode != "cut":
                self.disconnects += 1

    @staticmethod
    def _events(api: str, answer: str, tool: bool | str, input_tokens: int, body: dict[str, Any],
                cached: tuple[int, int] = (0, 0)) -> Any:
        pieces = [answer[i:i + 8] for i in range(0, len(answer), 8)]
        out_tokens = max(1, len(answer) // 4)
        read, written = cached
        if api == "responses":
            yield from _response_events(answer, pieces, tool, input_tokens, out_tokens, read)
        elif api == "openai":
            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                return b"data: " + json.dumps(data).encode() + b"\n\n"
            yield chunk({"role": "assistant", "content": ""})
            if tool:
                yield chunk({"tool_calls": [{"index": 0, "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                                             "function": {"name": "get_weather", "arguments": ""}}]})
                for part in ('{"city"', ': "Par', 'is"}'):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                yield chunk({}, "tool_calls")
            else:
                for piece in pieces:
                    yield chunk({"content": piece})
                yield chunk({}, "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": input_tokens, "completion_tokens": out_tokens,
                         "total_tokens": input_tokens + out_tokens, "prompt_tokens_details": {"cached_tokens": read}}
                data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                        "choices": [], "usage": usage}
                yield b"data: " + json.dumps(data).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        elif api == "anthropic":
            def event(name: str, data: dict[str, Any]) -> bytes:
                return f"event: {name}\ndata: ".encode() + json.dumps(dict(data, type=name)).encode() + b"\n\n"
            yield event("message_start", {"message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": input_tokens - read - written, "output_tokens": 1,
                          "cache_creation_input_tokens": written, "cache_read_input_tokens": read}}})
            yield event("ping", {})
            first = 0
            if _thinking_on(api, body):
                thought, redacted = _thoughts(len(body["messages"]))
                yield event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}})
                for k in range(0, len(thought["thinking"]), 16):
                    yield event("content_block_delta", {"index": 0, "delta": {
                        "type": "thinking_delta", "thinking": thought["thinking"][k:k + 16]}})
                yield event("content_block_delta", {"index": 0, "delta": {"type": "signature_delta",
                                                                          "signature": thought["signature"]}})
                yield event("content_block_stop", {"index": 0})
                yield event("content_block_start", {"index": 1, "content_block": redacted})
                yield event("content_block_stop", {"index": 1})
                first = 2
            yield event("content_block_start", {"index": first, "content_block": {"type": "text", "text": ""}})
            for piece in (["Let me check."] if tool else pieces):
                yield event("content_block_delta", {"index": first, "delta": {"type": "text_delta", "text": piece}})
            yield event("content_block_stop", {"index": first})
            if tool:
                yield event("content_block_start", {"index": first + 1, "content_block": {
                    "type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": "get_weather", "input": {}}})
                for part in ('{"city"', ': "Par', 'is"}'):
                    yield event("content_block_delta", {"index": first + 1, "delta": {
                        "type": "input_json_delta", "partial_json": part}})
                yield event("content_block_stop", {"index": first + 1})
            yield event("message_delta", {"delta": {"stop_reason": "tool_use" if tool else "end_turn",
                                                    "stop_sequence": None}, "usage": {"output_tokens": out_tokens}})
            yield event("message_stop", {})
        else:
            def line(data: dict[str, Any]) -> bytes:
                return json.dumps(dict({"model": MODEL, "created_at": "2025-01-01T00:00:00Z"}, **data)).encode() + b"\n"
            if tool:
                yield line({"message": {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, "done": False})
            else:
                for piece in pieces:
                    yield line({"message": {"role": "assistant", "content": piece}, "done": False})
            yield line({"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop",
                        "prompt_eval_count": input_tokens, "eval_count": out_tokens})


def _thoughts(n: int) -> list[dict[str, Any]]:
    """What the model thought before its answer to a request of ``n`` messages: a thinking
    block and a redacted one, signed so that only this process verifies them (wire.seal)."""
    text = f"The conversation has {n} messages; the next step follows."
    return [{"type": "thinking", "thinking": text, "signature": wire.seal(text)},
            {"type": "redacted_thinking", "data": wire.seal(f"redacted {n}")}]


def _responses_as_messages(body: dict[str, Any]) -> dict[str, Any] | None:
    """A Responses API request read as Chat Completions messages (what the fake model
    answers from), after checking its items are well formed; None if they are not."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return None
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    freeform: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            return None
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return None
            content = item.get("content")
            if isinstance(content, list):
                allowed = ("output_text", "refusal") if item["role"] == "assistant" else \
                    ("input_text", "input_image", "input_file")
                if any(not isinstance(p, dict) or p.get("type") not in allowed for p in content):
                    return None
                content = [{"type": "text", "text": p.get("text", "")} for p in content if "text" in p]
            elif not isinstance(content, str):
                return None
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                return None
            calls.add(item["call_id"])
            messages.append({"role": "assistant", "content": None})
        elif kind == "custom_tool_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "input")):
                return None
            freeform.add(item["call_id"])
            messages.append({"role": "assistant", "content": None})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            # What OpenAI answers otherwise: no tool call found for (custom tool) call output:
            # an output answers a call of its own kind.
            if item.get("call_id") not in (calls if kind == "function_call_output" else freeform):
                return None
            messages.append({"role": "tool", "content": str(item.get("output"))})
        elif kind != "reasoning":
            return None
    return dict(body, messages=messages)


FREEFORM_TOOL = "apply_patch"
PATCH = "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return a\n+    return b\n*** End Patch\n"


def _response_output(answer: str, tool: bool | str) -> list[dict[str, Any]]:
    if isinstance(tool, str):
        return [{"type": "custom_tool_call", "id": f"ctc_{uuid.uuid4().hex[:8]}",
                 "call_id": f"call_{uuid.uuid4().hex[:8]}", "name": tool, "input": PATCH, "status": "completed"}]
    if tool:
        return [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:8]}", "call_id": f"call_{uuid.uuid4().hex[:8]}",
                 "name": "get_weather", "arguments": '{"city": "Paris"}', "status": "completed"}]
    return [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": answer, "annotations": []}]}]


def _response_object(status: str, output: list[dict[str, Any]], input_tokens: int, out_tokens: int,
                     cached: int = 0) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": MODEL,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": input_tokens + out_tokens}}


def _response_events(answer: str, pieces: list[str], tool: bool | str, input_tokens: int, out_tokens: int,
                     cached: int = 0) -> Any:
    """A streamed Responses API answer, event by event as OpenAI sends them."""
    seq = iter(range(1_000_000))

    def event(name: str, data: dict[str, Any]) -> bytes:
        payload = dict(data, type=name, sequence_number=next(seq))
        return f"event: {name}\ndata: ".encode() + json.dumps(payload).encode() + b"\n\n"

    output = _response_output(answer, tool)
    item = output[0]
    yield event("response.created", {"response": _response_object("in_progress", [], 0, 0)})
    yield event("response.in_progress", {"response": _response_object("in_progress", [], 0, 0)})
    if isinstance(tool, str):
        yield event("response.output_item.added", {"output_index": 0, "item": dict(item, input="",
                                                                                   status="in_progress")})
        for at in range(0, len(PATCH), 16):
            yield event("response.custom_tool_call_input.delta", {"output_index": 0, "item_id": item["id"],
                                                                  "delta": PATCH[at:at + 16]})
        yield event("response.custom_tool_call_input.done", {"output_index": 0, "item_id": item["id"],
                                                             "input": PATCH})
    elif tool:
        yield event("response.output_item.added", {"output_index": 0, "item": dict(item, arguments="",
                                                                                   status="in_progress")})
        for part in ('{"city"', ': "Par', 'is"}'):
            yield event("response.function_call_arguments.delta", {"output_index": 0, "item_id": item["id"],
                                                                   "delta": part})
        yield event("response.function_call_arguments.done", {"output_index": 0, "item_id": item["id"],
                                                              "arguments": item["arguments"]})
    else:
        yield event("response.output_item.added", {"output_index": 0, "item": dict(item, content=[],
                                                                                   status="in_progress")})
        empty = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", {"output_index": 0, "item_id": "msg_1", "content_index": 0,
                                                    "part": empty})
        for piece in pieces:
            yield event("response.output_text.delta", {"output_index": 0, "item_id": "msg_1", "content_index": 0,
                                                       "delta": piece, "logprobs": []})
        yield event("response.output_text.done", {"output_index": 0, "item_id": "msg_1", "content_index": 0,
                                                  "text": answer, "logprobs": []})
        yield event("response.content_part.done", {"output_index": 0, "item_id": "msg_1", "content_index": 0,
                                                   "part": dict(empty, text=answer)})
    yield event("response.output_item.done", {"output_index": 0, "item": item})
    yield event("response.completed", {"response": _response_object("completed", output, input_tokens,
                                                                    out_tokens, cached)})


class _CutResponse(Response):
    """Announces ``length`` bytes, sends ``data`` (fewer), then the connection ends."""

    def __init__(self, data: bytes, length: int) -> None:
        super().__init__(status_code=200, media_type="application/json")
        self.data = data
        self.length = length

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(self.length).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.data, "more_body": True})
        raise ConnectionAbortedError("the fake upstream cuts the answer")
