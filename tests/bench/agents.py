"""Benchmark: the real agent CLIs through ``ctxd proxy`` against the same CLIs direct, on a
~30-turn coding task, offline (issues 21 and 22).

    python -m tests.bench.agents [--cli claude,codex,opencode,aider] [--window claude=48000,...]
                                 [--plan full|short] [--out bench-results/agents.json] [--keep-runs DIR]

For each CLI, two runs in the same benchmark (tests/agents/run.py, each in a private
network namespace): direct to the scripted upstream (tests/agents/upstream.py), and
through ``ctxd proxy`` at a window below the conversation (Claude Code 48K, Codex and
opencode 24K, aider 16K by default). The table (measures: tests/agents/measure.py):

- **ends same**: both runs end with the fix, and with the same diff;
- **sessions**: ctxd sessions of the task's conversation (1: no fork) and **stored**
  messages in them / messages of the conversation;
- **over window**: proxied upstream requests over ctxd's window (as the provider counts)
  / all, and the largest; **+ reply**: those whose input and reply limit are over it
  (which the providers refuse);
- **newest intact**, **files intact**: % of proxied requests showing the client's newest
  turn as sent, and every file the client itself sent as its context (aider's files in
  the chat) whole; requests that cannot hold them whole beside the client's fixed part
  and the reply floor are counted apart (**cannot fit**); **views intact**: of the files
  an agent read through its tools, counted once per request, those shown whole;
- **tokens**: input tokens sent upstream, proxy / direct;
- **bill**: the same requests priced with prompt caching (tests/agents/pricing.py:
  Anthropic writes 1.25x, reads 0.1x; OpenAI reads 0.1x; cached = the longest common
  prefix with an earlier request, in 128-token blocks from 1,024), proxy / direct;
- **prefix kept**: task requests that start with the previous one up to its last
  message, direct and proxied.

Needs the CLIs (``python3 tests/agents/clis.py install``) and ``unshare``; a CLI that
cannot run is reported as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.agents import clis
from tests.agents.measure import Comparison, compare, measure, pct
from tests.agents.run import WINDOWS, netns_missing, run_isolated
from tests.bench.spine import machine


def _windows(spec: str) -> dict[str, int]:
    out = dict(WINDOWS)
    for part in filter(None, spec.split(",")):
        name, _, value = part.partition("=")
        if name not in clis.CLIS or not value.isdigit():
            raise SystemExit(f"--window {part!r}: expected CLI=TOKENS with CLI one of {', '.join(clis.CLIS)}")
        out[name] = int(value)
    return out


def row(c: Comparison) -> list[str]:
    d, p = c.direct, c.proxy
    if not d.fixed:
        same = "no: direct did not fix"
    elif not p.fixed:
        same = "no: proxy did not fix" if p.returncode == 0 else f"no: proxy exit {p.returncode}"
    else:
        same = "yes" if c.same_diff else "no: another diff"
    return [
        c.cli, f"{c.window // 1000}K", same,
        f"{p.task_sessions} ({p.task_forks} forks)",
        f"{p.stored} / {p.conversation}",
        f"{p.over_window}/{p.requests - p.refused} (max {p.max_tokens / 1000:.1f}K); + reply {p.over_with_reply}",
        f"{p.refused}",
        pct(p.newest_intact, p.newest_pairs) + (f"; {p.newest_unfit} cannot fit" if p.newest_unfit else ""),
        pct(p.files_intact, p.files_pairs) + (f"; {p.files_unfit} cannot fit" if p.files_unfit else ""),
        pct(p.views_intact, p.views),
        f"{c.tokens_ratio:.2f}x",
        f"{c.bill_ratio:.2f}x",
        f"{pct(d.prefix_kept, d.prefix_pairs)} / {pct(p.prefix_kept, p.prefix_pairs)}",
    ]


HEAD = ["client", "window", "ends same", "sessions", "stored / conv.", "over window", "refused",
        "newest intact", "files intact", "views intact", "tokens p/d", "bill p/d", "prefix kept d / p"]


def table(rows: list[list[str]]) -> str:
    rows = [HEAD, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.agents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", default=",".join(clis.CLIS), help="which CLIs, comma-separated")
    parser.add_argument("--window", default="", help="ctxd's window per CLI, e.g. claude=48000,aider=16000")
    parser.add_argument("--plan", choices=("full", "short"), default="full", help="the ~30-turn task or its short form")
    parser.add_argument("--out", default="bench-results/agents.json")
    parser.add_argument("--keep-runs", type=Path, default=None, help="keep each run's record (JSON) in this directory")
    args = parser.parse_args(argv)
    windows = _windows(args.window)
    chosen = [c for c in args.cli.split(",") if c]
    for name in chosen:
        if name not in clis.CLIS:
            raise SystemExit(f"--cli {name!r}: one of {', '.join(clis.CLIS)}")
    work = args.keep_runs or Path(tempfile.mkdtemp(prefix="ctxd-bench-agents-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    try:
        for name in chosen:
            reason = netns_missing() or clis.missing(name)
            if reason:
                skipped[name] = reason
                print(f"{name}: skipped: {reason}", file=sys.stderr)
                continue
            runs = {via: run_isolated(name, via, work / f"{name}-{via}.json", windows[name], args.plan)
                    for via in ("direct", "proxy")}
            c = compare(measure(runs["direct"]), measure(runs["proxy"]))
            rows.append(row(c))
            entry = asdict(c)
            for side in ("direct", "proxy"):
                entry[side].pop("diff", None)
            entry["version"] = clis.version(name)
            entry["model"] = runs["direct"]["model"]
            results.append(entry)
            print(f"{name}: done ({runs['direct']['seconds']:.0f} s direct, {runs['proxy']['seconds']:.0f} s proxied)"
                  + "".join(f"; {n}" for n in c.notes), file=sys.stderr)
    finally:
        if args.keep_runs is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    for name, reason in skipped.items():
        print(f"{name}: skipped ({reason})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": dict(machine(), plan=args.plan, windows=windows), "results": results,
                               "skipped": skipped}, indent=2) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
