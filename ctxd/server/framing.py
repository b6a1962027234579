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
loop 0.1-0.5 s for 168 MB), so a scan finds the members of its outer containers (the
envelope, ``params``, ``messages``) and each member (a message) is decoded on its own,
letting the loop run in between; and while other clients' requests run, the thread
waits between pieces (:mod:`ctxd.service.turns`). Once decoded, the body's buffer is
released by that thread, not by the loop.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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
    size: int
    """The body's length (its bytes are not kept: a large body's mapping is gone once decoded)."""
    message: object


@dataclass(slots=True)
class FrameError:
    reason: str


Event = Frame | FrameError

_json_decode = msgspec.json.Decoder().decode
_skeleton_decode = msgspec.json.Decoder().decode
"""(The outline's decoder: a name of its own, so tests can tell its call from the pieces'.)"""

_NESTING = re.compile(rb'[\[\]{}"]')
_VALUE_START = re.compile(rb"[ \t\r\n]*")


def _blank_end(data: Any, pos: int) -> int:
    """Where the JSON whitespace at ``pos`` ends (``pos`` when there is none)."""
    match = _VALUE_START.match(data, pos)
    assert match is not None  # (the pattern matches the empty string)
    return match.end()
_SCALAR_END = re.compile(rb"[,\]}: \t\r\n]")
_QUOTE, _BACKSLASH, _COMMA, _COLON = 0x22, 0x5C, 0x2C, 0x3A
_OPENERS, _CLOSERS = (0x7B, 0x5B), (0x7D, 0x5D)
SCAN_STEP_BYTES = 1 << 20
"""The scan lets other requests run (``between``) after about this many bytes."""


class _Unsplittable(Exception):
    """The scan met something it does not expect: the body is decoded whole instead."""


def _is_utf8(body: bytes | mmap.mmap) -> bool:
    """Whether a body that failed to decode is UTF-8 at all: ours to say, since the JSON
    library's wording (and whether it raises UnicodeDecodeError) changes between releases.
    Only a failed frame pays for it."""
    try:
        str(memoryview(body), "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def decode_in_pieces(data: Any, between: Callable[[], Any] | None = None) -> object:
    """Decode JSON as ``msgspec.json.decode`` would, but a large body in pieces, none of
    which holds the interpreter lock for long (each decode holds it throughout; a whole
    168 MB body, or one pass over it, 50-100 ms).

    A scan in Python finds where the members of the outer containers
    (``MAX_PIECE_DEPTH`` levels: an envelope, its ``params``, a list in them) begin and
    end, stepping over strings with ``find`` (a 4 MB string costs well under a
    millisecond); each member is then decoded on its own, and what lies between them
    (the outline: brackets, keys, commas) is decoded with each member replaced by a
    placeholder string no client can know (a random nonce per body). ``between`` (the
    daemon's :meth:`ctxd.service.turns.Turns.step_aside`) is called between pieces.

    Same value and same failures (DecodeError, UnicodeDecodeError, RecursionError) as a
    whole decode: the document is the outline with each placeholder's string replaced
    by a member that decoded on its own, so when they all decode, so would the whole,
    to the same value; when anything fails, or the scan meets what it does not expect,
    the body is decoded whole, which gives the exact error."""
    if len(data) < PIECE_BYTES:
        return _json_decode(data)
    try:
        return _Pieces(data, between).decode()
    except (_Unsplittable, msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError, IndexError):
        return _json_decode(data)


class _Pieces:
    def __init__(self, data: Any, between: Callable[[], Any] | None) -> None:
        self.data = data
        self.n = len(data)
        self.between = between
        self.scanned = 0
        self.nonce = os.urandom(16).hex()
        self.outline: list[bytes] = []
        self.spans: list[tuple[int, int]] = []
        self.at = 0
        """Where the outline's next verbatim stretch starts."""

    def decode(self) -> object:
        data = self.data
        start = _blank_end(data, 0)
        if start >= self.n or data[start] not in _OPENERS:
            raise _Unsplittable  # (a lone huge string or number: nothing to split)
        end = self._container(start, 1)
        self.outline.append(bytes(data[self.at:]))
        values: list[Any] = []
        with memoryview(data) as view:
            for a, b in self.spans:
                self._step(0)
                if data[a] == _QUOTE and b - a >= PIECE_BYTES:
                    values.append(_long_string(data, a, b, self._step))
                    continue
                with view[a:b] as piece:
                    values.append(_json_decode(piece))
        self._step(0)
        del end
        outline = _skeleton_decode(b"".join(self.outline))
        prefix = f"ctxd-piece:{self.nonce}:"
        return _put_back(outline, prefix, values, MAX_PIECE_DEPTH)

    def _step(self, size: int) -> None:
        self.scanned += size
        if self.between is not None and (size == 0 or self.scanned >= SCAN_STEP_BYTES):
            self.scanned = 0
            self.between()

    def _container(self, i: int, depth: int) -> int:
        """Split the container at ``i`` into pieces (its members, or theirs); its end."""
        data = self.data
        closer = 0x7D if data[i] == 0x7B else 0x5D
        j = _blank_end(data, i + 1)
        if j < self.n and data[j] == closer:
            return j + 1
        while True:
            if closer == 0x7D:  # a key, then a colon
                if j >= self.n or data[j] != _QUOTE:
                    raise _Unsplittable
                j = _blank_end(data, _string_end(data, j, self._step))
                if j >= self.n or data[j] != _COLON:
                    raise _Unsplittable
                j = _blank_end(data, j + 1)
            if j >= self.n:
                raise _Unsplittable
            end = _value_end(data, j, self.n, self._step)
            if data[j] in _OPENERS and end - j >= PIECE_BYTES and depth < MAX_PIECE_DEPTH:
                end = self._container(j, depth + 1)
            elif data[j] not in _OPENERS and end - j < PIECE_BYTES // 16:
                pass  # a short string or number: left in the outline
            else:
                self.outline.append(bytes(data[self.at:j]))
                self.outline.append(b'"ctxd-piece:%s:%d"' % (self.nonce.encode(), len(self.spans)))
                self.spans.append((j, end))
                self.at = end
                self._step(end - j)
            j = _blank_end(data, end)
            if j >= self.n:
                raise _Unsplittable
            if data[j] == closer:
                return j + 1
            if data[j] != _COMMA:
                raise _Unsplittable
            j = _blank_end(data, j + 1)


ESCAPED_QUOTES_BY_FIND = 16
"""After this many escaped quotes in one string, its end is looked for a window at a time."""
WINDOW_BYTES = 1 << 20


def _string_end(data: Any, i: int, step: Callable[[int], None] | None = None) -> int:
    """Just past the string whose opening quote is at ``i``. Quote by quote with ``find``
    (a 4 MB message's text costs ~0.2 ms); a string with many escaped quotes (a JSON
    document sent as a string: ``session/import``) a window at a time instead, ``step``
    called with each window's size."""
    j = i + 1
    for _ in range(ESCAPED_QUOTES_BY_FIND):
        j = data.find(b'"', j)
        if j < 0:
            raise _Unsplittable
        k = j
        while data[k - 1] == _BACKSLASH:
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        j += 1
    return _string_end_by_windows(data, j, step)


def _string_end_by_windows(data: Any, j: int, step: Callable[[int], None] | None = None) -> int:
    """Just past the string's closing quote, from ``j``, a place inside the string where no
    escape sequence is cut. In each window, the escaped backslashes and then the escaped
    quotes are overwritten (same length, in C), and the first quote left ends the string;
    a window ending with a lone backslash is cut before it, so no escape is split.
    ``step`` runs after each window: the three passes over it hold the interpreter lock,
    ~3 ms a MB, and a 30 MB document scanned without a break held other clients' pushes
    200 ms on PostgreSQL."""
    n = len(data)
    size = max(2, WINDOW_BYTES)  # (an escape sequence's backslash and what it escapes fit)
    while j < n:
        window = bytes(data[j:j + size]).replace(b"\\\\", b"__").replace(b'\\"', b"__")
        quote = window.find(b'"')
        if quote >= 0:
            return j + quote + 1
        if step is not None:
            step(len(window))
        j += len(window) - 1 if window.endswith(b"\\") and len(window) > 1 else len(window)
    raise _Unsplittable


_STRING_CUT = re.compile(rb"[^\\]{12}(?=[\x00-\x7f])")
"""In a string's text with its escaped backslashes overwritten: a place with no escape
sequence starting in the 12 bytes before it (so none, nor a surrogate pair of two, is
cut) and an ASCII byte after it (so no UTF-8 sequence is)."""
_LOW_SURROGATE = re.compile(rb"\\u[dD][c-fC-F]")


def _string_cut(data: Any, start: int, end: int) -> int | None:
    """Where to cut the string text ``data[start:end]`` (``start`` is not inside an escape
    sequence) between half and all of ``PIECE_BYTES`` from ``start`` (or of twice that,
    and so on, when there is no place there): before the first escape sequence there
    that is not the second half of a surrogate pair, else at the first place
    :data:`_STRING_CUT` finds. None if there is none before ``end``."""
    size = PIECE_BYTES
    while True:
        # (An escaped backslash becomes "_" and a non-ASCII byte: no cut between the two.)
        window = bytes(data[start:min(end, start + size)]).replace(b"\\\\", b"_\x80")
        half = len(window) // 2
        at = window.find(b"\\", half)
        while at >= 0:
            if not _LOW_SURROGATE.match(window, at):
                return start + at
            at = window.find(b"\\", at + 1)
        found = _STRING_CUT.search(window, half)
        if found is not None:
            return start + found.end()
        if start + size >= end:
            return None
        size *= 2


def _long_string(data: Any, a: int, b: int, step: Callable[[int], None]) -> str:
    """The JSON string ``data[a:b]`` (quotes included), decoded ``PIECE_BYTES`` or so at a
    time: a 30 MB document sent to ``session/import`` as a string took one 80 ms decode.
    Each part is a string's text cut where no escape or character is split, so the parts
    joined are the whole's value; a part that does not decode fails the whole body, which
    is then decoded whole (the exact error)."""
    parts: list[str] = []
    start, end = a + 1, b - 1
    while end - start > PIECE_BYTES:
        cut = _string_cut(data, start, end)
        if cut is None or cut <= start:
            break
        parts.append(_json_decode(b'"' + bytes(data[start:cut]) + b'"'))
        step(0)
        start = cut
    parts.append(_json_decode(b'"' + bytes(data[start:end]) + b'"'))
    return parts[0] if len(parts) == 1 else "".join(parts)


def _value_end(data: Any, i: int, n: int, step: Callable[[int], None] | None = None) -> int:
    """Just past the JSON value starting at ``i`` (its brackets balanced, strings skipped;
    whether it is valid is for its decode to say)."""
    first = data[i]
    if first == _QUOTE:
        return _string_end(data, i, step)
    if first not in _OPENERS:
        found = _SCALAR_END.search(data, i, n)
        return n if found is None else found.start()
    depth = 0
    j = i
    while True:
        found = _NESTING.search(data, j, n)
        if found is None:
            raise _Unsplittable
        j = found.start()
        char = data[j]
        if char == _QUOTE:
            j = _string_end(data, j, step)
            continue
        depth += 1 if char in _OPENERS else -1
        j += 1
        if depth == 0:
            return j


def _put_back(value: Any, prefix: str, values: list[Any], levels: int) -> Any:
    """The outline with each placeholder replaced by its piece's value."""
    if isinstance(value, str):
        if value.startswith(prefix):
            return values[int(value[len(prefix):])]
        return value
    if levels <= 0:
        return value
    if isinstance(value, dict):
        return {key: _put_back(member, prefix, values, levels - 1) for key, member in value.items()}
    if isinstance(value, list):
        return [_put_back(member, prefix, values, levels - 1) for member in value]
    return value


class FrameReader:
    """Frames of one stream. ``max_frame_bytes`` may change between frames (the
    connection raises it once ``initialize`` succeeded); ``limit_note`` says which limit
    it is in the error. ``settle_limit``, when given, is awaited before a frame is refused
    as too large, and the limit checked again: a big request sent right behind
    ``initialize`` waits for it to be answered instead of being judged by the limit that
    applied before."""

    def __init__(self, reader: asyncio.StreamReader, *, max_frame_bytes: int, stall_seconds: float = 5.0,
                 settle_limit: Callable[[], Awaitable[None]] | None = None,
                 step_aside: Callable[[], Any] | None = None):
        self._reader = reader
        self.step_aside = step_aside
        """Called between the pieces of a large body's decode (see :func:`decode_in_pieces`)."""
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
        except TimeoutError:
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
                message = await asyncio.to_thread(self._decode_large, body)
            else:
                message = _json_decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            self._recover_from(body)
            what = "not valid JSON" if _is_utf8(body) else "not UTF-8"
            return FrameError(f"frame body is {what} ({exc}); skipped to the next frame")
        except RecursionError:
            return FrameError("frame body nests arrays or objects too deeply to decode; skipped")
        return Frame(length, message)

    def _decode_large(self, body: bytes | mmap.mmap) -> object:
        """(In a thread.) Decoded, the body's mapping goes at once and here: unmapping 168 MB
        takes the thread that does it 10-40 ms, and the event loop would otherwise do it
        when the frame is dropped, up to its connection's next frame."""
        message = decode_in_pieces(body, self.step_aside)
        if isinstance(body, mmap.mmap):
            body.close()
        return message

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

    def _recover_from(self, body: bytes | mmap.mmap) -> None:
        """After an unparsable body: put back any frame it swallowed, and skip the rest
        of a short frame's tail silently."""
        found = _FIND_HEADER.search(body, 1)
        if found:
            self._buf[:0] = body[found.start():]
        self._resync = True
