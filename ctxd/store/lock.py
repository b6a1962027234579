"""One daemon per SQLite database: the lock a daemon takes before it opens the file.

The SQLite backend keeps each session's state in the daemon's memory and takes it as the
truth (``Database.shared`` is False: nothing is re-read from the file), so a second
daemon writing the same file leaves both with stale counts and sequence numbers (two
``ctxd --socket`` paths, or a default socket path that changed with
``XDG_RUNTIME_DIR``, over one data directory). Every daemon (socket, TCP, stdio, the
proxy's in-process one) therefore takes ``ctxd.db.lock`` beside the database for its
lifetime (``ctxd.ownership.LockFile``: O_NOFOLLOW, 0600, ours, flock, released by the kernel when
the process dies), and a second one refuses to start, naming the directory and the pid
and transports of the daemon using it. PostgreSQL is meant for several daemons: nothing
is taken there. Tools that open the file without being a daemon (``ctxd-cli doctor``,
``ctxd-cli migrate``, tests) do not take it.

The holder writes its pid, then ``running`` (``stopping`` once it is closing), then its
transports one a line (``unix:PATH``, ``tcp:127.0.0.1:PORT``, ``stdio``). A daemon started
on the same data directory while the holder is stopping (the socket it let go of taken
by the next client's autostart) waits for it to finish closing the file instead of
refusing.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from ctxd.ownership import LockError, LockFile, LockHeld, PrivateFileError, pid_of, read_private_file
from ctxd.store.db import StoreOpenError, check_data_dir

RUNNING = "running"
STOPPING = "stopping"
STOPPING_WAIT_SECONDS = 30.0
"""How long a starting daemon waits for one that is closing the database (its last
writes, the WAL checkpoint) before it refuses."""


class DatabaseLock:
    """The lock of the SQLite file ``database`` (``ctxd.db.lock`` beside it)."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self._lock = LockFile(database.with_name(database.name + ".lock"),
                              elsewhere="another --data-dir")
        self.path = self._lock.path
        self._serving: list[str] = []

    async def acquire(self, serving: list[str], *, wait: float = STOPPING_WAIT_SECONDS) -> None:
        """Take the lock, saying ``serving`` (the daemon's transports). StoreOpenError when
        another daemon uses the database (after waiting up to ``wait`` seconds for one
        that is stopping), or when the directory or the lock file are not safe to use."""
        check_data_dir(self.database.parent)
        deadline = time.monotonic() + wait
        while True:
            try:
                self._lock.acquire(self._text(RUNNING, serving))
            except LockHeld as exc:
                lines = exc.text.splitlines()
                stopping = len(lines) > 1 and lines[1].strip() == STOPPING
                if stopping and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                raise StoreOpenError(self._in_use(exc.text, stopping, wait)) from None
            except LockError as exc:
                raise StoreOpenError(str(exc)) from None
            self._serving = serving
            return

    def serving(self, serving: list[str]) -> None:
        """The daemon's transports once bound (a TCP port chosen by the system)."""
        self._serving = serving
        self._lock.write(self._text(RUNNING, serving))

    def stopping(self) -> None:
        """Said before the daemon closes the database (see the module doc)."""
        self._lock.write(self._text(STOPPING, self._serving))

    def release(self) -> None:
        """Once the database is closed: the file is removed (a data directory without a
        daemon holds only the database)."""
        self._lock.release(remove=True)

    @staticmethod
    def _text(state: str, serving: list[str]) -> str:
        return "\n".join((str(os.getpid()), state, *serving)) + "\n"

    def _in_use(self, text: str, stopping: bool, wait: float) -> str:
        transports = [_printable(line) for line in text.splitlines()[2:6] if line.strip()]
        where = ", ".join(transports)
        holder = f"another ctxd (pid {pid_of(text)}" + (f", serving {where})" if where else ")")
        what = (f"the data directory {self.database.parent}" if self.database.name == "ctxd.db"
                else f"the database {self.database}")
        if stopping:
            return (f"{what} is still used by {holder}, which has been stopping for {wait:.0f} s; "
                    f"try again once it has exited")
        socket = next((t[len("unix:"):] for t in transports if t.startswith("unix:")), None)
        use = (f"use that daemon (ctxd-cli --socket {socket}; editors: ctxd --remote unix:{socket})"
               if socket else "stop it")
        return (f"{what} is in use by {holder}: one daemon at a time may use a SQLite database "
                f"({self.database}); {use}, or give this one another --data-dir")


def holder_socket(database: Path) -> Path | None:
    """The Unix socket of the running daemon holding ``database``'s lock, which a client
    can use instead of starting a daemon of its own (``ctxd proxy``); None when there is
    none (no lock file, a daemon stopping or serving no socket, a file not safe to read)."""
    try:
        text = read_private_file(database.with_name(database.name + ".lock"), "lock file")
    except (OSError, PrivateFileError):
        return None
    lines = [line.strip() for line in text.splitlines()]
    if len(lines) < 3 or lines[1] != RUNNING:
        return None
    socket = next((line[len("unix:"):] for line in lines[2:] if line.startswith("unix:")), None)
    return Path(socket) if socket else None


def _printable(text: str, limit: int = 512) -> str:
    """``text`` without control characters, at most ``limit`` characters (it is quoted to a
    terminal)."""
    clean = "".join(c if c.isprintable() else "?" for c in text.strip())
    return clean if len(clean) <= limit else clean[:limit] + "..."
