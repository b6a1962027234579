"""Imports follow the layers of docs/architecture.md: data flows down, never up.

Every ``import ctxd.X`` and ``from ctxd.X import`` counts, including those under
``TYPE_CHECKING`` and inside functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ctxd"

# layer -> the other ctxd packages/modules it may import
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "tokens": {"protocol"},
    # The provider shapes: read and written for everyone above, knowing nothing of them.
    "formats": {"protocol", "tokens"},
    "engine": {"formats", "protocol", "tokens"},
    "store": {"engine", "ownership", "protocol", "tokens"},
    "doctor": {"protocol", "store", "tokens"},
}
# layer -> what it must never import (the layers above it, and the front ends)
FORBIDDEN: dict[str, set[str]] = {
    "service": {"server", "daemon", "doctor", "cli", "client", "mcp", "proxy", "__main__", "embed", "remote_port"},
    # Handlers get a Request (service, hub, config, DaemonControl), never the Daemon; storage
    # is the service's (its errors mapped by service/errors.py, REQUEST_CANCELLED the protocol's).
    "server": {"daemon", "cli", "client", "mcp", "proxy", "doctor", "store", "__main__"},
    # The proxy calls the service port (service/port.py); a daemon in its process is made
    # outside the package (ctxd/embed.py) and handed to it by ``ctxd proxy``'s entry point.
    "proxy": {"server", "daemon", "__main__", "embed"},
    # Session ids as people type them are the client's (ctxd/ids.py), not ctxd-cli's.
    "mcp": {"cli", "server", "daemon", "__main__"},
}


# Who reads or writes a provider's shape does it through ctxd/formats (issue 25: a
# provider field is one edit there), not with a copy of its own.
THROUGH_FORMATS = ("engine", "importers", "exchange", "proxy", "service")  # (service/params.py: native names)


def _imports(package: Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """layer -> imported ctxd layer -> where."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        layer = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] if node.module != "ctxd" else [  # (``__version__`` is no layer)
                    f"ctxd.{a.name}" for a in node.names if a.name == "__main__" or not a.name.startswith("__")]
            for name in names:
                bits = name.split(".")
                if bits[0] == "ctxd" and len(bits) > 1 and bits[1] != layer:
                    found[layer][bits[1]].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


IMPORTS = _imports()


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_only_what_is_below_them(layer: str) -> None:
    extra = {k: v for k, v in IMPORTS.get(layer, {}).items() if k not in ALLOWED[layer]}
    assert not extra, f"ctxd/{layer} imports {sorted(extra)}: " + "; ".join(w for v in extra.values() for w in v)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_nothing_reaches_up(layer: str) -> None:
    bad = {k: v for k, v in IMPORTS.get(layer, {}).items() if k in FORBIDDEN[layer]}
    assert not bad, f"ctxd/{layer} imports {sorted(bad)}: " + "; ".join(w for v in bad.values() for w in v)


def test_the_reach_up_check_finds_each_kind(tmp_path: Path) -> None:
    """The check above reads imports of every form, so a violation cannot slip past it."""
    package = tmp_path / "ctxd"
    for name, source in [("proxy/a.py", "from ctxd.server.app import App\n"),
                         ("proxy/b.py", "def f():\n    import ctxd.daemon\n"),
                         ("proxy/c.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from ctxd import __main__\n"),
                         ("server/d.py", "from ctxd.store.db import REQUEST_CANCELLED\n"),
                         ("mcp/e.py", "from ctxd.cli.main import run\n"),
                         ("mcp/f.py", "from ctxd.ids import match_ids\n")]:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    found = _imports(package)
    assert {k for k in found["proxy"] if k in FORBIDDEN["proxy"]} == {"server", "daemon", "__main__"}
    assert set(found["server"]) & FORBIDDEN["server"] == {"store"}
    assert set(found["mcp"]) == {"cli", "ids"} and set(found["mcp"]) & FORBIDDEN["mcp"] == {"cli"}


@pytest.mark.parametrize("layer", THROUGH_FORMATS)
def test_provider_shapes_are_read_through_formats(layer: str) -> None:
    assert "formats" in IMPORTS.get(layer, {}), f"ctxd/{layer} no longer imports ctxd.formats"


# --- no cycles between subpackages -------------------------------------------------------

def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one layer (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_subpackages() -> None:
    graph = {layer: set(deps) for layer, deps in IMPORTS.items()}
    cycles = _cycles(graph)
    detail = []
    for component in cycles:
        for a in component:
            for b in component:
                if b in graph.get(a, ()):
                    detail.append(f"{a} -> {b} ({IMPORTS[a][b][0]})")
    assert not cycles, f"import cycles between ctxd's subpackages: {cycles}: " + "; ".join(detail)


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# --- dependencies through their public APIs only -----------------------------------------

LIBRARIES = ("pygls", "lsprotocol", "uvicorn", "httpx", "httpcore")
"""Dependencies whose internals ctxd once reached into (docs/decisions.md, "Foundations")."""
KNOWN_INTERNALS = frozenset({
    # pygls' JsonRPCProtocol: the result callback, the requests table, the dispatcher
    "_send_handler_result", "_request_futures", "_execute_handler", "_send_data", "_send_response",
    # uvicorn's Server: how it installs and raises signals again
    "capture_signals", "_captured_signals", "handle_exit",
    # httpx's transport: its connection pool's backend and its exception table
    "_network_backend", "HTTPCORE_EXC_MAP", "map_httpcore_exceptions",
})
"""Names of those libraries' internals that an object of theirs reached by any route
(``self.protocol._request_futures``) would expose: never written in ctxd."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _library_uses(source: str, where: str) -> list[str]:
    """Every use of a private name of :data:`LIBRARIES` in one module's source."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the library path it stands for
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if any(_private(p) for p in a.name.split(".")):
                        bad.append(f"{where}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in LIBRARIES:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if any(_private(p) for p in node.module.split(".")) or _private(a.name):
                    bad.append(f"{where}:{node.lineno}: from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in KNOWN_INTERNALS:
                bad.append(f"{where}:{node.lineno}: .{node.attr} (an internal of {'/'.join(LIBRARIES)})")
            dotted = _dotted(node)
            if dotted is not None and dotted.split(".")[0] in aliases \
                    and any(_private(p) for p in dotted.split(".")[1:]):
                bad.append(f"{where}:{node.lineno}: {dotted}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in KNOWN_INTERNALS:
            bad.append(f"{where}:{node.lineno}: def {node.name} (overrides an internal of {'/'.join(LIBRARIES)})")
        elif isinstance(node, ast.ClassDef):
            bases = [_dotted(b) for b in node.bases]
            library_bases = [b for b in bases if b is not None and b.split(".")[0] in aliases]
            for item in node.body if library_bases else ():
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _overrides_private(
                        item.name, [aliases[b.split(".")[0]] + b[len(b.split(".")[0]):] for b in library_bases]):
                    bad.append(f"{where}:{item.lineno}: {node.name}.{item.name} overrides a private method of "
                               f"{', '.join(library_bases)}")
    return bad


def _overrides_private(name: str, bases: list[str]) -> bool:
    """Whether ``name`` is a private attribute one of these library classes has."""
    if not _private(name):
        return False
    import importlib

    for dotted in bases:
        module, _, attr = dotted.rpartition(".")
        try:
            base = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        if hasattr(base, name):
            return True
    return False


def test_no_private_names_of_pygls_uvicorn_or_httpx_in_ctxd() -> None:
    bad: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        bad += _library_uses(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert not bad, "ctxd uses internals of its dependencies (public APIs only): " + "; ".join(bad)


@pytest.mark.parametrize("source, found", [
    ("from pygls.protocol import JsonRPCProtocol\nclass P(JsonRPCProtocol):\n"
     "    def _send_handler_result(self, f, *, msg_id): pass\n", "_send_handler_result"),
    ("def f(conn):\n    return conn.protocol._request_futures\n", "_request_futures"),
    ("import httpx\nx = httpx._transports.default\n", "httpx._transports.default"),
    ("from httpx._transports.default import HTTPCORE_EXC_MAP\n", "from httpx._transports.default"),
    ("import uvicorn\nclass S(uvicorn.Server):\n    def capture_signals(self): pass\n", "capture_signals"),
    ("import uvicorn\nclass S(uvicorn.Server):\n    def _wait_tasks_to_complete(self): pass\n",
     "overrides a private method"),
])
def test_the_private_name_check_finds_each_kind(source: str, found: str) -> None:
    bad = _library_uses(source, "x.py")
    assert bad and found in bad[0], bad


def test_public_uses_pass_the_private_name_check() -> None:
    source = ("import httpx\nimport httpcore\nclass T(httpx.AsyncBaseTransport):\n"
              "    def __init__(self):\n        self._own = 1\n"
              "    async def handle_async_request(self, request):\n        raise httpx.ConnectError('x')\n"
              "class S(httpcore.AsyncNetworkStream):\n    async def _flush(self): pass\n")
    assert _library_uses(source, "x.py") == []


# --- the forwarder starts without the daemon ---------------------------------------------

def test_the_forwarder_imports_neither_pygls_nor_the_daemon(tmp_path: Path) -> None:
    """``ctxd --remote`` (what every editor spawns) loads only what relays frames: not
    pygls/lsprotocol (a quarter of a second), not the daemon's service, storage or engine.
    Run as editors run it, under ``-X importtime``, against a socket nobody serves (it
    exits 2 once everything it needs is imported)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXD_", "XDG_", "PYTHON"))}
    env.update(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"), XDG_STATE_HOME=str(tmp_path / "state"))
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "ctxd", "--remote",
                          f"unix:{tmp_path / 'nobody.sock'}"], cwd=PACKAGE.parent, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "no ctxd daemon is running" in run.stderr, run.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    assert "ctxd.remote" in modules
    unwanted = sorted(m for m in modules
                      if m.split(".")[0] in ("pygls", "lsprotocol", "cattrs", "tiktoken")
                      or m.startswith(("ctxd.service", "ctxd.store", "ctxd.engine", "ctxd.server.connection")))
    assert not unwanted, f"ctxd --remote imports {unwanted}"


# --- ideas by name -------------------------------------------------------------------------

def test_the_code_names_its_ideas_instead_of_citing_design_notes() -> None:
    """A design note cited by its number ("seed" and three digits) names a document a clone
    of ctxd does not have: the code says what the idea is ("checkpoint ageing", "the six
    stages of a compression") instead."""
    import re

    cite = re.compile(r"\bseeds?[ _]?0\d\d", re.IGNORECASE)
    root = PACKAGE.parent
    paths = [p for top in ("ctxd", "tests", "protocol", "clients/vscode/src") for p in sorted((root / top).rglob("*"))
             if p.suffix in (".py", ".md", ".json", ".sql", ".ts", ".lua") and "__pycache__" not in p.parts]
    paths += sorted((root / "docs").glob("*.md")) + [root / "README.md"]
    found = [f"{p.relative_to(root)}:{n}" for p in paths
             for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if cite.search(line)]
    assert not found, "design notes cited by number: " + ", ".join(found[:20])
