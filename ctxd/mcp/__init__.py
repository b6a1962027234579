"""``ctxd mcp``: an MCP server (stdio, the official ``mcp`` SDK) that gives an agent
back what its compressed prompt no longer holds. See docs/mcp.md.

(The package is ``ctxd.mcp``; ``import mcp`` inside it is absolute and still finds the
SDK: nothing here puts ``ctxd/`` itself on ``sys.path``.)
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from ctxd.mcp.server import main as run

    return run(argv)
