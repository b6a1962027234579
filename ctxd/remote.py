"""``ctxd --remote TARGET``: the stdio forwarder, one way in for every editor.

Editors are good at spawning a stdio JSON-RPC server; ctxd's useful daemon is the
shared one on the user's socket (the one ``ctxd-cli`` talks to). The forwarder joins
the two, like ``gopls -remote=auto``: it speaks LSP base-protocol frames on its stdin and
stdout and relays every frame, both ways, to the daemon, so the editor sees the
sessions an agent in a terminal pushes, and notifications (``session/updated``, ...)
flow back.

    ctxd --remote auto              the user's socket (daemon.socket); the daemon is
                                    started (detached) when none answers, as ctxd-cli does
    ctxd --remote unix:PATH         a daemon already listening on PATH
    ctxd --remote tcp:HOST:PORT     a daemon started with --tcp; the token of
                                    daemon.token_file is put into ``initialize`` when the
                                    editor sends none

It is a relay of bytes: frames are checked (headers, length, size) and passed on whole,
never decoded, except two small looks: the first frame over TCP (to add the token) and
a frame short enough to be ``exit`` (so the daemon closing the connection after it is
not reported as a failure). The daemon does everything else (lifecycle, errors).

Exits: when the editor closes stdin, the daemon is told by a half-close (requests
already sent still get their answers), the forwarder relays those and exits 0; the
daemon keeps running. When the daemon goes away first, the forwarder says so on stderr
and exits 1. When it cannot reach (or start) a daemon, one line on stderr and exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ctxd.client import DaemonUnavailable, check_peer, check_server, daemon_log_path, start_daemon
from ctxd.config import Config
from ctxd.ownership import PrivateFileError, read_private_file
from ctxd.server.transports import open_stdio
from ctxd.server.writer import Writer

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_DAEMON_GONE = 1
EXIT_UNAVAILABLE = 2

_LENGTH_RE = re.compile(rb"content-length:[ \t]*(\d{1,18})[ \t]*", re.IGNORECASE)
_HEADER_RE = re.compile(rb"[A-Za-z][A-Za-z0-9-]*:[^\r\n]*")
MAX_HEADER_BYTES = 8192
"""Longer header lines are not LSP framing (a stray line of output, binary garbage)."""
_EXIT_PROBE = 200
"""Frames at most this long are looked at for ``exit``; no ``exit`` frame is longer."""
_STREAM_LIMIT = 1 << 20


def _tell(message: str) -> None:
    """One line for the editor's log: stderr only (stdout carries the editor's frames),
    whatever the log level, which is what an editor shows when its server fails."""
    sys.stderr.write(f"ctxd --remote: {message}\n")
    sys.stderr.flush()


class FramingError(Exception):
    """What came in is not LSP base-protocol framing; the message says where and how."""


class TargetError(ValueError):
    """``--remote`` was given something that is not a target."""


@dataclass(frozen=True)
class Target:
    """Where the daemon is: ``kind`` is ``auto``, ``unix`` or ``tcp``."""

    kind: str
    path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0

    def describe(self) -> str:
        return f"{self.host}:{self.port}" if self.kind == "tcp" else str(self.path)


def parse_target(text: str, config: Config) -> Target:
    """``auto``, ``unix:PATH`` or ``tcp:HOST:PORT`` (``tcp:PORT`` means 127.0.0.1)."""
    if text == "auto":
        return Target("auto", path=config.socket_path)
    kind, sep, rest = text.partition(":")
    if sep and kind == "unix" and rest:
        return Target("unix", path=Path(rest).expanduser())
    if sep and kind == "tcp" and rest:
        host, _, port_text = rest.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise TargetError(f"--remote {text}: {port_text!r} is not a port number (1-65535)")
        return Target("tcp", host=host, port=int(port_text))
    raise TargetError(f"--remote {text!r}: expected auto, unix:PATH or tcp:HOST:PORT")


async def read_frame(reader: asyncio.StreamReader, max_bytes: int, where: str) -> bytes | None:
    """The next frame's body from ``reader``, its framing checked; None at a clean end
    (between frames). Raises FramingError for anything that is not a frame."""
    length: int | None = None
    first = True
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError as exc:
            if first and not exc.partial:
                return None
            raise FramingError(f"{where} ended inside a frame's header") from None
        except asyncio.LimitOverrunError:
            raise FramingError(f"{where} sent a header line longer than {_STREAM_LIMIT} bytes: not a frame") from None
        first = False
        if line == b"\r\n":
            if length is None:
                raise FramingError(f"{where} sent a frame without a Content-Length header")
            break
        header = line[:-2]
        if len(header) > MAX_HEADER_BYTES or not _HEADER_RE.fullmatch(header):
            raise FramingError(f"{where} sent {header[:80]!r} where a frame header was expected")
        match = _LENGTH_RE.fullmatch(header)
        if match:
            length = int(match.group(1))
        elif header[:15].lower() == b"content-length:":
            raise FramingError(f"{where} sent a bad Content-Length: {header[:80]!r}")
    if length > max_bytes:
        raise FramingError(f"{where} sent a frame of {length:,} bytes; the limit is {max_bytes:,} "
                           "(limits.max_frame_bytes)")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FramingError(f"{where} ended inside a frame ({len(exc.partial):,} of {length:,} bytes)") from None


def _header(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body)


def _is_exit(body: bytes) -> bool:
    """Whether a (short) frame is the ``exit`` notification."""
    if len(body) > _EXIT_PROBE or b'"exit"' not in body:
        return False
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(message, dict) and message.get("method") == "exit"


def with_token(body: bytes, token: str) -> bytes:
    """An ``initialize`` request with ``initializationOptions.token`` set when it has
    none (a TCP daemon refuses a client without its token); any other frame unchanged."""
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body  # the daemon answers it with -32700
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return body
    params = message.get("params")
    if not isinstance(params, dict):
        return body
    options = params.get("initializationOptions")
    if options is None:
        options = params["initializationOptions"] = {}
    if not isinstance(options, dict) or options.get("token"):
        return body
    options["token"] = token
    return msgspec.json.encode(message)


async def open_daemon(target: Target, config: Config, *, config_file: str | None = None,
                      data_dir: str | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to the daemon (not initialized: the editor does that). ``auto``
    starts the daemon with ctxd-cli's own autostart when none answers on the socket."""
    if target.kind == "tcp":
        try:
            reader, writer = await asyncio.open_connection(target.host, target.port, limit=_STREAM_LIMIT)
        except OSError as exc:
            raise DaemonUnavailable(f"no ctxd daemon answers on {target.describe()} ({exc.strerror or exc}); "
                                    f"start one with: ctxd --tcp {target.port}") from None
        # Nothing (the editor's initialize, the token) goes to a server of another user's.
        await check_server(writer, target.describe(), unchecked=config.daemon.tcp_allow_unchecked)
        return reader, writer
    assert target.path is not None
    try:
        return _checked(await asyncio.open_unix_connection(str(target.path), limit=_STREAM_LIMIT), target.path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        if target.kind != "auto":
            raise DaemonUnavailable(f"no ctxd daemon is running on {target.path} ({exc.strerror}); start one "
                                    f"with: ctxd --socket {target.path} (or use --remote auto)") from None
    except OSError as exc:
        raise DaemonUnavailable(f"cannot connect to {target.path}: {exc.strerror or exc}") from None
    probe = await start_daemon(target.path, data_dir=data_dir, config_file=config_file,
                               log_file=config.daemon.log_file or None)
    if probe.started_daemon is not None:
        log.info("started ctxd (pid %d) on %s; it logs to %s", probe.started_daemon, target.path, probe.daemon_log)
    await probe.close(shutdown=False)
    try:
        return _checked(await asyncio.open_unix_connection(str(target.path), limit=_STREAM_LIMIT), target.path)
    except OSError as exc:
        raise DaemonUnavailable(f"ctxd started on {target.path} but does not answer: {exc.strerror or exc}") from None


def _checked(pair: tuple[asyncio.StreamReader, asyncio.StreamWriter],
             path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The connection, once its daemon is known to be this user's (``check_peer``)."""
    check_peer(pair[1], path)
    return pair


def _read_token(config: Config) -> str | None:
    path = config.token_path
    try:
        return read_private_file(path, "TCP token file") or None
    except FileNotFoundError as exc:
        log.warning("no TCP token from %s (%s): initialize goes to the daemon as the editor sent it",
                    path, exc.strerror or exc)
    except PrivateFileError as exc:
        log.warning("no TCP token: %s; initialize goes to the daemon as the editor sent it", exc)
    return None


class Relay:
    """The two pumps between the editor (stdio) and the daemon (socket)."""

    def __init__(self, target: Target, config: Config, daemon_reader: asyncio.StreamReader,
                 daemon_writer: asyncio.StreamWriter, token: str | None) -> None:
        self.target = target
        self.config = config
        self.daemon_reader = daemon_reader
        self.daemon_writer = daemon_writer
        self.token = token
        self.max_bytes = config.limits.max_frame_bytes
        self.editor_done = False
        """The editor closed stdin (or sent ``exit``): the daemon closing is expected."""
        self.error: str | None = None

    async def run(self) -> int:
        stdin, stdout = await open_stdio()
        up = asyncio.create_task(self._editor_to_daemon(stdin))
        down = asyncio.create_task(self._daemon_to_editor(stdout))
        await down  # the daemon closed the connection, or the editor stopped reading
        up.cancel()
        try:
            await up
        except asyncio.CancelledError:
            pass
        await stdout.drain()
        stdout.close()
        self.daemon_writer.close()
        if self.error is not None:
            _tell(str(self.error))
            return EXIT_DAEMON_GONE
        return EXIT_OK

    async def _editor_to_daemon(self, stdin: asyncio.StreamReader) -> None:
        first = True
        writer = self.daemon_writer
        try:
            while True:
                try:
                    body = await read_frame(stdin, self.max_bytes, "the editor (stdin)")
                except FramingError as exc:
                    # The stream cannot be trusted past this point: say so and stop.
                    self.error = str(exc)
                    self._abort_daemon()
                    return
                if body is None:
                    break
                if first and self.token is not None:
                    body = with_token(body, self.token)
                first = False
                if _is_exit(body):
                    self.editor_done = True
                writer.write(_header(body) + body)
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except (ConnectionError, OSError):
            return  # the daemon side broke: _daemon_to_editor reports it
        self.editor_done = True
        # A half-close: the daemon answers what it already received, then closes.
        try:
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()
        except (ConnectionError, OSError):
            pass

    def _abort_daemon(self) -> None:
        try:
            self.daemon_writer.transport.abort()
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def _daemon_to_editor(self, stdout: Writer) -> None:
        where = f"the daemon on {self.target.describe()}"
        write = stdout.write
        while True:
            try:
                body = await read_frame(self.daemon_reader, self.max_bytes, where)
            except FramingError as exc:
                if self.error is None:
                    self.error = str(exc) if not self.editor_done else None
                return
            except (ConnectionError, OSError) as exc:
                self._gone(f": {exc.strerror or exc}")
                return
            if body is None:
                self._gone("")
                return
            if not write(_header(body) + body):
                return  # the editor is gone: nobody to tell
            await stdout.drain()

    def _gone(self, detail: str) -> None:
        """The daemon ended the connection: a failure unless the editor was leaving."""
        if self.error is None and not self.editor_done:
            self.error = (f"the daemon on {self.target.describe()} closed the connection (it stopped or crashed"
                          f"{detail}){self._log_hint()}; restart the editor's ctxd client to reconnect")

    def _log_hint(self) -> str:
        if self.target.kind == "tcp" or self.target.path is None:
            return ""
        return f" (its log: {daemon_log_path(self.target.path, self.config.daemon.log_file or None)})"


async def forward(target: Target, config: Config, *, config_file: str | None = None,
                  data_dir: str | None = None) -> int:
    """Connect (starting the daemon for ``auto``) and relay until either side ends."""
    try:
        reader, writer = await open_daemon(target, config, config_file=config_file, data_dir=data_dir)
    except DaemonUnavailable as exc:
        _tell(str(exc))
        return EXIT_UNAVAILABLE
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    token = _read_token(config) if target.kind == "tcp" else None
    log.info("forwarding stdio to %s", target.describe())
    return await Relay(target, config, reader, writer, token).run()
