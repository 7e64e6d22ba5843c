"""``python -m ragcache_cli``: the ``ragcache`` command without its console script."""

import sys

from ragcache_cli.cli import main

sys.exit(main())
