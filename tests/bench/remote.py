"""The stdio forwarder's cost: ``session/push`` through ``ctxd --remote`` against the same
daemon's socket reached directly, in the same run.

    python -m tests.bench.remote            # full run (20-30 s on 2 cores)
    python -m tests.bench.remote --quick    # CI-sized (5-10 s)

One socket daemon; two clients on it, alternated round by round so machine noise falls
on both: a ``ctxd --remote unix:SOCKET`` child driven over its stdin/stdout, and a direct
connection to the socket. Both are driven by the same blocking frame loop
(``framed.py``: write bytes, read bytes, no JSON in the timed path), each pushes one
message per request into its own session, so the difference is the forwarder's two
extra hops (pipe -> forwarder -> socket and back). Reported: p50 and p99 of each, and
the p50 ratio forwarder / direct (docs/performance.md, "Forwarder benchmark").
A measurement, not a test: exit 0 whatever the figures, unless ``--strict``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.bench.corpus import Corpus
from tests.bench.framed import FramedProcess, ServerError, frame
from tests.bench.spine import HUGE_WINDOW, MODEL, Lab, Quiet, Result, check_bodies, percentile, table

TARGET_RATIO = 2.0
"""The forwarder may at most double a push's round trip (it adds two local hops to one)."""


@dataclass
class Plan:
    rounds: int
    per_round: int
    warmup: int = 200


QUICK = Plan(rounds=5, per_round=200)
FULL = Plan(rounds=11, per_round=1000)


class FramedSocket(FramedProcess):
    """``FramedProcess``'s frame loop on a connected Unix socket instead of a child's pipes,
    so both sides of the ratio are timed by exactly the same code."""

    def __init__(self, path: Path) -> None:  # noqa: D107 - no child process here
        self.argv = ["socket", str(path)]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self._wfd = self._rfd = self.sock.fileno()
        self._buf = bytearray()
        self._next_id = 1

    def _fill(self) -> None:
        chunk = os.read(self._rfd, 1 << 20)
        if not chunk:
            raise ServerError(f"the daemon on {self.argv[1]} closed the connection")
        self._buf += chunk

    def close(self, *, graceful: bool = True, timeout: float = 10.0) -> int | None:
        self.sock.close()
        return None


def start_daemon(lab: Lab) -> tuple[subprocess.Popen[bytes], Path]:
    sock = lab.root / "run" / "bench.sock"
    stderr = open(lab.root / "daemon.stderr", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([sys.executable, "-m", "ctxd", "--socket", str(sock), "--data-dir",
                             str(lab.fresh("daemon"))], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=stderr, env=lab.ctxd_env, cwd=str(lab.root))
    stderr.close()
    deadline = time.monotonic() + 60
    while True:
        try:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(str(sock))
            probe.close()
            return proc, sock
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: see {lab.root / 'daemon.stderr'}") from None
            time.sleep(0.05)


def initialize(client: FramedProcess, session_id: str) -> None:
    client.request("initialize", {"processId": None, "clientInfo": {"name": "remote-bench"}})
    client.notify("initialized", {})
    client.request("session/create", {"sessionId": session_id, "model": MODEL, "contextWindow": HUGE_WINDOW})


def timed_pushes(client: FramedProcess, session_id: str, messages: list[dict[str, Any]]) -> list[float]:
    frames = [frame(client.next_id(), "session/push", {"sessionId": session_id, "messages": [m]}) for m in messages]
    took: list[float] = []
    bodies: list[bytes] = []
    with Quiet():
        for f in frames:
            t = time.perf_counter()
            bodies.append(client.call(f))
            took.append(time.perf_counter() - t)
    check_bodies(bodies, "session/push")
    return took


def run(lab: Lab, plan: Plan) -> Result:
    daemon, sock = start_daemon(lab)
    forwarder = lab.spawn([sys.executable, "-m", "ctxd", "--remote", f"unix:{sock}"], "forwarder")
    direct = FramedSocket(sock)
    try:
        initialize(forwarder, "via-forwarder")
        initialize(direct, "direct")
        pool = Corpus().chat_messages(plan.warmup + plan.rounds * plan.per_round)
        timed_pushes(forwarder, "via-forwarder", pool[:plan.warmup])
        timed_pushes(direct, "direct", pool[:plan.warmup])
        lat: dict[str, list[float]] = {"forwarder": [], "direct": []}
        rounds: list[dict[str, float]] = []
        for r in range(plan.rounds):
            chunk = pool[plan.warmup + r * plan.per_round:plan.warmup + (r + 1) * plan.per_round]
            order = ("forwarder", "direct") if r % 2 == 0 else ("direct", "forwarder")
            this: dict[str, float] = {}
            for kind in order:
                client, session = (forwarder, "via-forwarder") if kind == "forwarder" else (direct, "direct")
                took = timed_pushes(client, session, chunk)
                lat[kind] += took
                this[kind] = percentile(took, 50) * 1e3
            rounds.append(this)
            print(f"[remote {time.strftime('%H:%M:%S')}] round {r + 1}/{plan.rounds}: p50 forwarder "
                  f"{this['forwarder']:.3f} ms, direct {this['direct']:.3f} ms", file=sys.stderr, flush=True)
    finally:
        direct.close()
        lab.close(forwarder)
        daemon.terminate()
        daemon.wait(30)
    fwd50, dir50 = percentile(lat["forwarder"], 50) * 1e3, percentile(lat["direct"], 50) * 1e3
    ratio = fwd50 / dir50
    return Result("1", "session/push p50 via ctxd --remote", fwd50, "ms", dir50, "direct socket client", ratio,
                  f"<= {TARGET_RATIO:g}x", ratio <= TARGET_RATIO,
                  {"p50_ms": {"forwarder": fwd50, "direct": dir50},
                   "p99_ms": {"forwarder": percentile(lat["forwarder"], 99) * 1e3,
                              "direct": percentile(lat["direct"], 99) * 1e3},
                   "added_p50_ms": fwd50 - dir50, "samples": len(lat["direct"]), "rounds": rounds})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.remote", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--out", default="bench-results/remote.json", help="JSON results file")
    p.add_argument("--strict", action="store_true", help="exit 1 when the ratio is over the target")
    p.add_argument("--keep", action="store_true", help="keep the temp tree (data dir, daemon's stderr)")
    p.add_argument("--ctxd-path", metavar="DIR", help="run the ctxd package in DIR instead of this checkout's")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    lab = Lab(keep=args.keep, ctxd_path=args.ctxd_path)
    started = time.perf_counter()
    try:
        result = run(lab, plan)
    finally:
        lab.shutdown()
    meta = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "nproc": os.cpu_count(), "mode": "quick" if args.quick else "full", "plan": asdict(plan),
            "seconds": round(time.perf_counter() - started, 1), "loadavg_end": os.getloadavg()}
    print()
    print(f"ctxd forwarder benchmark ({meta['mode']}), {meta['date_utc']}, {meta['nproc']} cpu, "
          f"Python {meta['python']}, {meta['seconds']:.0f} s")
    print(table([result]))
    d = result.details
    print(f"p99: forwarder {d['p99_ms']['forwarder']:.3f} ms, direct {d['p99_ms']['direct']:.3f} ms; "
          f"added p50 {d['added_p50_ms']:.3f} ms over {d['samples']} pushes each")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": [asdict(result)]}, indent=2) + "\n")
    print(f"results: {out}")
    return 1 if args.strict and not result.passed else 0


if __name__ == "__main__":
    raise SystemExit(main())
