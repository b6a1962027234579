"""Workloads for the compression and history benchmarks (deterministic, offline).

Two generators, both seeded and built from phrase tables, so nothing is read from
the network or /work/shared:

- :class:`AgentWorkload`: a coding agent's session as it reaches a context daemon. Most
  messages are assistant tool calls and their results; tool outputs are large and
  vary a lot in size (file dumps, test runs, diffs, listings: a log-normal size
  distribution, median ~250 tokens, a tail past 2,000); a user message every dozen
  steps or so. About 200 cl100k tokens per message on average, so 1,000 messages are
  ~200k tokens (what the compression benchmark calls a 200k-token active context).
- :class:`ProseWorkload`: chat text with a large, Zipf-distributed vocabulary (English
  words plus project identifiers and names) and ids that occur about once (hashes,
  ticket and job numbers), so full-text queries have realistic selectivities: a few
  words occur in most messages, most in few, ids in one.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from typing import Any

from tests.bench.corpus import _ERRORS, _FILES, _FUNCS, _THINGS, Corpus

# --- the coding agent ------------------------------------------------------------------

_CODE_LINES = [
    "def {func}(self, {arg}, *, timeout={n}):",
    "    \"\"\"{Thing} for {arg}; see {file}.\"\"\"",
    "    if not {arg}:",
    "        raise ValueError(f\"{func}: empty {arg}\")",
    "    result = self._{func2}({arg}, retries={n})",
    "    for index, item in enumerate({arg}):",
    "        cache[item.key] = merge(cache.get(item.key), item)",
    "    log.debug(\"{func} took %.2f ms\", elapsed * 1000)",
    "    return {arg}[{n}:] + [sentinel]",
    "class {Cls}({Base}):",
    "    max_items: int = {n}",
    "from {module} import {func}, {func2}",
    "# TODO({who}): {thing} breaks when the list is empty",
    "    assert len(rows) == {n}, rows",
    "    with open(path, encoding=\"utf-8\") as handle:",
    "        payload = json.load(handle)",
]
_ARGS = ["items", "rows", "payload", "request", "session", "tokens", "frames", "records", "entries", "ranges"]
_CLASSES = ["LexerState", "RouteTable", "SessionCache", "RetryPolicy", "FrameDecoder", "RowRenderer",
            "MigrationPlan", "TokenBucket", "ConfigLoader", "EventQueue"]
_BASES = ["object", "Base", "Protocol", "NamedTuple", "Exception", "dict"]
_MODULES = ["src.parser.lexer", "app.api.routes", "app.models.user", "lib.cache", "pkg.store", "web.hooks"]
_WHO = ["ana", "li", "sam", "omar", "kim", "jo"]
_TEST_LINES = [
    "tests/{test}.py::test_{func}_{case} PASSED",
    "tests/{test}.py::test_{func}_{case} FAILED",
    "E       AssertionError: assert {n} == {n2}",
    "E        +  where {n} = len([{arg}])",
    "{file}:{n}: in {func}",
    "    return self._{func2}({arg})",
    "========== {n} passed, {n2} failed, 1 warning in {n}.{n2}s ==========",
    "WARNING  {module}:{func} deprecated call, use {func2}",
]
_CASES = ["empty", "single", "many", "unicode", "timeout", "retry", "negative", "large", "nested", "none"]


class AgentWorkload:
    """Messages of a coding agent's session, in ctxd's wire shape (OpenAI-style calls)."""

    def __init__(self, seed: int = 20251122) -> None:
        self.corpus = Corpus(seed)
        self.rng = self.corpus.rng
        self.count = self.corpus.count
        self._calls = 0

    def _fill(self, template: str) -> str:
        r = self.rng
        func = r.choice(_FUNCS)
        return template.format(
            func=func, func2=r.choice(_FUNCS), arg=r.choice(_ARGS), n=r.randint(2, 999), n2=r.randint(0, 99),
            file=r.choice(_FILES), thing=r.choice(_THINGS), Thing=r.choice(_THINGS).capitalize(),
            Cls=r.choice(_CLASSES), Base=r.choice(_BASES), module=r.choice(_MODULES), who=r.choice(_WHO),
            test="test_" + func.split("_")[0], case=r.choice(_CASES), error=r.choice(_ERRORS))

    def _lines(self, table: list[str], tokens: int) -> str:
        """Lines from ``table`` until about ``tokens`` tokens (estimated per line, then
        counted once: cheap enough for hundreds of thousands of tokens)."""
        lines: list[str] = []
        estimate = 0
        while estimate < tokens:
            line = self._fill(self.rng.choice(table))
            lines.append(line)
            estimate += max(1, len(line) // 3)
        return "\n".join(lines)

    def tool_output_tokens(self) -> int:
        """Log-normal sizes: median ~250 tokens, ~10% above 1,000, capped at 6,000."""
        return int(min(6000, max(20, self.rng.lognormvariate(math.log(250), 1.0))))

    def tool_output(self, name: str, tokens: int) -> str:
        r = self.rng
        if name == "read_file":
            return self._lines(_CODE_LINES, tokens)
        if name == "run_command":
            return self._lines(_TEST_LINES, tokens)
        if name == "search":
            return self._lines(["{file}:{n}:    " + line for line in _CODE_LINES[:8]], tokens)
        body = self._lines(_CODE_LINES, tokens)
        file = r.choice(_FILES)
        return f"diff --git a/{file} b/{file}\n@@ -1,{r.randint(3, 40)} +1,{r.randint(3, 40)} @@\n" + \
            "\n".join(("+" if r.random() < 0.5 else "-") + line for line in body.split("\n"))

    def call(self) -> tuple[dict[str, Any], str]:
        r = self.rng
        self._calls += 1
        call_id = f"call_{self._calls:07d}"
        name = r.choice(("read_file", "read_file", "run_command", "run_command", "search", "edit_file"))
        if name == "read_file":
            args: dict[str, Any] = {"path": r.choice(_FILES)}
        elif name == "run_command":
            args = {"command": f"pytest -q {r.choice(_FILES)} -k {r.choice(_FUNCS)}", "timeout": 120}
        elif name == "search":
            args = {"query": r.choice(_FUNCS), "path": "src/"}
        else:
            args = {"path": r.choice(_FILES), "old": "first = items[0]",
                    "new": "if not items:\n    return None\nfirst = items[0]"}
        message = {"role": "assistant", "content": self.corpus.text(_assistant_lines(), 25, 90),
                   "toolCalls": [{"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}}]}
        return message, name

    def session(self) -> Iterator[dict[str, Any]]:
        """An endless session: a user request, then 6-18 tool steps, an assistant report."""
        r = self.rng
        while True:
            yield self.corpus.user(40, 160)
            for _ in range(r.randint(6, 18)):
                call, name = self.call()
                yield call
                yield {"role": "tool", "toolCallId": call["toolCalls"][0]["id"],
                       "content": self.tool_output(name, self.tool_output_tokens())}
            yield self.corpus.assistant(60, 220)

    def messages(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for message in self.session():
            out.append(message)
            if len(out) == n:
                break
        # End on a complete step: a trailing call without its result would be repaired.
        if out and out[-1].get("toolCalls"):
            out[-1] = self.corpus.assistant(60, 220)
        return out


def _assistant_lines() -> list[str]:
    from tests.bench.corpus import _ASSISTANT

    return _ASSISTANT


def renumber(messages: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """Copies of ``messages`` whose tool-call ids carry ``prefix`` (unique when a pool is
    cycled through a long session)."""
    out = []
    for m in messages:
        if "toolCalls" in m:
            m = {**m, "toolCalls": [{**c, "id": f"{prefix}{c['id']}"} for c in m["toolCalls"]]}
        elif "toolCallId" in m:
            m = {**m, "toolCallId": f"{prefix}{m['toolCallId']}"}
        out.append(m)
    return out


# --- prose with a realistic vocabulary --------------------------------------------------

_COMMON = ("the be to of and a in that have it for not on with he as you do at this but his by from they we "
           "say her she or an will my one all would there their what so up out if about who get which go me "
           "when make can like time no just him know take people into year your good some could them see "
           "other than then now look only come its over think also back after use two how our work first well "
           "way even new want because any these give day most us is was are were been has had did said").split()
_SYLLABLES = ("ka ro mi ten dul sar vek lo pan tri mor zel ash bin cor dax el fen gor hal is jun kel lum nar "
              "op pel quin ras sol tum ur val wen xi yor zan").split()


class ProseWorkload:
    """Messages whose words follow Zipf's law over ~60,000 distinct words.

    The vocabulary: ~130 common English words (ranked first, as in real text), then
    the coding corpus' identifiers and file names, then synthetic words made of
    syllables (names, project terms, identifiers with ``_`` and digits). Word ``k`` is
    drawn with probability ~ 1/k, so frequent words are in most messages and the long
    tail in a handful; one word in a hundred is an id that occurs about once. Queries
    can be chosen by document frequency.
    """

    def __init__(self, seed: int = 20251123, vocabulary: int = 60_000) -> None:
        self.rng = random.Random(seed)
        words: list[str] = list(_COMMON)
        words += [w for f in _FUNCS for w in f.split("_")] + _FUNCS
        words += [f.rsplit("/", 1)[-1].split(".")[0] for f in _FILES]
        seen = set(words)
        r = random.Random(seed + 1)
        while len(words) < vocabulary:
            parts = [r.choice(_SYLLABLES) for _ in range(r.randint(2, 4))]
            kind = r.random()
            if kind < 0.15:
                word = "_".join(parts)
            elif kind < 0.25:
                word = "".join(parts) + str(r.randint(0, 99))
            else:
                word = "".join(parts)
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.words = words
        # Cumulative Zipf weights (s = 1.0), for bisect sampling.
        total = 0.0
        self._cum: list[float] = []
        for k in range(1, len(words) + 1):
            total += 1.0 / k
            self._cum.append(total)
        self._total = total

    def word(self) -> str:
        import bisect

        return self.words[bisect.bisect_left(self._cum, self.rng.random() * self._total)]

    def unique(self) -> str:
        """A token that occurs in about one message: an id, a hash, a ticket, a number."""
        r = self.rng
        kind = r.random()
        if kind < 0.4:
            return f"{r.getrandbits(28):07x}"
        if kind < 0.7:
            return f"{r.choice(('req', 'job', 'build', 'run', 'order'))}_{r.randint(10_000, 9_999_999)}"
        return f"{r.choice(('PROJ', 'OPS', 'WEB', 'DATA'))}-{r.randint(1000, 99_999)}"

    def text(self, n_words: int) -> str:
        r = self.rng
        out: list[str] = []
        sentence = 0
        for _ in range(n_words):
            w = self.unique() if r.random() < 0.01 else self.word()
            if sentence == 0:
                w = w.capitalize()
            out.append(w)
            sentence += 1
            if sentence > 6 and r.random() < 0.15:
                out[-1] += r.choice((".", ".", ".", "?", "!"))
                sentence = 0
            elif r.random() < 0.05:
                out[-1] += ","
        return " ".join(out) + "."

    def messages(self, n: int, low: int = 20, high: int = 160) -> list[dict[str, Any]]:
        r = self.rng
        roles = ("user", "assistant", "assistant", "tool")
        out: list[dict[str, Any]] = []
        calls = 0
        for i in range(n):
            role = roles[i % 4]
            if role == "tool":
                calls += 1
                prev = out[-1]
                call_id = f"c{calls}"
                arguments = json.dumps({"path": r.choice(_FILES)})
                prev["toolCalls"] = [{"id": call_id, "type": "function",
                                      "function": {"name": "read_file", "arguments": arguments}}]
                out.append({"role": "tool", "toolCallId": call_id, "content": self.text(r.randint(low, high * 2))})
            else:
                out.append({"role": role, "content": self.text(r.randint(low, high))})
        if out and out[-1].get("toolCalls"):
            out[-1].pop("toolCalls")
        return out
