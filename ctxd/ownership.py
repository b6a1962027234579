"""Who owns a path, and may this process write in a directory: checked explicitly.

Root passes every permission check (``os.access`` says yes to all of them), so a daemon
run as root would write into another user's directory, or one its owner made
read-only, without a word. These helpers read owners and modes themselves, so the
daemon refuses the same places for everyone, with a message saying why.
"""

from __future__ import annotations

import os
import pwd
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
