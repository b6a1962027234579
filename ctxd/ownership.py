"""Who owns a path, and may this process write in a directory: checked explicitly.

Root passes every permission check (``os.access`` says yes to all of them), so a daemon
run as root would write into another user's directory, or one its owner made
read-only, without a word. These helpers read owners and modes themselves, so the
daemon refuses the same places for everyone, with a message saying why.
"""

from __future__ import annotations

import errno
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
