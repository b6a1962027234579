"""What the compression and history benchmarks share: a framed client that keeps
notifications aside, a socket daemon for ``ctxd-cli``, and the run/report loop.

The measurement conventions are the spine's (``spine.py``): servers in a private temp
tree, one framed client, baselines in the same run in alternating rounds, medians,
the CPU other processes used meanwhile, a table and a JSON file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from tests.bench.framed import FramedProcess, ServerError, frame, result_of
from tests.bench.spine import Lab, MachineLoad, Result, fmt, machine, table

_decode = msgspec.json.Decoder().decode


class NotifyingProcess(FramedProcess):
    """A :class:`FramedProcess` that may be subscribed to sessions: frames that are not
    the awaited response are notifications, kept in :attr:`notes` in arrival order.

    Timed loops still use :meth:`FramedProcess.call` (one frame back, undecoded), so
    they must run while nothing is subscribed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: list[tuple[float, str, dict[str, Any]]] = []
        self.data_dir: Path | None = None

    def _frame_ready(self) -> bool:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        for line in bytes(buf[:end]).split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                return len(buf) >= end + 4 + int(value)
        return True  # malformed header: let read_frame raise

    def poll_frame(self, timeout: float | None) -> bytes | None:
        """The next frame's body, or None when none is complete within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._frame_ready():
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._rfd], [], [], wait)
            if not ready:
                return None
            self._fill()
        return self.read_frame()

    def _keep(self, body: bytes) -> dict[str, Any]:
        message = _decode(body)
        if "id" not in message and "method" in message:
            self.notes.append((time.monotonic(), message["method"], message.get("params") or {}))
        return message

    def request(self, method: str, params: Any = None) -> Any:
        msg_id = self.next_id()
        self.write(frame(msg_id, method, params))
        while True:
            body = self.poll_frame(None)
            assert body is not None
            message = self._keep(body)
            if message.get("id") == msg_id:
                return result_of(body)
            if "id" in message:
                raise ServerError(f"expected the response to request {msg_id}, got {body[:200]!r}")

    def pump(self, timeout: float) -> None:
        """Read whatever notifications arrive within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.poll_frame(max(0.0, deadline - time.monotonic()))
            if body is None:
                return
            self._keep(body)

    def wait_note(self, since: int, accept: Callable[[str, dict[str, Any]], bool], timeout: float) -> int | None:
        """Index of the first note at or after ``since`` that ``accept`` takes, reading
        more as they come; None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        index = since
        while True:
            while index < len(self.notes):
                _, method, params = self.notes[index]
                if accept(method, params):
                    return index
                index += 1
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            body = self.poll_frame(left)
            if body is not None:
                self._keep(body)


def spawn_notifying(lab: Lab, name: str, extra: Sequence[str] = ()) -> NotifyingProcess:
    """A stdio ctxd in a fresh data dir of ``lab``, initialized (``extra``: more flags,
    e.g. ``--set section.key=value``)."""
    data_dir = lab.fresh(name)
    argv = lab.ctxd_argv(data_dir) + list(extra)
    proc = NotifyingProcess(argv, env=lab.ctxd_env, cwd=str(lab.root), stderr_path=str(lab.root / f"{name}.stderr"))
    proc.data_dir = data_dir
    lab.procs.append(proc)
    proc.request("initialize", {"processId": None, "clientInfo": {"name": "ctxd-bench"}})
    proc.notify("initialized", {})
    return proc


# --- a socket daemon, for ctxd-cli ---------------------------------------------------------

class SocketDaemon:
    """``python -m ctxd --socket S --data-dir D`` in the lab's environment."""

    def __init__(self, lab: Lab, name: str) -> None:
        self.lab = lab
        base = lab.fresh(name)
        base.mkdir(parents=True)
        self.socket = base / "s.sock"
        self.data_dir = base / "data"
        self.log = lab.root / f"{name}.stderr"
        self._log = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctxd", "--socket", str(self.socket), "--data-dir", str(self.data_dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log, env=lab.ctxd_env,
            cwd=str(lab.root))
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ServerError(f"ctxd did not open {self.socket} (log: {self.log})")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# --- running and reporting ------------------------------------------------------------------

def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def common_args(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--only", default="", help="comma-separated benchmark numbers")
    p.add_argument("--out", default=default_out, help="JSON results file")
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed")
    p.add_argument("--keep", action="store_true", help="keep the temp tree (data dirs, servers' stderr)")
    p.add_argument("--ctxd-path", metavar="DIR", help="run the ctxd package found in DIR instead of the installed one")


def run_suite(suite: str, args: argparse.Namespace, benches: dict[str, Callable[..., list[Result]]],
              titles: dict[str, str], plan: Any, extra_tables: Callable[[list[Result]], str] | None = None,
              skip: dict[str, str] | None = None) -> int:
    chosen = [b.strip() for b in args.only.split(",") if b.strip()] or list(benches)
    unknown = [b for b in chosen if b not in benches]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(benches)}")
    if args.ctxd_path:
        sys.path.insert(0, str(Path(args.ctxd_path).resolve()))
    meta = machine(args.ctxd_path)
    meta["suite"] = suite
    meta["mode"] = "quick" if args.quick else "full"
    meta["ctxd_path"] = str(Path(args.ctxd_path).resolve()) if args.ctxd_path else None
    lab = Lab(keep=args.keep, ctxd_path=args.ctxd_path)
    meta["lab"] = str(lab.root) if args.keep else None
    results: list[Result] = []
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{suite} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        for b in chosen:
            if skip and b in skip:
                skipped[b] = skip[b]
                log(f"benchmark {b} skipped: {skip[b]}")
                continue
            log(f"benchmark {b}: {titles[b]}")
            t = time.perf_counter()
            load = MachineLoad()
            la0 = os.getloadavg()
            try:
                got = benches[b](lab, plan, log)
            except Exception as exc:  # noqa: BLE001 - report it, run the others
                import traceback

                errors[b] = f"{type(exc).__name__}: {exc}"
                log(f"benchmark {b} failed: {errors[b]}\n{traceback.format_exc()}")
                continue
            other = load.other_cores()
            meta.setdefault("other_cpu_cores", {})[b] = other
            meta.setdefault("loadavg", {})[b] = {"start": la0, "end": os.getloadavg()}
            meta.setdefault("seconds_per_benchmark", {})[b] = round(time.perf_counter() - t, 1)
            if other is not None and other > 0.3:
                log(f"  note: other processes used {other:.2f} of {meta.get('nproc')} cores meanwhile")
            for r in got:
                r.details["other_processes_cpu_cores"] = other
                verdict = "" if r.passed is None else (" PASS" if r.passed else " FAIL")
                log(f"  {r.name}: {fmt(r.value, r.unit)} vs {fmt(r.baseline, r.unit)} -> "
                    f"{'-' if r.ratio is None else f'{r.ratio:.2f}x'}{verdict}")
            results += got
    finally:
        lab.shutdown()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["loadavg_end"] = os.getloadavg()
    meta["plan"] = asdict(plan)

    print()
    print(f"ctxd {suite} benchmarks ({meta['mode']}), {meta['date_utc']}, {meta.get('nproc')} cpu "
          f"{meta.get('cpu', '?')}, {meta.get('ram_gb', '?')} GB, Python {meta['python']}, {meta['seconds']:.0f} s")
    print(table(results))
    if extra_tables is not None:
        extra = extra_tables(results)
        if extra:
            print()
            print(extra)
    loads = {b: v for b, v in meta.get("other_cpu_cores", {}).items() if v is not None}
    if loads:
        print("CPU used by other processes meanwhile (cores): "
              + ", ".join(f"#{b} {v:.2f}" for b, v in loads.items())
              + ("  <- absolute figures are depressed; ratios hold better" if max(loads.values()) > 0.3 else ""))
    for b, why in skipped.items():
        print(f"benchmark {b} skipped: {why}")
    for b, err in errors.items():
        print(f"benchmark {b} did not complete: {err}")
    failed = [r.name for r in results if r.passed is False] + [f"benchmark {b} (error)" for b in errors]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(clean({"meta": meta, "results": [asdict(r) for r in results], "errors": errors,
                                     "skipped": skipped, "failed": failed}), indent=2) + "\n")
    print(f"\n{len(results)} figures, {sum(r.passed is True for r in results)} targets met, "
          f"{len(failed)} missed; JSON: {out}")
    return 1 if (args.strict and failed) else 0
