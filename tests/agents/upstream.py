"""The scripted fake upstream the agent CLIs talk to, and the tap that records what they
send: one HTTP server (Starlette on uvicorn, in a thread) on 127.0.0.1.

Upstream routes (what the providers serve): Anthropic ``/v1/messages`` (and its
``count_tokens``), OpenAI ``/v1/chat/completions`` and ``/v1/responses`` (and its
``input_tokens``), ``/v1/models``; whole and streamed (SSE, event by event as the
providers send them). Each request is checked as the real API checks it
(tests/agents/wire.py: a refusal is the API's 400 with its wording), counted, refused
with the provider's own "prompt is too long" 400 over the model's window, answered by
the script (tests/agents/script.py) and recorded (:class:`Exchange`). Usage fields
report the prompt cache as the benchmark's pricer sees it (tests/agents/pricing.py).

The tap (``/tap/...``): the CLI's base URL points at it; it records the client's request
as sent (and which of the repository's files it shows whole) and forwards it, with a
header ``x-agents-tap: N``, to the target (this upstream, or ``ctxd proxy``), relaying
the answer as it streams. The proxy forwards that header upstream, so each upstream
request pairs with the client request it came from.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.agents import pricing, wire
from tests.agents.script import Move, Script

TAP_HEADER = "x-agents-tap"
WINDOWS: tuple[tuple[str, int], ...] = (("claude-", 200_000), ("gpt-5", 272_000), ("gpt-4o", 128_000),
                                        ("gpt-4.1", 1_047_576))
"""The models' own windows (longest prefix first wins); others: 128K."""
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}
SHOWN_MIN_CHARS = 200
"""A file shorter than this is not looked for in requests (an empty ``__init__.py`` is in every one)."""


def model_window(model: str) -> int:
    for prefix, window in WINDOWS:
        if model.startswith(prefix):
            return window
    return 128_000


@dataclass
class Exchange:
    """One request the upstream got, and what it answered."""

    n: int
    path: str
    api: str
    tap: int | None  # the client request it came from
    model: str
    stream: bool
    status: int
    kind: str  # task | title | summary | other | error
    step: int
    tokens: int
    cached: int
    error: str
    body: Any
    at: float


@dataclass
class Tapped:
    """One request the client sent (through the tap)."""

    n: int
    path: str
    method: str
    body: Any
    shown: list[str]  # hashes of the repository's files this request shows whole, as on disk
    at: float
    status: int = 0


@dataclass
class Record:
    exchanges: list[Exchange] = field(default_factory=list)
    tapped: list[Tapped] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # hash -> a file's text as it was seen
    passthrough: list[str] = field(default_factory=list)  # other paths the upstream was asked for


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def escaped(text: str) -> str:
    """A text as it appears inside a JSON string (what to look for in a raw body)."""
    return json.dumps(text)[1:-1]


class ScriptedUpstream:
    def __init__(self, script: Script, repo: Path | None = None) -> None:
        self.script = script
        self.repo = repo
        self.target = ""  # where the tap forwards: "" = this upstream
        self.record = Record()
        self._lock = threading.Lock()
        self._pricers: dict[str, pricing.Pricer] = {}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ScriptedUpstream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tap_url(self) -> str:
        return f"{self.url}/tap"

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/messages", self._chat, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._chat, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
            Route("/v1/responses/input_tokens", self._count, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/tap/{path:path}", self._tap, methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
            Route("/{path:path}", self._other, methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
        ])

    # --- the tap --------------------------------------------------------------------------

    def _shown(self, raw: bytes) -> list[str]:
        if self.repo is None:
            return []
        text = raw.decode(errors="replace")
        shown = []
        for path in sorted(self.repo.rglob("*")):
            if ".git" in path.parts or not path.is_file():
                continue
            try:
                content = path.read_text()
            except (OSError, UnicodeDecodeError):
                continue
            if len(content) >= SHOWN_MIN_CHARS and escaped(content) in text:
                digest = _sha(content)
                with self._lock:
                    self.record.files[digest] = content
                shown.append(digest)
        return shown

    async def _tap(self, request: Request) -> Response:
        raw = await request.body()
        path = "/" + request.path_params["path"]
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            tapped = Tapped(len(self.record.tapped), path, request.method, body, [], time.time())
            self.record.tapped.append(tapped)
        if body is not None and request.method == "POST":
            tapped.shown = await asyncio.to_thread(self._shown, raw)
        target = (self.target or self.url) + path
        if request.url.query:
            target += "?" + request.url.query
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers[TAP_HEADER] = str(tapped.n)
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10))
        upstream = await self._http.send(self._http.build_request(request.method, target, headers=headers,
                                                                  content=raw), stream=True)
        tapped.status = upstream.status_code
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code, headers=out_headers)

    # --- the upstream -----------------------------------------------------------------------

    async def _other(self, request: Request) -> Response:
        with self._lock:
            self.record.passthrough.append(f"{request.method} /{request.path_params['path']}")
        return JSONResponse({"error": {"message": "not found", "type": "not_found_error"}}, status_code=404)

    async def _models(self, request: Request) -> Response:
        with self._lock:
            self.record.passthrough.append("GET /v1/models")
        names = ("claude-sonnet-4-5", "gpt-5.5", "gpt-4o", "gpt-4o-mini")
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model", "created": 1,
                                                         "owned_by": "fake", "type": "model", "display_name": n}
                                                        for n in names]})

    async def _count(self, request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        api = "anthropic" if request.url.path.startswith("/v1/messages") else "responses"
        with self._lock:
            self.record.passthrough.append("POST " + request.url.path)
        n = await asyncio.to_thread(wire.count, api, body)
        if api == "anthropic":
            return JSONResponse({"input_tokens": n})
        return JSONResponse({"object": "response.input_tokens", "input_tokens": n})

    def _pricer(self, api: str) -> pricing.Pricer:
        if api not in self._pricers:
            self._pricers[api] = pricing.Pricer(pricing.prices_for(api))
        return self._pricers[api]

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        api = {"/v1/messages": "anthropic", "/v1/chat/completions": "chat",
               "/v1/responses": "responses"}[request.url.path]
        tap = request.headers.get(TAP_HEADER)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            return self._refuse(api, None, tap, 400, f"invalid JSON body: {exc}", None)
        if api == "responses" and (body.get("previous_response_id") or body.get("conversation")):
            return self._refuse(api, body, tap, 400, "previous_response_id is not supported (store is off)", None)
        v = wire.view(api, body)
        bad = wire.problem(api, body, v)
        if bad:
            return self._refuse(api, body, tap, 400, bad, v)
        tokens = await asyncio.to_thread(wire.token_ids, api, body)
        window = model_window(v.model)
        if len(tokens) > window:
            message = {"anthropic": f"prompt is too long: {len(tokens)} tokens > {window} maximum",
                       "chat": f"This model's maximum context length is {window} tokens. However, your messages "
                               f"resulted in {len(tokens)} tokens. Please reduce the length of the messages.",
                       "responses": "Your input exceeds the context window of this model. Please adjust your input "
                                    "and try again."}[api]
            return self._refuse(api, body, tap, 400, message, v, len(tokens), code="context_length_exceeded")
        move = self.script.reply(v)
        with self._lock:
            billed = self._pricer(api).add(tokens)
            self.record.exchanges.append(Exchange(
                len(self.record.exchanges), request.url.path, api, int(tap) if tap else None, v.model, v.stream,
                200, move.kind, move.step, len(tokens), billed.cached, "", body, time.time()))
        custom = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "custom"}
        reply = _Reply(api, v, move, len(tokens), billed.cached, custom, body)
        if not v.stream:
            return JSONResponse(reply.whole())
        return StreamingResponse(_iterate(reply.events()), media_type="text/event-stream")

    def _refuse(self, api: str, body: Any, tap: str | None, status: int, message: str, v: wire.View | None,
                tokens: int = 0, code: str | None = None) -> Response:
        with self._lock:
            self.record.exchanges.append(Exchange(
                len(self.record.exchanges), {"anthropic": "/v1/messages", "chat": "/v1/chat/completions",
                                             "responses": "/v1/responses"}[api], api, int(tap) if tap else None,
                v.model if v else "", bool(v and v.stream), status, "error", -1, tokens, 0, message, body,
                time.time()))
        if api == "anthropic":
            payload: Any = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        else:
            payload = {"error": {"message": message, "type": "invalid_request_error",
                                 "param": "input" if api == "responses" else "messages", "code": code}}
        return JSONResponse(payload, status_code=status)


async def _iterate(events: Iterator[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


class _Reply:
    """A move of the script in an API's shape, whole or as its stream of events."""

    def __init__(self, api: str, v: wire.View, move: Move, tokens: int, cached: int, custom: set[str],
                 body: dict[str, Any]) -> None:
        self.api = api
        self.v = v
        self.move = move
        self.tokens = tokens
        self.cached = cached
        self.custom = custom
        self.body = body
        self.out_tokens = max(1, wire.count_text(move.text + json.dumps([c.input for c in move.calls])))
        self.id = uuid.uuid4().hex[:24]

    # Anthropic -------------------------------------------------------------------------------

    def _anthropic_usage(self) -> dict[str, int]:
        # what the pricer calls cached is read; the rest is written when the request asks
        # for caching at all (a breakpoint), else billed plain
        marked = '"cache_control"' in json.dumps(self.body)
        rest = self.tokens - self.cached
        return {"input_tokens": 0 if marked else rest, "cache_creation_input_tokens": rest if marked else 0,
                "cache_read_input_tokens": self.cached, "output_tokens": self.out_tokens}

    def _anthropic_blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if self.v.thinking and self.move.thinking:
            shown = "" if self.v.thinking_display == "omitted" else self.move.thinking
            blocks.append({"type": "thinking", "thinking": shown, "signature": wire.seal(self.move.thinking)})
        if self.move.text:
            blocks.append({"type": "text", "text": self.move.text})
        for call in self.move.calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input})
        return blocks

    # OpenAI Chat ---------------------------------------------------------------------------------

    def _chat_usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.tokens, "completion_tokens": self.out_tokens,
                "total_tokens": self.tokens + self.out_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached}}

    def _chat_calls(self) -> list[dict[str, Any]]:
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.input)}}
                for c in self.move.calls]

    # Responses -------------------------------------------------------------------------------------

    def _responses_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if self.v.thinking and self.move.thinking:
            items.append({"type": "reasoning", "id": f"rs_{self.id}", "summary": [],
                          "encrypted_content": wire.seal(self.move.thinking)})
        if self.move.text:
            items.append({"type": "message", "id": f"msg_{self.id}", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": self.move.text, "annotations": []}]})
        for i, call in enumerate(self.move.calls):
            if call.name in self.custom:
                items.append({"type": "custom_tool_call", "id": f"ctc_{self.id}{i}", "call_id": call.id,
                              "name": call.name, "input": call.input, "status": "completed"})
            else:
                items.append({"type": "function_call", "id": f"fc_{self.id}{i}", "call_id": call.id,
                              "name": call.name, "arguments": json.dumps(call.input), "status": "completed"})
        return items

    def _response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        usage = {"input_tokens": self.tokens, "input_tokens_details": {"cached_tokens": self.cached},
                 "output_tokens": self.out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": self.tokens + self.out_tokens}
        return {"id": f"resp_{self.id}", "object": "response", "created_at": int(time.time()), "status": status,
                "model": self.v.model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [], "store": False, "usage": usage if status == "completed" else None, "error": None,
                "incomplete_details": None, "instructions": None, "metadata": {}}

    # whole ------------------------------------------------------------------------------------------

    def whole(self) -> dict[str, Any]:
        calls = bool(self.move.calls)
        if self.api == "anthropic":
            return {"id": f"msg_{self.id}", "type": "message", "role": "assistant", "model": self.v.model,
                    "content": self._anthropic_blocks(), "stop_reason": "tool_use" if calls else "end_turn",
                    "stop_sequence": None, "usage": self._anthropic_usage()}
        if self.api == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": self.move.text or None, "refusal": None}
            if calls:
                message["tool_calls"] = self._chat_calls()
            return {"id": f"chatcmpl-{self.id}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.v.model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                                        "finish_reason": "tool_calls" if calls else "stop"}],
                    "usage": self._chat_usage()}
        return self._response("completed", self._responses_items())

    # streamed ---------------------------------------------------------------------------------------

    def events(self) -> Iterator[bytes]:
        if self.api == "anthropic":
            yield from self._anthropic_events()
        elif self.api == "chat":
            yield from self._chat_events()
        else:
            yield from self._responses_events()

    @staticmethod
    def _sse(name: str | None, data: dict[str, Any]) -> bytes:
        head = f"event: {name}\n" if name else ""
        return (head + "data: " + json.dumps(data) + "\n\n").encode()

    @staticmethod
    def _pieces(text: str, size: int = 24) -> list[str]:
        return [text[i:i + size] for i in range(0, len(text), size)] or [""]

    def _anthropic_events(self) -> Iterator[bytes]:
        def ev(name: str, data: dict[str, Any]) -> bytes:
            return self._sse(name, dict(data, type=name))

        usage = dict(self._anthropic_usage(), output_tokens=1)
        yield ev("message_start", {"message": {"id": f"msg_{self.id}", "type": "message", "role": "assistant",
                                               "model": self.v.model, "content": [], "stop_reason": None,
                                               "stop_sequence": None, "usage": usage}})
        yield ev("ping", {})
        for i, block in enumerate(self._anthropic_blocks()):
            kind = block["type"]
            if kind == "thinking":
                yield ev("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": "",
                                                                               "signature": ""}})
                if block["thinking"]:
                    for piece in self._pieces(block["thinking"]):
                        yield ev("content_block_delta", {"index": i, "delta": {"type": "thinking_delta",
                                                                               "thinking": piece}})
                yield ev("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                       "signature": block["signature"]}})
            elif kind == "text":
                yield ev("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                for piece in self._pieces(block["text"]):
                    yield ev("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": piece}})
            else:
                yield ev("content_block_start", {"index": i, "content_block": {"type": "tool_use", "id": block["id"],
                                                                               "name": block["name"], "input": {}}})
                for piece in self._pieces(json.dumps(block["input"]), 40):
                    yield ev("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                           "partial_json": piece}})
            yield ev("content_block_stop", {"index": i})
        yield ev("message_delta", {"delta": {"stop_reason": "tool_use" if self.move.calls else "end_turn",
                                             "stop_sequence": None},
                                   "usage": {"output_tokens": self.out_tokens}})
        yield ev("message_stop", {})

    def _chat_events(self) -> Iterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return self._sse(None, {"id": f"chatcmpl-{self.id}", "object": "chat.completion.chunk",
                                    "created": int(time.time()), "model": self.v.model,
                                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                 "finish_reason": finish}]})

        yield chunk({"role": "assistant", "content": ""})
        if self.move.text:
            for piece in self._pieces(self.move.text):
                yield chunk({"content": piece})
        for i, call in enumerate(self._chat_calls()):
            yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                         "function": {"name": call["function"]["name"], "arguments": ""}}]})
            for piece in self._pieces(call["function"]["arguments"], 40):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if self.move.calls else "stop")
        if (self.body.get("stream_options") or {}).get("include_usage"):
            yield self._sse(None, {"id": f"chatcmpl-{self.id}", "object": "chat.completion.chunk",
                                   "created": int(time.time()), "model": self.v.model, "choices": [],
                                   "usage": self._chat_usage()})
        yield b"data: [DONE]\n\n"

    def _responses_events(self) -> Iterator[bytes]:
        seq = iter(range(1_000_000))

        def ev(name: str, data: dict[str, Any]) -> bytes:
            return self._sse(name, dict(data, type=name, sequence_number=next(seq)))

        yield ev("response.created", {"response": self._response("in_progress", [])})
        yield ev("response.in_progress", {"response": self._response("in_progress", [])})
        items = self._responses_items()
        for i, item in enumerate(items):
            kind = item["type"]
            if kind == "message":
                yield ev("response.output_item.added", {"output_index": i, "item": dict(item, content=[],
                                                                                        status="in_progress")})
                part = {"type": "output_text", "text": "", "annotations": []}
                yield ev("response.content_part.added", {"output_index": i, "item_id": item["id"],
                                                         "content_index": 0, "part": part})
                text = item["content"][0]["text"]
                for piece in self._pieces(text):
                    yield ev("response.output_text.delta", {"output_index": i, "item_id": item["id"],
                                                            "content_index": 0, "delta": piece, "logprobs": []})
                yield ev("response.output_text.done", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                       "text": text, "logprobs": []})
                yield ev("response.content_part.done", {"output_index": i, "item_id": item["id"],
                                                        "content_index": 0, "part": dict(part, text=text)})
            elif kind == "function_call":
                yield ev("response.output_item.added", {"output_index": i, "item": dict(item, arguments="",
                                                                                        status="in_progress")})
                for piece in self._pieces(item["arguments"], 40):
                    yield ev("response.function_call_arguments.delta", {"output_index": i, "item_id": item["id"],
                                                                        "delta": piece})
                yield ev("response.function_call_arguments.done", {"output_index": i, "item_id": item["id"],
                                                                   "arguments": item["arguments"]})
            elif kind == "custom_tool_call":
                yield ev("response.output_item.added", {"output_index": i, "item": dict(item, input="",
                                                                                        status="in_progress")})
                for piece in self._pieces(item["input"], 40):
                    yield ev("response.custom_tool_call_input.delta", {"output_index": i, "item_id": item["id"],
                                                                       "delta": piece})
                yield ev("response.custom_tool_call_input.done", {"output_index": i, "item_id": item["id"],
                                                                  "input": item["input"]})
            else:
                yield ev("response.output_item.added", {"output_index": i, "item": item})
            yield ev("response.output_item.done", {"output_index": i, "item": item})
        yield ev("response.completed", {"response": self._response("completed", items)})


def record_json(record: Record) -> dict[str, Any]:
    return {"exchanges": [asdict(e) for e in record.exchanges], "tapped": [asdict(t) for t in record.tapped],
            "files": record.files, "passthrough": record.passthrough}
