"""``python -m ctxd.cli``: the same as ``ctxd-cli``."""

import sys

from ctxd.cli.main import main

sys.exit(main())
