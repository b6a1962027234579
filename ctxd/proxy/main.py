"""``ctxd proxy``: serve the OpenAI, Anthropic and Ollama chat APIs on 127.0.0.1, with
ctxd managing each conversation's context (docs/proxy.md).

    ctxd proxy [--port PORT] [--socket PATH] [--data-dir DIR] [--config FILE] [--set k=v] [-v]
               [--no-autostart] [--separate-daemon]

Prints ``ctxd proxy: listening on http://127.0.0.1:PORT`` on stdout once it accepts
connections (with ``--port 0``, the port the system chose).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxd.config import ConfigError, load_config, parse_assignment
from ctxd.proxy import peers, wire

if TYPE_CHECKING:
    from ctxd.proxy.inproc import OpenHere


def _fail(message: str) -> None:
    """A start-up failure, on stderr whatever the log level (the exit code is 2)."""
    sys.stderr.write(f"ctxd proxy: {message}\n")
    sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxd proxy", description="An LLM API proxy on 127.0.0.1 backed by ctxd.")
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (proxy.port; 0: any free port)")
    p.add_argument("--socket", metavar="PATH", help="the ctxd daemon's socket (daemon.socket); started if none answers")
    p.add_argument("--no-autostart", action="store_true", help="fail instead of starting a daemon")
    p.add_argument("--data-dir", metavar="DIR", help="data directory of a daemon the proxy starts (daemon.data_dir)")
    p.add_argument("--separate-daemon", action="store_true",
                   help="when no daemon runs, start one in its own process instead of in the proxy's "
                        "(proxy.in_process = false)")
    p.add_argument("--config", metavar="FILE", help="configuration file (default ~/.config/ctxd/config.toml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="set any configuration key (repeatable), e.g. proxy.anthropic_base_url=...")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info, -vv debug")
    return p


def listening_socket(port: int) -> socket.socket:
    """The proxy's socket on 127.0.0.1, made so that every connection it accepts has
    TCP_NODELAY.

    asyncio turns Nagle's algorithm off on an accepted connection only when the socket
    says ``proto == IPPROTO_TCP``; a socket made as ``socket(AF_INET, SOCK_STREAM)``
    says 0, and so do the connections it accepts. Left on, Nagle holds uvicorn's body
    write behind its header write until the client ACKs, which the client delays
    (~40 ms on Linux): that was the proxy's ~48 ms per request (docs/performance.md).
    The option is also set on the listener, which Linux copies to accepted sockets.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def parking() -> int:
    """How many of another user's surplus connections the proxy may hold (peers.py): the
    descriptor limit is raised to what the system allows this process (as servers do, at
    most 2^20), and ``descriptors.parking_room`` of it goes to them; the rest stays for the
    owner's connections, the upstreams and the daemon in this process."""
    from ctxd.descriptors import parking_room

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        pass
    return parking_room()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency where it builds: not on
    Windows), else asyncio's (None). With uvloop, and uvicorn parsing HTTP with httptools
    (picked by uvicorn when installed, else h11), the proxy spends 10-15% less CPU per
    request (docs/performance.md, docs/decisions.md)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None, *, open_here: OpenHere | None = None) -> int:
    """``ctxd proxy``. ``open_here`` starts a daemon in this process when none answers on
    the socket (``ctxd/embed.py``, given by ``ctxd/__main__.py``); without it, such a
    daemon is started apart, as with ``--separate-daemon``."""
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    try:
        for assignment in args.set:
            section, key, value = parse_assignment(assignment)
            overrides.setdefault(section, {})[key] = value
        if args.port is not None:
            overrides.setdefault("proxy", {})["port"] = args.port
        if args.socket:
            overrides.setdefault("daemon", {})["socket"] = args.socket
        if args.data_dir:
            overrides.setdefault("daemon", {})["data_dir"] = args.data_dir
        if args.separate_daemon:
            overrides.setdefault("proxy", {})["in_process"] = False
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        _fail(f"configuration error: {exc}")
        return 2
    level = "debug" if args.verbose >= 2 else "info" if args.verbose == 1 else config.daemon.log_level
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "uvicorn.access", "pygls"):  # (pygls: a daemon in process)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The daemon client logs whole requests (conversation text) at debug: only at -vvv.
    logging.getLogger("ctxd.client").setLevel(logging.DEBUG if args.verbose >= 3 else logging.WARNING)
    checked = True
    try:
        peers.self_test()
    except peers.PeerCheckUnavailable as exc:
        if not config.proxy.allow_unchecked:
            _fail(f"cannot tell which user a connection comes from ({exc}), so any local user could use "
                  "this proxy and the sessions' histories; refusing to start (proxy.allow_unchecked = true "
                  "serves unchecked: docs/proxy.md)")
            return 2
        logging.getLogger("ctxd.proxy").warning(
            "proxy.allow_unchecked: serving every local user (%s)", exc)
        checked = False
    try:
        sock = listening_socket(config.proxy.port)
    except OSError as exc:
        _fail(f"cannot listen on 127.0.0.1:{config.proxy.port}: {exc.strerror or exc}")
        return 2
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_serve(config, sock, autostart=not args.no_autostart, config_file=args.config,
                                     checked=checked, open_here=open_here))
    except KeyboardInterrupt:
        return 130


async def _serve(config: Any, sock: socket.socket, *, autostart: bool, config_file: str | None,
                 checked: bool, open_here: OpenHere | None) -> int:
    import httpx
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from ctxd.proxy.app import Proxy, build_app
    from ctxd.proxy.screen import Screen
    from ctxd.proxy.sessions import Sessions
    from ctxd.proxy.windows import Windows

    os.umask(0o077)  # a daemon this proxy starts keeps its files private
    try:
        link = await _link(config, autostart=autostart, config_file=config_file, open_here=open_here)
    except _LinkFailed as exc:
        _fail(str(exc))
        return 2
    timeout = httpx.Timeout(config.proxy.upstream_timeout_seconds, connect=config.proxy.connect_timeout_seconds)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
    # Each upstream request is written in one send (wire.py); the transport is used
    # without an httpx.AsyncClient (app.Proxy).
    async with wire.UpstreamTransport(limits=limits) as transport:
        sessions = Sessions(link, reply_floor=config.proxy.reply_floor_tokens)
        proxy = Proxy(config.proxy, sessions, transport, timeout, Windows.from_config(config))
        # Only the user running the proxy is served (peers.py): the proxy accepts its
        # connections itself, each one's uid looked up as it is accepted; another user's
        # get a 403 and never reach uvicorn.
        gate = peers.PeerGate(check=checked, timeout=config.proxy.client_timeout_seconds, park=parking())
        # What a request must be before the proxy acts on it: a loopback Host, no web
        # page's Origin, a JSON body on the chat routes, a path without dot segments, a
        # body within proxy.max_body_bytes (screen.py).
        screen = Screen(gate, config.proxy)
        # No X-Forwarded-* rewriting (clients are local) and no Server/Date headers of its
        # own: the upstream's go back as they came.
        # Each response is written in one send (wire.py).
        protocol = wire.coalescing(gate.protocol(AutoHTTPProtocol))
        server = uvicorn.Server(uvicorn.Config(screen.wrap(build_app(proxy)), http=protocol,
                                               log_level="warning", access_log=False,
                                               lifespan="off", timeout_graceful_shutdown=5, proxy_headers=False,
                                               server_header=False, date_header=False))
        signals = _stop_on_signals(server)
        # A daemon in this process stopped by ``daemon/stop`` (a socket client): the proxy stops too.
        watch = asyncio.ensure_future(_exit_with_daemon(link, server))
        # uvicorn serves no socket of its own (its accepting, libuv's, cannot be held to
        # a batch per turn): the gate accepts and hands the owner's connections to
        # uvicorn's protocol, made as uvicorn makes it.
        serving = asyncio.ensure_future(server.serve(sockets=[]))
        try:
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            if server.started:
                uvicorn_config, state = server.config, server.server_state
                app_state = server.lifespan.state
                gate.listen(sock, lambda: protocol(config=uvicorn_config, server_state=state, app_state=app_state),
                            accepting=lambda: not server.should_exit)
                print(f"ctxd proxy: listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
            await serving
        finally:
            watch.cancel()
            gate.close()
            await sessions.drain()  # replies pushed and not yet answered
            await link.close()  # (in process: the daemon's own stop path)
            for sig in signals:
                asyncio.get_running_loop().remove_signal_handler(sig)
    return 0


class _LinkFailed(Exception):
    """No daemon to use: neither one running, nor one started (the message says why)."""


async def _link(config: Any, *, autostart: bool, config_file: str | None, open_here: OpenHere | None) -> Any:
    """The proxy's link to the daemon: the one running on the socket; else (autostart)
    one in this process (``proxy.in_process``, made by ``open_here``) or one started apart."""
    from ctxd.client import DaemonUnavailable, try_connect_unix
    from ctxd.proxy.sessions import DaemonLink

    socket_path = Path(config.socket_path)
    if autostart and config.proxy.in_process and open_here is not None:
        try:
            probe = await try_connect_unix(socket_path)
        except DaemonUnavailable as exc:
            raise _LinkFailed(str(exc)) from None
        if probe is not None:
            await probe.close()
        else:
            from ctxd.proxy.inproc import NotHere, PortLink

            try:
                return PortLink(await open_here(config))
            except NotHere as exc:
                if exc.socket is None:
                    raise _LinkFailed(str(exc)) from None
                if exc.socket != socket_path:  # the daemon of the data directory: use it, start none
                    socket_path, autostart = exc.socket, False
    apart = DaemonLink(socket_path, connections=config.proxy.daemon_connections, autostart=autostart,
                       data_dir=config.daemon.data_dir or None, config_file=config_file)
    try:
        await apart.start()
    except DaemonUnavailable as exc:
        raise _LinkFailed(str(exc)) from None
    return apart


async def _exit_with_daemon(link: Any, server: Any) -> None:
    wait = getattr(link, "wait_stopped", None)
    if wait is None:
        return
    await wait()
    logging.getLogger("ctxd.proxy").warning("the daemon was asked to stop; stopping the proxy")
    server.should_exit = True


def _stop_on_signals(server: Any) -> list[int]:
    """SIGTERM/SIGINT stop serving and let :func:`_serve` finish its shutdown (reply
    pushes, the daemon's stop path), however many arrive. uvicorn's ``serve`` handles the
    signals while it serves, then puts back the handlers it found and raises the signal
    again for them (its "cooperative signal handling"): without handlers of ours that
    second raise killed the process before the pushes were waited for. These, the event
    loop's, are the ones it finds; they only ask the server to exit."""
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, setattr, server, "should_exit", True)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
    return installed
