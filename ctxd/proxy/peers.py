"""Who is on the other end of a connection to the proxy: it serves only the user running it.

The proxy listens on 127.0.0.1, which every local user can reach, and a request names a
session (``X-Ctxd-Session``, or a derived id): without this check another user could push
into the owner's sessions and have the owner's history sent upstream with their own key
(issue 12: another local user gets nothing). A client can only be given a base URL and its
own API key, so no shared secret would do; the kernel knows who owns each loopback socket.

On Linux the kernel names the owner of every TCP socket: the client's socket is the one
whose local end is the connection's peer and whose remote end is the proxy's own address.
It is asked through sock_diag netlink (an exact lookup, as ``ss`` does), else found in
``/proc/net/tcp`` (and ``/proc/net/tcp6``, for a v4-mapped IPv6 client). The uid is looked
up once per connection, when uvicorn's protocol object is made for it, and kept until the
connection is lost; each request then costs a dictionary lookup. No other connection can
have the same two ends meanwhile: the proxy's socket holds them until ``connection_lost``
has run (asyncio closes the socket after it). A connection whose uid cannot be found is
refused like another user's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("ctxd.proxy")

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]
Address = tuple[str, int]


class PeerCheckUnavailable(Exception):
    """The kernel's socket table cannot tell who owns a loopback connection here."""


def _hex4(host: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: one 32-bit word in host byte order."""
    return f"{struct.unpack('=I', socket.inet_aton(host))[0]:08X}"


def _hex6(host: str) -> str:
    """An IPv6 address as /proc/net/tcp6 writes it: four 32-bit words in host byte order
    (an IPv4 address as its v4-mapped form, ``::ffff:a.b.c.d``)."""
    if ":" not in host:
        host = "::ffff:" + host
    return "".join(f"{word:08X}" for word in struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, host)))


def peer_uid(client: Address, server: Address) -> int | None:
    """The uid owning the live socket whose local end is ``client`` and remote end
    ``server``; None when there is none (the client already closed it). Asks the kernel's
    sock_diag netlink (one exact lookup, ~13 us), else reads /proc/net/tcp (the whole
    table: ~6 ms here). Raises OSError when neither can be asked."""
    try:
        return _diag_uid(client, server)
    except OSError as exc:
        if isinstance(exc, _NotFound):
            return None
    return _proc_uid(client, server)


class _NotFound(OSError):
    """sock_diag knows no socket with those ends."""


SOCK_DIAG_BY_FAMILY = 20
NETLINK_SOCK_DIAG = 4
NLMSG_ERROR = 2
NOCOOKIE = 0xFFFFFFFF


def _diag_uid(client: Address, server: Address) -> int | None:
    """One ``inet_diag_req_v2`` exact lookup (what ``ss`` uses): the reply's
    ``inet_diag_msg`` carries the socket's uid and inode."""
    family = socket.AF_INET6 if ":" in client[0] else socket.AF_INET

    def packed(host: str) -> bytes:
        raw = socket.inet_pton(family, host)
        return raw + bytes(16 - len(raw))

    sockid = (struct.pack("!HH", client[1], server[1]) + packed(client[0]) + packed(server[0])
              + struct.pack("=III", 0, NOCOOKIE, NOCOOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0)  # NLM_F_REQUEST
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1)
        nl.sendto(header + request, (0, 0))
        data = nl.recv(65536)
    _, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        errno = -struct.unpack_from("=i", data, 16)[0]
        if errno == 2:  # ENOENT
            raise _NotFound(errno, "no such socket")
        raise OSError(errno, os.strerror(errno))
    # nlmsghdr (16), family/state/timer/retrans (4), sockid (48), expires/rqueue/wqueue (12)
    uid, inode = struct.unpack_from("=II", data, 16 + 4 + 48 + 12)
    return uid if inode else None  # a TIME_WAIT or orphaned socket belongs to nobody now


def _proc_uid(client: Address, server: Address) -> int | None:
    """The same from /proc/net/tcp and /proc/net/tcp6 (the latter for a v4-mapped IPv6
    client, read only when the first has no row)."""
    found: int | None = None
    readable = False
    for table, encode in zip(TABLES, (_hex4, _hex6)):
        try:
            needle = f" {encode(client[0])}:{client[1]:04X} {encode(server[0])}:{server[1]:04X} "
        except (OSError, ValueError):
            continue  # an IPv6 peer has no row in the IPv4 table
        try:
            with open(table, "rb") as f:
                text = f.read().decode("ascii", "replace")
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        readable = True
        start = text.find(needle)
        while start >= 0:
            line_end = text.find("\n", start)
            fields = text[start:line_end if line_end >= 0 else None].split()
            # local rem st tx:rx tr:when retrnsmt uid timeout inode: a socket in
            # TIME_WAIT (or an orphan) has inode 0 and belongs to nobody any more.
            if len(fields) >= 9 and fields[8] != "0":
                uid = int(fields[6])
                if found is not None and found != uid:
                    return None  # cannot happen for one 4-tuple; refuse rather than guess
                found = uid
            start = text.find(needle, start + 1)
        if found is not None:
            return found
    if not readable:
        raise FileNotFoundError(f"{TABLES[0]} is not available")
    return found


def self_test() -> None:
    """Checks that this system tells the owner of a loopback connection: a connection this
    process makes to a listener of its own must be found with its own uid. Raises
    PeerCheckUnavailable (no /proc/net/tcp: not Linux, or /proc hidden) otherwise."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client.connect(listener.getsockname())
        try:
            uid = peer_uid(client.getsockname(), listener.getsockname())
        except OSError as exc:
            raise PeerCheckUnavailable(f"cannot read the kernel's socket table: {exc}") from exc
    if uid != os.geteuid():
        raise PeerCheckUnavailable(f"the kernel does not show this process's own loopback connection "
                                   f"with its uid ({uid} for uid {os.geteuid()})")


class PeerGate:
    """The uid of each open connection, and the ASGI wrapper that refuses another user's
    requests (403, nothing read past the headers, nothing pushed, nothing forwarded)."""

    def __init__(self, owner: int | None = None, *, check: bool = True) -> None:
        self.owner = os.geteuid() if owner is None else owner
        self.check = check
        self.uids: dict[Address, int | None] = {}

    def connected(self, client: Address | None, server: Address | None) -> None:
        if not self.check or client is None or server is None:
            return
        self.uids[client] = self._lookup(client, server)

    def lost(self, client: Address | None) -> None:
        if client is not None:
            self.uids.pop(client, None)

    def uid_of(self, client: Address | None, server: Address | None) -> int | None:
        if client is None or server is None:
            return None
        if client in self.uids:
            return self.uids[client]
        return self._lookup(client, server)  # not seen connecting (cannot happen with uvicorn)

    @staticmethod
    def _lookup(client: Address, server: Address) -> int | None:
        try:
            return peer_uid(client, server)
        except OSError as exc:
            log.warning("cannot tell whose connection %s:%d is (%s); refused", client[0], client[1], exc)
            return None

    def protocol(self, base: type[Any]) -> type[Any]:
        """uvicorn's HTTP protocol class, recording each connection's uid as it is made."""
        gate = self

        class CheckedProtocol(base):
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                gate.connected(self.client, self.server)

            def connection_lost(self, exc: Exception | None) -> None:
                gate.lost(self.client)
                super().connection_lost(exc)

        CheckedProtocol.__name__ = f"Checked{base.__name__}"
        return CheckedProtocol

    def wrap(self, app: Asgi) -> Asgi:
        """``app`` behind the check."""
        if not self.check:
            return app

        async def checked(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] not in ("http", "websocket"):
                await app(scope, receive, send)
                return
            client, server = scope.get("client"), scope.get("server")
            uid = self.uid_of((client[0], client[1]) if client else None, (server[0], server[1]) if server else None)
            if uid == self.owner:
                await app(scope, receive, send)
                return
            who = f"uid {uid}" if uid is not None else "a user the kernel does not name"
            log.warning("refused a request from %s (%s:%s): ctxd proxy serves only uid %d", who,
                        client[0] if client else "?", client[1] if client else "?", self.owner)
            await _refuse(scope, send, f"ctxd proxy serves only its own user (uid {self.owner}); "
                                       f"this connection is from {who}")

        return checked


async def _refuse(scope: Scope, send: Send, message: str) -> None:
    """403 in the error shape of the API the path and headers suggest (as api_of picks the
    upstream); a websocket is closed."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    from ctxd.proxy import apis

    path: str = scope.get("path", "")
    headers = {k.lower() for k, _ in scope.get("headers", [])}
    if path.startswith("/api/"):
        api = "ollama"
    elif path.startswith("/v1/messages") or b"anthropic-version" in headers or b"x-api-key" in headers:
        api = "anthropic"
    elif path.endswith("/responses") or "/responses/" in path:
        api = "responses"
    else:
        api = "openai"
    body = json.dumps(apis.error_body(api, 403, message)).encode()  # type: ignore[arg-type]
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
