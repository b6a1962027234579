"""``ctxd``: run the daemon.

    ctxd                      serve one client over stdio (how editors and agents spawn it)
    ctxd --socket [PATH]      serve many clients on a Unix socket
    ctxd --tcp PORT           serve many clients on 127.0.0.1:PORT (token required)
    ctxd --remote auto        relay stdio to the shared daemon, starting it if needed
                              (also unix:PATH, tcp:HOST:PORT; see ctxd/remote.py)
    ctxd proxy [--port PORT]  an OpenAI/Anthropic/Ollama API proxy on 127.0.0.1 (docs/proxy.md)
    ctxd mcp                  an MCP server over stdio for agents (docs/mcp.md)

Logs go to stderr (or ``--log-file``), never to stdout: in stdio mode stdout carries
nothing but protocol frames. Every file the daemon creates is private: the process
umask is 077 from the start, before the log file or the database is opened.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import stat
import sys
from typing import Any, TextIO

from ctxd import __version__
from ctxd.config import Config, ConfigError, load_config, parse_assignment
from ctxd.ownership import foreign, owner
from ctxd.tuning import tune_for_daemon


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctxd", usage="%(prog)s [options]\n       %(prog)s proxy [--port PORT] [...]\n       %(prog)s mcp [...]",
        description="The ctxd context daemon.", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
               "  proxy         an OpenAI/Anthropic/Ollama API proxy on 127.0.0.1: every request becomes a\n"
               "                session's prompt (ctxd proxy --help; docs/proxy.md)\n"
               "  mcp           an MCP server over stdio for agents: recall, search, stats\n"
               "                (ctxd mcp --help; docs/mcp.md)\n"
               "\nctxd-cli talks to a running daemon (sessions, prompts, stats, replay, doctor).")
    p.add_argument("--version", action="version", version=f"ctxd {__version__}")
    p.add_argument("--stdio", action="store_true", help="serve stdio (the default when no other transport is given)")
    p.add_argument("--socket", nargs="?", const="", default=None, metavar="PATH",
                   help="serve a Unix socket (default path: see docs/configuration.md)")
    p.add_argument("--tcp", type=_port, default=None, metavar="PORT",
                   help="serve TCP on 127.0.0.1:PORT (0: any free port); clients send the token file's token")
    p.add_argument("--remote", metavar="TARGET",
                   help="serve nothing: relay stdio frames to a daemon (auto: the user's socket, started when none "
                        "runs; unix:PATH; tcp:HOST:PORT)")
    p.add_argument("--config", metavar="FILE", help="configuration file (default ~/.config/ctxd/config.toml)")
    p.add_argument("--data-dir", metavar="DIR", help="where the database lives (daemon.data_dir)")
    p.add_argument("--durability", choices=["normal", "full"], help="storage.durability")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS", help="daemon.idle_exit_seconds")
    p.add_argument("--autostarted", action="store_true",
                   help="started on demand by a client: idle exit after daemon.autostart_idle_exit_seconds")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="set any configuration key (repeatable)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info, -vv debug")
    p.add_argument("--log-file", metavar="FILE", help="log to FILE instead of stderr")
    return p


PRIVATE_UMASK = 0o077
"""The daemon's files (database, -wal, -shm, log, token, lock, socket, exports) are for
its user only, from their first byte, whatever umask it was started with."""


def open_log_file(path: str) -> TextIO:
    """The log file, opened to append: created 0600, never through a symbolic link, and
    only a regular file of this user's. Its lines quote what clients sent (ids, method
    names), so a log in a shared directory must not let another user point it at one of
    ours (a shell's startup file). Raises OSError saying why."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "it is a symbolic link, which is not followed (give the file itself)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or foreign(st):
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"it belongs to {owner(st.st_uid)}"
        raise OSError(errno.EPERM, f"{what}, not a log file of this user's")
    return os.fdopen(fd, "a", encoding="utf-8")


def setup_logging(level: str, verbose: int, log_file: str | None) -> None:
    """Raises OSError when the log file cannot be opened."""
    if verbose >= 2:
        level = "debug"
    elif verbose == 1 and level in ("warning", "error"):
        level = "info"
    handler = logging.StreamHandler(open_log_file(log_file) if log_file else sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)


def config_of(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    """The configuration the flags ``args`` (``build_parser()``'s) say: the file, then
    ``--set`` and the other flags over it. ``environ``: the environment whose ``CTXD_*``
    apply (this process's by default). Raises ConfigError."""
    overrides: dict[str, Any] = {}

    def put(section: str, key: str, value: Any) -> None:
        overrides.setdefault(section, {})[key] = value

    for assignment in args.set:
        put(*parse_assignment(assignment))
    if args.data_dir:
        put("daemon", "data_dir", args.data_dir)
    if args.socket:
        put("daemon", "socket", args.socket)
    if args.durability:
        put("storage", "durability", args.durability)
    if args.idle_exit is not None:
        put("daemon", "idle_exit_seconds", args.idle_exit)
    if args.log_file:
        put("daemon", "log_file", args.log_file)
    config = load_config(args.config, overrides=overrides, environ=environ)
    if args.autostarted and args.idle_exit is None:
        config.daemon.idle_exit_seconds = config.daemon.autostart_idle_exit_seconds
    return config


def main(argv: list[str] | None = None) -> int:
    os.umask(PRIVATE_UMASK)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["proxy"]:  # the LLM API proxy (docs/proxy.md)
        from ctxd.embed import open_here
        from ctxd.proxy.main import main as proxy_main

        return proxy_main(argv[1:], open_here=open_here)
    if argv[:1] == ["mcp"]:
        from ctxd.mcp import main as mcp_main

        return mcp_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        config = config_of(args)
    except ConfigError as exc:
        print(f"ctxd: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        setup_logging(config.daemon.log_level, args.verbose, config.daemon.log_file or None)
    except OSError as exc:
        print(f"ctxd: cannot open the log file {config.daemon.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.remote is not None:
        return _remote(args, config)

    from ctxd.daemon import Daemon, StartupError
    from ctxd.server.transports import TransportError
    from ctxd.store.db import StoreOpenError

    unix = args.socket is not None
    stdio = args.stdio or (not unix and args.tcp is None)
    daemon = Daemon(config, stdio=stdio, unix=unix, tcp_port=args.tcp)
    tune_for_daemon()
    try:
        return asyncio.run(daemon.run())
    except (StoreOpenError, TransportError, StartupError) as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _remote(args: argparse.Namespace, config: Any) -> int:
    """``--remote``: the stdio forwarder (it serves nothing itself, so no transport flag)."""
    from ctxd.remote import TargetError, forward, parse_target

    clash = [flag for flag, given in (("--stdio", args.stdio), ("--socket", args.socket is not None),
                                      ("--tcp", args.tcp is not None)) if given]
    if clash:
        print(f"ctxd: --remote relays to a daemon and cannot be combined with {', '.join(clash)} "
              "(give a socket as --remote unix:PATH, or --set daemon.socket=PATH with --remote auto)",
              file=sys.stderr)
        return 2
    try:
        target = parse_target(args.remote, config)
    except TargetError as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(forward(target, config, config_file=args.config, data_dir=args.data_dir))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
