"""Where a connection's frames go, bounded: a client that stops reading its output is
closed rather than let the daemon's memory grow (``MAX_PENDING_OUTPUT``).

Its own module because the stdio forwarder (``ctxd --remote``) writes its frames
through it too, and must start without the daemon's imports."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

# Past this much unsent output the client is not reading; drop it rather than grow forever.
MAX_PENDING_OUTPUT = 64 * 1024 * 1024
# How long a closed connection's unsent output may take to go out before it is dropped.
CLOSE_GRACE_SECONDS = 10.0
# The kernel's send buffer asked for on a trusted Unix socket: a ~200k-token prompt is
# ~1 MB of JSON, more than the default (~200 kB), which the kernel caps at net.core.wmem_max.
UNIX_SEND_BUFFER = 4 * 1024 * 1024


class Writer:
    """Where a connection's frames go: a StreamWriter, or a plain binary file (stdio fallback)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed = False
        self.max_pending = MAX_PENDING_OUTPUT
        self.overflow_log_level = logging.WARNING

    def write(self, data: bytes | bytearray) -> bool:
        if self.closed:
            return False
        stream = self._stream
        try:
            if isinstance(stream, asyncio.StreamWriter):
                if stream.is_closing():
                    self.closed = True
                    return False
                stream.write(data)
                if stream.transport.get_write_buffer_size() > self.max_pending:
                    log.log(self.overflow_log_level, "client is not reading its output; closing the connection")
                    self.close(abort=True)  # its output is dropped now, not when it reads
                    return False
            else:
                stream.write(data)
                stream.flush()
        except (ConnectionError, OSError, RuntimeError):
            self.closed = True
            return False
        return True

    def extra(self, name: str) -> Any:
        """The transport's ``get_extra_info(name)`` (None for a plain file)."""
        stream = self._stream
        return stream.get_extra_info(name) if isinstance(stream, asyncio.StreamWriter) else None

    def widen_send_buffer(self) -> None:
        """On a Unix socket, ask the kernel for a send buffer that holds a large answer
        whole: a 1 MB prompt then leaves in one ``send`` instead of a few rounds of
        partial sends, copies of the rest and waits for the client to read (docs/
        performance.md, spine 3). For a client that passed ``initialize`` only: one that
        has not must not make the kernel hold megabytes for it. TCP keeps its autotuning."""
        sock = self.extra("socket")
        if sock is None or sock.family != socket.AF_UNIX:
            return
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < UNIX_SEND_BUFFER:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
        except OSError as exc:  # (a limit of the system's: the default buffer still works)
            log.debug("cannot widen the send buffer: %s", exc)

    async def drain(self) -> None:
        """Wait until what was written has gone out (or the other side is gone)."""
        if self.closed or not isinstance(self._stream, asyncio.StreamWriter):
            return
        try:
            await self._stream.drain()
        except (ConnectionError, OSError, RuntimeError):
            self.closed = True

    def close(self, *, abort: bool = False) -> None:
        """Close after what is still unsent has gone out, within ``CLOSE_GRACE_SECONDS``
        (a client that never reads cannot keep its connection open); ``abort``: at once,
        dropping it."""
        if self.closed:
            return
        self.closed = True
        stream = self._stream
        try:
            if not isinstance(stream, asyncio.StreamWriter):
                stream.close()
                return
            transport = stream.transport
            if abort:
                transport.abort()
                return
            stream.close()
            if transport.get_write_buffer_size():
                asyncio.get_running_loop().call_later(CLOSE_GRACE_SECONDS, transport.abort)
        except (ConnectionError, OSError, RuntimeError):
            pass
