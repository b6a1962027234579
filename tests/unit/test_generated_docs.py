"""The documents generated from code must match the code (and CI must run what README says)."""

from __future__ import annotations

import re
from pathlib import Path

from ctxd.config import _markdown
from ctxd.protocol.generate import render
from ctxd.protocol.methods import METHODS
from ctxd.server.handlers import HANDLERS

REPO = Path(__file__).resolve().parents[2]


def test_protocol_documents_are_current() -> None:
    for name, text in render().items():
        path = REPO / name
        assert path.exists(), f"{path} is missing: run python -m ctxd.protocol.generate"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run python -m ctxd.protocol.generate"


def test_configuration_document_is_current() -> None:
    path = REPO / "docs" / "configuration.md"
    assert path.read_text(encoding="utf-8") == _markdown(), \
        "docs/configuration.md is stale: run python -m ctxd.config --markdown > docs/configuration.md"


def test_every_method_has_a_handler() -> None:
    assert set(METHODS) == set(HANDLERS)


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```(?:sh|bash|console)?\n(.*?)\n```", text, re.DOTALL)


def test_ci_runs_the_readme_test_command() -> None:
    commands = _readme_commands()
    assert len(commands) >= 2, "README.md must open with the run command and the test command"
    test_command = commands[1].strip()
    assert "pytest" in test_command
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci, ".ci/run must run exactly README's test command"


def test_typescript_types_follow_the_schema() -> None:
    """types.ts is rendered from the schema: a new field, a new literal and a new
    notification appear in it, typed, without anyone editing TypeScript."""
    import copy

    from ctxd.protocol.generate import build_schema
    from ctxd.protocol.typescript import render_typescript

    schema = build_schema()
    before = render_typescript(schema)
    assert 'export type Role = "assistant" | "system" | "tool" | "user";' in before
    assert "  role: Role;" in before  # Message.role, by its name
    assert "export type Prompt = OpenAIPrompt | AnthropicPrompt | OllamaPrompt;" in before
    changed = copy.deepcopy(schema)
    changed["$defs"]["Message"]["properties"]["role"]["enum"].append("developer")
    changed["$defs"]["SessionInfo"]["properties"]["pinnedCount"] = {"type": "integer"}
    changed["$defs"]["SessionInfo"]["required"].append("pinnedCount")
    changed["notifications"]["session/renamed"] = {"description": "", "direction": "server->client",
                                                   "params": {"$ref": "#/$defs/SessionRef"}}
    after = render_typescript(changed)
    assert 'export type Role = "assistant" | "system" | "tool" | "user" | "developer";' in after
    session_info = after.split("export interface SessionInfo {", 1)[1].split("}", 1)[0]
    assert "  pinnedCount: number;" in session_info
    assert '  "session/renamed": SessionRef;' in after and '  "session/renamed",' in after


def test_performance_and_decisions_are_references() -> None:
    """docs/performance.md and docs/decisions.md say what holds now (figures with the
    command that gives them), not the sessions that got there: git has the history. Each
    stays short enough to read (issue 25: 400 and 600 lines), and no heading is dated like
    a session log."""
    dated = re.compile(r"^#+ .*\b20\d\d-\d\d-\d\d")
    for name, limit in (("performance.md", 400), ("decisions.md", 600)):
        lines = (REPO / "docs" / name).read_text(encoding="utf-8").splitlines()
        assert len(lines) <= limit, f"docs/{name} has {len(lines)} lines (at most {limit}): keep what holds now"
        stale = [line for line in lines if dated.match(line)]
        assert not stale, f"docs/{name} has dated session headings: {stale[:3]}"


def test_section_links_into_the_reference_docs_resolve() -> None:
    """A citation like (docs/performance.md, "Proxy benchmark") in code, tests or docs names
    a heading, or the opening words of a bold entry, that the document still has."""
    cite = re.compile(r"docs/(performance|decisions)\.md[,\s(]*[\"“]([^\"”]+)[\"”]")
    targets = {name: (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")
               for name in ("performance", "decisions")}
    missing = []
    for top in ("ctxd", "tests", "docs", "README.md", "pyproject.toml"):
        root = REPO / top
        for path in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if path.suffix not in (".py", ".md", ".toml") or "__pycache__" in path.parts:
                continue
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            text = " ".join(line.strip().lstrip("#").strip() for line in lines)  # comments run on
            for doc, title in cite.findall(text):
                words = title.strip().rstrip(".:")
                headings = [line.lstrip("#").strip() for line in targets[doc].splitlines() if line.startswith("#")]
                bold = re.findall(r"\*\*([^*]+)\*\*", targets[doc])
                if not any(h.startswith(words) for h in headings) and not any(b.startswith(words) for b in bold):
                    missing.append(f"{path.relative_to(REPO)}: docs/{doc}.md, \"{words}\"")
    assert not missing, "citations of sections that no longer exist: " + "; ".join(missing)
