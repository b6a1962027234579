"""Who owns a path, and may this process write in a directory: checked explicitly; and
the lock files that make a socket and a database one daemon's (:class:`LockFile`).

Root passes every permission check (``os.access`` says yes to all of them), so a daemon
run as root would write into another user's directory, or one its owner made
read-only, without a word. These helpers read owners and modes themselves, so the
daemon refuses the same places for everyone, with a message saying why.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import stat
from pathlib import Path


def owner(uid: int) -> str:
    """``uid 1000 (alice)``, or ``uid 1000`` when that uid has no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def me() -> str:
    return owner(os.geteuid())


def foreign(st: os.stat_result, *, root_ok: bool = False) -> bool:
    """Owned by someone other than this process's user (root counts as ours when
    ``root_ok``: /tmp and /run are root's)."""
    return st.st_uid != os.geteuid() and not (root_ok and st.st_uid == 0)


def writable_dir(path: Path, st: os.stat_result) -> bool:
    """Whether this process may create files in the directory ``path`` (``st`` its stat)
    and its owner meant it to: ``os.access`` (a read-only filesystem fails it even for
    root) and, for a directory of our own, the owner's write and search bits, which root
    would otherwise ignore."""
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    if st.st_uid == os.geteuid() and st.st_mode & 0o300 != 0o300:
        return False
    return True


class UnsafeDirectory(Exception):
    """A directory ctxd will not put its files in; the message says why and what to do."""


def check_shared_dir(path: Path, what: str, instead: str) -> None:
    """The rules for a directory where ctxd puts a socket, its lock and a log: ours (or
    root's: /tmp, /run), writable by us, and writable by nobody else unless it is sticky
    like /tmp (then others cannot remove or replace our files there; each file is still
    opened without following links and checked to be ours). ``what`` names the directory
    in messages (``the socket directory``), ``instead`` the way out (``choose another
    --socket path``). Raises UnsafeDirectory."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UnsafeDirectory(f"{what} {path}: {exc.strerror}") from None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory; {instead}")
    if foreign(st, root_ok=True):
        raise UnsafeDirectory(f"{what} {path} belongs to {owner(st.st_uid)}, not to this user, "
                              f"who could replace the socket; {instead}")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"{what} {path} is writable by other users (mode {mode:o}) and "
                              f"not sticky, so they could replace the socket or its lock file; make it "
                              f"private (chmod 700 {path}) or {instead}")
    if not writable_dir(path, st):
        raise UnsafeDirectory(f"{what} {path} is not writable by this user (mode {mode:o}, "
                              f"owner {owner(st.st_uid)}); {instead}")


def open_private_log(path: Path) -> int:
    """A log file opened for appending, the careful way (it sits beside the socket, maybe
    in /tmp): created 0600, never through a symbolic link, and used only when it is a
    regular file of this user's with no other hard links. Returns the descriptor; raises
    UnsafeDirectory (naming the file) otherwise."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        # (The kernel may refuse first: fs.protected_symlinks and fs.protected_regular
        # answer EACCES for another user's link or file in a sticky directory.)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if exc.errno == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
            raise UnsafeDirectory(f"the log file {path} is a symbolic link: ctxd will not write through it; "
                                  f"remove it or choose another --socket path") from None
        if st is not None and foreign(st):
            raise UnsafeDirectory(_not_our_log(path, st)) from None
        raise UnsafeDirectory(f"cannot open the log file {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = f"the log file {path} is not a regular file: ctxd will not write to it; remove it or choose " \
                  f"another --socket path"
    elif foreign(st):
        problem = _not_our_log(path, st)
    elif st.st_nlink != 1:
        problem = f"the log file {path} has other hard links: ctxd will not write to it; remove it or choose " \
                  f"another --socket path"
    if problem is not None:
        os.close(fd)
        raise UnsafeDirectory(problem)
    os.set_blocking(fd, True)
    return fd


def _not_our_log(path: Path, st: os.stat_result) -> str:
    return (f"the log file {path} belongs to {owner(st.st_uid)}, not to this user: ctxd will not write to it; "
            f"remove it or choose another --socket path")


class PrivateFileError(Exception):
    """Why a secret file (the TCP token) was not read; the message names the file and the fix."""


def read_private_file(path: Path, what: str, limit: int = 4096) -> str:
    """The text of ``path``, a secret (``what`` names it in errors): read only when it is a
    regular file of this user's that no one else can read, opened without following a
    symbolic link. Whoever reads a token sends it on (``ctxd-cli --tcp`` to whatever listens
    on the port), so a link planted in a shared directory must not make it read, and send,
    another of this user's files. FileNotFoundError when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PrivateFileError(f"{what} {path} is a symbolic link; it is not followed (give the file "
                                   f"itself)") from None
        raise PrivateFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PrivateFileError(f"{what} {path} is not a regular file")
        if foreign(st):
            raise PrivateFileError(f"{what} {path} belongs to {owner(st.st_uid)}, not to this user ({me()})")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise PrivateFileError(f"{what} {path} is readable by other users (mode {mode:o}); run: chmod 600 {path}")
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise PrivateFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise PrivateFileError(f"{what} {path} is longer than {limit} bytes: not a token")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise PrivateFileError(f"{what} {path} is not UTF-8 text") from None


# --- lock files ---------------------------------------------------------------------


class LockError(Exception):
    """The lock file cannot be used; the message names it and a way out."""


class LockHeld(LockError):
    """Another live process holds the lock; ``text`` is what it wrote in the file."""

    def __init__(self, message: str, text: str) -> None:
        super().__init__(message)
        self.text = text


class LockFile:
    """A lock file held for a process's lifetime: what makes a socket, and a SQLite
    database, one daemon's. ``elsewhere`` completes "remove it or choose ...": how the
    user avoids this file (``another --socket path``).

    The lock is an ``flock`` on a small file beside what it guards (``x.sock.lock``,
    ``ctxd.db.lock``). The kernel releases it when the process exits, however it exits
    (a SIGKILL too): a lock file left behind by a dead daemon never blocks the next one;
    only a live holder does. The file may sit in a directory others can write to (a
    socket in /tmp), so it is opened the careful way: never through a symbolic link (one
    planted there would make ctxd truncate its target), created 0600, and used only when
    it is a plain file of this user's with no other hard links; what a lock file of
    another user says is never repeated. The holder writes its pid (and, for the
    database's lock, where it serves) into it, which the refused process quotes. A holder
    may remove its file as it lets go (the database's lock does): a process that opened
    it just before then finds, once it holds the lock, the path empty or another file
    there, and starts over on what is at the path.
    """

    def __init__(self, path: Path, *, elsewhere: str) -> None:
        self.path = path
        self.elsewhere = elsewhere
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, text: str) -> None:
        """Take the lock without waiting and write ``text`` into the file. LockHeld when a
        live process holds it (with what that process wrote), LockError when the file is
        not safe to use."""
        for _ in range(100):
            if self._acquire(text):
                return
            # The holder removed the file as we locked it: lock the one at the path now.
        raise LockError(f"the lock file {self.path} keeps being replaced; choose {self.elsewhere}")

    def _acquire(self, text: str) -> bool:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise LockError(self._cannot_open(exc)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LockError(f"the lock file {self.path} is not a regular file; "
                                f"move it away or choose {self.elsewhere}")
            if foreign(st):
                raise LockError(self._not_ours(st.st_uid))
            if st.st_nlink != 1:
                raise LockError(f"the lock file {self.path} has other hard links; "
                                f"move it away or choose {self.elsewhere}")
            if stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise LockHeld(f"{self.path} is locked by another process", _text_in(fd)) from None
                raise LockError(f"cannot lock {self.path}: {exc.strerror}") from None
            if not self._at_path(st):
                os.close(fd)
                return False
            _write(fd, text)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def _at_path(self, st: os.stat_result) -> bool:
        """Whether the file ``st`` describes is still the one at the path (a holder that
        removes its file on release does so while it holds the lock)."""
        try:
            now = os.lstat(self.path)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

    def write(self, text: str) -> None:
        """Replace what the held lock file says (nothing when it is not held)."""
        if self._fd is not None:
            try:
                _write(self._fd, text)
            except OSError:
                pass  # (only what a refused process quotes)

    def _not_ours(self, uid: int) -> str:
        return (f"the lock file {self.path} belongs to {owner(uid)}, not to this user: ctxd will not "
                f"use it; remove it or choose {self.elsewhere}")

    def _cannot_open(self, exc: OSError) -> str:
        if exc.errno == errno.ELOOP:
            return (f"the lock file {self.path} is a symbolic link: ctxd will not follow it (it could "
                    f"make ctxd overwrite the file it points to); remove it or choose {self.elsewhere}")
        try:
            st = os.lstat(self.path)
        except OSError:
            pass
        else:
            if foreign(st):
                return self._not_ours(st.st_uid)
        return f"cannot open the lock file {self.path}: {exc.strerror}"

    def release(self, *, remove: bool = False) -> None:
        """Let go (closing the file releases the flock). ``remove``: the file is removed
        first, while still held, so that whoever opened it meanwhile sees it is gone
        (``acquire`` checks); otherwise it stays, harmless."""
        if self._fd is not None:
            if remove and self._at_path(os.fstat(self._fd)):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            os.close(self._fd)
            self._fd = None


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("utf-8", "replace"), 0)


def _text_in(fd: int) -> str:
    """What the holder wrote (its first 4 KiB, "" when unreadable)."""
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace")
    except OSError:
        return ""


def pid_of(text: str) -> str:
    """The pid on the first line of a lock file's ``text`` (a number, or "?")."""
    first = text.strip().split("\n", 1)[0].strip()
    return first if first.isdigit() else "?"
