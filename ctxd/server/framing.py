"""LSP base-protocol framing (``Content-Length`` headers) that survives bad input.

pygls' own read loop trusts every header: a frame whose body is not JSON is logged
and never answered, a wrong ``Content-Length`` desynchronises the stream for good,
and a huge one is buffered whole. This reader reports each of those as a
:class:`FrameError` (the connection answers it with -32700 and keeps serving) and
finds the next frame:

- a body that does not parse, because its length was too long (it swallowed the
  next frame's header) or too short (its tail is left in the stream), is answered
  once, then the reader skips to the next ``Content-Length:`` header, looking
  inside the bad body first so the swallowed frame is not lost;
- a ``Content-Length`` above the limit is discarded as it streams in, never held
  (before ``initialize`` the connection sets a much lower limit, see
  ``Connection.serve``);
- a ``Content-Length`` too long to be a length at all (more than 18 digits, which no
  frame can have: Python's ``int()`` even refuses more than 4300) is reported at once,
  and the reader skips to the next header as after bytes outside a frame;
- a body that stops arriving for ``stall_seconds`` (a length larger than what the
  client sent, with nothing behind it) is treated as complete, so the client gets
  its error instead of waiting forever.

A large body (a legal push may be 256 MB) must not hold the event loop, which every
other client shares: it is read into one buffer sized from its ``Content-Length``,
chunk by chunk as it arrives, and never copied whole again (growing a buffer and
slicing the body out of it stalled the loop 25-40 ms every ~50 ms, then 355 ms at the
end, for a 168 MB frame). It is decoded in a thread and in pieces: msgspec holds the
interpreter lock for the whole of one decode (a thread alone would still stop the
loop 0.1-0.5 s for 168 MB), so a first pass decodes only its outer containers (the
envelope, ``params``, ``messages``) with their members kept as ``msgspec.Raw``, and
each member (a message) is decoded on its own, letting the loop run in between.
"""

from __future__ import annotations

import asyncio
import mmap
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Awaitable, Callable, Union

import msgspec

_HEADER_RE = re.compile(rb"content-length:[ \t]*(\d+)", re.IGNORECASE)
_OTHER_HEADER_RE = re.compile(rb"[A-Za-z][A-Za-z0-9-]*:[^\r\n]{0,1000}")
_FIND_HEADER = re.compile(rb"Content-Length:", re.IGNORECASE)
MAX_HEADER_LINE = 8192
MAX_LENGTH_DIGITS = 18
"""Longer (leading zeros aside) is an exabyte: not a length any frame has."""
LARGE_BODY = 1 << 20
"""Bodies from this size are read into a buffer of their own and decoded in a thread,
in pieces. (Smaller ones are sliced out of the read buffer and decoded on the loop:
a thread hop costs more than decoding them.)"""
READ_CHUNK = 1 << 20
"""The most a large body's read asks the stream for at once."""
PIECE_BYTES = 1 << 20
"""A container at least this large is split into its members before decoding."""
MAX_PIECE_DEPTH = 3
"""How many levels of containers the first pass decodes (an envelope, its ``params``,
a list in them); their members are then decoded whole, one at a time."""


@dataclass(slots=True)
class Frame:
    body: bytes | mmap.mmap
    message: object


@dataclass(slots=True)
class FrameError:
    reason: str


Event = Union[Frame, FrameError]

_json_decode = msgspec.json.Decoder().decode


def _skeleton_type(levels: int) -> Any:
    """Any JSON value, with the members of containers ``levels`` deep kept as ``Raw``."""
    member: Any = msgspec.Raw if levels <= 1 else _skeleton_type(levels - 1)
    return Union[dict[str, member], list[member], str, int, float, bool, None]


@lru_cache(maxsize=None)
def _skeleton_decoder(levels: int) -> Callable[[Any], Any]:
    return msgspec.json.Decoder(_skeleton_type(levels)).decode


def decode_in_pieces(data: Any) -> object:
    """Decode JSON as ``msgspec.json.decode`` would, but a large body in pieces: one pass
    decodes the containers ``MAX_PIECE_DEPTH`` levels deep (the envelope, its ``params``,
    a list in them), keeping their members as ``Raw``, and each member is then decoded on
    its own. Each decode holds the interpreter lock; between them other threads (the
    event loop, the database writer) get to run. Same value and same failures
    (DecodeError, UnicodeDecodeError, RecursionError); a malformed body's error names a
    byte offset within the piece that holds the fault rather than within the body."""
    if len(data) < PIECE_BYTES:
        return _json_decode(data)
    return _fill_in(_skeleton_decoder(MAX_PIECE_DEPTH)(data))


def _fill_in(value: Any) -> Any:
    if isinstance(value, msgspec.Raw):
        return _json_decode(value)
    if isinstance(value, dict):
        return {key: _fill_in(member) for key, member in value.items()}
    if isinstance(value, list):
        return [_fill_in(member) for member in value]
    return value


class FrameReader:
    """Frames of one stream. ``max_frame_bytes`` may change between frames (the
    connection raises it once ``initialize`` succeeded); ``limit_note`` says which limit
    it is in the error. ``settle_limit``, when given, is awaited before a frame is refused
    as too large, and the limit checked again: a big request sent right behind
    ``initialize`` waits for it to be answered instead of being judged by the limit that
    applied before."""

    def __init__(self, reader: asyncio.StreamReader, *, max_frame_bytes: int, stall_seconds: float = 5.0,
                 settle_limit: Callable[[], Awaitable[None]] | None = None):
        self._reader = reader
        self._buf = bytearray()
        self._eof = False
        self.max_frame_bytes = max_frame_bytes
        self.limit_note = ""
        self.settle_limit = settle_limit
        self.stall_seconds = stall_seconds
        self._resync = False

    async def _read(self, size: int, timeout: float | None = None) -> bytes:
        """Up to ``size`` bytes from the stream; empty at EOF (then remembered) or on a stall."""
        if self._eof:
            return b""
        try:
            if timeout is None:
                chunk = await self._reader.read(size)
            else:
                chunk = await asyncio.wait_for(self._reader.read(size), timeout)
        except asyncio.TimeoutError:
            return b""
        except (ConnectionError, OSError):
            chunk = b""
        if not chunk:
            self._eof = True
        return chunk

    async def _fill(self, timeout: float | None = None) -> bool:
        """Read more bytes into the buffer; False at EOF (or on a stall when timed)."""
        chunk = await self._read(1 << 16, timeout)
        if not chunk:
            return False
        self._buf += chunk
        return True

    async def _line(self) -> bytes | None:
        while True:
            index = self._buf.find(b"\n")
            if index >= 0:
                line = bytes(self._buf[: index + 1])
                del self._buf[: index + 1]
                return line
            if len(self._buf) > MAX_HEADER_LINE:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            if not await self._fill():
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                return None

    async def next(self) -> Event | None:
        """The next frame or framing error; None at end of stream."""
        length: int | None = None
        saw_header = False
        while True:
            line = await self._line()
            if line is None:
                return None
            stripped = line.strip()
            if not stripped:
                if length is not None:
                    break
                if saw_header:
                    saw_header = False
                    if not self._resync:
                        return FrameError("frame headers without a valid Content-Length")
                continue
            match = _HEADER_RE.fullmatch(stripped)
            if match:
                digits = match.group(1).lstrip(b"0") or b"0"
                if len(digits) > MAX_LENGTH_DIGITS:
                    # No body can be that long: do not wait for it, resynchronise.
                    length = None
                    saw_header = False
                    self._resync = True
                    return FrameError(f"Content-Length of {len(digits)} digits is not a usable length; "
                                      f"skipped to the next Content-Length header")
                length = int(digits)
                saw_header = True
                continue
            if saw_header and _OTHER_HEADER_RE.fullmatch(stripped):
                continue  # Content-Type and friends, ignored as LSP allows
            # Bytes that belong to no frame: skip to the next header, report once.
            length = None
            saw_header = False
            found = _FIND_HEADER.search(line, 1)
            if found:
                self._buf[:0] = line[found.start():]
            if not self._resync:
                self._resync = True
                return FrameError("unexpected bytes outside a frame; skipped to the next Content-Length header")
        self._resync = False
        if length > self.max_frame_bytes and self.settle_limit is not None:
            await self.settle_limit()
        if length > self.max_frame_bytes:
            limit, note = self.max_frame_bytes, self.limit_note
            await self._discard(length)
            return FrameError(f"frame of {length} bytes exceeds the limit of {limit}{note}; skipped")
        body = await self._body(length)
        if len(body) < length:
            # The client sent less than it announced. Even when those bytes happen to
            # parse, the frame is malformed: answer it, never run it.
            self._recover_from(body)
            return FrameError(f"frame body stopped after {len(body)} of the {length} bytes in its "
                              f"Content-Length; skipped")
        try:
            if len(body) >= LARGE_BODY:
                message = await asyncio.to_thread(decode_in_pieces, body)
            else:
                message = _json_decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            self._recover_from(body)
            what = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not valid JSON"
            return FrameError(f"frame body is {what} ({exc}); skipped to the next frame")
        except RecursionError:
            return FrameError("frame body nests arrays or objects too deeply to decode; skipped")
        return Frame(body, message)

    async def _body(self, length: int) -> bytes | mmap.mmap:
        """The body, or as much of it as came before the stream ended or stalled."""
        if length >= LARGE_BODY:
            return await self._large_body(length)
        while len(self._buf) < length:
            if not await self._fill(timeout=self.stall_seconds):
                break
        body = bytes(self._buf[:length])
        del self._buf[:length]
        return body

    async def _large_body(self, length: int) -> bytes | mmap.mmap:
        """Read straight into a buffer of the body's size: each chunk is copied once, as
        it arrives, and the body is never copied whole (nor is a growing buffer). The
        buffer is an anonymous mapping, whose pages the kernel supplies as they are first
        written: ``bytearray(length)`` would zero all of it first, on the loop (~300 ms for
        168 MB on a busy machine)."""
        body = mmap.mmap(-1, length)
        got = min(len(self._buf), length)
        with memoryview(body) as view:
            with memoryview(self._buf) as buffered:
                view[:got] = buffered[:got]
            del self._buf[:got]
            while got < length:
                chunk = await self._read(min(length - got, READ_CHUNK), timeout=self.stall_seconds)
                if not chunk:
                    break
                view[got:got + len(chunk)] = chunk
                got += len(chunk)
        if got < length:  # answered as malformed and searched for a header: rare, copied
            short = body[:got]
            body.close()
            return short
        return body

    async def _discard(self, length: int) -> None:
        remaining = length
        while remaining > 0:
            if not self._buf and not await self._fill(timeout=self.stall_seconds):
                return
            take = min(remaining, len(self._buf))
            del self._buf[:take]
            remaining -= take

    def _recover_from(self, body: bytes) -> None:
        """After an unparsable body: put back any frame it swallowed, and skip the rest
        of a short frame's tail silently."""
        found = _FIND_HEADER.search(body, 1)
        if found:
            self._buf[:0] = body[found.start():]
        self._resync = True
