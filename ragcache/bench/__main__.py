"""``python -m ragcache.bench all --quick`` (the same as ``ragcache bench all --quick``)."""

import sys

from ragcache.bench import main

sys.exit(main())
