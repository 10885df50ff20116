"""``python -m approxlab <study> [options]``: the same as the ``approxlab`` command."""

import sys

from .cli import main

if __name__ == "__main__":  # not when imported (doctest collection)
    sys.exit(main())
