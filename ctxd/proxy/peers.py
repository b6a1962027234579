"""Who is on the other end of a connection to the proxy, and how long and how much a
connection may take: the proxy serves only the user running it.

The proxy listens on 127.0.0.1, which every local user can reach, and a request names a
session (``X-Ctxd-Session``, or a derived id): without this check another user could push
into the owner's sessions and have the owner's history sent upstream with their own key
(another local user gets nothing). A client can only be given a base URL and its own API
key, so no shared secret would do; the kernel knows who owns each loopback socket
(ctxd/loopback.py).

**The proxy accepts its connections itself** (:meth:`PeerGate.listen`), at most
``ACCEPT_BATCH`` per turn of the event loop, and looks up the owner of each client's
socket on the raw socket it accepted (sock_diag, ~13 us), before any transport or
protocol is made for it. Only the owner's become uvicorn's
(``loop.connect_accepted_socket``). A connection of another uid (or one whose owner the
kernel does not name) never reaches uvicorn, Starlette or ctxd: it is given to a
:class:`Refusal`, which reads at most ``MAX_FOREIGN_HEAD`` bytes of its request head,
answers a 403 in the API's error shape and closes (dropping at most ``MAX_DISCARD`` bytes
the client still sends). Each other uid may have ``FOREIGN_PER_UID`` such connections open
at once; past that a new one is *parked*: held unread, its socket alone (no transport),
until the sweep closes it ``proxy.client_timeout_seconds`` later, while fewer than
``park`` are (a share of the descriptors the proxy may open, ``descriptors.parking_room``); beyond,
closed once the turn's accepting is over (closed at once, its client could connect again
into the same turn). Closing another user's connections as they come made them a flood:
a client that reconnects as soon as it is closed kept the accept queue full, and the
owner's connections waited behind it (their packets dropped and sent again 200, 400,
800 ms later); parked, they stop. So another user's connections, however many and
however half-sent, hold a bounded share of descriptors for a bounded time, a flood of
them leaves turns of the loop to the owner's requests, and the daemon in the proxy's
process keeps its descriptors too.
(uvicorn's own accepting, libuv's, accepts until the queue is empty: under a flood of
reconnections it never was, and every other callback waited.)

**The owner's connections** are timed too (a web page in the owner's browser, a stuck
client): the request head must be whole within ``proxy.client_timeout_seconds`` of the
connection's opening or of its previous answer, and a body the proxy is reading may not
pause longer than that; else the connection is closed. A sweep once a second checks it
(no timer per request). A connection is known by its client's address until it is lost:
no other connection can have the same two ends meanwhile (the proxy's socket holds them
until ``connection_lost`` has run).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ctxd.loopback import PeerCheckUnavailable, peer_uid, self_test

log = logging.getLogger("ctxd.proxy")

__all__ = ["PeerCheckUnavailable", "PeerGate", "peer_uid", "self_test"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]
Address = tuple[str, int]

FOREIGN_PER_UID = 4
"""Connections another uid may have open at once (each waiting for its 403)."""
MAX_FOREIGN_HEAD = 16 * 1024
"""Most bytes read from another user's connection: its request head, for the 403's shape."""
MAX_DISCARD = 1024 * 1024
"""Most bytes of another user's request dropped after its 403 before the connection is cut."""
ACCEPT_BATCH = 64
"""Connections accepted per turn of the event loop."""
SWEEP_SECONDS = 1.0
REFUSAL_LOG_SECONDS = 60.0
"""Another uid's refused connections are logged once, then counted once a minute at most."""


class Conn:
    """An open connection of the owner's: its transport, and what the sweep checks.
    ``since``: when it began waiting for a request head (opened, or its last answer
    went); ``busy``: a request is being served; ``waiting``: since when that request has
    been waiting for body bytes (0: not waiting)."""

    __slots__ = ("transport", "uid", "since", "busy", "waiting")

    def __init__(self, transport: Any, uid: int | None) -> None:
        self.transport = transport
        self.uid = uid
        self.since = time.monotonic()
        self.busy = False
        self.waiting = 0.0

    def started(self) -> None:
        self.busy = True

    def finished(self) -> None:
        self.busy = False
        self.waiting = 0.0
        self.since = time.monotonic()


class PeerGate:
    """The uid of each connection as it is accepted, another user's connections refused
    apart (:class:`Refusal`), and the owner's timed. ``check=False``
    (``proxy.allow_unchecked``): everyone is served as the owner, timed alike."""

    def __init__(self, owner: int | None = None, *, check: bool = True, timeout: float = 10.0,
                 park: int = 0) -> None:
        self.owner = os.geteuid() if owner is None else owner
        self.check = check
        self.timeout = timeout
        self.conns: dict[Address, Conn] = {}
        self.foreign: dict[int | None, set[Refusal]] = {}
        self._refused: dict[int | None, list[float]] = {}  # uid -> [count since last line, when logged]
        self._sweep: asyncio.TimerHandle | None = None
        self._sock: socket.socket | None = None
        self._server: Address | None = None
        self._owner_protocol: Callable[[], Any] = lambda: None
        self._accepting: Callable[[], bool] = lambda: True
        self._accept_failed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.park = park
        self._parked: collections.deque[tuple[float, socket.socket]] = collections.deque()

    # --- accepting ---------------------------------------------------------------------

    def listen(self, sock: socket.socket, owner_protocol: Callable[[], Any],
               accepting: Callable[[], bool] = lambda: True) -> None:
        """Accept ``sock``'s connections from now on: the owner's become
        ``owner_protocol()``'s (uvicorn's), another user's a :class:`Refusal`'s.
        ``accepting``: False once the server stops (then nothing more is accepted)."""
        sock.setblocking(False)
        self._sock = sock
        self._server = _address(sock.getsockname())
        self._owner_protocol = owner_protocol
        self._accepting = accepting
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None
        loop = asyncio.get_running_loop()
        if not self._accepting():
            loop.remove_reader(sock.fileno())
            return
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors...: the next turn tries again
                if not self._accept_failed:
                    log.warning("cannot accept a connection: %s", exc.strerror or exc)
                self._accept_failed = True
                return
            self._accept_failed = False
            client = _address(address)
            uid = self.uid_at(client, self._server)
            if uid == self.owner and client is not None:
                self._spawn(loop.connect_accepted_socket(self._owner_protocol, conn))
                continue
            refusals = self.foreign.setdefault(uid, set())
            self._note_refused(uid, client)
            if len(refusals) >= FOREIGN_PER_UID:
                if len(self._parked) < self.park:
                    # Held, unread, until the sweep closes it: a client that reconnects
                    # as soon as it is closed cannot make a flood of it.
                    self._parked.append((time.monotonic(), conn))
                    self._arm()
                else:
                    loop.call_soon(conn.close)
                continue
            refusal = Refusal(self, uid, time.monotonic())
            refusals.add(refusal)
            self._spawn(loop.connect_accepted_socket(refusal.itself, conn))
            self._arm()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._made)

    def _made(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("a connection was lost before it was set up: %s", task.exception())

    def uid_at(self, client: Address | None, server: Address | None) -> int | None:
        if not self.check:
            return self.owner
        if client is None or server is None:
            return None
        try:
            return peer_uid(client, server)
        except OSError as exc:
            log.warning("cannot tell whose connection %s:%d is (%s); refused", client[0], client[1], exc)
            return None

    def opened(self, transport: Any, client: Address | None) -> None:
        """An owner's connection, now uvicorn's: timed by the sweep."""
        if client is not None:
            self.conns[client] = Conn(transport, self.owner)
            self._arm()

    def lost(self, client: Address | None) -> None:
        if client is not None:
            self.conns.pop(client, None)

    def _note_refused(self, uid: int | None, client: Address | None) -> None:
        """One WARNING for the first connection of another uid, then one a minute at most
        with the count: a flood of connections must not become a flood of log lines."""
        now = time.monotonic()
        seen = self._refused.get(uid)
        who = f"uid {uid}" if uid is not None else "a user the kernel does not name"
        if seen is None:
            self._refused[uid] = [0, now]
            where = f"{client[0]}:{client[1]}" if client else "?"
            log.warning("refused a request from %s (%s): ctxd proxy serves only uid %d", who, where, self.owner)
            return
        seen[0] += 1
        if now - seen[1] >= REFUSAL_LOG_SECONDS:
            log.warning("refused %d more connections from %s in the last %.0f s", seen[0], who, now - seen[1])
            seen[0], seen[1] = 0, now

    # --- the sweep ---------------------------------------------------------------------

    def _arm(self) -> None:
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._run_sweep)

    def _run_sweep(self) -> None:
        self._sweep = None
        now = time.monotonic()
        limit = self.timeout
        slow_heads = slow_bodies = 0
        for conn in list(self.conns.values()):
            if conn.busy:
                if conn.waiting and now - conn.waiting > limit and not conn.transport.is_closing():
                    slow_bodies += 1
                    conn.transport.close()
            elif now - conn.since > limit and not conn.transport.is_closing():
                slow_heads += 1
                conn.transport.close()
        for refusals in self.foreign.values():
            for refusal in list(refusals):
                if now - refusal.opened > limit and refusal.transport is not None:
                    refusal.transport.abort()
        parked = self._parked
        while parked and now - parked[0][0] > limit:
            parked.popleft()[1].close()
        if slow_heads or slow_bodies:
            log.info("closed %d connection(s) whose request head was not whole within %g s and %d whose body "
                     "paused longer (proxy.client_timeout_seconds)", slow_heads, limit, slow_bodies)
        if self.conns or self._parked or any(self.foreign.values()):
            self._arm()

    def close(self) -> None:
        """No more accepting, no more sweeps (the listening socket is the caller's)."""
        if self._sock is not None and self._sock.fileno() >= 0:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._parked:
            self._parked.popleft()[1].close()

    # --- uvicorn's protocol ------------------------------------------------------------

    def protocol(self, base: type[Any]) -> type[Any]:
        """uvicorn's HTTP protocol class, each connection (the owner's: :meth:`listen`
        gives it only those) registered for the sweep while it lasts."""
        gate = self

        class TimedProtocol(base):
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                gate.opened(transport, _address(self.client))

            def connection_lost(self, exc: Exception | None) -> None:
                gate.lost(_address(self.client))
                super().connection_lost(exc)

        TimedProtocol.__name__ = f"Timed{base.__name__}"
        return TimedProtocol

    # --- the ASGI side -----------------------------------------------------------------

    def conn_of(self, scope: Scope) -> Conn | None:
        client = scope.get("client")
        return self.conns.get((client[0], client[1])) if client else None


def _address(value: Any) -> Address | None:
    return (value[0], value[1]) if isinstance(value, tuple) and len(value) >= 2 else None


class Refusal(asyncio.Protocol):
    """Another user's connection: its request head is read (at most ``MAX_FOREIGN_HEAD``
    bytes) only to answer in the error shape of the API it asked for, then a 403 and the
    connection is closed. Nothing of it reaches uvicorn or ctxd."""

    def __init__(self, gate: PeerGate, uid: int | None, opened: float) -> None:
        self.gate = gate
        self.transport: Any = None
        self.uid = uid
        self.opened = opened
        self.head = b""
        self.done = False
        self.discarded = 0

    def itself(self) -> Refusal:
        """The protocol factory ``connect_accepted_socket`` asks for: this refusal."""
        return self

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.done:
            # After the answer: the rest of what the client sends is dropped (so that a
            # client writing its whole request before reading gets the 403, not a reset),
            # up to MAX_DISCARD; then the connection is cut.
            self.discarded += len(data)
            if self.discarded > MAX_DISCARD:
                self.transport.abort()
            return
        self.head += data[:MAX_FOREIGN_HEAD + 4 - len(self.head)]
        end = self.head.find(b"\r\n\r\n")
        if end < 0 and len(self.head) < MAX_FOREIGN_HEAD:
            return
        self.done = True
        path, names = _head_of(self.head[:end] if end >= 0 else self.head)
        who = f"uid {self.uid}" if self.uid is not None else "a user the kernel does not name"
        body = refusal_body(path, names, f"ctxd proxy serves only its own user (uid {self.gate.owner}); "
                                         f"this connection is from {who}")
        self.transport.write(b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # (the transport closes)

    def connection_lost(self, exc: Exception | None) -> None:
        refusals = self.gate.foreign.get(self.uid)
        if refusals is not None:
            refusals.discard(self)


def _head_of(head: bytes) -> tuple[str, set[bytes]]:
    """The path of a request head and its header names (lowercase)."""
    lines = head.split(b"\r\n")
    target = lines[0].split(b" ")
    path = target[1].decode("latin-1").split("?", 1)[0] if len(target) >= 2 else "/"
    names = {line.split(b":", 1)[0].strip().lower() for line in lines[1:] if b":" in line}
    return path, names


def api_for(path: str, names: Any) -> str:
    """The API a request's path and headers suggest (as the pass-through picks its
    upstream): its error shape is the one the client understands."""
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages") or b"anthropic-version" in names or b"x-api-key" in names:
        return "anthropic"
    if path.endswith("/responses") or "/responses/" in path:
        return "responses"
    return "openai"


def refusal_body(path: str, names: Any, message: str, status: int = 403) -> bytes:
    """An error body in the shape of the API the request was for."""
    from ctxd.proxy import apis

    api = api_for(path, names)
    body = apis.error_body(api, status, message)  # type: ignore[arg-type]
    if status == 413 and api == "anthropic":
        body["error"]["type"] = "request_too_large"
    return json.dumps(body).encode()
