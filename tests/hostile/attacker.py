"""Another local user's side of the hostile-user suite: ``python -m tests.hostile.attacker``
started as root becomes ``nobody`` (uid 65534) before it makes a socket, then attacks.

Everything it needs is imported first, as root (the interpreter and this checkout may sit
where nobody cannot read: a clone under a 0700 home), and nothing of ctxd is imported: the
other user has the standard library and the loopback interface, nothing else.

    listen SECONDS              listen on 127.0.0.1 (the port printed first), record what
                                every client sends, until SECONDS passed or stdin closes;
                                print it as JSON at the end
    hold PORT COUNT SECONDS     keep COUNT connections open to 127.0.0.1:PORT, each having
                                sent half a request head (``--data``: what instead), opening
                                a new one for each the server closes (``--once``: not, and
                                "opened" is printed once all are), until SECONDS passed or
                                stdin closes; print counts as JSON
    big PORT BYTES              send a POST with a body of BYTES; print the answer's status

Each prints one JSON object on stdout (``listen`` prints its port on a line before).
"""

from __future__ import annotations

import argparse
import encodings.idna  # noqa: F401  (a lazy import nobody might not be able to make later)
import json
import os
import resource
import select
import socket
import sys
import time

NOBODY = 65534


def become_nobody(files: int = 4096) -> None:
    """Drop to uid/gid 65534 for good, after raising the descriptor limit (as far as the
    hard limit, which only a root with CAP_SYS_RESOURCE may raise)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, max(files, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(files, hard), hard))
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def listen(seconds: float) -> dict:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    print(server.getsockname()[1], flush=True)
    received: list[bytes] = []
    connections = 0
    clients: list[socket.socket] = []
    deadline = time.monotonic() + seconds
    stdin = sys.stdin.buffer
    while time.monotonic() < deadline:
        ready, _, _ = select.select([server, stdin, *clients], [], [], 0.05)
        if stdin in ready and not os.read(stdin.fileno(), 1):
            break  # told to stop
        for sock in ready:
            if sock is stdin:
                continue
            if sock is server:
                conn, _ = server.accept()
                conn.setblocking(False)
                clients.append(conn)
                connections += 1
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                received.append(data)
            else:
                clients.remove(sock)
                sock.close()
    raw = b"".join(received)
    return {"connections": connections, "bytes": len(raw), "data": raw[:4000].decode("latin-1")}


def hold(port: int, count: int, seconds: float, data: bytes, once: bool = False) -> dict:
    """``count`` connections kept open (each having sent ``data`` once connected),
    reopened as the server closes them; how many it managed at most and how many the
    server closed."""
    poller = select.poll()
    stdin = sys.stdin.fileno()
    poller.register(stdin, select.POLLIN)
    socks: dict[int, socket.socket] = {}
    unsent: set[int] = set()
    opened = closed = refused = most = 0
    deadline = time.monotonic() + seconds
    stop = told = False
    while time.monotonic() < deadline and not stop:
        while len(socks) < count and not (once and opened >= count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                sock.close()
                refused += 1
                break
            fd = sock.fileno()
            socks[fd] = sock
            unsent.add(fd)
            poller.register(fd, select.POLLIN | select.POLLOUT)
            opened += 1
            if len(socks) % 64 == 0:
                break  # let the server accept
        most = max(most, len(socks))
        if once and opened >= count and not unsent and not told:
            print("opened", flush=True)  # (what a benchmark waits for)
            told = True
        for fd, event in poller.poll(50):
            if fd == stdin:
                stop = not os.read(stdin, 1)  # told to stop
                if stop:
                    poller.unregister(stdin)
                continue
            sock = socks.get(fd)
            if sock is None:
                continue
            if event & select.POLLOUT and fd in unsent:
                unsent.discard(fd)
                poller.modify(fd, select.POLLIN)
                try:
                    sock.send(data)
                except OSError:
                    pass
                continue
            if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    poller.unregister(fd)
                    del socks[fd]
                    unsent.discard(fd)
                    sock.close()
                    closed += 1
    for sock in socks.values():
        sock.close()
    return {"opened": opened, "closed_by_server": closed, "most_open": most, "refused": refused}


def big(port: int, size: int) -> dict:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % size)
    sent = 0
    chunk = b" " * (1 << 20)
    answer = b""
    try:
        while sent < size:
            sock.sendall(chunk[: size - sent])
            sent += min(len(chunk), size - sent)
            ready, _, _ = select.select([sock], [], [], 0)
            if ready:
                break
    except OSError:
        pass  # the server closed the connection: its answer may be there still
    try:
        answer = sock.recv(65536)
    except OSError as exc:
        answer = f"({exc})".encode()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else ""
    return {"status": status, "sent": sent, "answer": answer[:500].decode("latin-1")}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("listen")
    p.add_argument("seconds", type=float)
    p = sub.add_parser("hold")
    p.add_argument("port", type=int)
    p.add_argument("count", type=int)
    p.add_argument("seconds", type=float)
    p.add_argument("--data", default="POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: sk-")
    p.add_argument("--once", action="store_true", help="open COUNT connections in all, none again")
    p = sub.add_parser("big")
    p.add_argument("port", type=int)
    p.add_argument("size", type=int)
    args = parser.parse_args()
    data = args.data.encode().decode("unicode_escape").encode("latin-1") if args.command == "hold" else b""
    become_nobody(max(4096, getattr(args, "count", 0) + 256))
    if args.command == "listen":
        out = listen(args.seconds)
    elif args.command == "hold":
        out = hold(args.port, args.count, args.seconds, data, args.once)
    else:
        out = big(args.port, args.size)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
