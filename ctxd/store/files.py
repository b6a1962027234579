"""Durable file writes outside SQLite (exports, recovered databases)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (best effort: not every
    filesystem lets a directory be opened or synced)."""
    try:
        dir_fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
