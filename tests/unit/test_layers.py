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
    "service": {"server", "daemon", "doctor", "cli", "client", "mcp", "proxy", "__main__"},
    # Handlers get a Request (service, hub, config, DaemonControl), never the Daemon.
    "server": {"daemon", "cli", "client", "mcp", "proxy", "doctor", "__main__"},
}


# Who reads or writes a provider's shape does it through ctxd/formats (issue 25: a
# provider field is one edit there), not with a copy of its own.
THROUGH_FORMATS = ("engine", "importers", "exchange", "proxy", "server")


def _imports() -> dict[str, dict[str, list[str]]]:
    """layer -> imported ctxd layer -> where."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        layer = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] if node.module != "ctxd" else [  # (``__version__`` is no layer)
                    f"ctxd.{a.name}" for a in node.names if not a.name.startswith("__")]
            for name in names:
                bits = name.split(".")
                if bits[0] == "ctxd" and len(bits) > 1 and bits[1] != layer:
                    found[layer][bits[1]].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
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


@pytest.mark.parametrize("layer", THROUGH_FORMATS)
def test_provider_shapes_are_read_through_formats(layer: str) -> None:
    assert "formats" in IMPORTS.get(layer, {}), f"ctxd/{layer} no longer imports ctxd.formats"
