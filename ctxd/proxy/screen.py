"""What a request must be before the proxy acts on it: the owner's (peers.py), meant for
this proxy by name, not a web page's, of a shape the proxy reads, and not too large.

A web page in the owner's browser reaches 127.0.0.1 too, and its requests come from the
owner's uid. Two ways in are closed here:

* **DNS rebinding**: a page of ``evil.example`` whose name is made to resolve to 127.0.0.1
  sends requests that the browser treats as same-origin. They carry ``Host:
  evil.example:PORT``: only loopback names (``localhost``, 127.0.0.0/8, ``[::1]``) and
  ``proxy.allowed_hosts`` are served, others get a 403.
* **Cross-origin requests**: a browser sends ``Origin`` with every cross-origin request
  (and with same-origin POSTs); "simple" ones (a POST with ``Content-Type: text/plain``)
  are sent without asking first. A request with an ``Origin`` not in
  ``proxy.allowed_origins`` (empty by default: no page, not even one on a loopback
  address, which any local user can serve) gets a 403; preflights (``OPTIONS`` with
  ``Access-Control-Request-Method``) are answered here, never forwarded: 204 with the
  CORS headers for an allowed origin, 403 otherwise. The chat endpoints also take only
  JSON bodies (415 otherwise).

And for every request: a path with ``.`` or ``..`` segments (``/v1/..%2F..%2Fsecret``,
which the upstream URL would resolve out of its base path) is a 400; a body larger than
``proxy.max_body_bytes`` is a 413, answered on its ``Content-Length`` before any of it is
read, or as soon as a body without one passes the limit; the rest is skipped as it comes,
never buffered. Each error is in the shape of the API the request was for.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from typing import Any

from ctxd.config import ProxyConfig
from ctxd.proxy.peers import Asgi, Conn, PeerGate, Receive, Scope, Send, refusal_body

log = logging.getLogger("ctxd.proxy")

JSON_ROUTES = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                         "/api/chat", "/v1/responses", "/responses"})
"""The paths whose bodies the proxy reads as JSON (app.build_app's chat routes)."""
_ALLOW_METHODS = b"GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"


class BodyTooLarge(Exception):
    """A request body passed ``proxy.max_body_bytes`` while being read (a body without a
    Content-Length); the app answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit:,} bytes (proxy.max_body_bytes)")
        self.limit = limit


def is_loopback_name(host: str) -> bool:
    """``localhost`` (and its names, RFC 6761), an address of 127.0.0.0/8 or ``::1``."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name of a ``Host`` header's value, without its port."""
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def bad_path(path: str) -> bool:
    """Whether a (decoded) path has a ``.`` or ``..`` segment, with ``/`` or ``\\`` as
    separators: the upstream URL would resolve it out of its base path."""
    if "." not in path:
        return False
    for segment in path.replace("\\", "/").split("/"):
        if segment in (".", ".."):
            return True
    return False


def json_type(value: bytes) -> bool:
    """Whether a Content-Type is JSON (``application/json``, ``...+json``, any parameters)."""
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class Screen:
    """The ASGI wrapper in front of the app (see the module's docstring)."""

    def __init__(self, gate: PeerGate, config: ProxyConfig) -> None:
        self.gate = gate
        self.max_body = config.max_body_bytes
        self.hosts = {h.lower().rstrip(".") for h in config.allowed_hosts}
        self.origins = set(config.allowed_origins)
        self._host_ok: dict[bytes, bool] = {}

    def host_allowed(self, value: bytes) -> bool:
        known = self._host_ok.get(value)
        if known is not None:
            return known
        name = _host_name(value.decode("latin-1").strip())
        ok = is_loopback_name(name) or "*" in self.hosts or name.lower().rstrip(".") in self.hosts
        if len(self._host_ok) < 256:
            self._host_ok[value] = ok
        return ok

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def wrap(self, app: Asgi) -> Asgi:
        gate = self.gate

        async def screened(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await app(scope, receive, send)
                return
            conn = gate.conn_of(scope)
            if gate.check and (conn is None or conn.uid != gate.owner):
                # (Another user's connection never gets here: peers.Refusal answers it.)
                await self.refuse(scope, send, 403, f"ctxd proxy serves only its own user (uid {gate.owner}); "
                                                    "this connection's user is not known")
                return
            if conn is not None:
                conn.started()
            try:
                await self.serve(app, conn, scope, receive, send)
            finally:
                if conn is not None:
                    conn.finished()

        return screened

    async def serve(self, app: Asgi, conn: Conn | None, scope: Scope, receive: Receive, send: Send) -> None:
        host = origin = ctype = length = None
        chunked = preflight = False
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                ctype = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"access-control-request-method":
                preflight = True
        if host is not None and not self.host_allowed(host):
            shown = host.decode("latin-1")[:200]
            log.warning("refused a request for Host %r: not a loopback name (proxy.allowed_hosts)", shown)
            await self.refuse(scope, send, 403, f"ctxd proxy: the Host {shown!r} is not a loopback name; a web "
                                                "page's request through DNS rebinding is refused (set "
                                                "proxy.allowed_hosts to serve other names)")
            return
        allowed_origin: bytes | None = None
        if origin is not None:
            text = origin.decode("latin-1")
            if not self.origin_allowed(text):
                log.warning("refused a request from a web page (Origin %r; proxy.allowed_origins)", text[:200])
                await self.refuse(scope, send, 403, f"ctxd proxy: requests from web pages are refused (Origin "
                                                    f"{text[:200]!r}); proxy.allowed_origins lists the pages "
                                                    f"that may use it")
                return
            allowed_origin = origin
            if preflight and scope["method"] == "OPTIONS":
                await self.preflight(scope, send, origin)
                return
        path: str = scope["path"]
        if bad_path(path):
            await self.refuse(scope, send, 400, f"ctxd proxy: the path {path[:200]!r} has '.' or '..' segments; "
                                                "it is not forwarded")
            return
        if ctype is not None and scope["method"] == "POST" and path in JSON_ROUTES and not json_type(ctype):
            shown = ctype.decode("latin-1")[:100]
            await self.refuse(scope, send, 415, f"ctxd proxy: {path} takes a JSON body (Content-Type: "
                                                f"application/json), not {shown!r}")
            return
        if length is not None:
            try:
                size = int(length) if len(length) <= 19 else self.max_body + 1
            except ValueError:
                size = 0  # (uvicorn's parser refuses a bad Content-Length before this)
            if size > self.max_body:
                log.warning("refused a request body of %s bytes: more than proxy.max_body_bytes (%d)",
                            length.decode("latin-1")[:30], self.max_body)
                await self.refuse(scope, send, 413, f"ctxd proxy: the request body ({size:,} bytes) is larger "
                                                    f"than {self.max_body:,} bytes (proxy.max_body_bytes)")
                return
        if (length is not None and length != b"0") or chunked:
            receive = _Body(receive, conn, self.max_body)
        if allowed_origin is not None:
            send = _with_cors(send, allowed_origin)
        await app(scope, receive, send)

    async def preflight(self, scope: Scope, send: Send, origin: bytes) -> None:
        """A CORS preflight of an allowed origin, answered here (never forwarded)."""
        asked = b""
        for name, value in scope["headers"]:
            if name == b"access-control-request-headers":
                asked = value
        headers = [(b"access-control-allow-origin", origin), (b"access-control-allow-methods", _ALLOW_METHODS),
                   (b"access-control-max-age", b"600"), (b"vary", b"Origin"), (b"content-length", b"0")]
        if asked:
            headers.append((b"access-control-allow-headers", asked))
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
        """An error in the API's shape, sent before any of the request's body is read. The
        connection stays open: the rest of a body still coming is skipped by uvicorn's
        parser as it arrives (never buffered; a client that writes its whole body before
        reading gets the answer instead of a reset), within the gate's timeout."""
        names = {name for name, _ in scope.get("headers", ())}
        body = refusal_body(scope.get("path", ""), names, message, status)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _Body:
    """A request's ``receive`` while its body is read: counts it against the limit and
    marks when the app waits for more (the gate's sweep closes a body that pauses)."""

    __slots__ = ("_receive", "_conn", "_limit", "_read", "_done")

    def __init__(self, receive: Receive, conn: Conn | None, limit: int) -> None:
        self._receive = receive
        self._conn = conn
        self._limit = limit
        self._read = 0
        self._done = False

    async def __call__(self) -> Any:
        if self._done:
            return await self._receive()
        conn = self._conn
        if conn is not None:
            conn.waiting = time.monotonic()
        try:
            message = await self._receive()
        finally:
            if conn is not None:
                conn.waiting = 0.0
        if message["type"] == "http.request":
            self._read += len(message.get("body", b""))
            if self._read > self._limit:
                self._done = True
                raise BodyTooLarge(self._limit)
            if not message.get("more_body", False):
                self._done = True
        else:
            self._done = True
        return message


def _with_cors(send: Send, origin: bytes) -> Send:
    """``send`` adding the CORS headers an allowed origin's page needs to read the answer."""

    async def cors(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", ()), (b"access-control-allow-origin", origin),
                                             (b"vary", b"Origin")])
        await send(message)

    return cors
