import sys

from ctxd.proxy.main import main

sys.exit(main())
