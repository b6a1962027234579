"""The "model" of the scripted upstream: a ~30-turn coding task on the fixture repository
(tests/agents/fixture.py), played with each CLI's own tools.

The plan is the same for every CLI (read files, run commands, edit one file, run the
tests); each CLI's script says it with that CLI's tool names and arguments (Claude Code
``Read``/``Bash``/``Edit``, Codex ``exec_command`` and the freeform ``apply_patch``,
opencode ``read``/``bash``/``edit``) or, for aider, answers its user's messages in text
with a SEARCH/REPLACE block for the edit.

The script decides each move from the request alone, as a model does: the newest tool
result's call id tells which step it answers (the ids this upstream gave are
``<prefix>ag<step><variant><hash>``), so the same script works direct and through the
proxy. What it needs to see, it checks: before the edit, the line it is about to change
must be visible in the request (else it reads the file again, or for aider asks for it:
a real model cannot edit what it does not see), and after the last test run the result
decides its final answer. Side conversations (opencode's title, aider's summaries) get
answers of their own kind.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tests.agents import fixture
from tests.agents.wire import View

TASK = ("The unit tests of this repository fail (task ref STOCK-417). Find out why and fix the code so "
        "that `python3 -m unittest` passes; change only what the fix needs.")
"""The prompt every tool-using CLI gets; its ref marks the task's conversation."""
TASK_MARK = "task ref STOCK-417"

RUN, READ, EDIT = "run", "read", "edit"


@dataclass(frozen=True)
class Step:
    kind: str
    arg: str
    say: str = ""  # a line of text the model writes before its call


PLAN: tuple[Step, ...] = (
    Step(RUN, "git status --short && git log --oneline", "Let me look at the repository first."),
    Step(RUN, "find . -type f -not -path './.git/*' | sort"),
    Step(READ, "README.md"),
    Step(READ, "docs/design.md"),
    Step(READ, "CHANGELOG.md"),
    Step(READ, "pyproject.toml"),
    Step(READ, "src/stock/__init__.py"),
    Step(READ, "src/stock/models.py"),
    Step(READ, "src/stock/pricing.py"),
    Step(READ, "src/stock/loader.py"),
    Step(READ, "src/stock/report.py"),
    Step(RUN, "python3 -m unittest -v 2>&1", "Now the tests, to see what fails."),
    Step(READ, "tests/test_pricing.py"),
    Step(READ, "tests/test_report.py"),
    Step(RUN, "grep -rn 'apply_discount' src tests"),
    Step(RUN, "git log -p -- src/stock/pricing.py"),
    Step(READ, "data/items.csv"),
    Step(RUN, "PYTHONPATH=src python3 -m stock.report data/items.csv"),
    Step(RUN, "git show --stat HEAD"),
    Step(RUN, "PYTHONPATH=src python3 -c 'from stock.pricing import apply_discount as d; "
              "print([d(p, 15) for p in (199, 250, 999)])'"),
    Step(RUN, "git show HEAD~1 -- src tests"),
    Step(RUN, "sort -t, -k4 -n data/items.csv | tail -n 300", "Which items are the dearest?"),
    Step(RUN, "git log -p --reverse -- src/stock/models.py src/stock/loader.py src/stock/report.py"),
    Step(RUN, "grep -rn 'round\\|// 100' src"),
    Step(READ, "src/stock/pricing.py", "The discount truncates; the design says round half up."),
    Step(EDIT, fixture.EDITED, "Fixing the rounding in apply_discount."),
    Step(RUN, "python3 -m unittest tests.test_pricing -v 2>&1"),
    Step(RUN, "python3 -m unittest -v 2>&1"),
    Step(RUN, "git diff"),
)
"""The task's tool steps; the request after the last one gets the final answer."""

SHORT_PLAN: tuple[Step, ...] = (
    PLAN[0],
    Step(READ, "README.md"),
    Step(READ, "src/stock/pricing.py"),
    Step(RUN, "python3 -m unittest -v 2>&1", "Now the tests, to see what fails."),
    Step(READ, "data/items.csv"),
    *PLAN[-5:],
)
"""The same task in 10 requests (the tests' size)."""
PLANS = {"full": PLAN, "short": SHORT_PLAN}

DONE = "Fixed: apply_discount now rounds to the nearest cent, halves up, as docs/design.md says; all tests pass."
STILL_FAILING = "The tests still fail after my change; I stopped here."
CANNOT_SEE = f"I cannot see {fixture.EDITED} any more, so I cannot edit it safely."
TITLE = "Fix discount rounding in stock pricing"
OTHER = "OK."


@dataclass
class Call:
    id: str
    name: str
    input: Any  # a dict for function tools, a str for a freeform (custom) tool


@dataclass
class Move:
    """One reply of the model."""

    kind: str  # which conversation: task | title | summary | other
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    thinking: str = ""
    step: int = -1  # the plan step this reply's calls perform (-1: none)


_ID = re.compile(r"ag(\d\d)([nr])")


def call_id(prefix: str, step: int, variant: str = "n") -> str:
    digest = hashlib.sha256(f"{step}{variant}".encode()).hexdigest()[:14]
    return f"{prefix}ag{step:02d}{variant}{digest}"


def _answered(v: View) -> tuple[int, str, str] | None:
    """The plan step the newest tool result answers, its variant and its text."""
    for m in reversed(v.trailing()):
        for b in reversed(m.blocks):
            if b.type == "result":
                found = _ID.search(b.id)
                if found:
                    return int(found.group(1)), found.group(2), b.text
    return None


class Script:
    """A tool-using CLI's script; subclasses say the steps with the CLI's tools."""

    prefix = "call_"
    name = ""

    def __init__(self, root: str = "", plan: tuple[Step, ...] = PLAN) -> None:
        self.root = root
        self.plan = plan
        self.edit_step = next(i for i, s in enumerate(plan) if s.kind == EDIT)
        self.test_step = len(plan) - 2  # the full test run after the edit

    def side(self, v: View) -> Move | None:
        """A request of another conversation than the task (title, summary...), answered."""
        if TASK_MARK not in v.all_text():
            return Move("other", OTHER)
        return None

    def reply(self, v: View) -> Move:
        other = self.side(v)
        if other is not None:
            return other
        got = _answered(v)
        if got is None:
            if TASK_MARK in v.last_user_text():
                return self._step(0, "n", v)
            return Move("task", "Tell me what to do next.")
        step, variant, result = got
        if step == self.edit_step and variant == "n" and not self.edit_worked(result):
            return Move("task", f"The edit failed: {result[:200]}")
        if step == self.test_step:
            if "FAILED" in result or "OK" not in result:
                return Move("task", STILL_FAILING)
        if variant == "r":  # the file read again before the edit: now edit it
            return self._step(self.edit_step, "n", v, reread=True)
        if step + 1 >= len(self.plan):
            return Move("task", DONE)
        return self._step(step + 1, "n", v)

    def _step(self, index: int, variant: str, v: View, reread: bool = False) -> Move:
        step = self.plan[index]
        if step.kind == EDIT and fixture.BUGGY.strip() not in v.all_text():
            if reread:
                return Move("task", CANNOT_SEE)
            step = Step(READ, step.arg, "I need to see the file again before I change it.")
            variant = "r"
        call = Call(call_id(self.prefix, index, variant), *self.tool(step))
        return Move("task", step.say, [call], thinking=f"Step {index}: {step.kind} {step.arg}", step=index)

    def tool(self, step: Step) -> tuple[str, Any]:
        raise NotImplementedError

    def edit_worked(self, result: str) -> bool:
        return "error" not in result.lower() and "fail" not in result.lower()


class ClaudeCode(Script):
    prefix = "toolu_01"
    name = "claude"

    def tool(self, step: Step) -> tuple[str, Any]:
        if step.kind == READ:
            return "Read", {"file_path": f"{self.root}/{step.arg}"}
        if step.kind == EDIT:
            return "Edit", {"file_path": f"{self.root}/{step.arg}", "old_string": fixture.BUGGY.rstrip("\n"),
                            "new_string": fixture.FIXED.rstrip("\n")}
        return "Bash", {"command": step.arg, "description": step.say or f"Run {step.arg.split()[0]}"}

    def edit_worked(self, result: str) -> bool:
        return "has been updated" in result or "updated" in result.lower()


class Codex(Script):
    prefix = "call_"
    name = "codex"

    def tool(self, step: Step) -> tuple[str, Any]:
        if step.kind == READ:
            return "exec_command", {"cmd": f"sed -n '1,400p' {step.arg}", "yield_time_ms": 10000}
        if step.kind == EDIT:
            patch = (f"*** Begin Patch\n*** Update File: {step.arg}\n@@\n-{fixture.BUGGY.rstrip()}\n"
                     f"+{fixture.FIXED.rstrip()}\n*** End Patch\n")
            return "apply_patch", patch
        return "exec_command", {"cmd": step.arg, "yield_time_ms": 10000}

    def edit_worked(self, result: str) -> bool:
        return "Success" in result or "Updated" in result or "M " in result


class OpenCode(Script):
    prefix = "call_"
    name = "opencode"

    def side(self, v: View) -> Move | None:
        if "title generator" in v.system or "Generate a title" in v.all_text()[:4000] and TASK_MARK in v.all_text():
            if not any(m.role == "assistant" for m in v.messages):
                return Move("title", TITLE)
        return super().side(v)

    def tool(self, step: Step) -> tuple[str, Any]:
        if step.kind == READ:
            return "read", {"filePath": f"{self.root}/{step.arg}"}
        if step.kind == EDIT:
            return "edit", {"filePath": f"{self.root}/{step.arg}", "oldString": fixture.BUGGY.rstrip("\n"),
                            "newString": fixture.FIXED.rstrip("\n")}
        return "bash", {"command": step.arg, "description": step.say or f"Runs {step.arg.split()[0]}"}

    def edit_worked(self, result: str) -> bool:
        return "success" in result.lower() or "applied" in result.lower()


# --- aider: no tools; its user types, the model answers in text ----------------------------

AIDER_TURNS: tuple[tuple[str, str], ...] = (
    ("/add src/stock/pricing.py", ""),
    ("/read-only README.md docs/design.md", ""),
    ("What does this project do, in two sentences? (task ref STOCK-417)",
     "It keeps a shop's catalogue with prices in integer cents and stock per warehouse, and prints a weekly "
     "report. Discounts and taxes round each line to the nearest cent, halves up."),
    ("/run python3 -m unittest -v 2>&1", ""),
    ("Which tests fail, and what do they have in common?",
     "The failing tests are all in DiscountTest: each expects a discounted price rounded to the nearest cent, "
     "and gets one cent less whenever the fraction is a half or more."),
    ("/run git log -p -- src/stock/pricing.py", ""),
    ("When did that behaviour change?",
     "The last commit, 'pricing: discounts without floats', replaced the float rounding with int(), which "
     "truncates instead of rounding."),
    ("/run PYTHONPATH=src python3 -m stock.report data/items.csv", ""),
    ("Does the weekly report depend on the discount?",
     "No: the report sums shelf prices times quantities; only baskets go through the discount."),
    ("/run cat tests/test_pricing.py", ""),
    ("How are the expected values in DiscountTest computed?",
     "By hand, with the shop's rule: price times (100 - percent), plus 50, integer-divided by 100."),
    ("/run git show --stat HEAD", ""),
    ("Is anything else in that commit suspicious?",
     "No: it only touched the discount and the changelog."),
    ("/run grep -rn 'round' src docs", ""),
    ("What does the design document say about rounding?",
     "Round each line to the nearest cent, halves up, with integer arithmetic: (amount * numerator + "
     "denominator // 2) // denominator."),
    ("/run cat data/items.csv", ""),
    ("How many categories does the catalogue have?",
     "Eight: hardware, garden, kitchen, office, toys, outdoor, paint and lighting."),
    ("/run git show HEAD~1 --stat", ""),
    ("Was the report commit tested?",
     "Yes, it added tests/test_report.py with totals per category and per warehouse."),
    ("Please fix the rounding in apply_discount now, with integer arithmetic as the design says.", "EDIT"),
    ("/run python3 -m unittest -v 2>&1", ""),
    ("Do all the tests pass now?", "TESTS"),
    ("Summarize the change in one line for the changelog.",
     "pricing: discounts round to the nearest cent, halves up, again (the last release truncated them)."),
)
"""What aider's user types (commands and questions), and the model's answer to each
question (``EDIT``: the SEARCH/REPLACE block; ``TESTS``: read from the test output)."""

AIDER_COMMIT = "fix: round discounts half up"
SIDE_REPLIES = (TITLE, OTHER, AIDER_COMMIT)
"""What the model answers outside the task's conversation (with :data:`AIDER_SUMMARY`)."""

AIDER_SHORT: tuple[tuple[str, str], ...] = (
    *AIDER_TURNS[:5], AIDER_TURNS[15], AIDER_TURNS[16], *AIDER_TURNS[19:22])
"""The same session in 5 requests (the tests' size)."""
AIDER_PLANS = {"full": AIDER_TURNS, "short": AIDER_SHORT}

AIDER_EDIT = (f"The discount truncates; round half up instead:\n\n{fixture.EDITED}\n```python\n<<<<<<< SEARCH\n"
              f"{fixture.BUGGY}=======\n{fixture.FIXED}>>>>>>> REPLACE\n```\n")
AIDER_SUMMARY = ("I asked about the failing discount tests of the stock package; you found that apply_discount "
                 "truncates instead of rounding half up since the last commit.")


class Aider(Script):
    name = "aider"

    def __init__(self, root: str = "", plan: tuple[Step, ...] = PLAN,
                 turns: tuple[tuple[str, str], ...] = AIDER_TURNS) -> None:
        super().__init__(root, plan)
        self.turns = turns

    def side(self, v: View) -> Move | None:
        first = v.messages[0].text() if v.messages else ""
        if "summarize" in v.system.lower()[:400] or "Briefly summarize" in first[:400]:
            return Move("summary", AIDER_SUMMARY)
        if "commit message" in v.system.lower()[:600]:
            return Move("other", AIDER_COMMIT)
        return None

    def reply(self, v: View) -> Move:
        other = self.side(v)
        if other is not None:
            return other
        asked = v.last_user_text()
        for prompt, answer in self.turns:
            if answer and asked.strip().startswith(prompt):
                if answer == "EDIT":
                    if fixture.files()[fixture.EDITED] not in _files_text(v):
                        return Move("task", f"I cannot see {fixture.EDITED}: please add it to the chat.")
                    return Move("task", AIDER_EDIT)
                if answer == "TESTS":
                    ran = [m.text() for m in v.messages if "python3 -m unittest" in m.text()]
                    return Move("task", "Yes: every test passes." if ran and "\nOK" in ran[-1]
                                else "No, some tests still fail.")
                return Move("task", answer)
        return Move("other", OTHER)


def _files_text(v: View) -> str:
    """What the request shows of the files (aider sends the files in the chat whole, as
    they are on disk): every message but the model's own replies."""
    return "\n".join(m.text() for m in v.messages if m.role != "assistant") + v.system


def for_cli(cli: str, root: str, plan: str = "full") -> Script:
    """The script of ``cli`` working in ``root``, on the ``full`` task or its ``short`` form."""
    if cli == "claude":
        return ClaudeCode(root, PLANS[plan])
    if cli == "codex":
        return Codex(root, PLANS[plan])
    if cli == "opencode":
        return OpenCode(root, PLANS[plan])
    if cli == "aider":
        return Aider(root, PLANS[plan], AIDER_PLANS[plan])
    raise ValueError(f"no script for the CLI {cli!r}")


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
