"""How many descriptors a listener may spend holding another user's surplus connections:
the TCP daemon's (``server/transports.py``) and ``ctxd proxy``'s (``proxy/peers.py``),
which share the rule and import nothing of each other."""

from __future__ import annotations

import resource


def parking_room() -> int:
    """How many refused connections a listener may hold (``server.transports.TcpServer``, ``proxy.peers.PeerGate``): a
    quarter of the descriptors this process may open beyond the first 1,024, at most
    16,384 (none under the common limit of 1,024)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, min((soft - 1024) // 4, 16384))
