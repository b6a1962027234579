"""The in-process daemon (``tests/inprocess.py``) is configured as the process it stands
for would be: that process got ``daemon_environ()``/``daemon_env()`` (no ``CTXD_*`` from
whoever runs the suite, private XDG directories), so a developer's own ``CTXD_*``
variables and ``config.toml`` must not reach a test's daemon run in the test process."""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.compression_helpers import CtxdProc, remove_root, short_root
from tests.e2e.helpers import Daemon, short_dir


@pytest.fixture
def developer_settings(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """What a developer running the suite may have: a CTXD_* variable and a config file."""
    monkeypatch.setenv("CTXD_COMPRESSION_AUTO", "false")
    config_home = tmp_path / "config"
    (config_home / "ctxd").mkdir(parents=True)
    (config_home / "ctxd" / "config.toml").write_text('[compression]\nstrategy = "truncate"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))


def test_compression_helpers_daemon_ignores_the_callers_ctxd_variables(developer_settings):
    root = short_root()
    proc = CtxdProc(root).start()
    try:
        assert proc.inproc is not None
        assert proc.inproc.daemon.config.compression.auto is True
    finally:
        proc.stop()
        remove_root(root)


def test_in_process_daemon_ignores_the_callers_variables_and_config_file(developer_settings):
    base = short_dir()
    daemon = Daemon(base / "data", socket_path=base / "d.sock", process=False).start()
    try:
        assert daemon.inproc is not None
        compression = daemon.inproc.daemon.config.compression
        assert (compression.auto, compression.strategy) == (True, "summarize")
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
