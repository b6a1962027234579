"""A bare pygls JSON-RPC server over stdio: the baseline ctxd is measured against.

One feature answers any params with a small dict. Nothing else:
no storage, no validation, no token counting. It is what pygls itself costs per
request (framing, JSON decode/encode through cattrs, task dispatch, stdio I/O), so
``ctxd / echo`` tells how much the daemon adds on top of the library it is built on.

The feature is registered as ``bench/echo`` and also as ``session/push``, so the
push benchmarks send this server byte-for-byte the frames they send ctxd.

    python -m tests.bench.echo_server      # speaks Content-Length frames on stdio
"""

from __future__ import annotations

import logging

from pygls.protocol import JsonRPCProtocol, default_converter
from pygls.server import JsonRPCServer

METHODS = ("bench/echo", "session/push")


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pygls").setLevel(logging.WARNING)
    server = JsonRPCServer(JsonRPCProtocol, default_converter)

    # No annotations: pygls reads the first parameter's annotation to decide whether
    # to pass the server object too.
    def echo(params):
        return {"ok": True, "n": 1}

    for method in METHODS:
        server.feature(method)(echo)

    server.start_io()


if __name__ == "__main__":
    main()
