"""How long ``ctxd --remote`` (what every editor spawns) and the daemon take to start, for
this checkout and, in the same run, another tree (``--before DIR``): repeated spawns,
alternated, like hyperfine.

    python -m tests.bench.startup --before DIR          # e.g. DIR from `git archive main ctxd`
    python -m tests.bench.startup --before DIR --quick  # CI-sized (~1 min on 2 cores)
    python -m tests.bench.startup                        # this checkout only

One socket daemon (this checkout's) serves every forwarder, so what differs between
trees is the forwarder's own start: spawn -> ``initialize`` sent -> its answer read.
The daemon rows spawn ``ctxd`` over stdio with a fresh data directory each time (spawn ->
``initialize`` answered). The floor is the interpreter itself answering one frame
(``python -c``), measured in the same rounds. Each tree's forwarder is also run once
under ``python -X importtime``: its slowest imports and whether pygls/lsprotocol are
among them. Reported: medians, p90, ratios this/before (docs/decisions.md,
"Foundations": "ctxd's own JSON-RPC core").
A measurement, not a test: exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.bench.framed import FramedProcess, frame
from tests.bench.remote import start_daemon
from tests.bench.spine import Lab, Quiet, Result, check_bodies, machine, median, percentile, table

FLOOR = ("import sys, os\n"
         "data = b''\n"
         "while b'\\r\\n\\r\\n' not in data:\n"
         "    data += os.read(0, 65536)\n"
         "body = b'{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}'\n"
         "os.write(1, b'Content-Length: %d\\r\\n\\r\\n' % len(body) + body)\n")
"""The interpreter answering one frame: no ctxd, no import beyond its own."""

INIT = {"processId": None, "clientInfo": {"name": "startup-bench"}}


@dataclass
class Plan:
    spawns: int


QUICK = Plan(spawns=8)
FULL = Plan(spawns=25)


def log(msg: str) -> None:
    print(f"[startup {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env_for(lab: Lab, tree: str | None) -> dict[str, str]:
    """The environment a child sees to run ``tree``'s ctxd (None: this checkout's)."""
    env = dict(lab.env)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve())]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def spawn_to_answer(argv: list[str], env: dict[str, str], lab: Lab, name: str, graceful: bool) -> float:
    """Seconds from spawn to the ``initialize`` answer read back."""
    with Quiet():
        started = time.perf_counter()
        proc = FramedProcess(argv, env=env, cwd=str(lab.root), stderr_path=str(lab.root / f"{name}.stderr"))
        proc.write(frame(1, "initialize", INIT))
        body = proc.read_frame()
        elapsed = time.perf_counter() - started
    check_bodies([body], name)
    proc.close(graceful=graceful)
    return elapsed


def import_profile(env: dict[str, str], sock: Path, cwd: Path) -> dict[str, Any]:
    """The forwarder's imports, once, under ``-X importtime`` (it exits 2 on a socket
    nobody serves, after importing all it needs): the total and the slowest packages."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "ctxd", "--remote", f"unix:{sock}.none"],
                         env=env, cwd=str(cwd), capture_output=True, text=True, timeout=120)
    cumulative: dict[str, int] = {}
    for line in run.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|", 2)
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        cumulative[parts[2][1:]] = int(parts[1])  # (nested imports keep their indent)
    top = {name: us for name, us in cumulative.items() if not name.startswith(" ")}
    names = {n.strip() for n in cumulative}
    return {"modules": len(cumulative), "total_ms": round(sum(top.values()) / 1e3, 1),
            "pygls_or_lsprotocol": sorted(n for n in names if n.split(".")[0] in ("pygls", "lsprotocol")),
            "slowest_top_level_ms": {n: round(us / 1e3, 1) for n, us in
                                     sorted(top.items(), key=lambda kv: -kv[1])[:6]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", metavar="DIR", help="another ctxd tree (a directory holding ctxd/) to compare with")
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--out", default="bench-results/startup.json", help="JSON results file")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    meta = machine()
    meta["mode"] = "quick" if args.quick else "full"
    meta["before"] = str(Path(args.before).resolve()) if args.before else None
    lab = Lab()
    trees: dict[str, str | None] = {"this": None}
    if args.before:
        trees["before"] = args.before
    started = time.perf_counter()
    times: dict[str, list[float]] = {}
    profiles: dict[str, Any] = {}
    daemon, sock = start_daemon(lab)
    try:
        kinds: list[tuple[str, list[str], dict[str, str]]] = [("floor", [sys.executable, "-c", FLOOR], lab.env)]
        for tree, path in trees.items():
            env = env_for(lab, path)
            kinds.append((f"forwarder {tree}", [sys.executable, "-m", "ctxd", "--remote", f"unix:{sock}"], env))
            kinds.append((f"daemon {tree}", [sys.executable, "-m", "ctxd", "--data-dir", "DATA"], env))
            profiles[tree] = import_profile(env, sock, lab.root)
            log(f"{tree}: forwarder imports {profiles[tree]['modules']} modules; pygls/lsprotocol: "
                f"{len(profiles[tree]['pygls_or_lsprotocol'])}")

        def once(kind: str, argv_: list[str], env: dict[str, str]) -> float:
            argv_ = [str(lab.fresh("data")) if a == "DATA" else a for a in argv_]
            return spawn_to_answer(argv_, env, lab, kind.replace(" ", "-"), graceful=kind != "floor")

        for kind, argv_, env in kinds:  # untimed: bytecode and page caches
            once(kind, argv_, env)
        for i in range(plan.spawns):
            order = kinds if i % 2 == 0 else list(reversed(kinds))
            for kind, argv_, env in order:
                times.setdefault(kind, []).append(once(kind, argv_, env) * 1e3)
            if (i + 1) % 5 == 0:
                log(f"{i + 1}/{plan.spawns} rounds")
    finally:
        daemon.terminate()
        daemon.wait(30)
        lab.shutdown()

    def stats(kind: str) -> tuple[float, float]:
        return median(times[kind]), percentile(times[kind], 90)

    floor, floor90 = stats("floor")
    results: list[Result] = []
    for what in ("forwarder", "daemon"):
        this, this90 = stats(f"{what} this")
        if "before" in trees:
            before, before90 = stats(f"{what} before")
            results.append(Result(what, f"{what}: spawn -> initialize answered (median)", this, "ms", before,
                                  "before", this / before, "", None,
                                  {"p90_ms": {"this": this90, "before": before90}, "floor_ms": floor,
                                   "over_floor_ms": {"this": this - floor, "before": before - floor},
                                   "ms": {"this": times[f"{what} this"], "before": times[f"{what} before"]}}))
        else:
            results.append(Result(what, f"{what}: spawn -> initialize answered (median)", this, "ms", floor,
                                  "python answering one frame", this / floor, "", None,
                                  {"p90_ms": this90, "ms": times[f"{what} this"]}))
    results.append(Result("floor", "python -c answering one frame (median)", floor, "ms", None, "", None, "", None,
                          {"p90_ms": floor90, "ms": times["floor"]}))
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["plan"] = asdict(plan)
    meta["loadavg_end"] = os.getloadavg()
    print()
    print(f"ctxd start-up ({meta['mode']}), {meta['date_utc']}, {meta.get('nproc')} cpu, Python {meta['python']}, "
          f"{plan.spawns} spawns each, {meta['seconds']:.0f} s")
    print(table(results))
    for tree, prof in profiles.items():
        print(f"forwarder imports ({tree}): {prof['modules']} modules, pygls/lsprotocol: "
              f"{len(prof['pygls_or_lsprotocol'])}; slowest: "
              + ", ".join(f"{n} {ms:g} ms" for n, ms in prof["slowest_top_level_ms"].items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results], "imports": profiles},
                              indent=2) + "\n")
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
