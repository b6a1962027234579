"""Real HTTP servers that speak the Ollama, OpenAI and Anthropic wire formats.

Tests point ctxd's LLM backends (and the whole daemon, in end-to-end tests) at these
instead of a model. One server answers all three APIs on one ephemeral port of
127.0.0.1; it runs in a background thread, so it works the same from sync and async
tests, and its answers are deterministic.

Usage::

    from tests.llm_servers import FakeLLMServer

    with FakeLLMServer(model="llama3.2:3b") as server:
        settings = server.settings("ollama")          # BackendSettings pointing here
        server.fail_then_ok(2, kind="429", retry_after=0.01)
        ...                                            # run the code under test
        assert len(server.chat_requests()) == 3
        assert server.chat_requests()[-1].json["options"]["num_predict"] == 260

Endpoints (shapes as the real APIs return them):

* Ollama: ``POST /api/chat``, ``POST /api/show``, ``GET /api/tags``
* OpenAI: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /v1/models/{id}``
* Anthropic: ``POST /v1/messages``, ``GET /v1/models/{id}`` (told from OpenAI's by the
  ``anthropic-version`` header every Anthropic client sends)

Modes (switch at any time; they apply to the chat endpoints only, model look-ups always
answer):

* ``ok()``: a summary built from the request: the first sentence of each ``USER:`` line
  of the rendered conversation (or of each user message) plus the words after "next" on
  lines that mention it. Always much shorter than the conversation it was given.
* ``slow(seconds)``: wait, then answer as ``ok``; a client that hangs up meanwhile is
  counted in ``disconnects``.
* ``fail(kind)``: ``"500"``, ``"429"`` (with ``Retry-After`` when ``retry_after`` is
  given), ``"400"``, or ``"drop"`` (close the connection without answering).
* ``garbage(kind)``: ``"invalid_json"``, ``"empty"``, ``"long"`` (longer than the input),
  ``"repeated"`` (one line over and over), ``"not_text"`` (punctuation soup), ``"huge"``
  (an answer of ``huge_bytes`` of prose, 20 MB by default, sent as one JSON body).
* ``fail_then_ok(n, kind)``: the next ``n`` chat requests fail as ``fail(kind)``, then ``ok``.

``hold_lookups()`` makes the model look-ups (``/api/show``, ``/v1/models...``) hang: they
are received and recorded, then answered only after ``release_lookups()`` (or never, if
the client hangs up first), like a server stuck loading a model.

With ``api_key`` set, requests without that key get each API's real 401 answer;
``echo_key_in_errors`` makes the 401 quote the key received (to test redaction).
Every request is recorded (``requests``, ``chat_requests()``) with path, lower-cased
headers and decoded JSON body.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import unquote

from ctxd.llm.settings import BackendSettings

FailKind = Literal["500", "429", "400", "drop"]
GarbageKind = Literal["invalid_json", "empty", "long", "repeated", "not_text", "huge"]
Flavor = Literal["ollama", "openai", "anthropic"]

CHAT_PATHS = {"/api/chat": "ollama", "/v1/chat/completions": "openai", "/v1/messages": "anthropic"}

_ROLE_LINE = re.compile(r"^(?:USER|ASSISTANT|SYSTEM|TOOL[^:]*|CHECKPOINT[^:]*):")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_NEXT = re.compile(r"\bnext\b[:,]?\s*(.*)", re.IGNORECASE)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    at: float

    @property
    def flavor(self) -> Flavor | None:
        """Which API a chat request spoke (None for other endpoints)."""
        return CHAT_PATHS.get(self.path)  # type: ignore[return-value]

    def text(self) -> str:
        """All message text of a chat request (system included), joined by newlines."""
        return "\n".join(_message_texts(self.json))


@dataclass
class Mode:
    """What the chat endpoints do now; build with the server's mode methods."""

    name: Literal["ok", "slow", "fail", "garbage", "fail_then_ok"] = "ok"
    delay: float = 0.0
    fail: FailKind = "500"
    retry_after: float | None = None
    garbage: GarbageKind = "empty"
    remaining: int = 0


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    mode: Mode = field(default_factory=Mode)
    requests: list[RecordedRequest] = field(default_factory=list)
    disconnects: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    lookups_released: threading.Event = field(default_factory=_set_event)
    request_event: threading.Condition = field(default_factory=threading.Condition)


class FakeLLMServer:
    """A real HTTP server on 127.0.0.1 speaking three LLM APIs; see the module docstring.

    ``context_length`` is the trained window the server reports (Ollama
    ``<arch>.context_length``, vLLM ``max_model_len``, llama.cpp ``n_ctx_train``);
    ``num_ctx`` is Ollama's Modelfile ``num_ctx`` (None: not set). ``openai_models_style``
    picks how ``/v1/models`` describes the model: ``"vllm"``, ``"llamacpp"`` or ``"openai"``
    (no window). ``anthropic_window`` makes ``/v1/models/{id}`` report
    ``max_input_tokens`` / ``max_tokens`` for Anthropic.
    """

    def __init__(self, *, model: str = "fake-llm:3b", context_length: int = 8192,
                 num_ctx: int | None = None, parameter_size: str = "3.2B", family: str = "llama",
                 api_key: str | None = None, echo_key_in_errors: bool = False,
                 openai_models_style: Literal["vllm", "llamacpp", "openai"] = "vllm",
                 anthropic_window: bool = False, huge_bytes: int = 20_000_000) -> None:
        self.model = model
        self.huge_bytes = huge_bytes
        self.context_length = context_length
        self.num_ctx = num_ctx
        self.parameter_size = parameter_size
        self.family = family
        self.api_key = api_key
        self.echo_key_in_errors = echo_key_in_errors
        self.openai_models_style = openai_models_style
        self.anthropic_window = anthropic_window
        self._state = _State()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        """Bind an ephemeral port and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        handler = type("Handler", (_Handler,), {"fake": self})
        httpd = _QuietServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._state.stopping.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-llm-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; slow requests in flight end at once."""
        if self._httpd is None:
            return
        self._state.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- addresses -------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (Ollama's and Anthropic's base URL)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI-compatible base URL, ``/v1`` included."""
        return self.url + "/v1"

    def base_url(self, kind: Flavor) -> str:
        return self.openai_url if kind == "openai" else self.url

    def settings(self, kind: Flavor, **overrides: Any) -> BackendSettings:
        """``BackendSettings`` for ``kind`` pointing at this server, with quick retries.

        Defaults here suit tests (short backoff, no key variable); ``overrides`` win.
        """
        values: dict[str, Any] = {
            "kind": kind, "model": self.model, "base_url": self.base_url(kind),
            "api_key_env": "", "backoff_seconds": 0.01, "backoff_max_seconds": 0.05,
            "timeout_seconds": 10.0,
        }
        values.update(overrides)
        return BackendSettings(**values)

    # ---- modes -----------------------------------------------------------------------

    def _set(self, mode: Mode) -> None:
        with self._state.lock:
            self._state.mode = mode

    def ok(self) -> None:
        self._set(Mode("ok"))

    def slow(self, seconds: float) -> None:
        self._set(Mode("slow", delay=seconds))

    def fail(self, kind: FailKind = "500", *, retry_after: float | None = None) -> None:
        self._set(Mode("fail", fail=kind, retry_after=retry_after))

    def garbage(self, kind: GarbageKind = "empty") -> None:
        self._set(Mode("garbage", garbage=kind))

    def fail_then_ok(self, n: int, kind: FailKind = "500", *, retry_after: float | None = None) -> None:
        self._set(Mode("fail_then_ok", fail=kind, retry_after=retry_after, remaining=n))

    def hold_lookups(self) -> None:
        """Model look-ups hang from now on (see the module docstring)."""
        self._state.lookups_released.clear()

    def release_lookups(self) -> None:
        """Answer the held model look-ups, and the later ones at once."""
        self._state.lookups_released.set()

    def lookups(self) -> list[RecordedRequest]:
        """Recorded model look-ups (``/api/show``, ``/v1/models...``), oldest first."""
        return [r for r in self.requests if r.path == "/api/show" or r.path.startswith("/v1/models")]

    @property
    def mode(self) -> Mode:
        with self._state.lock:
            return Mode(**vars(self._state.mode))

    # ---- records ---------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    def chat_requests(self, flavor: Flavor | None = None) -> list[RecordedRequest]:
        """Recorded chat requests (optionally of one API), oldest first."""
        return [r for r in self.requests if r.flavor and (flavor is None or r.flavor == flavor)]

    @property
    def disconnects(self) -> int:
        """How many clients hung up while a slow answer was pending."""
        with self._state.lock:
            return self._state.disconnects

    def clear(self) -> None:
        """Forget recorded requests and disconnects (the mode stays)."""
        with self._state.lock:
            self._state.requests.clear()
            self._state.disconnects = 0

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        """Block until ``predicate(server)`` is true (for sync tests); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return bool(predicate(self))

    # ---- internals used by the handler ----------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._state.lock:
            self._state.requests.append(request)

    def _next_action(self) -> Mode:
        """The mode to apply to this chat request (consumes a fail_then_ok failure)."""
        with self._state.lock:
            mode = self._state.mode
            if mode.name == "fail_then_ok":
                if mode.remaining > 0:
                    mode.remaining -= 1
                    return Mode("fail", fail=mode.fail, retry_after=mode.retry_after)
                return Mode("ok")
            return Mode(**vars(mode))

    def _note_disconnect(self) -> None:
        with self._state.lock:
            self._state.disconnects += 1


# ---- the deterministic "model" -----------------------------------------------------------

def _message_texts(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return []
    out: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        out.append(system)
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p.get("text", "") for p in content if isinstance(p, dict))
    return out


def _first_sentence(text: str, max_words: int = 16) -> str:
    sentence = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    words = sentence.split()
    return " ".join(words[:max_words])


def fake_summary(body: Any, max_tokens: int | None) -> str:
    """The ``ok`` answer: deterministic, and much shorter than the conversation sent."""
    texts = _message_texts(body)
    lines = [line for text in texts for line in text.splitlines()]
    convo = [line for line in lines if _ROLE_LINE.match(line)]
    if convo:
        users = [line.split(":", 1)[1] for line in convo if line.startswith("USER:")]
        source_chars = sum(len(line) for line in convo)
    else:
        users = []
        for message in (body.get("messages") or []) if isinstance(body, dict) else []:
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                users.append(message["content"])
        source_chars = sum(len(t) for t in texts)
    parts = [s for s in (_first_sentence(u) for u in users) if s]
    nexts = []
    for line in convo or lines:
        match = _NEXT.search(line)
        if match and match.group(1).strip():
            nexts.append(" ".join(match.group(1).split()[:12]))
        if len(nexts) == 3:
            break
    summary = "Summary: " + (" ".join(parts) if parts else "the conversation so far.")
    if nexts:
        summary += "\nNext: " + "; ".join(nexts)
    max_chars = max(48, source_chars // 3)
    if max_tokens:
        max_chars = min(max_chars, max(24, max_tokens * 3))
    if len(summary) > max_chars:
        summary = summary[:max_chars].rsplit(" ", 1)[0]
    return summary


def _garbage_text(kind: GarbageKind, body: Any, size: int = 0) -> str:
    if kind == "empty":
        return "  \n"
    if kind == "long":
        lines = "\n".join(_message_texts(body)).splitlines() * 2
        return "\n".join(f"{i}: {line}" for i, line in enumerate(lines))
    if kind == "repeated":
        return "The conversation continues.\n" * 60
    if kind == "not_text":
        return "#$%^&*()_+{}|:<>?~`-=[]\\;',./ 0123456789 " * 20
    if kind == "huge":
        line = "The assistant kept talking about the conversation and did not stop there.\n"
        return line * (size // len(line) + 1)
    raise ValueError(kind)


def _usage_tokens(text: str) -> int:
    return max(1, len(text) // 4)


# ---- the HTTP handler -------------------------------------------------------------------

class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (one that stops reading a huge one) is expected."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLLMServer
    protocol_version = "HTTP/1.1"
    server_version = "fake-llm/1.0"
    # Headers and body are written apart: with Nagle on, the body waited for the client's
    # delayed ACK, ~40 ms on every keep-alive request (docs/performance.md, "Proxy benchmark").
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    # routing

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake._record(RecordedRequest(method, path, headers, raw, body, time.time()))
        anthropic = "anthropic-version" in headers
        if method == "POST" and path in CHAT_PATHS:
            flavor: Flavor = CHAT_PATHS[path]  # type: ignore[assignment]
            if self._refuse(flavor, headers) or self._invalid(flavor, body):
                return
            self._chat(flavor, body)
        elif (path == "/api/show" or path.startswith("/v1/models")) and not self._lookup_released():
            return
        elif method == "GET" and path == "/api/tags":
            self._json(200, {"models": [self._ollama_tag()]})
        elif method == "POST" and path == "/api/show":
            self._show(body)
        elif method == "GET" and path == "/v1/models":
            if not self._refuse("anthropic" if anthropic else "openai", headers):
                self._json(200, {"object": "list", "data": [self._openai_model()]})
        elif method == "GET" and path.startswith("/v1/models/"):
            flavor = "anthropic" if anthropic else "openai"
            if not self._refuse(flavor, headers):
                self._model(flavor, unquote(path.removeprefix("/v1/models/")))
        else:
            self._json(404, {"error": f"no route for {method} {path}"})

    # replies

    def _json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, flavor: Flavor, status: int, message: str, etype: str,
               extra: dict[str, str] | None = None) -> None:
        if flavor == "ollama":
            payload: Any = {"error": message}
        elif flavor == "openai":
            payload = {"error": {"message": message, "type": etype, "param": None, "code": None}}
        else:
            payload = {"type": "error", "error": {"type": etype, "message": message}}
        self._json(status, payload, extra)

    def _refuse(self, flavor: Flavor, headers: dict[str, str]) -> bool:
        """Answer 401 (each API's way) when the expected key is missing or wrong."""
        expected = self.fake.api_key
        if flavor == "anthropic":
            if "anthropic-version" not in headers:
                self._error(flavor, 400, "anthropic-version: header is required", "invalid_request_error")
                return True
            got = headers.get("x-api-key")
        else:
            auth = headers.get("authorization", "")
            got = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if expected is None or got == expected:
            return False
        shown = f": {got}" if self.fake.echo_key_in_errors and got else ""
        if flavor == "anthropic":
            self._error(flavor, 401, f"invalid x-api-key{shown}", "authentication_error")
        elif flavor == "openai":
            self._error(flavor, 401, f"Incorrect API key provided{shown}", "invalid_request_error")
        else:
            self._error(flavor, 401, f"unauthorized{shown}", "")
        return True

    def _invalid(self, flavor: Flavor, body: Any) -> bool:
        """Reject what the real API rejects: no JSON, no messages, unknown model, no max_tokens."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(flavor, 400, "invalid request body: messages required", "invalid_request_error")
            return True
        if body.get("model") != self.fake.model:
            name = body.get("model")
            if flavor == "ollama":
                self._error(flavor, 404, f'model "{name}" not found, try pulling it first', "")
            elif flavor == "openai":
                self._error(flavor, 404, f"The model `{name}` does not exist.", "NotFoundError")
            else:
                self._error(flavor, 404, f"model: {name}", "not_found_error")
            return True
        if flavor == "anthropic" and not isinstance(body.get("max_tokens"), int):
            self._error(flavor, 400, "max_tokens: Field required", "invalid_request_error")
            return True
        return False

    def _chat(self, flavor: Flavor, body: dict[str, Any]) -> None:
        mode = self.fake._next_action()
        if mode.name == "slow":
            if not self._wait(mode.delay):
                return
        if mode.name == "fail":
            self._fail(flavor, mode)
            return
        if mode.name == "garbage" and mode.garbage == "invalid_json":
            self._json(200, b'{"id": "x", "choices": [{"message": {"content": "Summ')
            return
        max_tokens = self._max_tokens(flavor, body)
        if mode.name == "garbage":
            text, truncated = _garbage_text(mode.garbage, body, self.fake.huge_bytes), False
        else:
            text = fake_summary(body, max_tokens)
            truncated = text != fake_summary(body, None)
        prompt_tokens = sum(_usage_tokens(t) + 4 for t in _message_texts(body))
        self._json(200, self._completion(flavor, body, text, prompt_tokens, _usage_tokens(text), truncated))

    @staticmethod
    def _max_tokens(flavor: Flavor, body: dict[str, Any]) -> int | None:
        if flavor == "ollama":
            value = (body.get("options") or {}).get("num_predict")
        else:
            value = body.get("max_tokens") or body.get("max_completion_tokens")
        return value if isinstance(value, int) and value > 0 else None

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the client hangs up (then False: nothing to answer)."""
        deadline = time.monotonic() + seconds
        conn = self.connection
        while (left := deadline - time.monotonic()) > 0:
            if self.fake._state.stopping.is_set():
                return False
            readable, _, _ = select.select([conn], [], [], min(0.02, left))
            if readable:
                try:
                    peek = conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    peek = b""
                if not peek:
                    self.fake._note_disconnect()
                    self.close_connection = True
                    return False
        return True

    def _lookup_released(self) -> bool:
        """Wait while look-ups are held (False: the client hung up or the server stops)."""
        state = self.fake._state
        while not state.lookups_released.is_set():
            if not self._wait(0.05):  # the client hung up, or the server stops
                self.close_connection = True
                return False
        return True

    def _fail(self, flavor: Flavor, mode: Mode) -> None:
        if mode.fail == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if mode.fail == "429":
            extra = {"retry-after": f"{mode.retry_after:g}"} if mode.retry_after is not None else None
            etype = "rate_limit_error" if flavor == "anthropic" else "rate_limit_exceeded"
            self._error(flavor, 429, "Rate limit reached; please try again later", etype, extra)
        elif mode.fail == "400":
            self._error(flavor, 400, "the request is malformed", "invalid_request_error")
        else:
            etype = "api_error" if flavor == "anthropic" else "server_error"
            self._error(flavor, 500, "internal server error", etype)

    def _completion(self, flavor: Flavor, body: dict[str, Any], text: str, prompt_tokens: int,
                    completion_tokens: int, truncated: bool) -> dict[str, Any]:
        model = body["model"]
        if flavor == "ollama":
            return {
                "model": model,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
                "message": {"role": "assistant", "content": text},
                "done_reason": "length" if truncated else "stop",
                "done": True,
                "total_duration": 1_234_567, "load_duration": 12_345,
                "prompt_eval_count": prompt_tokens, "prompt_eval_duration": 456_789,
                "eval_count": completion_tokens, "eval_duration": 765_432,
            }
        if flavor == "openai":
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "length" if truncated else "stop",
                }],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "system_fingerprint": "fp_fake",
            }
        return {
            "id": f"msg_01{uuid.uuid4().hex[:22]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens" if truncated else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }

    # model look-ups

    def _ollama_details(self) -> dict[str, Any]:
        f = self.fake
        return {"parent_model": "", "format": "gguf", "family": f.family, "families": [f.family],
                "parameter_size": f.parameter_size, "quantization_level": "Q4_K_M"}

    def _ollama_tag(self) -> dict[str, Any]:
        f = self.fake
        return {"name": f.model, "model": f.model, "modified_at": "2025-01-01T00:00:00Z",
                "size": 2019393189, "digest": "a80c4f17acd5" + "0" * 52, "details": self._ollama_details()}

    def _show(self, body: Any) -> None:
        f = self.fake
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if name != f.model:
            self._json(404, {"error": f"model '{name}' not found"})
            return
        params = 'stop "<|eot_id|>"'
        if f.num_ctx is not None:
            params = f"num_ctx {f.num_ctx}\n" + params
        self._json(200, {
            "license": "fake license",
            "modelfile": f"FROM {f.model}\n",
            "parameters": params,
            "template": "{{ .Prompt }}",
            "details": self._ollama_details(),
            "model_info": {
                "general.architecture": f.family,
                "general.parameter_count": 3212749888,
                f"{f.family}.context_length": f.context_length,
                f"{f.family}.embedding_length": 3072,
                f"{f.family}.block_count": 28,
            },
            "capabilities": ["completion"],
            "modified_at": "2025-01-01T00:00:00Z",
        })

    def _openai_model(self) -> dict[str, Any]:
        f = self.fake
        entry: dict[str, Any] = {"id": f.model, "object": "model", "created": 1_700_000_000,
                                 "owned_by": "vllm" if f.openai_models_style == "vllm" else "system"}
        if f.openai_models_style == "vllm":
            entry.update({"root": f.model, "parent": None, "max_model_len": f.context_length,
                          "permission": []})
        elif f.openai_models_style == "llamacpp":
            entry["owned_by"] = "llamacpp"
            entry["meta"] = {"vocab_type": 2, "n_vocab": 128256, "n_ctx_train": f.context_length,
                             "n_embd": 3072, "n_params": 3212749888, "size": 2019373056}
        return entry

    def _model(self, flavor: Flavor, model_id: str) -> None:
        f = self.fake
        if model_id != f.model:
            if flavor == "anthropic":
                self._error(flavor, 404, f"model: {model_id}", "not_found_error")
            else:
                self._error(flavor, 404, f"The model `{model_id}` does not exist.", "invalid_request_error")
            return
        if flavor == "openai":
            self._json(200, self._openai_model())
            return
        payload: dict[str, Any] = {"type": "model", "id": f.model, "display_name": f.model,
                                   "created_at": "2025-02-19T00:00:00Z"}
        if f.anthropic_window:
            payload.update({"max_input_tokens": f.context_length, "max_tokens": 8192})
        self._json(200, payload)


def running_server(**kwargs: Any) -> Iterator[FakeLLMServer]:
    """Generator for a pytest fixture: ``fake_llm = pytest.fixture(running_server)``."""
    with FakeLLMServer(**kwargs) as server:
        yield server
