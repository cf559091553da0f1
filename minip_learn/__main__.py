"""``python -m minip_learn``: the ``minip-learn`` command line (see :mod:`minip_learn.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
