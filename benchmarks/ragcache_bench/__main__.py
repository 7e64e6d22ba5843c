"""``python -m ragcache_bench all --quick`` (the same as ``ragcache bench all --quick``)."""

import sys

from ragcache_bench import main

sys.exit(main())
