"""Window use after a backlog: a whole transcript pushed at once, as ``ctxd-cli import``,
``ctxd-cli replay --batch 200``, a client connecting mid-conversation or the proxy's
first request of a long conversation push it, against the same transcript pushed one
message at a time (the incremental path every other quality benchmark measures), in the
same run, at the same windows.

    python -m tests.bench.backlog --corpus /work/shared/corpus
    python -m tests.bench.backlog --corpus DIR --windows 8192 --batch 200 --ctxd-path /other/tree

Every transcript under ``--corpus`` that ctxd reads is replayed with ``ctxd-cli replay
FILE --context-window W --batch B`` into one daemon on a temporary socket (the CLI waits
for compression to settle), then ``context/prompt`` is asked. Reported per window, over
the sessions whose history is bigger than their max prompt: the median and smallest
prompt / ``maxPromptTokens`` for the backlog and for one push per message, and how many
assistant or tool messages stay verbatim. Target: the backlog's median >= 0.6 (issue 8's
window use). The ratio to the incremental path is a figure: a session pushed a message at
a time ends anywhere between the low-water mark and the trigger, a backlog right after
its pass, at the low-water mark. A measurement, not a test: exit code 0 unless
``--strict``. Results in ``bench-results/backlog.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_FILL = 0.6


def transcripts(corpus: Path, ctxd_path: str | None) -> list[Path]:
    """The files under ``corpus`` that ctxd's importers read (others are skipped)."""
    env = _env(ctxd_path, None)
    code = ("import sys\nfrom ctxd.importers import load_transcripts\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n        load_transcripts(p)\n    except Exception:\n        continue\n"
            "    print(p)\n")
    files = sorted(str(p) for p in corpus.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".traj", ".md"))
    out = subprocess.run([sys.executable, "-c", code, *files], env=env, capture_output=True, text=True, check=True)
    return [Path(line) for line in out.stdout.splitlines() if line]


def _env(ctxd_path: str | None, home: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if ctxd_path:
        env["PYTHONPATH"] = ctxd_path + os.pathsep + env.get("PYTHONPATH", "")
    if home:
        env.update(HOME=home, XDG_RUNTIME_DIR=f"{home}/run", XDG_CONFIG_HOME=f"{home}/.config",
                   XDG_DATA_HOME=f"{home}/.local/share", XDG_STATE_HOME=f"{home}/.local/state")
    return env


class Cli:
    """``ctxd-cli`` against one daemon of its own (started by the first call)."""

    def __init__(self, ctxd_path: str | None) -> None:
        self.home = tempfile.mkdtemp(prefix="ctxd-backlog-")
        os.makedirs(f"{self.home}/run", mode=0o700)
        self.env = _env(ctxd_path, self.home)

    def __call__(self, *args: str) -> Any:
        out = subprocess.run([sys.executable, "-m", "ctxd.cli", "--json", *args], env=self.env,
                             capture_output=True, text=True, cwd=self.home)
        if out.returncode:
            raise RuntimeError(f"ctxd-cli {' '.join(args[:2])}: {out.stderr.strip()[-300:]}")
        return json.loads(out.stdout)

    def close(self) -> None:
        subprocess.run([sys.executable, "-m", "ctxd.cli", "daemon", "stop"], env=self.env, capture_output=True)


def replay(cli: Cli, path: Path, window: int, batch: int) -> list[dict[str, Any]]:
    """One row per session of ``path``: history and prompt figures after the replay."""
    result = cli("replay", str(path), "--context-window", str(window), "--batch", str(batch))
    rows = []
    for session in result["sessions"]:
        prompt = cli("prompt", session["sessionId"])
        budget = prompt["budget"]
        rows.append({
            "file": str(path), "title": session.get("title"), "window": window, "batch": batch,
            "history": session["tokenCount"], "maxPrompt": budget["maxPromptTokens"],
            "prompt": budget["promptTokens"], "fill": round(budget["promptTokens"] / budget["maxPromptTokens"], 4),
            "otherVerbatim": sum(1 for m in prompt["messages"] if m.get("role") in ("assistant", "tool")),
            "messages": len(prompt["messages"]),
        })
    return rows


def summarize(rows: list[dict[str, Any]], window: int, batch: int) -> dict[str, Any]:
    chosen = [r for r in rows if r["window"] == window and r["batch"] == batch and r["history"] > r["maxPrompt"]]
    fills = [r["fill"] for r in chosen]
    return {"sessions": len(chosen), "median": round(statistics.median(fills), 3) if fills else None,
            "min": min(fills) if fills else None,
            "otherVerbatimMedian": statistics.median([r["otherVerbatim"] for r in chosen]) if chosen else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="real transcripts (e.g. /work/shared/corpus)")
    parser.add_argument("--windows", default="8192,16384,32768", help="comma-separated context windows")
    parser.add_argument("--batch", type=int, default=200, help="messages per push for the backlog (default 200)")
    parser.add_argument("--ctxd-path", help="run the ctxd package found in DIR instead of the installed one")
    parser.add_argument("--out", type=Path, default=Path("bench-results/backlog.json"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    files = transcripts(args.corpus, args.ctxd_path)
    print(f"[backlog] {len(files)} transcript files, windows {windows}, backlog batch {args.batch}", flush=True)
    cli = Cli(args.ctxd_path)
    rows: list[dict[str, Any]] = []
    started = time.time()
    try:
        for window in windows:
            for path in files:
                for batch in (args.batch, 1):
                    try:
                        rows += replay(cli, path, window, batch)
                    except RuntimeError as exc:
                        print(f"[backlog] {path.name} @ {window}: {exc}", file=sys.stderr, flush=True)
            print(f"[backlog] {window} done, {time.time() - started:.0f} s", flush=True)
    finally:
        cli.close()
    table = []
    missed = 0
    print()
    print("window | sessions | backlog: median fill (min) | one push per message: median fill (min) | ratio "
          "| assistant/tool messages verbatim (median, backlog / incremental) | target | result")
    print("-------+----------+----------------------------+-----------------------------------------+-------"
          "+------------------------------------------------------------------+--------+-------")
    for window in windows:
        big = summarize(rows, window, args.batch)
        one = summarize(rows, window, 1)
        ratio = round(big["median"] / one["median"], 3) if big["median"] and one["median"] else None
        ok = bool(big["median"] and big["median"] >= TARGET_FILL)
        missed += not ok
        table.append({"window": window, "backlog": big, "incremental": one, "ratio": ratio, "pass": ok})
        print(f"{window:>6} | {big['sessions']:>8} | {big['median']} ({big['min']}) | {one['median']} ({one['min']}) "
              f"| {ratio}x | {big['otherVerbatimMedian']} / {one['otherVerbatimMedian']} "
              f"| >= {TARGET_FILL} | {'PASS' if ok else 'FAIL'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"batch": args.batch, "windows": windows, "summary": table, "rows": rows,
                                    "seconds": round(time.time() - started, 1)}, indent=1))
    print(f"\nJSON: {args.out}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
