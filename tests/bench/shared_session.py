"""Two daemons on one PostgreSQL database, many clients pushing into ONE session through
both at once: do all pushes succeed, and does every daemon answer from what is stored?

    python -m tests.bench.shared_session                      # 5 runs, 8 clients x 150 messages
    python -m tests.bench.shared_session --runs 1 --clients 4 --messages 50
    python -m tests.bench.shared_session --window 8192        # compression passes too

Each run: a fresh database on a throwaway server (tests/pgserver.py), two ``ctxd --socket``
processes on it, one session created with one message, then ``--clients`` clients (half on
each daemon) each push ``--messages`` messages one at a time. Afterwards, on each daemon,
``session/get`` and ``context/stats`` are asked at once and again 3 s later (nothing in
between that would make a daemon catch up), then ``context/prompt``; the message counts
they give are compared with what PostgreSQL holds. It
is a measurement, not a test: it prints a table and writes bench-results/shared_session.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ctxd.client import Client, DaemonUnavailable, RpcError
from tests.pgserver import PgServer, start_server, stop_server

REPO = Path(__file__).resolve().parents[2]


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for name in ("config", "state", "data", "run"):
        (root / name).mkdir(mode=0o700, exist_ok=True)
    env.update(XDG_CONFIG_HOME=str(root / "config"), XDG_STATE_HOME=str(root / "state"),
               XDG_DATA_HOME=str(root / "data"), XDG_RUNTIME_DIR=str(root / "run"))
    return env


def _start(root: Path, name: str, url: str) -> tuple[subprocess.Popen[bytes], Path]:
    sock = root / f"run-{name}" / "ctxd.sock"
    sock.parent.mkdir(mode=0o700)
    log = open(root / f"{name}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "ctxd", "--socket", str(sock), "--data-dir", str(root / name),
                             "--set", f"storage.url={url}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=log, env=_env(root), close_fds=True)
    log.close()
    return proc, sock


async def _connect(sock: Path, deadline: float = 60.0) -> Client:
    start = time.monotonic()
    while True:
        try:
            client = await Client.connect_unix(str(sock))
            await client.initialize(client_name="bench-shared-session")
            return client
        except (OSError, ConnectionError, DaemonUnavailable):
            if time.monotonic() - start > deadline:
                raise
            await asyncio.sleep(0.1)


def _stored(server: PgServer, dbname: str, sid: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(server.conninfo(dbname)) as conn:
        rows = conn.execute("SELECT count(*) FROM messages WHERE session_id = %s", (sid,)).fetchone()
        last = conn.execute("SELECT last_seq FROM sessions WHERE id = %s", (sid,)).fetchone()
    return int(rows[0]), int(last[0])


async def _views(clients: list[Client], sid: str, prompt: bool = False) -> list[dict[str, int]]:
    out = []
    for client in clients:
        got = await client.request("session/get", {"sessionId": sid})
        stats = await client.request("context/stats", {"sessionId": sid})
        view = {"get": got["messageCount"], "stats": stats["messageCount"]}
        if prompt:
            view["prompt"] = (await client.request("context/prompt", {"sessionId": sid, "format": "openai"}))[
                "messageCount"]
        out.append(view)
    return out


async def one_run(server: PgServer, run: int, clients_n: int, messages: int, window: int) -> dict[str, Any]:
    url = server.create_database()
    dbname = url.split("@/", 1)[1].split("?", 1)[0]
    root = Path(tempfile.mkdtemp(prefix="ctxd-bss-", dir="/tmp"))
    procs = []
    try:
        (pa, sa), (pb, sb) = _start(root, "a", url), _start(root, "b", url)
        procs = [pa, pb]
        ca, cb = await _connect(sa), await _connect(sb)
        sid = f"shared-{run}"
        await ca.request("session/create", {"sessionId": sid, "contextWindow": window})
        await ca.request("session/push", {"sessionId": sid, "messages": [{"role": "system", "content": "start"}]})
        refused: list[str] = []
        acked = 0

        async def pusher(k: int) -> None:
            nonlocal acked
            client = await _connect(sa if k % 2 == 0 else sb)
            try:
                for i in range(messages):
                    role = "user" if i % 2 == 0 else "assistant"
                    text = f"client {k} message {i}: " + " ".join(f"w{(k * 31 + i * 7 + j) % 501}" for j in range(30))
                    try:
                        await client.request("session/push", {"sessionId": sid,
                                                              "messages": [{"role": role, "content": text}]})
                        acked += 1
                    except RpcError as exc:
                        refused.append(f"{exc.code} {exc.message}")
            finally:
                await client.close()

        started = time.perf_counter()
        await asyncio.gather(*(pusher(k) for k in range(clients_n)))
        seconds = time.perf_counter() - started
        stored_rows, last_seq = _stored(server, dbname, sid)
        now = await _views([ca, cb], sid)
        await asyncio.sleep(3)
        later = await _views([ca, cb], sid)  # (nothing asked meanwhile could have made them catch up)
        prompts = await _views([ca, cb], sid, prompt=True)
        await ca.close()
        await cb.close()
        expected = 1 + clients_n * messages
        agree = all(n == stored_rows for v in now + later + prompts for n in v.values())
        return {"run": run, "pushes": clients_n * messages, "acked": acked, "refused": len(refused),
                "refusals": refused[:3], "stored": stored_rows, "lastSeq": last_seq, "expected": expected,
                "seconds": round(seconds, 2), "now": now, "later": later, "prompts": prompts, "agree": agree}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = start_server()
    try:
        return [await one_run(server, run, args.clients, args.messages, args.window) for run in range(args.runs)]
    finally:
        stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--messages", type=int, default=150)
    parser.add_argument("--window", type=int, default=1_000_000)
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    print(f"{'run':>3} {'acked':>6} {'refused':>7} {'stored':>6} {'s':>6}  {'a: get/stats':>12} {'b: get/stats':>12} "
          f"{'a 3 s later':>12} {'b 3 s later':>12} {'prompts a/b':>11}")
    for r in results:
        def fmt(v: dict[str, int]) -> str:
            return f"{v['get']}/{v['stats']}"
        prompts = f"{r['prompts'][0]['prompt']}/{r['prompts'][1]['prompt']}"
        print(f"{r['run']:>3} {r['acked']:>6} {r['refused']:>7} {r['stored']:>6} {r['seconds']:>6}  "
              f"{fmt(r['now'][0]):>12} {fmt(r['now'][1]):>12} {fmt(r['later'][0]):>12} {fmt(r['later'][1]):>12} "
              f"{prompts:>11}")
        for refusal in r["refusals"]:
            print(f"    refused: {refusal}")
    failed = sum(1 for r in results if r["refused"] or not r["agree"] or r["stored"] != r["expected"])
    print(f"runs with a refused push or a daemon that disagrees with storage: {failed} of {len(results)}")
    Path("bench-results").mkdir(exist_ok=True)
    Path("bench-results/shared_session.json").write_text(json.dumps(
        {"runs": args.runs, "clients": args.clients, "messages": args.messages, "window": args.window,
         "results": results, "failed": failed}, indent=2))


if __name__ == "__main__":
    main()
