"""The minimal client every spine benchmark drives its servers with.

A child process speaking LSP base-protocol frames (``Content-Length``) on its stdin
and stdout, and a blocking, single-threaded request/response loop over the raw pipe
file descriptors. It is deliberately not ``ctxd.client``: both ctxd and the bare
pygls echo server are driven by exactly this code, so whatever the client costs is
the same on both sides of every ratio.

Timed paths never decode JSON: :meth:`FramedProcess.call` returns the response body
as bytes once the whole frame has arrived; callers decode afterwards, outside the
clock. Request frames can be encoded ahead of time (:func:`frame`) so the timed
loop is "write bytes, read bytes".
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from typing import IO, Any, Self

import msgspec

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_READ = 1 << 20


class ServerError(Exception):
    """The server answered with a JSON-RPC error, or went away."""


def frame(msg_id: int, method: str, params: Any = None) -> bytes:
    """One request as a complete frame (header and body)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    body = _encode(message)
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def notification(method: str, params: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    body = _encode(message)
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def result_of(body: bytes) -> Any:
    """Decode a response body; raise ServerError on a JSON-RPC error."""
    message = _decode(body)
    if "error" in message:
        err = message["error"]
        raise ServerError(f"{err.get('message')} ({err.get('code')})")
    return message.get("result")


class FramedProcess:
    """A server child process and a blocking frame reader/writer on its pipes."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: str | None = None, stderr_path: str | None = None) -> None:
        self.argv = list(argv)
        self._stderr: IO[bytes] | None = open(stderr_path, "ab") if stderr_path else None  # noqa: SIM115
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr or subprocess.DEVNULL, env=env, cwd=cwd, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._wfd = self.proc.stdin.fileno()
        self._rfd = self.proc.stdout.fileno()
        self._buf = bytearray()
        self._next_id = 1

    @property
    def pid(self) -> int:
        return self.proc.pid

    def next_id(self) -> int:
        msg_id = self._next_id
        self._next_id += 1
        return msg_id

    # --- raw I/O ---------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._wfd, view)
            view = view[written:]

    def read_frame(self) -> bytes:
        """The next frame's body (blocking)."""
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            self._fill()
        length = -1
        for line in bytes(buf[:end]).split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise ServerError(f"frame without Content-Length: {bytes(buf[:end])!r}")
        start = end + 4
        while len(buf) < start + length:
            self._fill()
        with memoryview(buf) as view:  # one copy of the body, not two (a slice, then bytes)
            body = bytes(view[start:start + length])
        del buf[:start + length]
        return body

    def _fill(self) -> None:
        chunk = os.read(self._rfd, _READ)
        if not chunk:
            raise ServerError(f"{self.argv[1:3]} closed its stdout (exit code {self.proc.poll()})")
        self._buf += chunk

    # --- requests --------------------------------------------------------------------

    def call(self, request_frame: bytes) -> bytes:
        """Send one pre-encoded request and return the next frame's body, undecoded.

        The benchmarks subscribe to nothing and send one request at a time, so the
        next frame is that request's response; :meth:`request` checks the id."""
        self.write(request_frame)
        return self.read_frame()

    def request(self, method: str, params: Any = None) -> Any:
        """Encode, send, wait, decode: for setup, not for timed loops."""
        msg_id = self.next_id()
        body = self.call(frame(msg_id, method, params))
        got = _decode(body).get("id")
        if got != msg_id:
            raise ServerError(f"expected the response to request {msg_id}, got {body[:200]!r}")
        return result_of(body)

    def notify(self, method: str, params: Any = None) -> None:
        self.write(notification(method, params))

    # --- teardown --------------------------------------------------------------------

    def close(self, *, graceful: bool = True, timeout: float = 10.0) -> int | None:
        """Close stdin (after shutdown/exit when ``graceful``) and reap the child."""
        if self.proc.poll() is None and graceful:
            try:
                self.request("shutdown")
                self.notify("exit")
            except (ServerError, OSError):
                pass
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        try:
            self.proc.stdout.close()  # type: ignore[union-attr]
        except OSError:
            pass
        if self._stderr is not None:
            self._stderr.close()
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(graceful=exc[0] is None)
