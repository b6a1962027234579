#!/usr/bin/env python3
"""An agent's side of ctxd, with nothing but the standard library.

It spawns ``ctxd`` over stdio (as an agent does), creates a session with a small
window, and runs a scripted coding-agent loop: each turn it pushes what happened
(OpenAI-shaped messages, exactly as the API returns them, tool calls included) and
asks for the prompt to send next. It prints one line per turn (prompt tokens against
the budget) and the notifications ctxd sends (compressions, checkpoints, thresholds).
No LLM is involved: the assistant turns are scripted.

    python clients/python/agent_loop.py                 # ctxd from PATH
    python clients/python/agent_loop.py --turns 200 --window 4096
    python clients/python/agent_loop.py --ctxd "python -m ctxd" --data-dir /tmp/ctxd-demo

``ctxd`` is on PATH once the package is installed in the environment you run this in:
``pip install .`` in the repository, or ``. .venv/bin/activate`` after the README's
``python3 -m venv .venv && .venv/bin/pip install .``. Without that, name it:
``--ctxd .venv/bin/ctxd`` or ``--ctxd ".venv/bin/python -m ctxd"``.

Without ``--data-dir`` the database goes to a new temporary directory, removed at the end.

Port it to any language: the wire is LSP's base protocol (a ``Content-Length`` header,
a blank line, a JSON-RPC 2.0 body); see protocol/methods.md for every method.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from itertools import count
from typing import Any, BinaryIO


class Ctxd:
    """One stdio connection: requests in order, notifications collected as they come."""

    def __init__(self, command: list[str], data_dir: str) -> None:
        try:
            self.proc = subprocess.Popen([*command, "--data-dir", data_dir], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        except FileNotFoundError:
            raise SystemExit(f"agent_loop.py: {command[0]!r} is not on PATH. Install ctxd in this environment "
                             "(pip install . in the repository, or activate its venv: . .venv/bin/activate), "
                             "or name the command: --ctxd .venv/bin/ctxd") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out: BinaryIO = self.proc.stdin
        self.inp: BinaryIO = self.proc.stdout
        self.ids = count(1)
        self.notifications: list[tuple[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        self.out.write(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        self.out.flush()

    def receive(self) -> dict[str, Any]:
        length = None
        while True:
            line = self.inp.readline()
            if not line:
                raise RuntimeError("ctxd closed the connection")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        assert length is not None, "frame without Content-Length"
        return json.loads(self.inp.read(length))

    def request(self, method: str, params: Any = None) -> Any:
        msg_id = next(self.ids)
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params or {}})
        while True:
            message = self.receive()
            if "id" not in message:  # a notification: keep it for the caller
                self.notifications.append((message["method"], message.get("params")))
                continue
            if message["id"] != msg_id:
                continue
            if "error" in message:
                error = message["error"]
                raise RuntimeError(f"{method}: {error['message']} ({error['code']})")
            return message["result"]

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params or {}})

    def close(self) -> int:
        self.request("shutdown")
        self.notify("exit")
        self.out.close()
        return self.proc.wait(timeout=30)


def scripted_turn(n: int) -> list[dict[str, Any]]:
    """One turn of a coding agent: the user asks, the model calls a tool, the tool
    answers (a big output now and then), the model reports (with a goal marker)."""
    call_id = f"call_{n:04d}"
    lines = 400 if n % 7 == 0 else 30
    output = "\n".join(f"src/module_{n % 9}.py:{i}: def handler_{i}(request): ..." for i in range(lines))
    return [
        {"role": "user", "content": f"Step {n}: check module_{n % 9} for handlers that ignore timeouts."},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "grep", "arguments": json.dumps({"pattern": "def handler_", "path": "src/"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
        {"role": "assistant", "content": f"module_{n % 9} has {lines} handlers; none sets a timeout.\n"
                                         f"[CHECKPOINT] Audit module_{n % 9} - COMPLETED"},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ctxd", default="ctxd", help="command that runs the daemon (default: ctxd)")
    parser.add_argument("--data-dir", help="where ctxd keeps its database (default: a new temporary directory)")
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--window", type=int, default=8192)
    args = parser.parse_args()

    if args.data_dir:
        return run(args, args.data_dir)
    data_dir = tempfile.mkdtemp(prefix="ctxd-agent-")
    try:
        return run(args, data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        print(f"removed {data_dir}")


def run(args: argparse.Namespace, data_dir: str) -> int:
    ctxd = Ctxd(shlex.split(args.ctxd), data_dir)
    info = ctxd.request("initialize", {"processId": os.getpid(), "clientInfo": {"name": "agent_loop.py"}})
    ctxd.notify("initialized")
    print(f"connected to {info['serverInfo']['name']} {info['serverInfo']['version']} (data in {data_dir})")
    session = ctxd.request("session/create", {"model": "gpt-4o-mini", "contextWindow": args.window,
                                              "systemPrompt": "You are a careful coding agent."})
    sid = session["sessionId"]
    ctxd.request("session/subscribe", {"sessionId": sid})
    ctxd.request("goal/set", {"sessionId": sid, "description": "Make every request handler honour a timeout"})

    largest = 0
    for n in range(1, args.turns + 1):
        ctxd.request("session/push", {"sessionId": sid, "messages": scripted_turn(n)})
        prompt = ctxd.request("context/prompt", {"sessionId": sid, "format": "openai"})
        budget = prompt["budget"]
        largest = max(largest, prompt["tokens"])
        print(f"turn {n:3d}: prompt {prompt['tokens']:6,} / {budget['maxPromptTokens']:,} tokens, "
              f"{len(prompt['messages']):3d} messages, {prompt['checkpointCount']} checkpoints, "
              f"reliability {prompt['reliability']['level']}")
        for method, params in ctxd.notifications:
            if method == "context/compressed":
                print(f"          compressed ({'+'.join(params['layers'])}): "
                      f"{params['beforeTokens']:,} -> {params['afterTokens']:,} tokens")
            elif method in ("context/threshold", "context/overflow", "context/compressionFailed"):
                print(f"          {method}: {json.dumps(params)[:160]}")
        ctxd.notifications.clear()

    stats = ctxd.request("context/stats", {"sessionId": sid})
    print(f"done: {stats['messageCount']:,} messages ({stats['tokenCount']:,} tokens) in history, "
          f"largest prompt {largest:,} tokens, {stats['compressionCount']} compressions")
    return ctxd.close()


if __name__ == "__main__":
    sys.exit(main())
