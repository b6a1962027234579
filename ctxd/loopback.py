"""Who owns each end of a loopback TCP connection: the kernel's answer.

127.0.0.1 is reachable by every local user, so whoever is on the other end of a TCP
connection must be asked of the kernel, which names the owner of every socket:

* a server (``ctxd proxy``, a TCP daemon) asks who owns the *client's* socket, the one
  whose local end is the connection's peer and whose remote end is the server's own
  address (:func:`peer_uid`): the proxy serves only its user, the daemon counts each
  user's unauthenticated connections apart;
* a client (``ctxd-cli --tcp``, ``ctxd --remote tcp:``) asks who owns the *server's* end
  of its connection before it sends the token (:func:`server_uid`): another user who
  took the port first must not receive it.

On Linux the kernel is asked through sock_diag netlink (an exact lookup, as ``ss`` does,
~13 us), else the connection is found in ``/proc/net/tcp`` (and ``/proc/net/tcp6``, for
a v4-mapped IPv6 address; ~8 ms: the kernel writes its whole table). Elsewhere neither
exists and :func:`self_test` says so.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import struct
import threading
from typing import NamedTuple

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Address = tuple[str, int]

ESTABLISHED = 1
SYN_RECV = 3
TIME_WAIT = 6
CLOSE_WAIT = 8
NEW_SYN_RECV = 12
_SERVING = frozenset({ESTABLISHED, CLOSE_WAIT})
"""States of a server's end of a connection it still holds."""


class PeerCheckUnavailable(Exception):
    """The kernel's socket table cannot tell who owns a loopback connection here."""


class Found(NamedTuple):
    """A socket the kernel knows: its owner, its inode (0 for a socket no process holds
    yet, or any more: not yet accepted, TIME_WAIT, orphaned) and its TCP state."""

    uid: int
    inode: int
    state: int


def _hex4(host: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: one 32-bit word in host byte order."""
    return f"{struct.unpack('=I', socket.inet_aton(host))[0]:08X}"


def _hex6(host: str) -> str:
    """An IPv6 address as /proc/net/tcp6 writes it: four 32-bit words in host byte order
    (an IPv4 address as its v4-mapped form, ``::ffff:a.b.c.d``)."""
    if ":" not in host:
        host = "::ffff:" + host
    return "".join(f"{word:08X}" for word in struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, host)))


class _NotFound(OSError):
    """sock_diag knows no socket with those ends."""


SOCK_DIAG_BY_FAMILY = 20
NETLINK_SOCK_DIAG = 4
NLMSG_ERROR = 2
NOCOOKIE = 0xFFFFFFFF


def lookup(local: Address, remote: Address) -> Found | None:
    """The socket whose local end is ``local`` and remote end ``remote``; None when the
    kernel has none. sock_diag first, else /proc/net/tcp. Raises OSError when neither can
    be asked."""
    try:
        return _diag(local, remote)
    except _NotFound:
        return None
    except OSError:
        pass
    return _proc(local, remote)


_local = threading.local()
_seqs = itertools.count(1)


def _netlink() -> socket.socket:
    """This thread's sock_diag socket, kept open: making one per lookup was most of a
    lookup's cost (51 us against 13), which another user's connection flood multiplies."""
    nl = getattr(_local, "nl", None)
    if nl is None:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        nl.settimeout(1)
        _local.nl = nl
    return nl


def _diag(local: Address, remote: Address) -> Found | None:
    """One ``inet_diag_req_v2`` exact lookup (what ``ss`` uses): the reply's
    ``inet_diag_msg`` carries the socket's state, uid and inode."""
    family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET

    def packed(host: str) -> bytes:
        raw = socket.inet_pton(family, host)
        return raw + bytes(16 - len(raw))

    sockid = (struct.pack("!HH", local[1], remote[1]) + packed(local[0]) + packed(remote[0])
              + struct.pack("=III", 0, NOCOOKIE, NOCOOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    seq = next(_seqs) & 0xFFFFFFFF
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, seq, 0)  # NLM_F_REQUEST
    nl = _netlink()
    try:
        nl.sendto(header + request, (0, 0))
        while True:
            data = nl.recv(65536)
            if struct.unpack_from("=I", data, 8)[0] == seq:
                break  # (an answer to an earlier lookup that gave up waiting is skipped)
    except OSError:
        _local.nl = None
        nl.close()
        raise
    _, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        errno = -struct.unpack_from("=i", data, 16)[0]
        if errno == 2:  # ENOENT
            raise _NotFound(errno, "no such socket")
        raise OSError(errno, os.strerror(errno))
    state = data[16 + 1]
    # nlmsghdr (16), family/state/timer/retrans (4), sockid (48), expires/rqueue/wqueue (12)
    uid, inode = struct.unpack_from("=II", data, 16 + 4 + 48 + 12)
    return Found(uid, inode, state)


def _proc(local: Address, remote: Address) -> Found | None:
    """The same from /proc/net/tcp and /proc/net/tcp6 (the latter for a v4-mapped IPv6
    address, read only when the first has no row)."""
    readable = False
    for table, encode in zip(TABLES, (_hex4, _hex6)):
        try:
            needle = f" {encode(local[0])}:{local[1]:04X} {encode(remote[0])}:{remote[1]:04X} "
        except (OSError, ValueError):
            continue  # an IPv6 address has no row in the IPv4 table
        try:
            with open(table, "rb") as f:
                text = f.read().decode("ascii", "replace")
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        readable = True
        found: Found | None = None
        start = text.find(needle)
        while start >= 0:
            line_end = text.find("\n", start)
            # local rem st tx:rx tr:when retrnsmt uid timeout inode
            fields = text[start:line_end if line_end >= 0 else None].split()
            if len(fields) >= 9:
                row = Found(int(fields[6]), int(fields[8]), int(fields[2], 16))
                # A socket held by a process wins over a TIME_WAIT row with the same ends.
                if found is None or (row.inode and not found.inode):
                    found = row
            start = text.find(needle, start + 1)
        if found is not None:
            return found
    if not readable:
        raise FileNotFoundError(f"{TABLES[0]} is not available")
    return None


def peer_uid(client: Address, server: Address) -> int | None:
    """The uid owning the live socket whose local end is ``client`` and remote end
    ``server`` (a connection's client, seen from the server); None when no process holds
    one (the client already closed it: TIME_WAIT or an orphan belongs to nobody). Raises
    OSError when the kernel cannot be asked."""
    found = lookup(client, server)
    return found.uid if found is not None and found.inode else None


async def server_uid(me: Address, server: Address, *, attempts: int = 10) -> int | None:
    """The uid owning the other end of this process's connection from ``me`` to
    ``server``: the server's socket (its local end ``server``, its remote end ``me``).

    A server's end exists as soon as ``connect`` returned, before the server accepts it:
    it then belongs to the uid that made the listening socket, and to the accepting
    process once accepted, both the server's. Only for an instant (the handshake's last
    ACK on its way through the loopback) may it still be a request: that is waited out.
    None when there is no such socket in a state a server holds. Raises OSError when the
    kernel cannot be asked."""
    for attempt in range(attempts):
        found = lookup(server, me)
        if found is not None and found.state in _SERVING:
            return found.uid
        if found is not None and found.state not in (SYN_RECV, NEW_SYN_RECV):
            return None
        await asyncio.sleep(0.005 * (attempt + 1))
    return None


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
