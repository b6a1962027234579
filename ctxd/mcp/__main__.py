"""``python -m ctxd.mcp``: the same as ``ctxd mcp``."""

import sys

from ctxd.mcp import main

sys.exit(main())
