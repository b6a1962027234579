"""ctxd's own JSON-RPC core against pygls 2.1 used through its public API only, in the
same run: what each costs to import and to answer the results ctxd really returns.

    python -m tests.bench.rpc_core            # full run (~1 min on 2 cores)
    python -m tests.bench.rpc_core --quick    # CI-sized (~20 s)

Both sides answer the same requests with the same handler results, taken from a real
in-process Service (a push's answer, a prompt of 200 and of 2,000 chat messages), and
stop timing when the answer's bytes reach the writer. ctxd's side is
``ctxd.server.jsonrpc.Endpoint`` as the daemon uses it. pygls' side is what its public
API allows: ``JsonRPCServer`` + ``feature`` + ``protocol.structure_message`` +
``protocol.handle_message`` + ``set_writer``; since pygls serializes with ``json.dumps``
after cattrs' unstructuring and cannot take a msgspec Struct, its handler returns
``msgspec.to_builtins(result)`` (the least a handler would have to do). Imports are
timed in fresh interpreters, alternated. Also reported, not timed: what each does with a
Struct result and with an expected error (pygls logs a traceback for each).
A measurement, not a test: exit 0 whatever the figures (docs/decisions.md,
"Foundations": "ctxd's own JSON-RPC core").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from tests.bench.corpus import Corpus
from tests.bench.spine import Quiet, Result, machine, median, table


@dataclass
class Plan:
    rounds: int
    per_round: dict[str, int]
    import_spawns: int


QUICK = Plan(rounds=3, per_round={"push answer": 400, "prompt, 200 messages": 60, "prompt, 2,000 messages": 8},
             import_spawns=6)
FULL = Plan(rounds=7, per_round={"push answer": 1000, "prompt, 200 messages": 150, "prompt, 2,000 messages": 20},
            import_spawns=15)


def log(msg: str) -> None:
    print(f"[rpc_core {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the results ctxd returns ------------------------------------------------------------

async def real_results(corpus: Corpus) -> dict[str, Any]:
    """A push's answer and two prompts, from a Service on a temporary database."""
    from ctxd.config import Config, DaemonConfig
    from ctxd.protocol.methods import METHODS
    from ctxd.service import ingest, sessions
    from ctxd.service import prompt as prompt_service
    from ctxd.service.core import Service
    from ctxd.service.events import CollectingEvents

    def params(method: str, **raw: Any) -> Any:
        return msgspec.convert(raw, METHODS[method].params)

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ctxd-rpc-core-") as tmp:
        svc = await Service.open(Config(daemon=DaemonConfig(data_dir=tmp)), events=CollectingEvents())
        try:
            for n in (200, 2000):
                sid = f"s{n}"
                await sessions.create_session(svc, params("session/create", sessionId=sid, model="gpt-4",
                                                          contextWindow=1_000_000_000))
                messages = corpus.chat_messages(n)
                for i in range(0, n, 500):
                    pushed = await ingest.push(svc, params("session/push", sessionId=sid, messages=messages[i:i + 500]))
                out[f"prompt, {n:,} messages"] = await prompt_service.prompt(
                    svc, params("context/prompt", sessionId=sid, format="openai"))
            out["push answer"] = await ingest.push(
                svc, params("session/push", sessionId="s200", messages=corpus.chat_messages(1)))
            assert pushed is not None
        finally:
            await svc.close()
    return out


# --- the two sides -----------------------------------------------------------------------

class _Sink:
    """Where an answer's bytes go; wakes the timer."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None

    def deliver(self, data: bytes) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(data)


class CtxdSide:
    name = "ctxd core"

    def __init__(self, result: Any) -> None:
        from ctxd.server.connection import cancel_request
        from ctxd.server.jsonrpc import Endpoint

        self.sink = _Sink()
        sink = self.sink

        class Peer:
            id = 1
            close_after_reply = False

            def refuse(self, method: str) -> None:
                return None

            def on_notification(self, method: str, params: Any) -> None: ...

            def initialize_finished(self) -> None: ...

            def send_frame(self, data: bytes) -> None:
                sink.deliver(data)

            def close(self) -> None: ...

        async def handler(params: Any) -> Any:
            return result

        self.endpoint = Endpoint(Peer(), {"x/answer": handler}, cancel_request)

    def send(self, message: dict[str, Any]) -> None:
        self.endpoint.handle_raw(message)


class PyglsSide:
    """pygls 2.1 through its public API only."""

    name = "pygls public API"

    def __init__(self, result: Any, *, convert: bool = True) -> None:
        from pygls.protocol import JsonRPCProtocol, default_converter
        from pygls.server import JsonRPCServer

        self.sink = _Sink()
        sink = self.sink
        self.server = JsonRPCServer(JsonRPCProtocol, default_converter)
        answer = msgspec.to_builtins(result) if convert else result

        async def handler(params):  # (no annotations: pygls reads them to pass the server)
            return answer

        self.server.feature("x/answer")(handler)

        class Writer:
            def write(self, data: bytes) -> None:
                sink.deliver(data)

            def close(self) -> None: ...

        self.protocol = self.server.protocol
        self.protocol.set_writer(Writer())

    def send(self, message: dict[str, Any]) -> None:
        self.protocol.handle_message(self.protocol.structure_message(message))


async def time_side(side: Any, n: int) -> tuple[float, int]:
    """Seconds for ``n`` requests answered one after another; the last answer's size."""
    loop = asyncio.get_running_loop()
    size = 0
    started = time.perf_counter()
    for i in range(n):
        side.sink.waiter = loop.create_future()
        side.send({"jsonrpc": "2.0", "id": i, "method": "x/answer", "params": {"sessionId": "s"}})
        size = len(await side.sink.waiter)
    return time.perf_counter() - started, size


async def bench_answers(plan: Plan, results: dict[str, Any]) -> list[Result]:
    out: list[Result] = []
    for what, result in results.items():
        n = plan.per_round[what]
        sides = {"ctxd": CtxdSide(result), "pygls": PyglsSide(result)}
        times: dict[str, list[float]] = {"ctxd": [], "pygls": []}
        sizes: dict[str, int] = {}
        for side in sides.values():  # warm-up
            await time_side(side, max(1, n // 10))
        for r in range(plan.rounds):
            for key in (("ctxd", "pygls") if r % 2 == 0 else ("pygls", "ctxd")):
                with Quiet():
                    seconds, sizes[key] = await time_side(sides[key], n)
                times[key].append(seconds / n * 1e6)
        c, p = median(times["ctxd"]), median(times["pygls"])
        out.append(Result("answer", f"answer a {what} ({sizes['ctxd']:,} B)", c, "us", p,
                          "pygls public API, same result", c / p, "", None,
                          {"ctxd_us": times["ctxd"], "pygls_us": times["pygls"], "requests_per_round": n,
                           "answer_bytes": sizes}))
        log(f"  {what}: ctxd {c:,.1f} us, pygls {p:,.1f} us -> {c / p:.2f}x")
    return out


IMPORTS = {
    "ctxd": "import msgspec, ctxd.server.jsonrpc",
    "pygls": "import msgspec, pygls.protocol, pygls.server",
}


def bench_imports(plan: Plan) -> list[Result]:
    """Import time in fresh interpreters (what every daemon start pays), alternated."""
    code = "import time; t = time.perf_counter(); {0}; print(time.perf_counter() - t)"
    times: dict[str, list[float]] = {k: [] for k in IMPORTS}
    for stmt in IMPORTS.values():  # untimed: bytecode caches, page cache
        subprocess.run([sys.executable, "-c", code.format(stmt)], check=True, capture_output=True)
    for i in range(plan.import_spawns):
        for key in (("ctxd", "pygls") if i % 2 == 0 else ("pygls", "ctxd")):
            run = subprocess.run([sys.executable, "-c", code.format(IMPORTS[key])], check=True,
                                 capture_output=True, text=True)
            times[key].append(float(run.stdout) * 1e3)
    c, p = median(times["ctxd"]), median(times["pygls"])
    log(f"  import: ctxd {c:.1f} ms, pygls {p:.1f} ms")
    return [Result("import", "import the JSON-RPC layer (fresh interpreter)", c, "ms", p, "pygls.protocol + .server",
                   c / p, "", None, {"ctxd_ms": times["ctxd"], "pygls_ms": times["pygls"], "statements": IMPORTS})]


async def capabilities(results: dict[str, Any]) -> dict[str, str]:
    """What each side does with what ctxd needs, said in a sentence each (not timed)."""
    from pygls.exceptions import JsonRpcException

    found: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    struct = results["push answer"]
    side = PyglsSide(struct, convert=False)
    side.sink.waiter = loop.create_future()
    quiet = logging.getLogger("pygls")
    quiet.disabled = True
    try:
        side.send({"jsonrpc": "2.0", "id": 1, "method": "x/answer", "params": {}})
        data = await asyncio.wait_for(side.sink.waiter, 2.0)
    except TimeoutError:
        found["pygls: a msgspec Struct result"] = "never answered (json.dumps cannot encode it; pygls logs the " \
                                                  "error and sends nothing)"
    else:
        body = json.loads(data.split(b"\r\n\r\n", 1)[1])
        found["pygls: a msgspec Struct result"] = f"answered {str(body)[:100]}"
    finally:
        quiet.disabled = False
    side = CtxdSide(struct)
    side.sink.waiter = loop.create_future()
    side.send({"jsonrpc": "2.0", "id": 1, "method": "x/answer", "params": {}})
    body = json.loads((await side.sink.waiter).split(b"\r\n\r\n", 1)[1])
    found["ctxd: a msgspec Struct result"] = "answered with the result" if "result" in body else str(body)

    # An expected error (a session that does not exist): how many log records carry a traceback.
    class Count(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.tracebacks = 0

        def emit(self, record: logging.LogRecord) -> None:
            self.tracebacks += record.exc_info is not None

    counter = Count()
    root = logging.getLogger()
    root.addHandler(counter)
    try:
        side = PyglsSide(struct)

        async def refuse(params):
            raise JsonRpcException(code=-33001, message="no session 's'")

        side.server.feature("x/refuse")(refuse)
        side.sink.waiter = loop.create_future()
        side.send({"jsonrpc": "2.0", "id": 2, "method": "x/refuse", "params": {}})
        await side.sink.waiter
        pygls_tracebacks = counter.tracebacks
        counter.tracebacks = 0
        from ctxd.protocol.errors import CtxdError, ErrorCode

        ctxd = CtxdSide(struct)

        async def refuse_ctxd(params: Any) -> None:
            raise CtxdError(ErrorCode.SessionNotFound, "no session 's'")

        ctxd.endpoint.handlers = {"x/refuse": refuse_ctxd}
        ctxd.sink.waiter = loop.create_future()
        ctxd.send({"jsonrpc": "2.0", "id": 2, "method": "x/refuse", "params": {}})
        await ctxd.sink.waiter
        ctxd_tracebacks = counter.tracebacks
    finally:
        root.removeHandler(counter)
    found["pygls: an expected error"] = f"{pygls_tracebacks} traceback(s) logged"
    found["ctxd: an expected error"] = f"{ctxd_tracebacks} traceback(s) logged"
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.rpc_core", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--out", default="bench-results/rpc_core.json", help="JSON results file")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    meta = machine()
    meta["mode"] = "quick" if args.quick else "full"
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()

    async def run() -> tuple[list[Result], dict[str, str]]:
        log("building results from a real Service")
        results = await real_results(Corpus())
        log("answering")
        got = await bench_answers(plan, results)
        return got, await capabilities(results)

    answers, found = asyncio.run(run())
    log("importing")
    got = bench_imports(plan) + answers
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["plan"] = asdict(plan)
    print()
    print(f"ctxd JSON-RPC core vs pygls public API ({meta['mode']}), {meta['date_utc']}, {meta.get('nproc')} cpu, "
          f"Python {meta['python']}, {meta['seconds']:.0f} s")
    print(table(got))
    for what, said in found.items():
        print(f"{what}: {said}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in got], "capabilities": found},
                              indent=2) + "\n")
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
