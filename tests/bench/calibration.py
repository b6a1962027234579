"""How close ctxd's budget is to what providers count, and how much room it leaves: every
transcript with usage replayed into a Service, one message per push as the agent sent them.

    python -m tests.bench.calibration                                  # tests/fixtures/transcripts
    python -m tests.bench.calibration --corpus /work/shared/corpus --window 200000
    python -m tests.bench.calibration --baseline-path /tmp/ctxd-main   # the same, on another tree

For each usage-bearing message after the third ("later turns"): the budget's line before
it was pushed, ``tokenRatio x counted + tokenOverhead``, against the input the provider
reported for that call (Anthropic's ``input + cache reads + cache writes``, OpenAI's
``prompt_tokens``, which includes cached tokens), where counted is ctxd's count of what
the agent sent (these agents send their whole history: nothing is compressed at the
windows used here). Then ``maxPromptTokens`` after the last message, and the same with
no calibration (ratio 1, no overhead) as the baseline of the same run. With
``--baseline-path`` the tree at that path is measured in a subprocess the same way, and
both are printed. A measurement, not a test: prints a table, writes
bench-results/calibration.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[2]
LATER = 3


def _transcripts(root: Path) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".traj") and "locomo" not in path.name.lower():
            out.append(path)
    return out


async def measure(root: Path, window: int) -> list[dict[str, Any]]:
    from ctxd.config import Config, DaemonConfig
    from ctxd.importers import load_transcripts
    from ctxd.protocol.methods import METHODS
    from ctxd.service import ingest, sessions, stats
    from ctxd.service.core import Service
    from ctxd.service.events import CollectingEvents

    def params(method: str, **raw: Any) -> Any:
        return msgspec.convert(raw, METHODS[method].params)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        svc = await Service.open(Config(daemon=DaemonConfig(data_dir=tmp)), events=CollectingEvents())
        try:
            for path in _transcripts(root):
                try:
                    transcripts = load_transcripts(path)
                except Exception:  # (not a transcript: metadata, attribution)
                    continue
                for t in transcripts:
                    usages = [m for m in t.messages if m.usage is not None and m.usage.input_tokens is not None]
                    if len(usages) < LATER + 1:
                        continue
                    created = await sessions.create_session(svc, params(
                        "session/create", model=t.model, contextWindow=window, systemPrompt=t.system_prompt,
                        settings={"autoCompress": False}))
                    sid = created.session_id
                    errors: list[float] = []
                    plain: list[float] = []
                    seen = 0
                    for m in t.messages:
                        u = m.usage
                        if u is not None and u.input_tokens is not None:
                            seen += 1
                            reported = u.input_tokens + (u.cache_read_tokens or 0) + (u.cache_write_tokens or 0)
                            if seen > LATER:
                                st = await stats.stats(svc, sid)
                                counted = st.budget.prompt_tokens  # (the whole history: nothing compressed)
                                b = st.budget
                                errors.append(abs(b.token_ratio * counted + b.token_overhead - reported) / reported)
                                plain.append(abs(counted - reported) / reported)
                        await ingest.push(svc, params("session/push", sessionId=sid,
                                                      messages=[msgspec.to_builtins(m)]))
                    st = await stats.stats(svc, sid)
                    b = st.budget
                    rows.append({"transcript": str(path.relative_to(root)), "model": t.model, "calls": seen,
                                 "later": len(errors), "median_error": statistics.median(errors),
                                 "max_error": max(errors), "median_error_uncalibrated": statistics.median(plain),
                                 "ratio": b.token_ratio, "overhead": b.token_overhead,
                                 "max_prompt": b.max_prompt_tokens,
                                 "max_prompt_uncalibrated": b.usable - b.reserved_output})
        finally:
            await svc.close()
    return rows


def table(title: str, rows: list[dict[str, Any]]) -> None:
    print(title)
    print(f"  {'transcript':<44} {'later':>5} {'err med':>8} {'err max':>8} {'ratio':>6} {'overhead':>8} "
          f"{'max prompt':>10} {'uncalibrated: err med':>22} {'max prompt':>10}")
    for r in rows:
        print(f"  {r['transcript'][-44:]:<44} {r['later']:>5} {100 * r['median_error']:>7.2f}% "
              f"{100 * r['max_error']:>7.2f}% {r['ratio']:>6.3f} {r['overhead']:>8,} {r['max_prompt']:>10,} "
              f"{100 * r['median_error_uncalibrated']:>21.2f}% {r['max_prompt_uncalibrated']:>10,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO / "tests" / "fixtures" / "transcripts")
    parser.add_argument("--window", type=int, default=200_000)
    parser.add_argument("--baseline-path", type=Path, help="another ctxd tree to measure the same way")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.corpus, args.window))
    if args.json_only:
        print(json.dumps(rows))
        return
    out: dict[str, Any] = {"corpus": str(args.corpus), "window": args.window, "rows": rows}
    table(f"this tree, window {args.window:,}", rows)
    if args.baseline_path:
        env_path = str(args.baseline_path)
        got = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "sys.argv = sys.argv[1:]; import runpy; "
                              "runpy.run_module('tests.bench.calibration', run_name='__main__')",
                              env_path, "--corpus", str(args.corpus), "--window", str(args.window), "--json-only"],
                             capture_output=True, text=True, cwd=env_path, check=True)
        base = json.loads(got.stdout.strip().splitlines()[-1])
        out["baseline_path"], out["baseline_rows"] = env_path, base
        table(f"baseline {env_path}", base)
    Path("bench-results").mkdir(exist_ok=True)
    Path("bench-results/calibration.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
