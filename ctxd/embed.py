"""The daemon inside another process's event loop: ``ctxd proxy`` with
``proxy.in_process`` (docs/proxy.md). The proxy gets :func:`open_here` from its entry
point (``ctxd/__main__.py``) and sees only what ``ctxd.proxy.inproc`` asks: the service
port (``service/local.py``: the daemon's own service, called directly) and the daemon's
lifetime. The daemon's modules are imported only when one is started here."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxd.config import Config
from ctxd.proxy.inproc import NotHere

if TYPE_CHECKING:
    from ctxd.daemon import Daemon
    from ctxd.service.local import LocalPort

log = logging.getLogger("ctxd.proxy")


class EmbeddedDaemon:
    """A started daemon (its socket serves other clients as usual) and the port its
    service serves this process."""

    def __init__(self, daemon: Daemon, port: LocalPort) -> None:
        self.daemon = daemon
        self._port = port

    @property
    def port(self) -> LocalPort:
        return self._port

    def watch(self, watcher: Callable[[str, Any], None]) -> Callable[[], None] | None:
        service = self.daemon.service
        if service is None or service.db.shared:
            return None  # (other daemons' changes come later, through the store, or not at all)
        return self.daemon.hub.watch(watcher)

    async def wait_stopped(self) -> None:
        await self.daemon.stopped()

    async def close(self) -> None:
        """As on SIGTERM: no new requests, the port's in flight finished (writes begun
        commit, requests not begun are withdrawn), the connections closed, storage closed."""
        self.daemon.stop()
        await self._port.drain()
        await self.daemon.close()


async def open_here(config: Config) -> EmbeddedDaemon:
    """Start the daemon in this process (its socket and storage), or raise
    :class:`~ctxd.proxy.inproc.NotHere`: naming the socket of the daemon to use instead
    when this socket was taken meanwhile (one daemon per socket) or the data directory is
    a daemon's on another socket (one daemon per SQLite file)."""
    from ctxd.daemon import Daemon, StartupError
    from ctxd.server.transports import TransportError
    from ctxd.service.local import LocalPort
    from ctxd.store.db import StoreOpenError
    from ctxd.store.lock import holder_socket
    from ctxd.tuning import tune_for_daemon

    daemon = Daemon(config, unix=True)
    try:
        await daemon.start()
    except TransportError as exc:  # another daemon took the socket meanwhile: use it
        log.info("not serving the daemon in process (%s); connecting to the socket's", exc)
        raise NotHere(str(exc), Path(config.socket_path)) from None
    except StoreOpenError as exc:
        # The data directory is a daemon's on another socket (``--socket``, another
        # XDG_RUNTIME_DIR): that daemon serves this process instead.
        other = holder_socket(Path(config.database_path))
        if other is None:
            raise NotHere(f"cannot start the ctxd daemon: {exc}") from None
        # (a normal start, as when a daemon answers on the proxy's own socket: INFO)
        log.info("the data directory is used by the ctxd daemon on %s; the proxy uses it", other)
        raise NotHere(str(exc), other) from None
    except StartupError as exc:
        raise NotHere(f"cannot start the ctxd daemon: {exc}") from None
    log.info("ctxd daemon %d in this process, serving %s", os.getpid(), config.socket_path)
    tune_for_daemon()  # (the daemon's, in this process)
    return EmbeddedDaemon(daemon, LocalPort(daemon.service))
