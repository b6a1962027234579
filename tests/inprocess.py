"""ctxd's daemon run inside the test process: the same ``ctxd.daemon.Daemon`` (transports,
framing, connections, handlers, service, storage) that ``python -m ctxd --socket PATH``
runs, on a thread and event loop of its own, serving a real Unix socket (and TCP when
asked). Tests of what the daemon *does* use it and pay no interpreter start per daemon;
tests of what the *process* does (signals, SIGKILL, exit codes of a failed start, file
modes under the daemon's umask, stdio) start ``python -m ctxd`` instead.

Its log records (those logged from its event loop and the threads it hands work to) are
written to ``log_path`` as the process would write them on stderr, so a test reads them
the same way whichever way the daemon runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ctxd.__main__ import build_parser, config_of

START_TIMEOUT = 30.0

_OWNER: contextvars.ContextVar[InProcessDaemon | None] = contextvars.ContextVar("ctxd_test_daemon", default=None)
_LIVE: set[InProcessDaemon] = set()
_LIVE_LOCK = threading.Lock()


class _Route(logging.Handler):
    """Every record logged on behalf of an in-process daemon, to that daemon's log."""

    def emit(self, record: logging.LogRecord) -> None:
        daemon = _OWNER.get()
        if daemon is not None and record.levelno >= daemon.log_level:
            try:
                daemon.write_log(self.format(record))
            except Exception:  # noqa: BLE001 - logging must never fail the daemon
                self.handleError(record)


_ROUTE = _Route()
_ROUTE.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))


_SAVED_LEVEL: list[int] = []
"""The root logger's level before the first live daemon lowered it."""


def _levels_changed() -> None:
    """The root logger lets through what the most verbose live daemon logs, and only
    while one runs: other tests' logging stays as pytest set it."""
    root = logging.getLogger()
    with _LIVE_LOCK:
        levels = [d.log_level for d in _LIVE]
        if levels:
            if _ROUTE not in root.handlers:
                root.addHandler(_ROUTE)
                _SAVED_LEVEL[:] = [root.level]
            if root.level > min(levels):
                root.setLevel(min(levels))
            # As ``setup_logging`` does: pygls logs whole bodies at INFO, httpx every request.
            logging.getLogger("pygls").setLevel(logging.WARNING)
            logging.getLogger("httpx").setLevel(logging.WARNING)
        elif _ROUTE in root.handlers:
            root.removeHandler(_ROUTE)
            if _SAVED_LEVEL:
                root.setLevel(_SAVED_LEVEL.pop())


def _log_level(level: str, verbose: int) -> int:
    """``ctxd.__main__.setup_logging``'s level for ``daemon.log_level`` and ``-v``."""
    if verbose >= 2:
        level = "debug"
    elif verbose == 1 and level in ("warning", "error"):
        level = "info"
    return logging.getLevelName(level.upper())


class InProcessDaemon:
    """``python -m ctxd ARGV`` (a socket and/or TCP daemon), run in this process.

    ``start()`` returns once every transport listens (AssertionError with the log when the
    daemon could not start, as the process would have exited 2); ``stop()`` is what
    SIGTERM does and returns the exit code; it may be started again afterwards (same
    socket, same data directory). It cannot be SIGKILLed: a test of that needs a process.
    """

    def __init__(self, argv: list[str], *, log_path: Path | None = None,
                 environ: dict[str, str] | None = None) -> None:
        """``environ``: the environment the process would have been started with, which
        its configuration reads (``CTXD_*``, ``CTXD_CONFIG``, ``XDG_CONFIG_HOME``); by
        default this process's without ``CTXD_*``, as ``daemon_env()`` gives a process:
        whatever the developer running the suite set must not reach a test's daemon."""
        self.argv = list(argv)
        self.log_path = log_path
        self.environ = dict(environ) if environ is not None else \
            {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
        self.log_level = logging.WARNING
        self.daemon: Any = None
        self.returncode: int | None = None
        self.pid = os.getpid()
        self._lines: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- the log ------------------------------------------------------------------

    def write_log(self, line: str) -> None:
        self._lines.append(line)
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def log_text(self) -> str:
        return "\n".join(self._lines)

    # --- run ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int | None:
        """The TCP port it listens on (``--tcp 0`` picks one)."""
        bound = self.daemon.bound.get("tcp") if self.daemon is not None else None
        return int(bound.rsplit(":", 1)[1]) if bound else None

    def start(self, timeout: float = START_TIMEOUT, *, check: bool = True) -> InProcessDaemon:
        """Start serving; ``check=False``: a daemon that could not start is not an error
        here (its ``returncode`` and log say why, as a process's exit code and stderr do)."""
        assert not self.running, "already running"
        args = build_parser().parse_args(self.argv)
        if args.remote is not None or args.stdio or (args.socket is None and args.tcp is None):
            raise ValueError(f"an in-process daemon serves a socket or TCP, not {self.argv}")
        if args.config is None and not self.environ.get("CTXD_CONFIG"):
            args.config = self._default_config_file()
        config = config_of(args, self.environ)
        self.log_level = _log_level(config.daemon.log_level, args.verbose)
        self.returncode = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(config, args, ready), daemon=True,
                                        name=f"ctxd-daemon:{args.socket or args.tcp}")
        with _LIVE_LOCK:
            _LIVE.add(self)
        _levels_changed()
        self._thread.start()
        if not ready.wait(timeout):
            self.stop()
            raise AssertionError(f"ctxd did not listen within {timeout:.0f} s:\n{self.log_text()}")
        if self.returncode is not None:
            self._thread.join(timeout)
            if not check:
                return self
            raise AssertionError(f"ctxd exited with {self.returncode} before it was ready:\n{self.log_text()}")
        return self

    def _default_config_file(self) -> str:
        """The configuration file the process would read by default: its environment's
        ``$XDG_CONFIG_HOME/ctxd/config.toml`` (platformdirs' rule on Linux, where these
        tests run), not this process's; none there reads as an empty one."""
        base = self.environ.get("XDG_CONFIG_HOME") or os.path.join(self.environ.get("HOME", "~"), ".config")
        path = Path(base).expanduser() / "ctxd" / "config.toml"
        return str(path) if path.exists() else os.devnull

    def _run(self, config: Any, args: Any, ready: threading.Event) -> None:
        _OWNER.set(self)
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self.returncode = loop.run_until_complete(self._serve(config, args, ready))
        except BaseException as exc:  # noqa: BLE001 - reported as the process would
            from ctxd.daemon import StartupError
            from ctxd.server.transports import TransportError
            from ctxd.store.db import StoreOpenError

            if isinstance(exc, (StoreOpenError, TransportError, StartupError)):
                self.write_log(f"ctxd: {exc}")
                self.returncode = 2
            else:
                self.write_log("".join(traceback.format_exception(exc)))
                self.returncode = 1
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                self._loop = None
                with _LIVE_LOCK:
                    _LIVE.discard(self)
                _levels_changed()
                ready.set()

    async def _serve(self, config: Any, args: Any, ready: threading.Event) -> int:
        from ctxd.daemon import Daemon

        self.daemon = Daemon(config, unix=args.socket is not None, tcp_port=args.tcp)
        wanted = {kind for kind, on in (("unix", args.socket is not None), ("tcp", args.tcp is not None)) if on}
        run = asyncio.ensure_future(self.daemon.run())
        while not run.done() and not wanted <= set(self.daemon.bound):
            await asyncio.sleep(0.002)
        if not run.done():
            ready.set()
        return await run

    def stop(self, timeout: float = START_TIMEOUT) -> int | None:
        """What SIGTERM does: stop serving, close every connection and the database."""
        loop, thread = self._loop, self._thread
        if thread is None:
            return self.returncode
        if loop is not None and self.daemon is not None:
            try:
                loop.call_soon_threadsafe(self.daemon.stop)
            except RuntimeError:  # its loop closed meanwhile
                pass
        deadline = time.monotonic() + timeout
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise AssertionError(f"the in-process ctxd did not stop within {timeout:.0f} s:\n{self.log_text()}")
        return self.returncode

    def kill(self) -> None:
        raise TypeError("an in-process daemon cannot be SIGKILLed: start this test's daemon as a process")
