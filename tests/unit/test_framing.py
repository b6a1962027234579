"""The frame reader on an in-memory stream: large bodies read into a buffer of their own
size and decoded in pieces, delivered whole and once however they arrive, with the
robustness of small frames (short bodies, bad JSON, resynchronisation) kept."""

from __future__ import annotations

import asyncio
import json
import random
import tracemalloc
from typing import Any

import msgspec
import pytest

from ctxd.server import framing
from ctxd.server.framing import Frame, FrameError, FrameReader, decode_in_pieces

_encode = msgspec.json.Encoder().encode


def frame(payload: Any) -> bytes:
    body = _encode(payload)
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def push(msg_id: int, sizes: list[int]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "session/push",
            "params": {"sessionId": "s", "messages": [{"role": "user", "content": chr(97 + i % 26) * n}
                                                      for i, n in enumerate(sizes)]}}


async def read_all(chunks: list[bytes], *, stall_seconds: float = 5.0, eof: bool = True,
                   max_frame_bytes: int = 1 << 30) -> list[Frame | FrameError]:
    """Feed ``chunks`` one at a time, letting the reader run between them; every event."""
    stream = asyncio.StreamReader(limit=1 << 16)
    reader = FrameReader(stream, max_frame_bytes=max_frame_bytes, stall_seconds=stall_seconds)
    events: list[Frame | FrameError] = []

    async def consume() -> None:
        while (event := await reader.next()) is not None:
            events.append(event)

    task = asyncio.create_task(consume())
    for chunk in chunks:
        stream.feed_data(chunk)
        for _ in range(3):
            await asyncio.sleep(0)
    if eof:
        stream.feed_eof()
        await asyncio.wait_for(task, 30)
    else:
        await asyncio.sleep(stall_seconds * 3)
        task.cancel()
    return events


def pieces(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for size in sizes:
        out.append(data[at:at + size])
        at += size
    out.append(data[at:])
    return [c for c in out if c]


async def test_a_large_body_in_many_chunks_is_delivered_whole_and_once() -> None:
    big = push(1, [700_000, 900_000, 5])
    small = {"jsonrpc": "2.0", "id": 2, "method": "session/get", "params": {"sessionId": "s"}}
    data = frame(big) + frame(small)
    # Odd chunk sizes: the header and the body's first bytes together, the body's end and
    # the next frame's header together, single bytes.
    chunks = pieces(data, [30, 1, 1, 65_537, 123_457, 1_000_000, 7, 500_000])
    assert len(chunks) > 5
    events = await read_all(chunks)
    assert [type(e) for e in events] == [Frame, Frame]
    assert events[0].message == big and events[1].message == small


async def test_a_large_body_is_exactly_its_content_length() -> None:
    big = push(1, [3_000_000])
    data = frame(big) + b"Content-Length: 2\r\n\r\n{}"
    events = await read_all(pieces(data, [100] + [65_536] * 60))
    assert isinstance(events[0], Frame) and events[0].message == big
    assert events[0].size == len(_encode(big))
    assert isinstance(events[1], Frame) and events[1].message == {}


async def test_reading_a_large_frame_holds_its_body_once() -> None:
    """The body is never copied whole: reading and decoding a frame of L bytes holds the
    body (L), what it decodes to (about L) and a few chunks, not a grown buffer and copies
    sliced out of it (3 L and more before it was changed)."""
    content = 8_000_000
    data = frame(push(1, [content]))
    chunks = pieces(data, [65_536] * (len(data) // 65_536))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        events = await read_all(chunks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(events[0], Frame) and len(events[0].message["params"]["messages"][0]["content"]) == content
    assert peak - before < 2.4 * len(data)


async def test_a_large_body_that_stops_short_is_answered_and_the_frame_inside_it_kept() -> None:
    inner = {"jsonrpc": "2.0", "id": 7, "method": "session/get", "params": {"sessionId": "s"}}
    # A Content-Length of 2 MB, but only ~1.2 MB of body, then a whole frame, then nothing.
    data = b"Content-Length: 2000000\r\n\r\n" + b'{"jsonrpc": "2.0", "x": "' + b"y" * 1_200_000 + frame(inner)
    events = await read_all(pieces(data, [65_536] * 30), stall_seconds=0.05, eof=False)
    assert isinstance(events[0], FrameError) and "stopped after" in events[0].reason
    assert isinstance(events[1], Frame) and events[1].message == inner


async def test_a_large_body_that_is_not_json_is_answered_and_the_next_frame_read() -> None:
    after = {"jsonrpc": "2.0", "id": 3, "method": "session/get", "params": {"sessionId": "s"}}
    body = b'{"jsonrpc": "2.0", "params": [' + b'"x",' * 400_000 + b"}"
    data = b"Content-Length: %d\r\n\r\n%b" % (len(body), body) + frame(after)
    events = await read_all([data])
    assert isinstance(events[0], FrameError) and "not valid JSON" in events[0].reason
    assert isinstance(events[1], Frame) and events[1].message == after


async def test_a_large_body_that_is_not_utf8_is_answered() -> None:
    """ctxd's own words say why (not the JSON library's, which change between releases),
    and the next frame is read."""
    after = {"jsonrpc": "2.0", "id": 5, "method": "session/get", "params": {"sessionId": "s"}}
    for size in (100, 1_100_000):
        body = b'{"jsonrpc": "2.0", "params": {"a": "' + b"z" * size + b'\xff"}}'
        events = await read_all([b"Content-Length: %d\r\n\r\n%b" % (len(body), body) + frame(after)])
        assert isinstance(events[0], FrameError) and "not UTF-8" in events[0].reason
        assert isinstance(events[1], Frame) and events[1].message == after


async def test_a_body_that_is_utf8_but_not_json_is_not_called_not_utf8() -> None:
    body = '{"jsonrpc": "2.0", "params": {"a": "é" ]}'.encode()
    (event,) = await read_all([b"Content-Length: %d\r\n\r\n%b" % (len(body), body)])
    assert isinstance(event, FrameError) and "not valid JSON" in event.reason


async def test_a_large_frame_over_the_limit_is_skipped_and_the_next_read() -> None:
    after = {"jsonrpc": "2.0", "id": 4, "method": "session/get", "params": {"sessionId": "s"}}
    data = frame(push(1, [2_000_000])) + frame(after)
    events = await read_all(pieces(data, [65_536] * 40), max_frame_bytes=1_000_000)
    assert isinstance(events[0], FrameError) and "exceeds the limit" in events[0].reason
    assert isinstance(events[1], Frame) and events[1].message == after


DOCUMENTS = [
    b'{"a": [1, 2, {"b": "xyz"}], "c": "hello", "a": [3]}',
    b'  [ {"x": 1}, [[[[1]]]], "s", null, 1.5e3, true ]  ',
    b'"a string"',
    b"123",
    b"{}",
    b"[]",
    b'{"a": {"b": {"c": {"d": [1, 2, 3]}}}}',
    # failures: same exception type as a whole decode
    b'{"a": [1, 2,]}',
    b'{"a": "\xff\xfe"}',
    b"[1] x",
    b'{"a": [1, 2}',
    b"",
    b'[123456789012345678901234567890, -0, 1.0, 2e-3]',
    b'{"a": [1e400]}',
    b'[[[' + b'[' * 2000 + b']' * 2000 + b']]]',
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_decoding_in_pieces_gives_what_a_whole_decode_gives(document: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "PIECE_BYTES", 4)  # split everything that can be split

    def outcome(decode: Any) -> Any:
        try:
            return ("value", decode(bytearray(document)))
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            return ("error", type(exc))

    assert outcome(decode_in_pieces) == outcome(msgspec.json.decode)


def test_a_large_push_is_decoded_one_message_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = framing._json_decode

    def recording(data: Any) -> Any:
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(framing, "_json_decode", recording)
    monkeypatch.setattr(framing, "PIECE_BYTES", 100_000)
    message = push(1, [300_000] * 5)
    body = bytearray(_encode(message))
    assert decode_in_pieces(body) == message
    # Every whole decode got one message, never the body or the list: the outer
    # containers were decoded by a first pass that kept each message as a Raw.
    assert sorted(calls) == sorted(len(_encode(m)) for m in message["params"]["messages"])


def test_nesting_is_split_only_a_few_levels_deep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "PIECE_BYTES", 1)
    calls: list[int] = []
    real = framing._json_decode
    monkeypatch.setattr(framing, "_json_decode", lambda data: calls.append(len(data)) or real(data))
    document = b"[" * 50 + b"1" + b"]" * 50
    assert decode_in_pieces(document) == msgspec.json.decode(document)
    assert calls == [len(document) - 2 * framing.MAX_PIECE_DEPTH]


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth > 4 or kind < 0.45:
        pick = rng.randrange(7)
        if pick == 0:
            return rng.choice([True, False, None])
        if pick == 1:
            return rng.randint(-10**20, 10**20)
        if pick == 2:
            return rng.random() * 10 ** rng.randint(-5, 5)
        # strings with what a scan could trip on: escaped quotes and backslashes, runs of
        # backslashes before a quote, brackets and braces, non-ASCII, control characters
        alphabet = ['"', "\\", "\\\\", '\\"', "[", "]", "{", "}", ",", ":", "é", "\u2028", "\n", "\t",
                    "\x00", "😀", "ctxd-piece:", "a", "b", " "]
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
    if kind < 0.75:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {_random_key(rng): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def _random_key(rng: random.Random) -> str:
    while not isinstance(key := _random_value(rng, 99), str):
        pass
    return key if rng.random() < 0.8 else "k"  # (some repeat: the last one wins)


def _outcome(decode: Any, document: bytes) -> Any:
    try:
        return ("value", decode(bytearray(document)))
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        return ("error", type(exc))


@pytest.mark.parametrize("seed", range(40))
def test_random_documents_decode_in_pieces_as_whole(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random JSON (strings full of quotes, backslashes and brackets, pretty-printed or
    not), whole and damaged (a byte changed, cut short): the pieces give what a whole
    decode gives, value or error type."""
    rng = random.Random(seed)
    monkeypatch.setattr(framing, "PIECE_BYTES", rng.choice([1, 4, 16, 64]))
    monkeypatch.setattr(framing, "ESCAPED_QUOTES_BY_FIND", rng.choice([0, 1, 16]))
    monkeypatch.setattr(framing, "WINDOW_BYTES", rng.choice([1, 2, 3, 7, 1 << 20]))
    value = {"jsonrpc": "2.0", "params": _random_value(rng, 0), "more": [_random_value(rng, 1) for _ in range(3)]}
    document = _encode(value) if seed % 2 else json.dumps(value, indent=rng.choice([None, 1])).encode()
    assert _outcome(decode_in_pieces, document) == ("value", msgspec.json.decode(document))
    for _ in range(20):
        damaged = bytearray(document)
        at = rng.randrange(len(damaged))
        if rng.random() < 0.7:
            damaged[at] = rng.choice(b'"\\[]{},: x0\xff')
        else:
            del damaged[at:]
        assert _outcome(decode_in_pieces, bytes(damaged)) == _outcome(msgspec.json.decode, bytes(damaged))


def test_no_decode_of_a_large_push_sees_more_than_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each decode holds the interpreter lock throughout: the largest any call gets is one
    message (before: a first pass over the whole body, 50-100 ms for 168 MB)."""
    sizes: list[int] = []
    for name in ("_json_decode", "_skeleton_decode"):
        real = getattr(framing, name)
        monkeypatch.setattr(framing, name, lambda data, real=real: sizes.append(len(data)) or real(data))
    monkeypatch.setattr(framing, "PIECE_BYTES", 100_000)
    message = push(1, [300_000] * 5)
    body = bytearray(_encode(message))
    assert decode_in_pieces(body) == message
    assert max(sizes) == max(len(_encode(m)) for m in message["params"]["messages"])
    assert sum(sizes) < len(body) + 1000


def test_a_string_like_a_placeholder_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "PIECE_BYTES", 1)
    document = {"a": ["ctxd-piece:0:0", "ctxd-piece:%s:0" % ("0" * 32), "x" * 10], "b": "ctxd-piece:"}
    assert decode_in_pieces(_encode(document)) == document


def test_the_decode_steps_aside_between_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """``between`` (the daemon's Turns.step_aside) runs between the decodes of the pieces,
    so that a small request of another client does not hand the interpreter lock back and
    forth with a thread decoding 4 MB messages."""
    monkeypatch.setattr(framing, "PIECE_BYTES", 100_000)
    events: list[str] = []
    real = framing._json_decode
    monkeypatch.setattr(framing, "_json_decode", lambda data: events.append("decode") or real(data))
    message = push(1, [300_000] * 4)
    assert decode_in_pieces(bytearray(_encode(message)), lambda: events.append("aside")) == message
    assert events.count("decode") == 4
    for i, event in enumerate(events[:-1]):  # no two decodes back to back
        assert not (event == "decode" and events[i + 1] == "decode"), events


async def test_the_frame_reader_decodes_a_large_body_stepping_aside() -> None:
    calls: list[int] = []
    stream = asyncio.StreamReader(limit=1 << 16)
    reader = FrameReader(stream, max_frame_bytes=1 << 30, step_aside=lambda: calls.append(1))
    big = push(1, [700_000, 900_000])
    stream.feed_data(frame(big))
    stream.feed_eof()
    event = await reader.next()
    assert isinstance(event, Frame) and event.message == big and event.size == len(_encode(big))
    assert len(calls) >= 2


@pytest.mark.parametrize("seed", range(12))
def test_a_long_string_is_decoded_in_parts_as_whole(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A string longer than a piece (a document sent to session/import) is decoded in
    parts cut where no escape, surrogate pair or UTF-8 sequence is split; its end found a
    window at a time when it holds many escaped quotes."""
    rng = random.Random(seed)
    monkeypatch.setattr(framing, "PIECE_BYTES", rng.choice([40, 64, 200]))
    monkeypatch.setattr(framing, "ESCAPED_QUOTES_BY_FIND", rng.choice([0, 2]))
    monkeypatch.setattr(framing, "WINDOW_BYTES", rng.choice([1, 5, 64]))
    sizes: list[int] = []
    real = framing._json_decode
    monkeypatch.setattr(framing, "_json_decode", lambda data: sizes.append(len(data)) or real(data))
    bits = ['{"a": "b"}', '\\', '\\"', '"', "\n", "é", "日本語", "😀", "\\ud83d", "x" * 30, " ", "\t", "\\u0041"]
    text = "".join(rng.choice(bits) for _ in range(2000))
    document = {"jsonrpc": "2.0", "params": {"document": text, "format": "json"}}
    body = _encode(document) if seed % 2 else json.dumps(document).encode()
    assert decode_in_pieces(bytearray(body)) == msgspec.json.decode(body)
    assert max(sizes) <= 8 * framing.PIECE_BYTES < len(_encode(text)) // 4  # (never the string whole)
    for _ in range(10):  # damaged: the same error as a whole decode
        damaged = bytearray(body)
        damaged[rng.randrange(len(damaged))] = rng.choice(b'"\\\x01\xff')
        assert _outcome(decode_in_pieces, bytes(damaged)) == _outcome(msgspec.json.decode, bytes(damaged))


def test_the_end_of_a_long_string_full_of_escaped_quotes_is_found_stepping_aside(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ctxd JSON export sent as ``session/import``'s document is one string with an escaped
    quote every few bytes, and its end is looked for a window at a time: ``between`` runs
    between the windows (before, none ran in the 0.1-0.3 s the 30 MB document's scan took,
    and other clients' pushes fell 200 ms behind on PostgreSQL)."""
    monkeypatch.setattr(framing, "PIECE_BYTES", 1 << 16)
    monkeypatch.setattr(framing, "WINDOW_BYTES", 1 << 12)
    monkeypatch.setattr(framing, "SCAN_STEP_BYTES", 1 << 12)
    text = json.dumps([{"seq": i, "content": f"message {i}"} for i in range(4000)])
    document = {"jsonrpc": "2.0", "id": 1, "method": "session/import", "params": {"document": text, "format": "json"}}
    events: list[str] = []
    real = framing._string_end_by_windows

    def windows(*args: Any, **kwargs: Any) -> int:
        events.append("scan")
        try:
            return real(*args, **kwargs)
        finally:
            events.append("scanned")

    monkeypatch.setattr(framing, "_string_end_by_windows", windows)
    assert decode_in_pieces(bytearray(_encode(document)), lambda: events.append("aside")) == document
    scan = events[events.index("scan"):events.index("scanned")]
    assert scan.count("aside") >= len(_encode(text)) // (1 << 12) - 2, (len(scan), len(_encode(text)))
