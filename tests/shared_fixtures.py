"""Fixtures of more than one suite, in one place: a suite's ``conftest.py`` imports the ones
it uses (a fixture is found where it is imported), so ``tests/proxy`` and ``tests/hostile``
start the same fake upstream and make their short directories the same way."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import short_dir
from tests.proxy.upstream import FakeUpstream


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    """A fake provider (the OpenAI, Anthropic and Ollama APIs) on 127.0.0.1, for one test."""
    with FakeUpstream() as server:
        yield server


def short_dir_fixture(name: str, prefix: str, mode: int | None = None) -> Callable[..., Any]:
    """A fixture ``name``: a fresh directory under /tmp named ``prefix...`` (Unix socket
    paths are limited to 107 bytes; pytest's ``tmp_path`` can be longer), given ``mode``
    when set, removed after the test."""

    @pytest.fixture(name=name)
    def fixture() -> Iterator[Path]:
        path = short_dir(prefix)
        if mode is not None:
            path.chmod(mode)
        yield path
        shutil.rmtree(path, ignore_errors=True)

    return fixture
