"""``ctxd-cli``, the shell client; see :mod:`ctxd.cli.main` for its options and exit codes."""
