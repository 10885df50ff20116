"""``python -m approxlab <study> [options]``: the same as the ``approxlab`` command."""

import sys

from .cli import main

sys.exit(main())
