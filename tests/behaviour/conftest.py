"""What the daemon does, over its real Unix socket, with the daemon run inside the test
process (``tests/inprocess.py``, through ``CtxdProc`` and ``running()`` of the e2e
helpers): compression, history and search, snapshots, transfer, retention, bounded work.

These tests are in the suite's fast part on SQLite; their PostgreSQL runs, and any test
here marked ``process`` (it needs ctxd as a process: SIGKILL, stdio, a refused start), are
in the process part (tests/conftest.py). A test that needs its own daemon process
belongs in tests/e2e/.
"""
